//! The fp8 linears on the GPU (`Backend::quantize_rows`, `Backend::linear_fp8`): the row-wise
//! quantization kernel (`cuda/common/fp8.cu`: the arithmetic of [`moss_core::fp8`] bit for bit) and
//! the cuBLASLt FP8 product on the path `select.rs` picks for the device.

use super::{Cuda, CudaTensor, DType, Download};
use crate::blas::Gemm;
use crate::kernels;
use crate::select::{self, Fp8Gemm};
use anyhow::{anyhow, ensure, Result};
use moss_core::fp8::{E4M3_MAX, MIN_AMAX};
use moss_core::tensor::Tensor;

/// Threads of a quantization block (one row at a time; the kernel takes any count up to 1024).
const QUANTIZE_THREADS: u32 = 256;

/// cuBLASLt's FP8 products want 16-byte aligned rows and dimensions: K and N multiples of 16.
const FP8_ALIGN: usize = 16;

impl Cuda {
    /// Whether this GPU has FP8 tensor cores (compute capability 8.9 or newer).
    pub fn supports_fp8(&self) -> bool {
        select::fp8_refusal(self.gpu().compute_capability).is_none()
    }

    /// Ok on a GPU that runs the fp8 linears, else the one line `--precision fp8` is refused with
    /// ("fp8 needs compute capability 8.9 or newer; this GPU is 8.6").
    pub fn check_fp8(&self) -> Result<()> {
        match select::fp8_refusal(self.gpu().compute_capability) {
            Some(why) => Err(anyhow!(why)),
            None => Ok(()),
        }
    }

    /// The FP8 product path of this device ([`select::pick_fp8_gemm`]), decided at the first call.
    pub fn fp8_gemm(&self) -> Result<Fp8Gemm> {
        let cc = self.gpu().compute_capability;
        self.blas().fp8_path.get_or_init(|| select::pick_fp8_gemm(cc, || self.outer_vec_runs()).map_err(|e| e.to_string())).clone().map_err(|e| anyhow!(e))
    }

    /// Whether cuBLASLt runs an FP8 product with outer-vector scales here and gets it right: A and
    /// B all ones (k = 32), `scale_a[i] = i + 1`, `scale_b[j]` 1 or 1/2, so `D[i, j] = 32 ·
    /// scale_a[i] · scale_b[j]` exactly in bf16 (a scale vector ignored or exchanged shows).
    fn outer_vec_runs(&self) -> bool {
        let (m, n, k) = (16usize, 16usize, 32usize);
        let sa: Vec<f32> = (0..m).map(|i| (i + 1) as f32).collect();
        let sb: Vec<f32> = (0..n).map(|j| if j % 2 == 1 { 0.5 } else { 1.0 }).collect();
        let run = || -> Result<bool> {
            let a = self.alloc(DType::F8E4M3, &[m, k])?;
            let b = self.alloc(DType::F8E4M3, &[n, k])?;
            let one = moss_core::fp8::e4m3_from_f32(1.0);
            self.write_bytes(a.ptr(), &vec![one; m * k])?;
            self.write_bytes(b.ptr(), &vec![one; n * k])?;
            let ga = self.upload_as(&Tensor::new(vec![m], sa.clone())?, DType::F32)?;
            let gb = self.upload_as(&Tensor::new(vec![n], sb.clone())?, DType::F32)?;
            // column-major D [m, n]: row-major [n, m]
            let d = self.alloc(DType::BF16, &[n, m])?;
            let g = Gemm::plain(DType::F8E4M3, DType::BF16, true, false, m, n, k, k, k, m);
            self.blas().gemm_fp8(&self.gpu().stream, g, a.ptr(), b.ptr(), d.ptr(), Some((ga.ptr(), gb.ptr())))?;
            let got = self.download_with(&d, Download::Pageable)?;
            Ok(got.data.iter().enumerate().all(|(idx, &v)| v == k as f32 * sa[idx % m] * sb[idx / m]))
        };
        matches!(run(), Ok(true))
    }

