//! The DiT's producers of float8 activations on the GPU (`--precision fp8`): the norms and
//! SiTU-GLU that write their output as per-row e4m3 codes and f32 scales, what
//! `moss_quantize_fp8` makes of their bf16/f32 output, bit for bit, without that output or the
//! pass over it (`cuda/dit/dit_ops.cu` `moss_rms_mod_fp8_*`, `moss_gres_mod_fp8_*`;
//! `cuda/dit/situ_fp8.cu`; the arithmetic `cuda/common/fp8.cuh`).

use crate::kernels;
use crate::launch::{DIT_SITU_FP8_THREADS, DIT_SITU_FP8_VECS};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::fp8::{E4M3_MAX, MIN_AMAX};

/// Codes and scales of a quantized activation (`[.., K]` e4m3, `[rows]` f32).
pub type Quantized = (CudaTensor, CudaTensor);

impl Cuda {
    /// Room for `shape` quantized per row: codes `shape`, one scale a row.
    fn alloc_quantized(&self, shape: &[usize]) -> Result<Quantized> {
        let rows = shape[..shape.len() - 1].iter().product::<usize>();
        Ok((self.alloc(DType::F8E4M3, shape)?, self.alloc(DType::F32, &[rows])?))
    }

    /// [`moss_core::backend::ops::DitOps::rms_norm_modulate_fp8`]: one warp a row, the norm's values
    /// computed twice (the row's amax, then its codes).
    pub(crate) fn rms_norm_modulate_fp8_op(&self, x: &CudaTensor, w: &CudaTensor, shift: &CudaTensor, scale: &CudaTensor, eps: f64) -> Result<Quantized> {
        let (d, vt, v) = self.row_vectors(x, &[("weight", w), ("shift", shift), ("scale", scale)], "rms_norm_modulate")?;
        let (q, qs) = self.alloc_quantized(&x.shape)?;
        let kernel = Self::norm_kernel(x.dtype, self.normed_dtype(x.dtype, vt), &kernels::RMS_MOD_FP8, &kernels::RMS_MOD_FP8_TO);
        let rows = x.shape[0];
        kernel.launch(self, Self::rows_cfg(rows), &q, &qs, x, &v[0], &v[1], &v[2], rows as i64, d as i32, eps as f32, E4M3_MAX, MIN_AMAX)?;
        Ok((q, qs))
    }

    /// [`moss_core::backend::ops::DitOps::gated_residual_norm_modulate_fp8`]: the new stream `x'` in
    /// `x`'s dtype, its norm quantized.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gres_norm_mod_fp8_op(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f64,
    ) -> Result<(CudaTensor, Quantized)> {
        let (d, y, _, v, ty) = self.gres_inputs(x, y, [gate, w, shift, scale])?;
        let xo = self.alloc(x.dtype, &x.shape)?;
        let (q, qs) = self.alloc_quantized(&x.shape)?;
        let kernel = Self::norm_kernel(x.dtype, ty, &kernels::GRES_MOD_FP8, &kernels::GRES_MOD_FP8_TO);
        let rows = x.shape[0];
        if let Some(cfg) = Self::row_blocks_cfg("gated_residual_norm_modulate_fp8", rows, d)? {
            let (d, eps) = (d as i32, eps as f32);
            kernel.launch(self, cfg, &xo, &q, &qs, x, &y, &v[0], &v[1], &v[2], &v[3], rows as i64, d, eps, E4M3_MAX, MIN_AMAX)?;
        }
        Ok((xo, (q, qs)))
    }

    /// [`moss_core::backend::ops::DitOps::situ_glu_fp8`] where [`crate::select::situ_fp8_fused`]
    /// takes `F`: one block a row, the row's values held in registers (bf16 the fast form, fp32
    /// the libm one, as `situ_glu`).
    pub(crate) fn situ_glu_fp8_op(&self, x: &CudaTensor) -> Result<Quantized> {
        let two_f = x.last_dim();
        ensure!(two_f.is_multiple_of(2), "situ_glu: last dim {two_f} is not [up | gate]");
        let f = two_f / 2;
        ensure!(crate::select::situ_fp8_fused(f), "situ_glu_fp8: no fused kernel for F = {f}");
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = f;
        let (q, qs) = self.alloc_quantized(&shape)?;
        let rows = x.rows();
        let threads = (f / 8).div_ceil(DIT_SITU_FP8_VECS).next_multiple_of(32).clamp(32, DIT_SITU_FP8_THREADS);
        let kernel = if x.dtype == DType::BF16 { &kernels::SITU_FAST_FP8 } else { &kernels::SITU_FP8 };
        kernel.launch(self, (rows.min(1 << 16) as u32, threads as u32, 0), &q, &qs, x, rows as i64, f as i64, E4M3_MAX, MIN_AMAX)?;
        Ok((q, qs))
    }
}
