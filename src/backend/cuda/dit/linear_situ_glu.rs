//! [`DitOps::linear_situ_glu`], the DiT FFN's `[up ; gate]` projection with SiTU-GLU on the way
//! out: on Hopper our own GEMM with SiTU in its epilogue (`cuda/dit/sm90a/linear_situ_glu.cu`:
//! TMA + wgmma, the `[M, 2F]` product never written) where the shape qualifies
//! ([`situ_gemm_shape`]); elsewhere, and for other shapes and fp32, cuBLASLt `linear` then
//! `situ_glu`, each timed under its own name.

use crate::backend::cuda::launch::{DIT_SITU_GEMM_COLS, DIT_SITU_GEMM_KTILE, DIT_SITU_GEMM_ROWS, DIT_SITU_GEMM_SMEM, DIT_SITU_GEMM_THREADS};
use crate::backend::cuda::ops::{tensor_map_2d, Arg, Cuda, CudaTensor, DType};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use anyhow::{anyhow, ensure, Result};

/// The fused kernel (the check image also has `{SITU_KERNEL}_swapped_control` and
/// `{SITU_KERNEL}_short_k_control`), launched with [`DIT_SITU_GEMM_SMEM`] bytes of dynamic shared
/// memory on the persistent grid (one block an SM, each looping over tiles).
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

#[cfg(test)]
mod tests {
    use super::situ_gemm_dims;

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

impl Cuda {
    /// The fused kernel `name` ([`SITU_KERNEL`] or a check-image twin) on `x [.., K]`, `w [2F, K]`
    /// → `[.., F]` bf16: min(SMs, tiles) blocks.
    pub(crate) fn linear_situ_glu_fused(&self, x: &CudaTensor, w: &CudaTensor, name: &str) -> Result<CudaTensor> {
        let (m, k, f) = situ_gemm_shape(x, w).ok_or_else(|| {
            anyhow!("linear_situ_glu: x {:?} {:?} · w {:?} {:?} is not a shape the fused kernel takes", x.shape, x.dtype, w.shape, w.dtype)
        })?;
        ensure!(self.has_sm90a(), "`{name}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = f;
        let out = self.alloc(DType::BF16, &shape)?;
        if m == 0 {
            return Ok(out);
        }
        let blocks = (m.div_ceil(DIT_SITU_GEMM_ROWS) * (f / DIT_SITU_GEMM_COLS)).min(self.sm_count());
        let (bk, rows) = (DIT_SITU_GEMM_KTILE as u32, DIT_SITU_GEMM_ROWS as u32);
        let tx = tensor_map_2d(x.ptr(), DType::BF16, k, m, k, bk, rows)?;
        let tw = tensor_map_2d(w.ptr(), DType::BF16, k, 2 * f, k, bk, DIT_SITU_GEMM_COLS as u32)?;
        self.launch(
            name,
            blocks as u32,
            DIT_SITU_GEMM_THREADS as u32,
            DIT_SITU_GEMM_SMEM as u32,
            &[Arg::Map(Box::new(tx)), Arg::Map(Box::new(tw)), Arg::P(out.ptr()), Arg::I(m as i32), Arg::I(f as i32), Arg::I(k as i32)],
        )?;
        Ok(out)
    }

    /// [`DitOps::linear_situ_glu`]: the fused kernel where the sm_90a kernels are loaded and the
    /// shape qualifies (profile row `linear_situ_glu MxKxN`, N = 2F), else `linear` + `situ_glu`.
    pub(crate) fn linear_situ_glu_op(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        match situ_gemm_shape(x, w).filter(|_| self.has_sm90a()) {
            Some((m, k, f)) => {
                let run = || self.linear_situ_glu_fused(x, w, SITU_KERNEL);
                self.timed_op(|| format!("linear_situ_glu {m}x{k}x{}", 2 * f), run)
            }
            None => self.situ_glu(&self.linear(x, w, None)?),
        }
    }
}