    /// Each row of `x` (bf16 or f32, `[.., K]`) quantized to e4m3: `(q [.., K] e4m3, scale [rows]
    /// f32)`, `scale[r] = max(amax(x[r]), MIN_AMAX) / 448`, `q = e4m3(x / scale)`.
    pub(crate) fn quantize_fp8(&self, x: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        ensure!(matches!(x.dtype, DType::BF16 | DType::F32), "fp8 quantize: {} input", x.dtype.name());
        let (rows, k) = (x.rows(), x.last_dim());
        let q = self.alloc(DType::F8E4M3, &x.shape)?;
        let scale = self.alloc(DType::F32, &[rows])?;
        if rows > 0 && k > 0 {
            let cfg = (rows.min(1 << 16) as u32, QUANTIZE_THREADS, 0);
            kernels::QUANTIZE_FP8.launch(self, cfg, &q, &scale, x, rows as i64, k as i64, E4M3_MAX, MIN_AMAX)?;
        }
        Ok((q, scale))
    }

    /// [`moss_core::backend::Backend::linear_fp8`], each part under its own profile row: the
    /// activation's quantization (`quantize_fp8 MxK`) and the product (`linear_fp8 MxKxN`).
    /// The weight's scales may be bf16 (a checkpoint's), used as f32.
    pub(crate) fn linear_fp8_timed(&self, x: &CudaTensor, q: &CudaTensor, scale: &CudaTensor) -> Result<CudaTensor> {
        let (rows, k, n) = (x.rows(), x.last_dim(), q.shape.first().copied().unwrap_or(0));
        let path = self.fp8_gemm()?;
        let scale = &self.cast(scale, DType::F32)?;
        let (xq, xs) = self.timed_op(|| format!("quantize_fp8 {rows}x{k}"), || self.quantize_fp8(x))?;
        self.timed_op(|| format!("linear_fp8 {rows}x{k}x{n}"), || self.fp8_product(&xq, &xs, q, scale, x.dtype, path))
    }

    /// [`moss_core::backend::Backend::linear_fp8_quantized`]: the product of [`Cuda::linear_fp8_timed`]
    /// on rows quantized already, into the activation dtype (profile row `linear_fp8 MxKxN`).
    pub(crate) fn linear_fp8_quantized_timed(&self, xq: &CudaTensor, xs: &CudaTensor, q: &CudaTensor, scale: &CudaTensor) -> Result<CudaTensor> {
        let (rows, k, n) = (xq.rows(), xq.last_dim(), q.shape.first().copied().unwrap_or(0));
        let path = self.fp8_gemm()?;
        let scale = &self.cast(scale, DType::F32)?;
        let out = self.act_dtype();
        self.timed_op(|| format!("linear_fp8 {rows}x{k}x{n}"), || self.fp8_product(xq, xs, q, scale, out, path))
    }

    /// `y [.., N] = xs[r] · ws[n] · Σ_k xq[r, k] · wq[n, k]` in `out` (bf16 or f32): the quantized
    /// rows `xq [.., K]`, `xs [rows]` times the quantized weight `wq [N, K]`, `ws [N]`, on `path`
    /// (fp32 output always takes the unit-scale product and the scaling kernel).
    pub(crate) fn fp8_product(&self, xq: &CudaTensor, xs: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor, out: DType, path: Fp8Gemm) -> Result<CudaTensor> {
        ensure!(wq.shape.len() == 2 && wq.dtype == DType::F8E4M3, "linear_fp8: weight must be 2-D e4m3, got {} {:?}", wq.dtype.name(), wq.shape);
        let (n, k, rows) = (wq.shape[0], wq.shape[1], xq.rows());
        ensure!(xq.dtype == DType::F8E4M3 && xq.last_dim() == k, "linear_fp8: input {} {:?} does not match weight {:?}", xq.dtype.name(), xq.shape, wq.shape);
        ensure!(ws.dtype == DType::F32 && ws.numel() == n, "linear_fp8: {} {} scales for {n} rows", ws.numel(), ws.dtype.name());
        ensure!(xs.dtype == DType::F32 && xs.numel() == rows, "linear_fp8: {} activation scales for {rows} rows", xs.numel());
        ensure!(matches!(out, DType::BF16 | DType::F32), "linear_fp8: {} output", out.name());
        ensure!(k % FP8_ALIGN == 0 && n % FP8_ALIGN == 0, "linear_fp8: cuBLASLt's FP8 products need K and N multiples of {FP8_ALIGN}, got K {k}, N {n}");
        let mut shape = xq.shape.clone();
        *shape.last_mut().unwrap() = n;
        self.settle()?;
        let stream = &self.gpu().stream;
        // cuBLAS's m is our n (rows of the column-major result), its n is our rows.
        let plain = |d| Gemm::plain(DType::F8E4M3, d, true, false, n, rows, k, k, k, n);
        if path == Fp8Gemm::OuterVec && out == DType::BF16 {
            let y = self.alloc(out, &shape)?;
            if rows > 0 {
                self.blas().gemm_fp8(stream, plain(out), wq.ptr(), xq.ptr(), y.ptr(), Some((ws.ptr(), xs.ptr())))?;
            }
            return Ok(y);
        }
        let acc = self.alloc(DType::F32, &shape)?;
        if rows == 0 {
            return Ok(if out == DType::F32 { acc } else { self.alloc(out, &shape)? });
        }
        self.blas().gemm_fp8(stream, plain(DType::F32), wq.ptr(), xq.ptr(), acc.ptr(), None)?;
        self.scale_fp8_product(&acc, xs, ws, out)
    }

