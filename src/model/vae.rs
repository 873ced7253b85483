//! The FLUX.2 small VAE decoder (spec section 7): packed latents → picture in [-1, 1].

use crate::backend::ops::VaeOps;
use crate::checkpoint::{config::VaeConfig, Component};
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use std::marker::PhantomData;

pub struct VaeDecoder<B: VaeOps> {
    _b: PhantomData<B>,
}

impl<B: VaeOps> VaeDecoder<B> {
    pub fn load(_b: &B, _c: &Component, _cfg: &VaeConfig) -> Result<Self> {
        bail!("the VAE decoder is not built yet (issue: CPU reference: the FLUX.2 small VAE decoder)")
    }

    /// Decode `z` `[1, 128, h, w]` (normalised, packed) to `[3, 16h, 16w]` clamped to [-1, 1].
    pub fn decode(&self, _b: &B, _z: &Tensor) -> Result<Tensor> {
        bail!("the VAE decoder is not built yet")
    }
}
