//! [`DitOps::linear_gated_residual`], the DiT's o and ffn_down products with the gated residual
//! on the way out: on Hopper our own GEMM with it in its epilogue
//! (`cuda/dit/sm90a/linear_gated_residual.cu`, the GEMM of `cuda/common/sm90a/gemm_tile.cuh`: the
//! `[M, D]` product is never written) where the shape qualifies ([`gres_gemm_dims`]); elsewhere,
//! and for other shapes and fp32, cuBLASLt `linear` then `gated_residual`. The stream `x` (and the
//! output) may be bf16 or f32 (the bf16 forward's f32 residual stream: the `_f32` kernel).

use crate::backend::cuda::launch::{DIT_QKV_GEMM_COLS, DIT_SITU_GEMM_KTILE, DIT_SITU_GEMM_ROWS};
use crate::backend::cuda::ops::{Arg, Cuda, CudaTensor, DType};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use anyhow::{anyhow, ensure, Result};

/// The fused kernel (the check image also has `{GRES_KERNEL}_gate_shift_control`), launched like
/// `moss_dit_linear_situ_glu` (persistent grid, `DIT_SITU_GEMM_SMEM` bytes of dynamic shared
/// memory).
pub const GRES_KERNEL: &str = "moss_dit_linear_gated_residual";

/// `(M, K, D)` when the fused kernel takes `a [M, K] · w [D, K]ᵀ` added to `x [M, D]` by their
/// shapes: D a positive multiple of 256, K of 64, sizes within its 32-bit indices.
pub fn gres_gemm_dims(a: &[usize], w: &[usize], x: &[usize]) -> Option<(usize, usize, usize)> {
    let (&[m, k], &[d, wk]) = (a, w) else { return None };
    let fits = |v: usize| v < i32::MAX as usize;
    let ok = wk == k
        && x == [m, d]
        && k > 0
        && k.is_multiple_of(DIT_SITU_GEMM_KTILE)
        && d > 0
        && d.is_multiple_of(DIT_QKV_GEMM_COLS)
        && [m, d, k, m.div_ceil(DIT_SITU_GEMM_ROWS) * (d / DIT_QKV_GEMM_COLS)].into_iter().all(fits);
    ok.then_some((m, k, d))
}

/// [`gres_gemm_dims`] where `a`, `w`, `x` and `gate` are also bf16 and aligned (TMA, 16-byte
/// vectors); `None`: the op is `linear` + `gated_residual`.
fn gres_gemm_shape(a: &CudaTensor, w: &CudaTensor, x: &CudaTensor, gate: &CudaTensor) -> Option<(usize, usize, usize)> {
    let ok = [a, w, gate].iter().all(|t| t.dtype == DType::BF16)
        && matches!(x.dtype, DType::BF16 | DType::F32)
        && [a, w, x, gate].iter().all(|t| t.ptr().is_multiple_of(16));
    gres_gemm_dims(&a.shape, &w.shape, &x.shape).filter(|&(_, _, d)| ok && gate.numel() == d)
}

impl Cuda {
    /// The fused kernel `name` ([`GRES_KERNEL`] or its check-image twin; an f32 `x` takes their
    /// `{GRES_KERNEL}_f32` forms): `x + gate ⊙ (a · wᵀ)` → `[M, D]` in `x`'s dtype, min(SMs,
    /// tiles) blocks.
    pub(crate) fn linear_gated_residual_fused(&self, a: &CudaTensor, w: &CudaTensor, x: &CudaTensor, gate: &CudaTensor, name: &str) -> Result<CudaTensor> {
        let (m, k, d) = gres_gemm_shape(a, w, x, gate).ok_or_else(|| {
            anyhow!("linear_gated_residual: a {:?} · w {:?} + x {:?} ⊙ gate {:?} is not a shape the fused kernel takes (bf16; x bf16 or f32)", a.shape, w.shape, x.shape, gate.shape)
        })?;
        ensure!(self.has_sm90a(), "`{name}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        let name = if x.dtype == DType::F32 { name.replacen(GRES_KERNEL, &format!("{GRES_KERNEL}_f32"), 1) } else { name.to_string() };
        let out = self.alloc(x.dtype, &[m, d])?;
        if m == 0 {
            return Ok(out);
        }
        let tiles = m.div_ceil(DIT_SITU_GEMM_ROWS) * (d / DIT_QKV_GEMM_COLS);
        let args = [&out, x, gate].map(|t| Arg::P(t.ptr())).into_iter().chain([m, d, k].map(|v| Arg::I(v as i32))).collect();
        self.launch_gemm_tiles(&name, (a, w), (m, d, k), tiles, args)?;
        Ok(out)
    }

    /// [`DitOps::linear_gated_residual`]: the fused kernel where the sm_90a kernels are loaded and
    /// the shapes and dtypes qualify (profile row `linear_gated_residual MxKxN`), else `linear` +
    /// `gated_residual`.
    /// Whether [`Cuda::linear_gated_residual_op`] runs the fused kernel on these tensors.
    pub(crate) fn takes_linear_gated_residual(&self, a: &CudaTensor, w: &CudaTensor, x: &CudaTensor, gate: &CudaTensor) -> bool {
        self.has_sm90a() && gres_gemm_shape(a, w, x, gate).is_some()
    }

    pub(crate) fn linear_gated_residual_op(&self, a: &CudaTensor, w: &CudaTensor, x: &CudaTensor, gate: &CudaTensor) -> Result<CudaTensor> {
        match gres_gemm_shape(a, w, x, gate).filter(|_| self.has_sm90a()) {
            Some((m, k, d)) => {
                let run = || self.linear_gated_residual_fused(a, w, x, gate, GRES_KERNEL);
                self.timed_op(|| format!("linear_gated_residual {m}x{k}x{d}"), run)
            }
            None => self.gated_residual(x, &self.linear(a, w, None)?, gate),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gres_gemm_dims;

    #[test]
    fn takes_the_dit_shape_and_refuses_the_rest() {
        assert_eq!(gres_gemm_dims(&[4224, 3072], &[3072, 3072], &[4224, 3072]), Some((4224, 3072, 3072)));
        assert_eq!(gres_gemm_dims(&[4224, 8192], &[3072, 8192], &[4224, 3072]), Some((4224, 8192, 3072)));
        assert_eq!(gres_gemm_dims(&[0, 64], &[256, 64], &[0, 256]), Some((0, 64, 256)));
        assert_eq!(gres_gemm_dims(&[77, 128], &[384, 128], &[77, 384]), None, "D not a multiple of 256");
        assert_eq!(gres_gemm_dims(&[77, 96], &[256, 96], &[77, 256]), None, "K not a multiple of 64");
        assert_eq!(gres_gemm_dims(&[77, 128], &[256, 128], &[76, 256]), None, "x's rows differ");
        assert_eq!(gres_gemm_dims(&[77, 128], &[256, 64], &[77, 256]), None, "K of a and w differ");
        assert_eq!(gres_gemm_dims(&[1, 77, 128], &[256, 128], &[77, 256]), None, "a not 2-D");
    }
}
