//! Gates of the fp8 linears: the row-wise e4m3 quantization (`cuda/common/fp8.cu`) against the
//! CPU twin bit for bit (every code's value, every scale), and `linear_fp8` on each FP8 product
//! path the GPU runs against `Cpu.linear_fp8` (the same codes and scales, f64 accumulation), each
//! with planted controls; and the timing of `linear_fp8` at the DiT's shapes.

use super::dit_ops::stream_rows;
use super::gates::*;
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use crate::select::{fp8_refusal, Fp8Gemm};
use anyhow::{ensure, Result};
use moss_core::backend::Backend;
use moss_core::options::Precision;
use moss_core::tensor::Tensor;

/// The fp8 gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[("fp8 quantize", gate_quantize), ("linear_fp8", gate_linear_fp8)];

/// `linear_fp8` with fp32 output. Both sides multiply the same codes with the same scales, and a
/// product of two e4m3 values is exact in fp32, so only the accumulation differs: Hopper's FP8
/// tensor cores keep about 14 bits in their accumulator (DeepSeek-V3 report, 3.3.2), ~6e-5 an
/// addition, and cuBLASLt without fast accumulation moves the partial sums to fp32 every few
/// k-blocks, which leaves ~1e-4 on random data; 1e-3 is 10x that. A wrong scale is O(1e-1).
/// (bf16 output: [`BF16_OUT`], its rounding dominates.)
pub const FP8_GEMM_F32: f64 = 1e-3;

/// The quantization's small shape: odd rows, K not a multiple of 8 (the scalar path).
const ODD_QUANT: (usize, usize) = (77, 99);
/// `linear_fp8`'s small shape: odd rows; K and N multiples of 16 (what cuBLASLt's FP8 products
/// take), not of 32.
const ODD_LINEAR: (usize, usize, usize) = (77, 208, 48);

/// `[rows, k]` normals of std `std` with per-row scales over e^±2 ([`stream_rows`]), row 0 all
/// zeros (the MIN_AMAX scale), and every 7th row's last element twice the row's amax (an outlier
/// channel: the rows the amax-tail control must get wrong).
pub(super) fn rows_with_outliers(cx: &mut Cx, rows: usize, k: usize, std: f32) -> Result<Tensor> {
    let mut x = stream_rows(cx, rows, k)?;
    x.data.iter_mut().for_each(|v| *v *= std);
    x.data[..k].fill(0.0);
    for r in (3..rows).step_by(7) {
        let row = &mut x.data[r * k..(r + 1) * k];
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        row[k - 1] = if r % 2 == 0 { 2.0 * amax } else { -2.0 * amax };
    }
    Ok(x)
}

/// (codes whose value differs, scales that differ) of a GPU quantization against the CPU twin's.
pub(super) fn mismatches(cu: &Cuda, out: Result<(CudaTensor, CudaTensor)>, want: &(Tensor, Tensor)) -> Result<(usize, usize)> {
    let (q, s) = out?;
    cu.sync()?;
    let (q, s) = (cu.download(&q)?, cu.download(&s)?);
    ensure!(q.data.len() == want.0.data.len() && s.data.len() == want.1.data.len(), "quantize: {} codes, {} scales", q.data.len(), s.data.len());
    // NaN (a poisoned code or scale) never equals anything
    let differ = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x != y).count();
    Ok((differ(&q.data, &want.0.data), differ(&s.data, &want.1.data)))
}

