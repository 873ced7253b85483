//! [`DitOps::linear_situ_glu`], the DiT FFN's `[up ; gate]` projection with SiTU-GLU on the way
//! out: on Hopper our own GEMM with SiTU in its epilogue (`cuda/dit/sm90a/linear_situ_glu.cu`:
//! TMA + wgmma, the `[M, 2F]` product never written) where the shape qualifies
//! ([`situ_gemm_shape`]); elsewhere, and for other shapes and fp32, cuBLASLt `linear` then
//! `situ_glu`, each timed under its own name. At fp8 ([`DitOps::linear_situ_glu_fp8`]) the same
//! GEMM on e4m3 codes (`moss_dit_linear_situ_glu_fp8`), its bf16 output then quantized per row;
//! elsewhere `linear_fp8_quantized` + `situ_glu_fp8`.

use crate::kernels::{self, Cfg, TensorMap};
use crate::launch::{
    DIT_SITU_EPI_SMEM, DIT_SITU_GEMM_CLUSTER, DIT_SITU_GEMM_COLS, DIT_SITU_GEMM_KTILE, DIT_SITU_GEMM_KTILE_FP8, DIT_SITU_GEMM_ROWS, DIT_SITU_GEMM_THREADS,
};
use crate::ops::{tensor_map_2d, Cuda, CudaTensor, DType};
use anyhow::{anyhow, ensure, Result};
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;

/// The fused kernel ([`kernels::DIT_LINEAR_SITU_GLU`]; the check image also has
/// `{SITU_KERNEL}_swapped_control` and `{SITU_KERNEL}_short_k_control`), launched with [`DIT_SITU_EPI_SMEM`] bytes of dynamic shared
/// memory (its epilogue on the producer warpgroup's spare warps) on the persistent grid (one block
/// an SM, each looping over tiles).
pub const SITU_KERNEL: &str = "moss_dit_linear_situ_glu";

/// `(M, K, F)` when the fused kernel takes `x [.., K] · w [2F, K]ᵀ` by their shapes: K a positive
/// multiple of 64, F of 128, sizes within its 32-bit indices.
pub fn situ_gemm_dims(x: &[usize], w: &[usize]) -> Option<(usize, usize, usize)> {
    let (&k, &[two_f, wk]) = (x.last()?, w) else { return None };
    let (m, f) = (x[..x.len() - 1].iter().product::<usize>(), two_f / 2);
    let fits = |v: usize| v < i32::MAX as usize;
    let ok = wk == k
        && k > 0
        && k.is_multiple_of(DIT_SITU_GEMM_KTILE)
        && f > 0
        && two_f.is_multiple_of(2 * DIT_SITU_GEMM_COLS)
        && [m, two_f, k, m.div_ceil(DIT_SITU_GEMM_ROWS) * (f / DIT_SITU_GEMM_COLS)].into_iter().all(fits);
    ok.then_some((m, k, f))
}

/// [`situ_gemm_dims`] of two device tensors that are also bf16 and 16-byte aligned (TMA); `None`:
/// the op is `linear` + `situ_glu`.
pub fn situ_gemm_shape(x: &CudaTensor, w: &CudaTensor) -> Option<(usize, usize, usize)> {
    let ok = x.dtype == DType::BF16 && w.dtype == DType::BF16 && x.ptr().is_multiple_of(16) && w.ptr().is_multiple_of(16);
    situ_gemm_dims(&x.shape, &w.shape).filter(|_| ok)
}

/// The e4m3 form's kernel ([`kernels::DIT_LINEAR_SITU_GLU_FP8`]; the check image also has `{SITU_FP8_KERNEL}_swapped_control` and
/// `{SITU_FP8_KERNEL}_short_k_control`), launched as [`SITU_KERNEL`].
pub const SITU_FP8_KERNEL: &str = "moss_dit_linear_situ_glu_fp8";

/// [`situ_gemm_dims`] for the e4m3 form: K also a multiple of 128 (a stage's 128 codes).
pub fn situ_gemm_fp8_dims(x: &[usize], w: &[usize]) -> Option<(usize, usize, usize)> {
    situ_gemm_dims(x, w).filter(|&(_, k, _)| k.is_multiple_of(DIT_SITU_GEMM_KTILE_FP8))
}

