//! [`DitOps::linear_qkv_norm_rope`], the DiT's packed `q|k|v` projection with per-head RMSNorm
//! and RoPE of q and k on the way out: on Hopper our own GEMM with them in its epilogue
//! (`cuda/dit/sm90a/linear_qkv_norm_rope.cu`, the GEMM of `cuda/common/sm90a/gemm_tile.cuh`: the
//! `[N, 3D]` product is never written before the norm) where the shape qualifies
//! ([`qkv_gemm_shape`]); elsewhere, and for other shapes and fp32, cuBLASLt `linear` then
//! `qkv_norm_rope`, each timed under its own name.

use crate::kernels;
use crate::launch::{DIT_QKV_GEMM_COLS, DIT_SITU_GEMM_KTILE, DIT_SITU_GEMM_KTILE_FP8, DIT_SITU_GEMM_ROWS, DIT_SITU_GEMM_SMEM};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{anyhow, ensure, Result};
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;

/// The fused kernel ([`kernels::DIT_LINEAR_QKV_NORM_ROPE`]; the check image also has `{QKV_KERNEL}_k_weight_control` and
/// `{QKV_KERNEL}_sign_control`), launched like `moss_dit_linear_situ_glu` (persistent grid) with
/// [`DIT_SITU_GEMM_SMEM`] bytes of dynamic shared memory.
pub const QKV_KERNEL: &str = "moss_dit_linear_qkv_norm_rope";

/// The e4m3 form's kernel ([`kernels::DIT_LINEAR_QKV_NORM_ROPE_FP8`], `--precision fp8`; check-image twins `{QKV_FP8_KERNEL}_k_weight_control`,
/// `{QKV_FP8_KERNEL}_sign_control`), launched as [`QKV_KERNEL`].
pub const QKV_FP8_KERNEL: &str = "moss_dit_linear_qkv_norm_rope_fp8";

/// The head dim the fused kernel takes.
const HEAD_DIM: usize = 128;

/// `(M, K, D)` when the fused kernel takes `x [.., K] · w [3D, K]ᵀ` with `heads` heads by their
/// shapes: head dim 128, D a positive multiple of 256 (two heads a tile), K of 64, sizes within
/// its 32-bit indices.
pub fn qkv_gemm_dims(x: &[usize], w: &[usize], heads: usize) -> Option<(usize, usize, usize)> {
    let (&k, &[three_d, wk]) = (x.last()?, w) else { return None };
    let (m, d) = (x[..x.len() - 1].iter().product::<usize>(), three_d / 3);
    let fits = |v: usize| v < i32::MAX as usize;
    let ok = wk == k
        && k > 0
        && k.is_multiple_of(DIT_SITU_GEMM_KTILE)
        && d > 0
        && three_d == 3 * d
        && d == heads * HEAD_DIM
        && d.is_multiple_of(DIT_QKV_GEMM_COLS)
        && [m, three_d, k, m.div_ceil(DIT_SITU_GEMM_ROWS) * (three_d / DIT_QKV_GEMM_COLS)].into_iter().all(fits);
    ok.then_some((m, k, d))
}

/// [`qkv_gemm_dims`] of two device tensors that are also both bf16 or both e4m3 codes (then K a
/// multiple of 128) and 16-byte aligned (TMA), `x` 2-D (the RoPE tables are a row each); `None`:
/// the op is the product, then `qkv_norm_rope`.
pub fn qkv_gemm_shape(x: &CudaTensor, w: &CudaTensor, heads: usize) -> Option<(usize, usize, usize)> {
    let fp8 = x.dtype == DType::F8E4M3;
    let ok =
        x.dtype == w.dtype && matches!(x.dtype, DType::BF16 | DType::F8E4M3) && x.shape.len() == 2 && x.ptr().is_multiple_of(16) && w.ptr().is_multiple_of(16);
    qkv_gemm_dims(&x.shape, &w.shape, heads).filter(|&(_, k, _)| ok && (!fp8 || k.is_multiple_of(DIT_SITU_GEMM_KTILE_FP8)))
}

/// Whether the norm weights and RoPE tables are all bf16 (what the fused kernel reads).
fn bf16_vectors(vs: &[&CudaTensor]) -> bool {
    vs.iter().all(|v| v.dtype == DType::BF16 && v.ptr().is_multiple_of(4))
}