fn gate_quantize(cx: &mut Cx) -> Result<()> {
    use dit::*;
    // (rows, K, std): activations into the DiT's linears (the joint stream, the ffn's hidden),
    // a q|k|v weight, and the odd shape.
    let cases: Vec<(usize, usize, f32)> = if cx.dtype == DType::BF16 {
        vec![(TOKENS, DIM, 1.0), (TOKENS, FFN, 1.0), (3 * DIM, DIM, 0.02), (ODD_QUANT.0, ODD_QUANT.1, 1.0)]
    } else {
        vec![(TOKENS, DIM, 1.0), (ODD_QUANT.0, ODD_QUANT.1, 1.0)]
    };
    for (rows, k, std) in cases {
        let x = rows_with_outliers(cx, rows, k, std)?;
        let (x, gx) = cx.exact(x, cx.dtype)?;
        let want = cx.cpu.quantize_rows(&x)?;
        let s = format!("{rows}x{k} {}", cx.dtype.name());
        for (kind, cu, what) in [
            (Kind::Gate, cx.cuda.clone(), "fp8 quantize (codes + scales, bit-exact)"),
            (Kind::Control, cx.planted(&kernels::QUANTIZE_FP8, &controls::CTL_QUANTIZE_FP8_RZ), "fp8 quantize rounding toward zero"),
            (Kind::Control, cx.planted(&kernels::QUANTIZE_FP8, &controls::CTL_QUANTIZE_FP8_TAIL), "fp8 quantize, amax misses the last element"),
        ] {
            let out = cu.quantize_fp8(&gx);
            let (error, note) = match mismatches(&cx.cuda, out, &want) {
                Ok((c, sc)) => ((c + sc) as f64 / (rows * k + rows) as f64, format!("{c} of {} codes, {sc} of {rows} scales differ", rows * k)),
                Err(e) => (f64::NAN, format!("[error: {e:#}]")),
            };
            cx.judge_value(what, &s, kind, EXACT, &note, error);
        }
    }
    Ok(())
}

/// Quantize `x` and run the FP8 product on `path` with the scaling kernel `scale` (production
/// pieces; the controls change one of them).
fn product(cx: &Cx, x: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor, path: Fp8Gemm, scale: Option<&'static ScaleRows>) -> Result<CudaTensor> {
    let (xq, xs) = cx.cuda.quantize_fp8(x)?;
    let cu = scale.map_or(cx.cuda.clone(), |s| cx.planted(&kernels::FP8_SCALE_ROWS, s));
    cu.fp8_product(&xq, &xs, wq, ws, x.dtype, path)
}

/// The FP8 product's scaling kernel (production or a planted twin).
type ScaleRows = crate::kernels::Family<fn(crate::kernels::Dev, crate::kernels::Dev, crate::kernels::Dev, crate::kernels::Dev, i64, i64)>;

/// The outer-vector path with the activation's scales squared (applied twice).
fn act_scales_twice(cx: &Cx, x: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor) -> Result<CudaTensor> {
    let (xq, xs) = cx.cuda.quantize_fp8(x)?;
    let mut h = cx.cuda.download(&xs)?;
    h.data.iter_mut().for_each(|v| *v *= *v);
    let xs2 = cx.cuda.upload_as(&h, DType::F32)?;
    cx.cuda.fp8_product(&xq, &xs2, wq, ws, x.dtype, Fp8Gemm::OuterVec)
}

