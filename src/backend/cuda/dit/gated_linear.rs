//! The DiT's gated residual in the epilogue of the product before it
//! ([`DitOps::linear_gated_residual`](crate::backend::ops::DitOps::linear_gated_residual),
//! `linear_fp8_gated_residual`): `x + (a · wᵀ) · gate` as one cuBLASLt product with the gate as a
//! device alpha vector (one factor per output feature) and `x` as C with beta 1, so the product is
//! never written on its own and read back: the fp32 accumulator is scaled, added to `x` and rounded
//! once. The fp8 product carries the activation and weight scales as outer vectors beside it.
//! Where the product path has no such epilogue (fp32 output of an fp8 product, the unit-scale FP8
//! path of GPUs without outer-vector scales) the two steps run apart.

use crate::backend::cuda::blas::Gemm;
use crate::backend::cuda::ops::{Cuda, CudaTensor, DType};
use crate::backend::cuda::select::Fp8Gemm;
use anyhow::{ensure, Result};

impl Cuda {
    fn gated_shapes(&self, a: &CudaTensor, n: usize, k: usize, x: &CudaTensor, gate: &CudaTensor) -> Result<()> {
        ensure!(a.last_dim() == k, "linear: input {:?} does not match a weight of {k} inputs", a.shape);
        ensure!(x.rows() == a.rows() && x.last_dim() == n, "gated residual: stream {:?} for {} rows of {n} outputs", x.shape, a.rows());
        ensure!(gate.numel() == n, "gated residual: gate {:?} for {n} outputs", gate.shape);
        Ok(())
    }

    /// `x + (a · wᵀ) · gate` in one product (`w [N, K]`, `a [.., K]`, `x [.., N]` of `w`'s dtype).
    pub(crate) fn linear_gated_with(&self, a: &CudaTensor, w: &CudaTensor, x: &CudaTensor, gate: &CudaTensor) -> Result<CudaTensor> {
        ensure!(w.shape.len() == 2, "linear: weight must be 2-D, got {:?}", w.shape);
        let (n, k) = (w.shape[0], w.shape[1]);
        self.gated_shapes(a, n, k, x, gate)?;
        self.settle()?;
        let (a, x, gate) = (self.cast(a, w.dtype)?, self.cast(x, w.dtype)?, self.cast(gate, DType::F32)?);
        let out = self.alloc(w.dtype, &x.shape)?;
        if a.rows() > 0 && n > 0 {
            let stream = &self.gpu().stream;
            self.blas().linear_gated(stream, w.dtype, (a.rows(), n, k), a.ptr(), w.ptr(), x.ptr(), gate.ptr(), out.ptr())?;
        }
        Ok(out)
    }

    /// `x + fp8_linear(a) · gate`: the activation quantized per row (its own profile row), then
    /// one FP8 product with the scales, the gate and the residual in its epilogue.
    pub(crate) fn linear_fp8_gated_with(&self, a: &CudaTensor, q: &CudaTensor, scale: &CudaTensor, x: &CudaTensor, gate: &CudaTensor) -> Result<CudaTensor> {
        ensure!(q.shape.len() == 2 && q.dtype == DType::F8E4M3, "linear_fp8: weight must be 2-D e4m3, got {} {:?}", q.dtype.name(), q.shape);
        let (n, k, rows) = (q.shape[0], q.shape[1], a.rows());
        self.gated_shapes(a, n, k, x, gate)?;
        if self.fp8_gemm()? != Fp8Gemm::OuterVec || x.dtype != DType::BF16 || a.dtype != DType::BF16 || rows == 0 {
            let y = self.linear_fp8_timed(a, q, scale)?;
            return self.timed_op(|| "gated_residual".into(), || self.gated_residual_with(x, &y, gate, "moss"));
        }
        let (ws, gate) = (self.cast(scale, DType::F32)?, self.cast(gate, DType::F32)?);
        let (aq, as_) = self.timed_op(|| format!("quantize_fp8 {rows}x{k}"), || self.quantize_fp8_with(a, "moss_quantize_fp8"))?;
        self.timed_op(
            || format!("linear_fp8_gated {rows}x{k}x{n}"),
            || {
                self.settle()?;
                let out = self.alloc(DType::BF16, &x.shape)?;
                // cuBLAS's m is our n (rows of the column-major result), its n is our rows.
                let g = Gemm::plain(DType::F8E4M3, DType::BF16, true, false, n, rows, k, k, k, n);
                let stream = &self.gpu().stream;
                self.blas().gemm_fp8_gated(stream, g, q.ptr(), aq.ptr(), x.ptr(), out.ptr(), Some((ws.ptr(), as_.ptr())), gate.ptr())?;
                Ok(out)
            },
        )
    }
}

/// The profile row of a gated product: `linear_gated MxKxN`.
pub(crate) fn gated_name(a: &CudaTensor, w: &CudaTensor) -> String {
    format!("linear_gated {}x{}x{}", a.rows(), w.shape.get(1).unwrap_or(&0), w.shape.first().unwrap_or(&0))
}
