//! The DiT's flash attention (bf16, head dim 128): `moss_dit_flash_attention_ws`
//! (cuda/dit/sm90a/flash_attention_ws.cu, warp-specialised TMA + wgmma) on Hopper,
//! `moss_dit_flash_attention` (cuda/dit/flash_attention.cu, mma.sync) on every other GPU.

use super::dims3;
use crate::kernels::{self, Dev};
use crate::launch::{DIT_FLASH_HEAD_DIM, DIT_FLASH_ROWS, DIT_FLASH_SMEM, DIT_FLASH_THREADS, DIT_FLASH_WS_ROWS, DIT_FLASH_WS_SMEM, DIT_FLASH_WS_THREADS};
use crate::ops::{tensor_map_2d, Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};

/// One flash attention kernel: its name (that of [`kernels::DIT_FLASH_ATTENTION_WS`] where `tma`,
/// else of [`kernels::DIT_FLASH_ATTENTION`]) and its launch shape: grid `(ceil(N / rows), heads)`, `threads`,
/// `smem` bytes of dynamic shared memory. `sm90a` kernels live in `cuda/*/sm90a/` and exist only
/// on compute capability 9.0 ([`Cuda::has_sm90a`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashKernel {
    /// Short name (`ws_nopp`: Hopper, `v2`: portable).
    pub key: &'static str,
    pub name: &'static str,
    pub rows: usize,
    pub threads: u32,
    pub smem: u32,
    pub sm90a: bool,
    /// q/k/v are passed as TMA tensor maps ([`flash_tensor_map`]) instead of pointers and strides.
    pub tma: bool,
}

/// The flash kernels: `ws_nopp` (`cuda/dit/sm90a/flash_attention_ws.cu`, Hopper): warp-specialised, a TMA
/// producer warp feeding mbarrier rings and two consumer warpgroups on wgmma; `v2`
/// (`cuda/dit/flash_attention.cu`, every other GPU): mma.sync, 64 rows per block, the Q tile kept in the
/// second K buffer (64 KiB of shared memory: three blocks an SM). Measured on the H200 at
/// N = 4224: ws_nopp 0.331 ms, v2 0.876 (torch SDPA 0.340); the slower variants were deleted
/// (git keeps them).
pub const FLASH_KERNELS: [FlashKernel; 2] = [
    FlashKernel {
        key: "ws_nopp",
        name: "moss_dit_flash_attention_ws",
        rows: DIT_FLASH_WS_ROWS,
        threads: DIT_FLASH_WS_THREADS as u32,
        smem: DIT_FLASH_WS_SMEM as u32,
        sm90a: true,
        tma: true,
    },
    FlashKernel {
        key: "v2",
        name: "moss_dit_flash_attention",
        rows: DIT_FLASH_ROWS,
        threads: DIT_FLASH_THREADS as u32,
        smem: DIT_FLASH_SMEM as u32,
        sm90a: false,
        tma: false,
    },
];
pub const FLASH_HEAD_DIM: usize = DIT_FLASH_HEAD_DIM;

/// The flash kernel for a device: the Hopper one where the `cuda/*/sm90a` kernels are loaded
/// (`sm90a`), else the portable one.
pub fn pick_flash(sm90a: bool) -> &'static FlashKernel {
    FLASH_KERNELS.iter().find(|k| sm90a || !k.sm90a).expect("v2 exists everywhere")
}

/// The TMA tensor map of a `tma` flash kernel's q, k or v: bf16 columns `[0, cols)` of `n` rows at
/// device address `ptr`, row stride `ld` elements; boxes of 64 columns x 128 rows with the 128-byte
/// swizzle (the wgmma layout), zero fill past the last row.
pub fn flash_tensor_map(ptr: u64, n: usize, cols: usize, ld: usize) -> Result<cudarc::driver::sys::CUtensorMap> {
    tensor_map_2d(ptr, DType::BF16, cols, n, ld, 64, 128)
}

/// Whether [`DitOps::attention`] takes the flash kernel: bf16 q/k/v of one shape, head dim 128.
pub fn flash_applies(q: &CudaTensor, k: &CudaTensor, v: &CudaTensor) -> bool {
    q.shape.len() == 3 && q.shape[2] == FLASH_HEAD_DIM && k.shape == q.shape && v.shape == q.shape && [q, k, v].iter().all(|t| t.dtype == DType::BF16)
}