fn gate_linear_fp8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let bf16 = cx.dtype == DType::BF16;
    if let Some(why) = fp8_refusal(cx.cuda.gpu().compute_capability) {
        if bf16 {
            println!("  linear_fp8: {why}: not gated (`--precision fp8` is refused with that line)");
        }
        return Ok(());
    }
    // fp32 activations always take the unit-scale product and the scaling kernel
    let mut paths = vec![Fp8Gemm::UnitThenScale];
    if bf16 {
        match cx.cuda.fp8_gemm()? {
            Fp8Gemm::OuterVec => paths.insert(0, Fp8Gemm::OuterVec),
            Fp8Gemm::UnitThenScale => {
                println!("  linear_fp8: cuBLASLt does not run outer-vector scales on this GPU; that path is not gated (not used either)")
            }
        }
    }
    // (rows, K, N): q|k|v, o, up|gate, down at 1024x1024 with a 128-token prompt; the odd shape.
    let cases = if bf16 {
        vec![(TOKENS, DIM, 3 * DIM), (TOKENS, DIM, DIM), (TOKENS, DIM, 2 * FFN), (TOKENS, FFN, DIM), ODD_LINEAR]
    } else {
        vec![(TOKENS, DIM, DIM), ODD_LINEAR]
    };
    let bound = cx.out_bound(FP8_GEMM_F32);
    for (m, k, n) in cases {
        let x = stream_rows(cx, m, k)?;
        let (x, gx) = cx.exact(x, cx.dtype)?;
        let mut w = stream_rows(cx, n, k)?;
        w.data.iter_mut().for_each(|v| *v /= (k as f32).sqrt());
        let (wq, ws) = cx.cpu.quantize_rows(&w)?;
        let gwq = cx.cuda.upload_as(&wq, DType::F8E4M3)?;
        let gws = cx.cuda.upload_as(&ws, DType::F32)?;
        let rows = cx.rng.subset(m, GEMM_REF_ROWS);
        let xs = Tensor::new(vec![rows.len(), k], rows.iter().flat_map(|&r| x.data[r * k..(r + 1) * k].iter().copied()).collect())?;
        let want = cx.cpu.linear_fp8(&xs, &wq, &ws)?;
        let s = format!("{m}x{k} · {k}x{n}");
        let note = format!("CPU on {} of {m} rows", rows.len());
        for &path in &paths {
            let (name, runs): (&str, Vec<(Kind, &str, Result<CudaTensor>)>) = match path {
                Fp8Gemm::OuterVec => {
                    let reversed = Tensor::new(vec![n], ws.data.iter().rev().copied().collect())?;
                    let rev = cx.cuda.upload_as(&reversed, DType::F32);
                    (
                        "linear_fp8 (cuBLASLt outer-vector scales)",
                        vec![
                            (Kind::Gate, "", product(cx, &gx, &gwq, &gws, path, None)),
                            (Kind::Control, "activation scales applied twice", act_scales_twice(cx, &gx, &gwq, &gws)),
                            (Kind::Control, "weight scales in reverse channel order", rev.and_then(|r| product(cx, &gx, &gwq, &r, path, None))),
                        ],
                    )
                }
                Fp8Gemm::UnitThenScale => (
                    "linear_fp8 (cuBLASLt unit scales + moss_fp8_scale_rows)",
                    vec![
                        (Kind::Gate, "", product(cx, &gx, &gwq, &gws, path, None)),
                        (Kind::Control, "scale vectors exchanged (transposed)", product(cx, &gx, &gwq, &gws, path, Some(&controls::CTL_FP8_SCALE_SWAPPED))),
                        (Kind::Control, "activation scale applied twice", product(cx, &gx, &gwq, &gws, path, Some(&controls::CTL_FP8_SCALE_TWICE))),
                    ],
                ),
            };
            for (kind, what, out) in runs {
                let label = if kind == Kind::Gate { name.to_string() } else { format!("{name}, {what}") };
                cx.judge(&label, &s, kind, bound, &note, out, &want, Some(&rows));
            }
        }
    }
    Ok(())
}

/// `linear_fp8` at the DiT's product shapes (bf16 activations): the activation's quantization,
/// the product on each path this GPU runs, the whole op; CUDA events, median of 50 after 10.
pub fn time_fp8(cuda: &Cuda) -> Result<()> {
    use dit::*;
    if let Some(why) = fp8_refusal(cuda.gpu().compute_capability) {
        println!("  linear_fp8: {why}");
        return Ok(());
    }
    let c = cuda.with_precision(Precision::Bf16);
    let paths: &[Fp8Gemm] = match c.fp8_gemm()? {
        Fp8Gemm::OuterVec => &[Fp8Gemm::OuterVec, Fp8Gemm::UnitThenScale],
        Fp8Gemm::UnitThenScale => &[Fp8Gemm::UnitThenScale],
    };
    let mut rng = Rng::new(11);
    for (m, k, n) in [(TOKENS, DIM, 3 * DIM), (TOKENS, DIM, DIM), (TOKENS, DIM, 2 * FFN), (TOKENS, FFN, DIM)] {
        let x = c.upload_as(&Tensor::new(vec![m, k], rng.normals(m * k, 1.0))?, DType::BF16)?;
        let w = c.upload_as(&Tensor::new(vec![n, k], rng.normals(n * k, 0.02))?, DType::BF16)?;
        let (wq, ws) = c.quantize_rows(&w)?;
        let (xq, xs) = c.quantize_fp8(&x)?;
        let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
        let quant = time_ms(&c, 10, 50, || c.quantize_fp8(&x).map(|_| ()))?;
        let whole = time_ms(&c, 10, 50, || c.linear_fp8(&x, &wq, &ws).map(|_| ()))?;
        let mut line = format!("  linear_fp8 {m}x{k} · {k}x{n}: {whole:.4} ms ({:.0} TFLOP/s): quantize {quant:.4} ms", tflops(whole));
        for &p in paths {
            let ms = time_ms(&c, 10, 50, || c.fp8_product(&xq, &xs, &wq, &ws, DType::BF16, p).map(|_| ()))?;
            line += &format!(", product {p:?} {ms:.4} ms ({:.0} TFLOP/s)", tflops(ms));
        }
        println!("{line}");
    }
    Ok(())
}
