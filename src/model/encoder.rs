//! The Qwen3.5 text backbone (spec section 3): prompt ids → final-norm hidden states.

use crate::backend::ops::EncoderOps;
use crate::checkpoint::{config::EncoderConfig, Component};
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use std::marker::PhantomData;

pub struct Encoder<B: EncoderOps> {
    _b: PhantomData<B>,
}

impl<B: EncoderOps> Encoder<B> {
    pub fn load(_b: &B, _c: &Component, _cfg: &EncoderConfig) -> Result<Self> {
        bail!("the prompt encoder is not built yet (issue: CPU reference: the Qwen3.5 prompt encoder)")
    }

    /// Hidden states `[L, hidden]` (f32) of one unpadded prompt.
    pub fn forward(&self, _b: &B, _ids: &[u32]) -> Result<Tensor> {
        bail!("the prompt encoder is not built yet")
    }
}
