//! The encoder's fused ops on CUDA. Not built yet: each op says so, so a GPU run stops at the
//! encode stage with a clear message instead of computing anything wrong.

use super::ops::Cuda;
use crate::backend::ops::EncoderOps;
use anyhow::{bail, Result};

const NOT_YET: &str = "the prompt encoder is not built for CUDA yet; encode on the CPU with \
    `moss encode --device cpu` and pass --embeds, or use --device cpu";

impl EncoderOps for Cuda {
    fn embed(&self, _table: &Self::T, _ids: &[u32]) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn head_norm_rope(&self, _x: &Self::T, _w: &Self::T, _eps: f64, _rot: usize, _theta: f64) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn causal_attention(&self, _q: &Self::T, _k: &Self::T, _v: &Self::T, _scale: f64) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn silu_mul(&self, _gate: &Self::T, _up: &Self::T) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn causal_conv1d_silu(&self, _x: &Self::T, _w: &Self::T) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn gdn_gates(&self, _a: &Self::T, _b: &Self::T, _a_log: &Self::T, _dt_bias: &Self::T) -> Result<(Self::T, Self::T)> {
        bail!(NOT_YET)
    }
    fn gated_delta_rule(&self, _q: &Self::T, _k: &Self::T, _v: &Self::T, _g: &Self::T, _beta: &Self::T) -> Result<Self::T> {
        bail!(NOT_YET)
    }
    fn gated_rms_norm(&self, _x: &Self::T, _z: &Self::T, _w: &Self::T, _eps: f64) -> Result<Self::T> {
        bail!(NOT_YET)
    }
}
