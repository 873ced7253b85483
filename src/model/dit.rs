//! The MOSS single-stream DiT (spec section 4): latent + timestep + text → velocity.

use crate::backend::ops::DitOps;
use crate::checkpoint::{config::DitConfig, Component};
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use std::marker::PhantomData;

pub struct Dit<B: DitOps> {
    _b: PhantomData<B>,
}

/// A prompt's text tokens after the text embedder and refiner: computed once per prompt.
pub struct TextCond<B: DitOps> {
    pub tokens: B::T,
    /// Text length L (the t-axis RoPE value of the image tokens).
    pub len: usize,
}

impl<B: DitOps> Dit<B> {
    pub fn load(_b: &B, _c: &Component, _cfg: &DitConfig) -> Result<Self> {
        bail!("the DiT is not built yet (issue: CPU reference: the DiT, the sampling loop)")
    }

    /// Run the text embedder and the refiner over `ctx` `[L, text_dim]`.
    pub fn refine_text(&self, _b: &B, _ctx: &Tensor) -> Result<TextCond<B>> {
        bail!("the DiT is not built yet")
    }

    /// Velocity `[1, C, h, w]` (f32) for latent `x` `[1, C, h, w]` at timestep `t` (σ·1000),
    /// skipping the blocks listed in `skip`.
    pub fn forward(&self, _b: &B, _x: &Tensor, _t: f32, _text: &TextCond<B>, _skip: &[usize]) -> Result<Tensor> {
        bail!("the DiT is not built yet")
    }
}
