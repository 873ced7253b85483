//! The VAE decoder's fused ops on CUDA. Not built yet: each op says so, so a GPU run stops at the
//! decode stage with a clear message instead of computing anything wrong.

use super::ops::Cuda;
use crate::backend::ops::VaeOps;
use anyhow::{bail, Result};

const NOT_YET: &str = "the VAE decoder is not built for CUDA yet; save the latents with \
    --save-latents and run `moss decode --device cpu`, or use --device cpu";

impl VaeOps for Cuda {
    fn bn_unpatchify(&self, _z: &Self::T, _mean: &Self::T, _var: &Self::T, _eps: f64, _patch: [usize; 2]) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn conv2d(&self, _x: &Self::T, _w: &Self::T, _b: &Self::T, _upsample2x: bool) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn group_norm(&self, _x: &Self::T, _w: &Self::T, _b: &Self::T, _groups: usize, _eps: f64, _silu: bool) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn spatial_attention(&self, _q: &Self::T, _k: &Self::T, _v: &Self::T) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn to_rgb8(&self, _x: &Self::T) -> Result<Vec<u8>> {
        bail!(NOT_YET)
    }
}