/// [`situ_gemm_fp8_dims`] of e4m3 codes `xq [M, K]`, `wq [2F, K]` (16-byte aligned) with their f32
/// row scales `xs [M]`, `ws [2F]`; `None`: the op is `linear_fp8_quantized` + `situ_glu_fp8`.
fn situ_gemm_fp8_shape(xq: &CudaTensor, xs: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor) -> Option<(usize, usize, usize)> {
    let ok = xq.dtype == DType::F8E4M3
        && wq.dtype == DType::F8E4M3
        && xs.dtype == DType::F32
        && ws.dtype == DType::F32
        && xq.shape.len() == 2
        && xq.ptr().is_multiple_of(16)
        && wq.ptr().is_multiple_of(16)
        && ws.ptr().is_multiple_of(8);
    situ_gemm_fp8_dims(&xq.shape, &wq.shape).filter(|&(m, _, f)| ok && xs.numel() == m && ws.numel() == 2 * f)
}

impl Cuda {
    /// How a kernel on `cuda/common/sm90a/gemm_tile.cuh`'s GEMM is launched: `x [M, K]` and
    /// `W [Nw, K]` (of one dtype: bf16, or e4m3 codes) as its two TMA maps (boxes of 128 bytes of
    /// K by 64 x rows, half a tile, and 128 W rows; 128-byte swizzle), its first two arguments;
    /// `tiles` output tiles on the persistent grid: min(SMs, tiles) blocks rounded down to whole
    /// clusters of [`DIT_SITU_GEMM_CLUSTER`] (at least one), of [`DIT_SITU_GEMM_THREADS`] threads
    /// and `smem` bytes ([`DIT_SITU_EPI_SMEM`] for the SiTU kernels, `DIT_SITU_GEMM_SMEM` for q|k|v).
    pub(crate) fn gemm_tiles(
        &self,
        (x, w): (&CudaTensor, &CudaTensor),
        (m, nw, k): (usize, usize, usize),
        tiles: usize,
        smem: usize,
    ) -> Result<(TensorMap, TensorMap, Cfg)> {
        let (bk, rows, cl) = ((128 / x.dtype.size()) as u32, DIT_SITU_GEMM_ROWS as u32, DIT_SITU_GEMM_CLUSTER);
        let tx = tensor_map_2d(x.ptr(), x.dtype, k, m, k, bk, rows / cl as u32)?;
        let tw = tensor_map_2d(w.ptr(), w.dtype, k, nw, k, bk, rows)?;
        let blocks = (tiles.min(self.sm_count()) / cl).max(1) * cl;
        Ok((tx, tw, (blocks as u32, DIT_SITU_GEMM_THREADS as u32, smem as u32).into()))
    }
}