impl Cuda {
    /// Flash attention (`cuda/dit/flash_attention.cu`) over `[N, H, 128]` bf16 `q`, `k`, `v` (contiguous),
    /// written into a new `[N, H, 128]`. `kernel` is one of [`FLASH_KERNELS`].
    pub(crate) fn flash_attention_on(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, scale: f64, kernel: &FlashKernel) -> Result<CudaTensor> {
        let (n, h, hd) = dims3(q, "attention q")?;
        ensure!(flash_applies(q, k, v), "flash attention: q {:?} {:?}, k {:?}, v {:?}", q.shape, q.dtype, k.shape, v.shape);
        let out = self.alloc(DType::BF16, &q.shape)?;
        let ld = h * hd;
        self.flash_attention_raw(kernel, (q.ptr(), ld), (k.ptr(), ld), (v.ptr(), ld), (out.ptr(), ld), n, h, scale)?;
        Ok(out)
    }

    /// The flash kernel [`DitOps::attention`] uses on this device ([`pick_flash`]).
    pub fn flash_kernel(&self) -> &'static FlashKernel {
        pick_flash(self.has_sm90a())
    }

    /// The flash kernel on raw bf16 row-major buffers `(pointer, row stride in elements)`:
    /// head `i` is columns `[128i, 128i + 128)` of each of the `n` rows, so q/k/v may be column
    /// slices of one fused `[n, 3·H·128]` projection.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_attention_raw(
        &self,
        spec: &FlashKernel,
        q: (u64, usize),
        k: (u64, usize),
        v: (u64, usize),
        o: (u64, usize),
        n: usize,
        heads: usize,
        scale: f64,
    ) -> Result<()> {
        for (what, (p, ld)) in [("q", q), ("k", k), ("v", v), ("o", o)] {
            ensure!(ld % 8 == 0 && p % 16 == 0, "flash attention {what}: stride {ld} / address not 16-byte aligned");
            ensure!(ld >= heads * FLASH_HEAD_DIM, "flash attention {what}: stride {ld} < {heads} heads of {FLASH_HEAD_DIM}");
        }
        ensure!(n < i32::MAX as usize && q.1 < i32::MAX as usize, "flash attention: {n} tokens");
        if n == 0 || heads == 0 {
            return Ok(());
        }
        let kernel = spec.name;
        ensure!(!spec.sm90a || self.has_sm90a(), "flash kernel `{kernel}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
        let grid = (n.div_ceil(spec.rows) as u32, heads as u32);
        let cfg = (grid, spec.threads, spec.smem);
        let out = Dev::new(o.0, DType::BF16);
        if spec.tma {
            let map = |(p, ld): (u64, usize)| flash_tensor_map(p, n, heads * FLASH_HEAD_DIM, ld);
            let (mq, mk, mv) = (map(q)?, map(k)?, map(v)?);
            return kernels::DIT_FLASH_ATTENTION_WS.launch(self, cfg, &mq, &mk, &mv, out, n as i32, o.1 as i32, scale_log2);
        }
        let [q, k, v] = [q, k, v].map(|(p, ld)| (Dev::new(p, DType::BF16), ld as i32));
        kernels::DIT_FLASH_ATTENTION.launch(self, cfg, q.0, k.0, v.0, out, n as i32, q.1, k.1, v.1, o.1 as i32, scale_log2)
    }
}

#[cfg(test)]
mod flash_pick_tests {
    use super::*;
    #[test]
    fn picks_by_device() {
        assert_eq!(pick_flash(true).key, "ws_nopp");
        assert_eq!(pick_flash(false).key, "v2");
    }

    /// A kernel's name is the one its launch takes (`tma`: the tensor-map kernel).
    #[test]
    fn names_are_the_launched_kernels() {
        for k in FLASH_KERNELS {
            let launched = if k.tma { &kernels::DIT_FLASH_ATTENTION_WS.info } else { &kernels::DIT_FLASH_ATTENTION.info };
            assert_eq!(launched.members.iter().map(|m| m.name).collect::<Vec<_>>(), [k.name]);
        }
    }
}
