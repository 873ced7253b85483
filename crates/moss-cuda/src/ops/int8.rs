//! The int8 linears on the GPU (`--precision int8`, `Backend::quantize_rows_int8`,
//! `Backend::linear_int8_quantized`): the row-wise quantization kernels of `cuda/dit/int8.cu`
//! (the arithmetic of [`moss_core::int8`] bit for bit; with a ConvRot group, each group of a row
//! turned by the normalized Hadamard matrix first), cuBLASLt's IMMA product (int8 A and B, exact
//! int32 sums) and the epilogue `moss_int8_scale_rows_*` that applies `xs[r] · ws[n]` and rounds
//! into the activation dtype. The same kernels on every GPU from sm_80 (no Hopper-only path).

use super::{Cuda, CudaTensor, DType};
use crate::blas::Gemm;
use crate::kernels;
use crate::launch::{DIT_INT8_ROT_TILE, DIT_INT8_THREADS};
use crate::select;
use anyhow::{anyhow, ensure, Result};
use moss_core::int8::MIN_AMAX;

/// cuBLASLt's IMMA products here take K and N multiples of 16 (the DiT's are).
pub const INT8_ALIGN: usize = 16;

impl Cuda {
    /// Ok on a GPU that runs the int8 linears, else the one line `--precision int8` is refused
    /// with ("int8 needs compute capability 8.0 or newer; this GPU is 7.5").
    pub fn check_int8(&self) -> Result<()> {
        match select::int8_refusal(self.gpu().compute_capability) {
            Some(why) => Err(anyhow!(why)),
            None => Ok(()),
        }
    }

    /// Each row of `x` (bf16 or f32 `[.., K]`; a kept quantized matrix dequantized first)
    /// quantized to int8, turned first in groups of `convrot`: `(q [.., K] int8, scale [rows] f32)`.
    pub(crate) fn quantize_int8(&self, x: &CudaTensor, convrot: Option<usize>) -> Result<(CudaTensor, CudaTensor)> {
        let x = &*self.dense(x)?;
        ensure!(matches!(x.dtype, DType::BF16 | DType::F32), "int8 quantize: {} input", x.dtype.name());
        let (rows, k) = (x.rows(), x.last_dim());
        let q = self.alloc(DType::I8, &x.shape)?;
        let scale = self.alloc(DType::F32, &[rows])?;
        if rows == 0 || k == 0 {
            return Ok((q, scale));
        }
        let cfg = (rows.min(1 << 16) as u32, DIT_INT8_THREADS as u32, 0);
        match convrot {
            None => kernels::QUANTIZE_INT8.launch(self, cfg, &q, &scale, x, rows as i64, k as i64, MIN_AMAX)?,
            Some(g) => {
                ensure!(
                    g >= 2 && g.is_power_of_two() && g <= DIT_INT8_ROT_TILE && k.is_multiple_of(g),
                    "int8 quantize: ConvRot groups of {g} over rows of {k} (the GPU turns power-of-two groups up to {DIT_INT8_ROT_TILE} that divide the row)"
                );
                let radix4 = g.trailing_zeros().is_multiple_of(2) as i32;
                let norm = 1.0 / (g as f64).sqrt();
                kernels::QUANTIZE_INT8_ROT.launch(self, cfg, &q, &scale, x, rows as i64, k as i64, g as i32, radix4, norm, MIN_AMAX)?
            }
        }
        Ok((q, scale))
    }