impl Cuda {
    /// The fused kernel ([`QKV_KERNEL`], or [`QKV_FP8_KERNEL`] with `scales`) on `x [M, K]`, `w [3D, K]` → `[M, 3D]` bf16 (the norm weights `[128]`, the RoPE tables
    /// `[M, 64]`, bf16): min(SMs, tiles) blocks. `scales` (`xs [M]`, `ws [3D]`, f32) when `x` and
    /// `w` are e4m3 codes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_qkv_norm_rope_fused(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        scales: Option<(&CudaTensor, &CudaTensor)>,
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        heads: usize,
        eps: f64,
    ) -> Result<CudaTensor> {
        let name = if scales.is_some() { QKV_FP8_KERNEL } else { QKV_KERNEL };
        let (m, k, d) = qkv_gemm_shape(x, w, heads).ok_or_else(|| {
            anyhow!("linear_qkv_norm_rope: x {:?} {:?} · w {:?} {:?} ({heads} heads) is not a shape the fused kernel takes", x.shape, x.dtype, w.shape, w.dtype)
        })?;
        ensure!(self.has_sm90a(), "`{name}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        for (what, v) in [("q weight", wq), ("k weight", wk)] {
            ensure!(v.numel() == HEAD_DIM, "linear_qkv_norm_rope {what}: {:?} for head dim {HEAD_DIM}", v.shape);
        }
        for (what, t) in [("cos", cos), ("sin", sin)] {
            ensure!(t.shape == [m, HEAD_DIM / 2], "linear_qkv_norm_rope: {what} {:?}, expected [{m}, {}]", t.shape, HEAD_DIM / 2);
        }
        ensure!(bf16_vectors(&[wq, wk, cos, sin]), "`{name}` reads bf16 norm weights and RoPE tables");
        ensure!(
            scales.is_some() == (x.dtype == DType::F8E4M3),
            "`{name}`: {} operands with{} scales",
            x.dtype.name(),
            if scales.is_some() { "" } else { "out" }
        );
        if let Some((xs, ws)) = scales {
            let ok = xs.dtype == DType::F32 && ws.dtype == DType::F32 && xs.numel() == m && ws.numel() == 3 * d && ws.ptr().is_multiple_of(8);
            ensure!(ok, "`{name}`: scales {:?} {:?} for {m} rows and {} W rows (f32)", xs.shape, ws.shape, 3 * d);
        }
        let out = self.alloc(DType::BF16, &[m, 3 * d])?;
        if m == 0 {
            return Ok(out);
        }
        let tiles = m.div_ceil(DIT_SITU_GEMM_ROWS) * (3 * d / DIT_QKV_GEMM_COLS);
        let (tx, tw, cfg) = self.gemm_tiles((x, w), (m, 3 * d, k), tiles, DIT_SITU_GEMM_SMEM)?;
        let (mi, di, ki, eps) = (m as i32, d as i32, k as i32, eps as f32);
        match scales {
            Some((xs, ws)) => kernels::DIT_LINEAR_QKV_NORM_ROPE_FP8.launch(self, cfg, &tx, &tw, &out, xs, ws, wq, wk, cos, sin, mi, di, ki, eps)?,
            None => kernels::DIT_LINEAR_QKV_NORM_ROPE.launch(self, cfg, &tx, &tw, &out, wq, wk, cos, sin, mi, di, ki, eps)?,
        }
        Ok(out)
    }

    /// [`DitOps::linear_qkv_norm_rope`]: the fused kernel where the sm_90a kernels are loaded, the
    /// shape qualifies and the vectors are bf16 (as the bf16 forward holds them) (profile row `linear_qkv_norm_rope MxKxN`, N = 3D), else `linear` +
    /// `qkv_norm_rope`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_qkv_norm_rope_op(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        heads: usize,
        eps: f64,
    ) -> Result<CudaTensor> {
        match qkv_gemm_shape(x, w, heads).filter(|_| x.dtype == DType::BF16 && self.has_sm90a() && bf16_vectors(&[wq, wk, cos, sin])) {
            Some((m, k, d)) => {
                let run = || self.linear_qkv_norm_rope_fused(x, w, None, wq, wk, cos, sin, heads, eps);
                self.timed_op(|| format!("linear_qkv_norm_rope {m}x{k}x{}", 3 * d), run)
            }
            None => self.qkv_norm_rope(self.linear(x, w, None)?, heads, wq, wk, cos, sin, eps),
        }
    }

    /// [`DitOps::linear_qkv_norm_rope_fp8`]: the e4m3 kernel where the sm_90a kernels are loaded,
    /// the shape qualifies and the vectors are bf16 (profile row `linear_qkv_norm_rope_fp8 MxKxN`),
    /// else `linear_fp8_quantized` + `qkv_norm_rope`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_qkv_norm_rope_fp8_op(
        &self,
        (xq, xs): (&CudaTensor, &CudaTensor),
        (w, ws): (&CudaTensor, &CudaTensor),
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        heads: usize,
        eps: f64,
    ) -> Result<CudaTensor> {
        let shaped = qkv_gemm_shape(xq, w, heads).filter(|_| xq.dtype == DType::F8E4M3 && self.has_sm90a() && bf16_vectors(&[wq, wk, cos, sin]));
        match shaped {
            Some((m, k, d)) => {
                let run = || self.linear_qkv_norm_rope_fused(xq, w, Some((xs, ws)), wq, wk, cos, sin, heads, eps);
                self.timed_op(|| format!("linear_qkv_norm_rope_fp8 {m}x{k}x{}", 3 * d), run)
            }
            None => self.qkv_norm_rope(self.linear_fp8_quantized(xq, xs, w, ws)?, heads, wq, wk, cos, sin, eps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::qkv_gemm_dims;

    #[test]
    fn takes_the_dit_shape_and_refuses_the_rest() {
        assert_eq!(qkv_gemm_dims(&[4224, 3072], &[9216, 3072], 24), Some((4224, 3072, 3072)));
        assert_eq!(qkv_gemm_dims(&[77, 128], &[768, 128], 2), Some((77, 128, 256)));
        assert_eq!(qkv_gemm_dims(&[0, 64], &[768, 64], 2), Some((0, 64, 256)));
        assert_eq!(qkv_gemm_dims(&[77, 128], &[768, 128], 4), None, "head dim 64");
        assert_eq!(qkv_gemm_dims(&[77, 128], &[384, 128], 1), None, "D = 128: one head, not a tile of two");
        assert_eq!(qkv_gemm_dims(&[77, 96], &[768, 96], 2), None, "K not a multiple of 64");
        assert_eq!(qkv_gemm_dims(&[77, 128], &[768, 192], 2), None, "K of x and w differ");
        assert_eq!(qkv_gemm_dims(&[77, 128], &[769, 128], 2), None, "3D not a multiple of 3");
        assert_eq!(qkv_gemm_dims(&[1 << 31, 64], &[768, 64], 2), None, "rows past 32-bit indices");
    }
}
