//! The VAE mid block's attention where the fp16 kernel (attention_fp16.rs) does not serve: the
//! split-TF32 flash kernel (cuda/vae/attention_tf32.cu, D = 384, where its shared memory fits),
//! else query chunks of scores: `S = Q_c·Kᵀ`, a row softmax kernel, `P·V`, the products on the
//! split-TF32 halo kernel as 1×1 convs (L, D multiples of 16), else cuBLAS fp32 (TF32 off).

use super::conv::HALO_TH;
use crate::kernels;
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::ops::vae::attention_dims;
use moss_core::backend::Backend;

/// cuda/vae/attention_tf32.cu (cuda/vae/launch.h): the head width it is built for, query rows per
/// block, shared memory (Q 64x388, K 32x388, V 32x392, S 64x36 floats).
const FLASH_D: usize = crate::launch::VAE_ATTN_D;
const FLASH_BQ: usize = crate::launch::VAE_ATTN_ROWS;
pub(crate) const FLASH_SMEM_BYTES: usize = crate::launch::VAE_ATTN_TF32_SMEM;

impl Cuda {
    /// `spatial_attention` in query chunks of scores on cuBLAS; `chunk_bytes` bounds the scores
    /// one chunk holds.
    pub(crate) fn spatial_attention_chunks(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, chunk_bytes: usize) -> Result<CudaTensor> {
        let (n, l, d) = attention_dims(&q.shape, &k.shape, &v.shape)?;
        let (q, k, v) = (self.f32(q)?, self.f32(k)?, self.f32(v)?);
        let scale = 1.0 / (d as f64).sqrt();
        let rows = (chunk_bytes / (4 * l.max(1))).clamp(1, l.max(1));
        let mut outs = vec![];
        for ni in 0..n {
            let (qn, kn, vn) = if n == 1 {
                (self.reshape(&q, &[l, d])?, self.reshape(&k, &[l, d])?, self.reshape(&v, &[l, d])?)
            } else {
                (
                    self.reshape(&self.narrow(&q, 0, ni, 1)?, &[l, d])?,
                    self.reshape(&self.narrow(&k, 0, ni, 1)?, &[l, d])?,
                    self.reshape(&self.narrow(&v, 0, ni, 1)?, &[l, d])?,
                )
            };
            let vt = self.permute(&vn, &[1, 0])?; // [D, L]: P·V = linear(P, Vᵀ)
            let mut parts = vec![];
            for r0 in (0..l).step_by(rows) {
                let rc = rows.min(l - r0);
                let qc = if rc == l { qn.clone() } else { self.narrow(&qn, 0, r0, rc)? };
                let s = self.linear_dense(&qc, &kn, None)?; // [rc, L]
                kernels::VAE_SOFTMAX_ROWS.launch(self, ((rc as u32).min(65535 * 8), 256, 0), &s, rc as i64, l as i32, scale as f32)?;
                parts.push(self.linear_dense(&s, &vt, None)?); // [rc, D]
            }
            let o = if parts.len() == 1 { parts.pop().unwrap() } else { self.cat(&parts.iter().collect::<Vec<_>>(), 0)? };
            outs.push(self.reshape(&o, &[1, l, d])?);
        }
        if outs.len() == 1 {
            Ok(outs.pop().unwrap())
        } else {
            self.cat(&outs.iter().collect::<Vec<_>>(), 0)
        }
    }

    /// `a · b` for row-major `a [M, K]` and `b [K, N]` on the halo conv kernel (split TF32, fp32
    /// accuracy): a 1×1 conv with `a` as the weight and `b` as a `[K, N/16, 16]` picture; split
    /// over K into `ks` images when the output has few tiles, the partial products then summed.
    /// Needs K % (8·ks) == 0 and N % 16 == 0.
    fn matmul_split(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
        ensure!(b.shape[0] == k && k % 8 == 0 && n % 16 == 0, "matmul_split: {:?} · {:?}", a.shape, b.shape);
        // Aim at two 1-block-per-SM waves (`grid_for` caps a grid at 16 blocks per SM).
        let sms = self.grid_for(usize::MAX) as usize / 16;
        let tiles = m.div_ceil(128) * (n / 16).div_ceil(HALO_TH);
        let mut ks = 1;
        while tiles * ks < 2 * sms && k % (16 * ks) == 0 && k / (2 * ks) >= 1024 {
            ks *= 2;
        }
        let w = self.reshape(a, &[m, k, 1, 1])?;
        let x = self.reshape(b, &[ks, k / ks, n / 16, 16])?;
        let o = self.conv2d_halo(&x, &w, None, false, ks > 1)?;
        let mut sum = self.narrow(&o, 0, 0, 1)?;
        for i in 1..ks {
            sum = self.add(&sum, &self.narrow(&o, 0, i, 1)?)?;
        }
        self.reshape(&sum, &[m, n])
    }