    /// `y [.., N] = xs[r] · ws[n] · Σ_k xq[r, k] · wq[n, k]` in `out` (bf16 or f32): cuBLASLt's
    /// IMMA product into an int32 scratch (`Yᵀ [N, M] = W [N, K] · Xᵀ`, the TN layout), then the
    /// epilogue.
    pub(crate) fn int8_product(&self, xq: &CudaTensor, xs: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor, out: DType) -> Result<CudaTensor> {
        ensure!(wq.shape.len() == 2 && wq.dtype == DType::I8, "linear_int8: weight must be 2-D int8, got {} {:?}", wq.dtype.name(), wq.shape);
        let (n, k, rows) = (wq.shape[0], wq.shape[1], xq.rows());
        ensure!(xq.dtype == DType::I8 && xq.last_dim() == k, "linear_int8: input {} {:?} does not match weight {:?}", xq.dtype.name(), xq.shape, wq.shape);
        ensure!(ws.dtype == DType::F32 && ws.numel() == n, "linear_int8: {} {} scales for {n} rows", ws.numel(), ws.dtype.name());
        ensure!(xs.dtype == DType::F32 && xs.numel() == rows, "linear_int8: {} activation scales for {rows} rows", xs.numel());
        ensure!(matches!(out, DType::BF16 | DType::F32), "linear_int8: {} output", out.name());
        ensure!(
            k.is_multiple_of(INT8_ALIGN) && n.is_multiple_of(INT8_ALIGN),
            "linear_int8: the int8 products need K and N multiples of {INT8_ALIGN}, got K {k}, N {n}"
        );
        let mut shape = xq.shape.clone();
        *shape.last_mut().unwrap() = n;
        let y = self.alloc(out, &shape)?;
        if rows == 0 {
            return Ok(y);
        }
        self.settle()?;
        let acc = self.alloc(DType::I32, &shape)?;
        // cuBLAS's m is our n (rows of the column-major result), its n is our rows.
        let g = Gemm::plain(DType::I8, DType::I32, true, false, n, rows, k, k, k, n);
        self.blas().gemm_int8(&self.gpu().stream, g, wq.ptr(), xq.ptr(), acc.ptr())?;
        kernels::INT8_SCALE_ROWS.launch(self, (self.grid_for(rows * n), 256, 0), &y, &acc, xs, ws, rows as i64, n as i64)?;
        Ok(y)
    }

    /// [`moss_core::backend::Backend::linear_int8_quantized`] into the activation dtype (profile
    /// row `linear_int8 MxKxN`); the weight's scales may be bf16, used as f32.
    pub(crate) fn linear_int8_quantized_timed(&self, xq: &CudaTensor, xs: &CudaTensor, q: &CudaTensor, scale: &CudaTensor) -> Result<CudaTensor> {
        let (rows, k, n) = (xq.rows(), xq.last_dim(), q.shape.first().copied().unwrap_or(0));
        let scale = &self.cast(scale, DType::F32)?;
        let out = self.act_dtype();
        self.timed_op(|| format!("linear_int8 {rows}x{k}x{n}"), || self.int8_product(xq, xs, q, scale, out))
    }

    /// [`moss_core::backend::Backend::linear_int8`], each part under its own profile row: the
    /// activation's quantization (`quantize_int8 MxK`) and the product.
    pub(crate) fn linear_int8_timed(&self, x: &CudaTensor, q: &CudaTensor, scale: &CudaTensor, convrot: Option<usize>) -> Result<CudaTensor> {
        let (rows, k) = (x.rows(), x.last_dim());
        let (xq, xs) = self.timed_op(|| format!("quantize_int8 {rows}x{k}"), || self.quantize_int8(x, convrot))?;
        self.linear_int8_quantized_timed(&xq, &xs, q, scale)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{from_bytes, to_bytes};
    use super::*;

    /// Every code goes up as its two's-complement byte and comes down as its value; other values
    /// round to the nearest code (ties to even) and clamp to ±127, as the kernels' codes do; int32
    /// sums come down exactly (below 2^24).
    #[test]
    fn int8_codes_and_int32_sums_go_up_and_down_as_their_values() {
        let vals: Vec<f32> = (-127..=127).map(|c| c as f32).collect();
        let bytes = to_bytes(&vals, DType::I8);
        assert_eq!(bytes, (-127i8..=127).map(|c| c as u8).collect::<Vec<_>>());
        assert_eq!(from_bytes(&bytes, DType::I8), vals);
        assert_eq!(to_bytes(&[2.5, -0.5, 300.0, -1e9, 126.6], DType::I8), vec![2, 0, 127, (-127i8) as u8, 127]);
        let sums = [0.0, -1.0, 16_129.0 * 3072.0, -16_777_215.0];
        assert_eq!(from_bytes(&to_bytes(&sums, DType::I32), DType::I32), sums);
        assert_eq!((DType::I8.size(), DType::I32.size()), (1, 4));
    }
}