impl Cuda {
    /// The fused kernel ([`SITU_KERNEL`]) on `x [.., K]`, `w [2F, K]` → `[.., F]` bf16: min(SMs,
    /// tiles) blocks.
    pub(crate) fn linear_situ_glu_fused(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        let name = SITU_KERNEL;
        let (m, k, f) = situ_gemm_shape(x, w)
            .ok_or_else(|| anyhow!("linear_situ_glu: x {:?} {:?} · w {:?} {:?} is not a shape the fused kernel takes", x.shape, x.dtype, w.shape, w.dtype))?;
        ensure!(self.has_sm90a(), "`{name}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = f;
        let out = self.alloc(DType::BF16, &shape)?;
        if m == 0 {
            return Ok(out);
        }
        let tiles = m.div_ceil(DIT_SITU_GEMM_ROWS) * (f / DIT_SITU_GEMM_COLS);
        let (tx, tw, cfg) = self.gemm_tiles((x, w), (m, 2 * f, k), tiles, DIT_SITU_EPI_SMEM)?;
        kernels::DIT_LINEAR_SITU_GLU.launch(self, cfg, &tx, &tw, &out, m as i32, f as i32, k as i32)?;
        Ok(out)
    }

    /// [`DitOps::linear_situ_glu`]: the fused kernel where the sm_90a kernels are loaded and the
    /// shape qualifies (profile row `linear_situ_glu MxKxN`, N = 2F), else `linear` + `situ_glu`.
    pub(crate) fn linear_situ_glu_op(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        match situ_gemm_shape(x, w).filter(|_| self.has_sm90a()) {
            Some((m, k, f)) => {
                let run = || self.linear_situ_glu_fused(x, w);
                self.timed_op(|| format!("linear_situ_glu {m}x{k}x{}", 2 * f), run)
            }
            None => self.situ_glu(&self.linear(x, w, None)?),
        }
    }
}

impl Cuda {
    /// The e4m3 kernel ([`SITU_FP8_KERNEL`]) on codes `xq [M, K]`, `wq [2F, K]` and their row
    /// scales → the SiTU output `[M, F]` bf16: min(SMs, tiles) blocks.
    pub(crate) fn linear_situ_glu_fp8_fused(&self, xq: &CudaTensor, xs: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor) -> Result<CudaTensor> {
        let name = SITU_FP8_KERNEL;
        let (m, k, f) = situ_gemm_fp8_shape(xq, xs, wq, ws).ok_or_else(|| {
            anyhow!("linear_situ_glu_fp8: x {:?} {:?} · w {:?} {:?} is not a shape the fused kernel takes", xq.shape, xq.dtype, wq.shape, wq.dtype)
        })?;
        ensure!(self.has_sm90a(), "`{name}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        let out = self.alloc(DType::BF16, &[m, f])?;
        if m == 0 {
            return Ok(out);
        }
        let tiles = m.div_ceil(DIT_SITU_GEMM_ROWS) * (f / DIT_SITU_GEMM_COLS);
        let (tx, tw, cfg) = self.gemm_tiles((xq, wq), (m, 2 * f, k), tiles, DIT_SITU_EPI_SMEM)?;
        kernels::DIT_LINEAR_SITU_GLU_FP8.launch(self, cfg, &tx, &tw, &out, xs, ws, m as i32, f as i32, k as i32)?;
        Ok(out)
    }

    /// [`DitOps::linear_situ_glu_fp8`]: the e4m3 kernel where the sm_90a kernels are loaded and
    /// the shape qualifies (profile rows `linear_situ_glu_fp8 MxKxN`, N = 2F, and `quantize_fp8
    /// MxF`), else `linear_fp8_quantized` + `situ_glu_fp8`.
    pub(crate) fn linear_situ_glu_fp8_op(&self, xq: &CudaTensor, xs: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        match situ_gemm_fp8_shape(xq, xs, wq, ws).filter(|_| self.has_sm90a()) {
            Some((m, k, f)) => {
                let run = || self.linear_situ_glu_fp8_fused(xq, xs, wq, ws);
                let situ = self.timed_op(|| format!("linear_situ_glu_fp8 {m}x{k}x{}", 2 * f), run)?;
                self.timed_op(|| format!("quantize_fp8 {m}x{f}"), || self.quantize_fp8(&situ))
            }
            None => self.situ_glu_fp8(&self.linear_fp8_quantized(xq, xs, wq, ws)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{situ_gemm_dims, situ_gemm_fp8_dims};

    #[test]
    fn the_e4m3_form_needs_k_in_128s() {
        assert_eq!(situ_gemm_fp8_dims(&[4224, 3072], &[16384, 3072]), Some((4224, 3072, 8192)));
        assert_eq!(situ_gemm_fp8_dims(&[77, 192], &[256, 192]), None, "K 192: a multiple of 64, not of 128");
        assert_eq!(situ_gemm_dims(&[77, 192], &[256, 192]), Some((77, 192, 128)), "the bf16 form takes it");
    }

    #[test]
    fn takes_the_dit_shape_and_refuses_the_rest() {
        assert_eq!(situ_gemm_dims(&[4224, 3072], &[16384, 3072]), Some((4224, 3072, 8192)));
        assert_eq!(situ_gemm_dims(&[2, 77, 128], &[256, 128]), Some((154, 128, 128)));
        assert_eq!(situ_gemm_dims(&[0, 64], &[256, 64]), Some((0, 64, 128)));
        assert_eq!(situ_gemm_dims(&[77, 96], &[256, 96]), None, "K not a multiple of 64");
        assert_eq!(situ_gemm_dims(&[77, 128], &[384, 128]), None, "F = 192, not a multiple of 128");
        assert_eq!(situ_gemm_dims(&[77, 128], &[256, 192]), None, "K of x and w differ");
        assert_eq!(situ_gemm_dims(&[77, 128], &[256, 128, 1]), None, "w not 2-D");
        assert_eq!(situ_gemm_dims(&[], &[256, 128]), None);
        assert_eq!(situ_gemm_dims(&[77, 0], &[256, 0]), None, "K = 0");
        assert_eq!(situ_gemm_dims(&[1 << 31, 64], &[256, 64]), None, "rows past 32-bit indices");
    }
}