    /// `out [rows, N] = acc [rows, N] · (xs[r] · ws[n])`, rounded once into `out`'s dtype.
    fn scale_fp8_product(&self, acc: &CudaTensor, xs: &CudaTensor, ws: &CudaTensor, out: DType) -> Result<CudaTensor> {
        let (rows, n) = (acc.rows(), acc.last_dim());
        let y = self.alloc(out, &acc.shape)?;
        let work = if n % 8 == 0 { rows * n / 8 } else { rows * n };
        kernels::FP8_SCALE_ROWS.launch(self, (self.grid_for(work), 256, 0), &y, acc, xs, ws, rows as i64, n as i64)?;
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{from_bytes, loaded_dtype, to_bytes};
    use super::*;
    use moss_core::checkpoint::{tensors, Dtype, TensorStore};
    use moss_core::fp8::e4m3_to_f32;
    use moss_core::options::Precision;

    /// Every finite code's value uploads as that code and downloads as that value (-0 included);
    /// other values round to the nearest code (ties to even) and saturate, as the kernel does; the
    /// checkpoint reader gives the same values and finds a NaN code.
    #[test]
    fn e4m3_codes_go_up_and_down_as_their_values() {
        let codes: Vec<u8> = (0..=255u8).filter(|c| c & 0x7f != 0x7f).collect();
        let vals: Vec<f32> = codes.iter().map(|&c| e4m3_to_f32(c)).collect();
        assert_eq!(to_bytes(&vals, DType::F8E4M3), codes);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&from_bytes(&codes, DType::F8E4M3)), bits(&vals));
        assert_eq!(bits(&tensors::decode_f32(Dtype::F8E4M3, &codes).unwrap()), bits(&vals));
        // 1.0625 lies halfway between 1 (0x38) and 1.125 (0x39): the even code
        assert_eq!(to_bytes(&[1.0625, -1000.0, 450.0, 1e-4], DType::F8E4M3), vec![0x38, 0xfe, 0x7e, 0x00]);
        assert_eq!(tensors::first_non_finite(Dtype::F8E4M3, &[0x38, 0x7e, 0xff]), Some(2));
        assert_eq!(tensors::first_non_finite(Dtype::F8E4M3, &[0x38, 0xfe]), None);
    }

    #[test]
    fn stored_e4m3_loads_as_e4m3_at_every_precision() {
        for p in [Precision::Bf16, Precision::Fp32] {
            assert_eq!(loaded_dtype(Dtype::F8E4M3, p), DType::F8E4M3);
        }
        assert_eq!(loaded_dtype(Dtype::BF16, Precision::Bf16), DType::BF16);
        assert_eq!(loaded_dtype(Dtype::BF16, Precision::Fp32), DType::F32);
        assert_eq!(loaded_dtype(Dtype::F32, Precision::Bf16), DType::F32);
    }

    /// A safetensors `F8_E4M3` tensor reads as `Dtype::F8E4M3`, one byte an element, its values the codes'.
    #[test]
    fn a_float8_checkpoint_tensor_is_read_as_e4m3() {
        let dir = std::env::temp_dir().join(format!("moss-f8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.safetensors");
        let codes = vec![0x38u8, 0xb8, 0x7e, 0x01, 0x00, 0x40];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F8_E4M3, vec![2, 3], &codes).unwrap();
        std::fs::write(&path, safetensors::tensor::serialize([("w", view)], None).unwrap()).unwrap();
        let store = TensorStore::open_file(&path).unwrap();
        let info = store.get("w").unwrap();
        assert_eq!((info.dtype, info.dtype.size(), info.end - info.start), (Dtype::F8E4M3, 1, 6));
        let (shape, data) = store.to_f32("w").unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(data, vec![1.0, -1.0, 448.0, 1.0 / 512.0, 0.0, 2.0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
