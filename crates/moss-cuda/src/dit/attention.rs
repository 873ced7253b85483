//! The DiT's attention ops. At bf16 with head dim 128 (the DiT's) a flash kernel (online softmax,
//! no score matrix): `cuda/dit/sm90a/flash_attention_ws.cu` (warp-specialised TMA + wgmma) on
//! Hopper, `cuda/dit/flash_attention.cu` (mma.sync) elsewhere; see [`FLASH_KERNELS`](super::FLASH_KERNELS). Otherwise (fp32, other head dims) three steps per
//! chunk of heads: `S = scale · Q Kᵀ` (cuBLASLt, strided-batched over heads straight out of the
//! `[N, H, hd]` layout, fp32 scores), a row softmax (fp32, `P` rounded to the activation dtype),
//! `O = P V` (cuBLASLt, written straight into `[N, H, hd]`). Scores are chunked by heads (and
//! query rows) to stay under [`ATTN_SCORE_BUDGET`].

use super::{dims3, packed_dims, FLASH_HEAD_DIM};
use crate::blas::Gemm;
use crate::kernels;
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;

/// Bytes of fp32 scores one attention chunk may hold.
pub const ATTN_SCORE_BUDGET: usize = 1 << 30;

impl Cuda {
    /// [`DitOps::attention_packed`]: at bf16 with head dim 128 the flash kernel reads q, k, v as
    /// column slices of the packed rows (row stride 3·D); otherwise the parts are copied out for
    /// [`DitOps::attention`]. `(kb, vb)`: the column blocks (of D) holding k and v, (1, 2) in the
    /// projection's packing.
    pub(crate) fn attention_packed_blocks(&self, qkv: &CudaTensor, heads: usize, scale: f64, (kb, vb): (usize, usize)) -> Result<CudaTensor> {
        let (n, hd) = packed_dims(qkv, heads, "attention_packed")?;
        let d = heads * hd;
        ensure!(kb.max(vb) < 3, "attention_packed: column blocks ({kb}, {vb}) of a q|k|v projection");
        let (ko, vo) = (kb * d, vb * d);
        if qkv.dtype == DType::BF16 && hd == FLASH_HEAD_DIM {
            let out = self.alloc(DType::BF16, &[n, d])?;
            if n > 0 {
                let (p, ld, es) = (qkv.ptr(), 3 * d, 2u64);
                self.flash_attention_raw(self.flash_kernel(), (p, ld), (p + ko as u64 * es, ld), (p + vo as u64 * es, ld), (out.ptr(), d), n, heads, scale)?;
            }
            return Ok(out);
        }
        let part = |o: usize| self.narrow_copy(qkv, 1, o, d).and_then(|t| self.reshape(&t, &[n, heads, hd]));
        let o = self.attention(&part(0)?, &part(ko)?, &part(vo)?, scale)?;
        self.reshape(&o, &[n, d])
    }

    /// [`DitOps::attention`] off the flash kernel: cuBLASLt scores, the row softmax, cuBLASLt
    /// `P V`; `alpha` is the factor on the scores (the real op passes `scale`).
    pub(crate) fn attention_gemm(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, alpha: f64) -> Result<CudaTensor> {
        let (n, h, hd) = dims3(q, "attention q")?;
        ensure!(k.shape == q.shape && v.shape == q.shape, "attention: q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape);
        let dt = q.dtype;
        let (k, v) = (self.cast(k, dt)?, self.cast(v, dt)?);
        let out = self.alloc(dt, &q.shape)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        let es = dt.size() as u64;
        let per_head = n * n * 4;
        let (hb, qc) =
            if per_head <= ATTN_SCORE_BUDGET { ((ATTN_SCORE_BUDGET / per_head).clamp(1, h), n) } else { (1, (ATTN_SCORE_BUDGET / (n * 4)).clamp(1, n)) };
        let s = self.alloc(DType::F32, &[hb * qc * n])?;
        let p = self.alloc(dt, &[hb * qc * n])?;
        let ld = h * hd;
        let stream = &self.gpu().stream;
        for h0 in (0..h).step_by(hb) {
            let hbn = hb.min(h - h0);
            for i0 in (0..n).step_by(qc) {
                let qn = qc.min(n - i0);
                // S (column-major N × qn per head) = Kᵀ-read K · Q: S[i][j] row-major.
                let g1 = Gemm::plain(dt, DType::F32, true, false, n, qn, hd, ld, ld, n).batched(hbn, hd, hd, qn * n);
                let off_q = (i0 * ld + h0 * hd) as u64 * es;
                self.blas().gemm(stream, g1, k.ptr() + (h0 * hd) as u64 * es, q.ptr() + off_q, s.ptr(), None, alpha as f32)?;
                kernels::SOFTMAX.launch(self, ((hbn * qn) as u32, 256, 0), &p, &s, n as i64)?;
                // O (column-major hd × qn per head, ld H·hd) = V · P, straight into [N, H, hd].
                let g2 = Gemm::plain(dt, dt, false, false, hd, qn, n, ld, n, ld).batched(hbn, hd, qn * n, hd);
                self.blas().gemm(stream, g2, v.ptr() + (h0 * hd) as u64 * es, p.ptr(), out.ptr() + off_q, None, 1.0)?;
            }
        }
        Ok(out)
    }
}
