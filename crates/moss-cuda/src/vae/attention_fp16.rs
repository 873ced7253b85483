//! The VAE mid block's attention on fp16 tensor cores with hi/lo split operands (cuda/vae/attention_fp16.cu;
//! the default for D = 384 on a GPU with 210 KB of shared memory a block):
//! per-tensor power-of-two scales from a max-abs pass, Q, K, V written once as fp16 hi/lo, then one
//! flash kernel (P split in registers, no score matrix in memory). Deterministic (the max-abs
//! atomicMax is order-independent; no other atomics), so the strip decode's identity holds.
use anyhow::{ensure, Result};

use crate::kernels::{self, Dev, Elem};
use crate::ops::{Cuda, CudaTensor, DType};

/// cuda/vae/launch.h: head width, query rows per block, shared memory (Q 64, K 32, V 32 rows of
/// 776 halves, the partial-score exchange 8 x 4 x 32 float4).
const D16: usize = crate::launch::VAE_ATTN_D;
const BQ16: usize = crate::launch::VAE_ATTN_ROWS;
pub(crate) const SMEM16_BYTES: usize = crate::launch::VAE_ATTN_FP16_SMEM;

/// The kernel ([`kernels::VAE_ATTN16_D384`]): fresh tiles for every product sum (the split-TF32
/// kernels' rule). A variant with the small terms of S in a running tile (`f16r`) was deleted
/// (git keeps it); another, P V straight into O, failed the fp32 bound and is a control
/// (`moss_ctl3_vae_attn16_d384`).
pub(crate) const KERNEL: &str = "moss_vae_attn16_d384";

impl Cuda {
    /// Whether cuda/vae/attention_fp16.cu applies: D = 384 and its shared memory fits a block.
    pub(crate) fn f16_attn_fits(&self, d: usize) -> bool {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
        d == D16 && self.gpu().ctx.attribute(OPTIN).map(|v| v as usize >= SMEM16_BYTES).unwrap_or(false)
    }

    /// softmax(q kᵀ / sqrt(D)) v for q, k, v [N, L, 384] on [`KERNEL`].
    pub(crate) fn spatial_attention_f16(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor) -> Result<CudaTensor> {
        ensure!(q.shape.len() == 3 && k.shape == q.shape && v.shape == q.shape, "spatial_attention: q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape);
        let (n, l, d) = (q.shape[0], q.shape[1], q.shape[2]);
        ensure!(d == D16 && l > 0 && n > 0 && n < 65536, "spatial_attention_f16: [N {n}, L {l}, D {d}] (D must be {D16})");
        let lq = l.next_multiple_of(BQ16);
        ensure!(l * d < i32::MAX as usize && 3 * n * lq * 2 * d < i64::MAX as usize, "spatial_attention_f16: L {l} too long");
        let (q, k, v) = (self.cast(q, DType::F32)?, self.cast(k, DType::F32)?, self.cast(v, DType::F32)?);
        // max |q|, |k|, |v| as float bits
        let mx = self.alloc(DType::F32, &[4])?;
        let mx = Dev::new(mx.ptr(), Elem::U32);
        kernels::VAE_F16_ZERO3.launch(self, (1, 32, 0), mx)?;
        let n4 = n * l * d / 4;
        let grid = self.grid_for(n4);
        kernels::VAE_F16_MAXABS.launch(self, ((grid, 3), 256, 0), mx, &q, &k, &v, n4 as i64)?;
        // [3][N][Lq][hi D | lo D] halves (BF16 only for its 2-byte size)
        let qkv = self.alloc(DType::BF16, &[3, n, lq, 2 * d])?;
        let total = n * lq * d / 4;
        let halves = Dev::new(qkv.ptr(), Elem::F16);
        kernels::VAE_F16_PREP.launch(self, ((self.grid_for(total), 3), 256, 0), halves, &q, &k, &v, mx, l as i32, lq as i32, total as i64)?;
        let out = self.alloc(DType::F32, &[n, l, d])?;
        let rsqrt_d = (1.0 / (d as f64).sqrt()) as f32;
        let cfg = (((lq / BQ16) as u32, n as u32), crate::launch::VAE_ATTN_THREADS as u32, SMEM16_BYTES as u32);
        kernels::VAE_ATTN16_D384.launch(self, cfg, &out, halves, mx, l as i32, lq as i32, (n * lq * 2 * d) as i64, rsqrt_d)?;
        Ok(out)
    }
}