    /// `spatial_attention` with both products on the split-TF32 halo kernel ([`Self::matmul_split`]):
    /// per query chunk `S = Q_c · Kᵀ`, the row softmax, `P · V`. Chunks hold `chunk_bytes / 3` of
    /// scores (the weight prep of `P` takes twice its size). Needs L % 16 == 0, D % 16 == 0.
    pub(crate) fn spatial_attention_split(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, chunk_bytes: usize) -> Result<CudaTensor> {
        let (n, l, d) = attention_dims(&q.shape, &k.shape, &v.shape)?;
        let (q, k, v) = (self.f32(q)?, self.f32(k)?, self.f32(v)?);
        ensure!(l % 16 == 0 && d % 16 == 0, "spatial_attention_split: L {l}, D {d} (need multiples of 16)");
        let scale = 1.0 / (d as f64).sqrt();
        let rows = (chunk_bytes / 3 / (4 * l)).clamp(1, l);
        let mut outs = vec![];
        for ni in 0..n {
            let one = |t: &CudaTensor| -> Result<CudaTensor> {
                if n == 1 {
                    self.reshape(t, &[l, d])
                } else {
                    self.reshape(&self.narrow(t, 0, ni, 1)?, &[l, d])
                }
            };
            let (qn, kn, vn) = (one(&q)?, one(&k)?, one(&v)?);
            let kt = self.permute(&kn, &[1, 0])?; // [D, L]
            let mut parts = vec![];
            for r0 in (0..l).step_by(rows) {
                let rc = rows.min(l - r0);
                let qc = if rc == l { qn.clone() } else { self.narrow(&qn, 0, r0, rc)? };
                let s = self.matmul_split(&qc, &kt)?; // [rc, L]
                kernels::VAE_SOFTMAX_ROWS.launch(self, ((rc as u32).min(65535 * 8), 256, 0), &s, rc as i64, l as i32, scale as f32)?;
                parts.push(self.matmul_split(&s, &vn)?); // [rc, D]
            }
            let o = if parts.len() == 1 { parts.pop().unwrap() } else { self.cat(&parts.iter().collect::<Vec<_>>(), 0)? };
            outs.push(self.reshape(&o, &[1, l, d])?);
        }
        if outs.len() == 1 {
            Ok(outs.pop().unwrap())
        } else {
            self.cat(&outs.iter().collect::<Vec<_>>(), 0)
        }
    }

    /// `spatial_attention` as one flash-style kernel (cuda/vae/attention_tf32.cu, D = 384): split-TF32
    /// products, online softmax, no scores in memory.
    pub(crate) fn spatial_attention_flash(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor) -> Result<CudaTensor> {
        ensure!(q.shape.len() == 3 && k.shape == q.shape && v.shape == q.shape, "spatial_attention: q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape);
        let (n, l, d) = (q.shape[0], q.shape[1], q.shape[2]);
        ensure!(d == FLASH_D && l > 0 && n > 0 && n < 65536, "spatial_attention_flash: [N {n}, L {l}, D {d}] (D must be {FLASH_D})");
        ensure!(l * d < i32::MAX as usize, "spatial_attention_flash: L {l} too long");
        let (q, k, v) = (self.f32(q)?, self.f32(k)?, self.f32(v)?);
        let out = self.alloc(DType::F32, &[n, l, d])?;
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let cfg = ((l.div_ceil(FLASH_BQ) as u32, n as u32), crate::launch::VAE_ATTN_THREADS as u32, FLASH_SMEM_BYTES as u32);
        kernels::VAE_FLASH_D384.launch(self, cfg, &out, &q, &k, &v, l as i32, scale)?;
        Ok(out)
    }

    /// Whether the flash attention kernel applies: D = 384 and its 203.5 KB of shared memory
    /// fit (H100/H200; not an A100 or sm_86/89/120).
    pub(crate) fn flash_fits(&self, d: usize) -> bool {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
        d == FLASH_D && self.gpu().ctx.attribute(OPTIN).map(|v| v as usize >= FLASH_SMEM_BYTES).unwrap_or(false)
    }
}
