//! The DiT's producers of float8 activations on the GPU (`--precision fp8`): the norms and
//! SiTU-GLU that write their output as per-row e4m3 codes and f32 scales, what
//! `moss_quantize_fp8` makes of their bf16/f32 output, bit for bit, without that output or the
//! pass over it (`cuda/dit/dit_ops.cu` `moss_rms_mod_fp8_*`, `moss_gres_mod_fp8_*`;
//! `cuda/dit/situ_fp8.cu`; the arithmetic `cuda/common/fp8.cuh`). `prefix` `moss_ctl` names the
//! planted twins (check image).

use crate::launch::{DIT_SITU_FP8_THREADS, DIT_SITU_FP8_VECS};
use crate::ops::{Arg, Cuda, CudaTensor, DType};
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
    /// computed twice (the row's amax, then its codes); `moss_ctl`: each lane's own amax.
    pub(crate) fn rms_norm_modulate_fp8_with(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f64,
        prefix: &str,
    ) -> Result<Quantized> {
        let (d, vt, v) = self.row_vectors(x, &[("weight", w), ("shift", shift), ("scale", scale)], "rms_norm_modulate")?;
        let (q, qs) = self.alloc_quantized(&x.shape)?;
        let name = Self::norm_kernel(prefix, "rms_mod_fp8", x.dtype, vt, self.normed_dtype(x.dtype, vt));
        let ptrs = [q.ptr(), qs.ptr(), x.ptr(), v[0].ptr(), v[1].ptr(), v[2].ptr()];
        self.launch_rows(&name, x.shape[0], &ptrs, vec![Arg::I(d as i32), Arg::F(eps as f32), Arg::F(E4M3_MAX), Arg::F(MIN_AMAX)])?;
        Ok((q, qs))
    }

    /// [`moss_core::backend::ops::DitOps::gated_residual_norm_modulate_fp8`]: the new stream `x'` in
    /// `x`'s dtype, its norm quantized; `moss_ctl`: codes rounded toward zero.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gres_norm_mod_fp8_with(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f64,
        prefix: &str,
    ) -> Result<(CudaTensor, Quantized)> {
        let (d, y, vt, v, ty) = self.gres_inputs(x, y, [gate, w, shift, scale])?;
        let xo = self.alloc(x.dtype, &x.shape)?;
        let (q, qs) = self.alloc_quantized(&x.shape)?;
        let name = Self::norm_kernel(prefix, "gres_mod_fp8", x.dtype, vt, ty);
        let ptrs = [xo.ptr(), q.ptr(), qs.ptr(), x.ptr(), y.ptr(), v[0].ptr(), v[1].ptr(), v[2].ptr(), v[3].ptr()];
        self.launch_row_blocks(&name, x.shape[0], d, &ptrs, vec![Arg::I(d as i32), Arg::F(eps as f32), Arg::F(E4M3_MAX), Arg::F(MIN_AMAX)])?;
        Ok((xo, (q, qs)))
    }

    /// [`moss_core::backend::ops::DitOps::situ_glu_fp8`] where [`crate::select::situ_fp8_fused`]
    /// takes `F`: one block a row, the row's values held in registers (bf16 the fast form, fp32
    /// the libm one, as `situ_glu`); `moss_ctl`: the amax of the first warp's values only.
    pub(crate) fn situ_glu_fp8_with(&self, x: &CudaTensor, prefix: &str) -> Result<Quantized> {
        let two_f = x.last_dim();
        ensure!(two_f.is_multiple_of(2), "situ_glu: last dim {two_f} is not [up | gate]");
        let f = two_f / 2;
        ensure!(crate::select::situ_fp8_fused(f), "situ_glu_fp8: no fused kernel for F = {f}");
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = f;
        let (q, qs) = self.alloc_quantized(&shape)?;
        let rows = x.rows();
        let threads = (f / 8).div_ceil(DIT_SITU_FP8_VECS).next_multiple_of(32).clamp(32, DIT_SITU_FP8_THREADS);
        let form = if x.dtype == DType::BF16 { "situ_fast" } else { "situ" };
        self.launch(
            &format!("{prefix}_{form}_fp8_{}", x.dtype.name()),
            rows.min(1 << 16) as u32,
            threads as u32,
            0,
            &[Arg::P(q.ptr()), Arg::P(qs.ptr()), Arg::P(x.ptr()), Arg::L(rows as i64), Arg::L(f as i64), Arg::F(E4M3_MAX), Arg::F(MIN_AMAX)],
        )?;
        Ok((q, qs))
    }
}
