//! Gates of the int8 linears (`--precision int8`): the row-wise int8 quantization
//! (`cuda/dit/int8.cu`, plain and with the ConvRot turn) against the CPU twin bit for bit (every
//! code, every scale), and `linear_int8` (the quantization, cuBLASLt's IMMA product, the scaling
//! epilogue) against `Cpu.linear_int8` (the same codes and scales, exact integer sums, the scaling
//! in f64), each with planted controls; and the timing of `linear_int8` at the DiT's shapes. The
//! same kernels run on every family (`MOSS_KERNELS=portable` included).

use super::dit_ops::stream_rows;
use super::fp8::{mismatches, rows_with_outliers};
use super::gates::*;
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use crate::select::int8_refusal;
use anyhow::Result;
use moss_core::backend::Backend;
use moss_core::options::Precision;
use moss_core::tensor::Tensor;

/// The int8 gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[("int8 quantize", gate_quantize), ("int8 quantize + ConvRot", gate_quantize_rot), ("linear_int8", gate_linear_int8)];

/// `linear_int8` with fp32 output: both sides sum the same codes exactly (int32 on the GPU, as
/// integers on the CPU), so only the scaling differs: the GPU's `f32(acc) · (xs · ws)` (three f32
/// roundings, ≤ 2e-7 relative) against the CPU's f64 product rounded once. 1e-6 is 5x that; a
/// wrong scale is O(1e-1). (bf16 output: [`BF16_OUT`], its rounding dominates.)
pub const INT8_GEMM_F32: f64 = 1e-6;

/// The quantization's small shape: odd rows, K not a multiple of 8 (the scalar path).
const ODD_QUANT: (usize, usize) = (77, 99);
/// `linear_int8`'s small shape: odd rows; K and N multiples of 16, not of 32.
const ODD_LINEAR: (usize, usize, usize) = (77, 208, 48);
/// The ConvRot group of the published int8_convrot DiT files (convert-to-quant's default).
const GROUP: usize = 256;

/// Whether this GPU runs the int8 linears; prints why not once (at bf16).
fn runs_int8(cx: &Cx, what: &str) -> bool {
    match int8_refusal(cx.cuda.gpu().compute_capability) {
        None => true,
        Some(why) => {
            if cx.dtype == DType::BF16 {
                println!("  {what}: {why}: not gated (`--precision int8` is refused with that line)");
            }
            false
        }
    }
}

/// One quantization case against the CPU twin, with its controls: `(kind, backend, label)`.
fn judge_quantize(cx: &mut Cx, x: Tensor, convrot: Option<usize>, runs: Vec<(Kind, Cuda, &str)>) -> Result<()> {
    let (rows, k) = (x.rows(), x.last_dim());
    let (x, gx) = cx.exact(x, cx.dtype)?;
    let want = cx.cpu.quantize_rows_int8(&x, convrot)?;
    let group = convrot.map_or(String::new(), |g| format!(", groups of {g}"));
    let s = format!("{rows}x{k} {}{group}", cx.dtype.name());
    for (kind, cu, what) in runs {
        let out = cu.quantize_int8(&gx, convrot);
        let (error, note) = match mismatches(&cx.cuda, out, &want) {
            Ok((c, sc)) => ((c + sc) as f64 / (rows * k + rows) as f64, format!("{c} of {} codes, {sc} of {rows} scales differ", rows * k)),
            Err(e) => (f64::NAN, format!("[error: {e:#}]")),
        };
        cx.judge_value(what, &s, kind, EXACT, &note, error);
    }
    Ok(())
}

fn gate_quantize(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if !runs_int8(cx, "int8 quantize") {
        return Ok(());
    }
    // (rows, K, std): activations into the DiT's linears (the joint stream, the ffn's hidden),
    // a q|k|v weight, and the odd shape.
    let cases: Vec<(usize, usize, f32)> = if cx.dtype == DType::BF16 {
        vec![(TOKENS, DIM, 1.0), (TOKENS, FFN, 1.0), (3 * DIM, DIM, 0.02), (ODD_QUANT.0, ODD_QUANT.1, 1.0)]
    } else {
        vec![(TOKENS, DIM, 1.0), (ODD_QUANT.0, ODD_QUANT.1, 1.0)]
    };
    for (rows, k, std) in cases {
        let x = rows_with_outliers(cx, rows, k, std)?;
        let runs = vec![
            (Kind::Gate, cx.cuda.clone(), "int8 quantize (codes + scales, bit-exact)"),
            (Kind::Control, cx.planted(&kernels::QUANTIZE_INT8, &controls::CTL_QUANTIZE_INT8_RZ), "int8 quantize rounding toward zero"),
            (Kind::Control, cx.planted(&kernels::QUANTIZE_INT8, &controls::CTL_QUANTIZE_INT8_TAIL), "int8 quantize, amax misses the last element"),
        ];
        judge_quantize(cx, x, None, runs)?;
    }
    Ok(())
}

/// The turn sums in f64 with the host's butterfly (the same additions in the same order) and
/// rounds once, so the codes and scales are the host's bit for bit.
fn gate_quantize_rot(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if !runs_int8(cx, "int8 quantize + ConvRot") {
        return Ok(());
    }
    // (rows, K, group): the published group (a power of 4: the H4 butterfly) on both widths, a
    // power of 2 that is not one of 4 (Sylvester's), the largest group (one tile), odd rows.
    let cases: Vec<(usize, usize, usize)> = if cx.dtype == DType::BF16 {
        vec![(TOKENS, DIM, GROUP), (TOKENS, FFN, GROUP), (TOKENS, DIM, 128), (256, FFN, 4096), (ODD_QUANT.0, 96, 32)]
    } else {
        vec![(TOKENS, DIM, GROUP), (ODD_QUANT.0, 96, 32)]
    };
    for (rows, k, g) in cases {
        let x = rows_with_outliers(cx, rows, k, 1.0)?;
        let runs = vec![
            (Kind::Gate, cx.cuda.clone(), "int8 quantize + ConvRot turn (codes + scales, bit-exact)"),
            (
                Kind::Control,
                cx.planted(&kernels::QUANTIZE_INT8_ROT, &controls::CTL_QUANTIZE_INT8_ROT_SHORT),
                "int8 quantize + ConvRot, the turn's last stage left out",
            ),
        ];
        judge_quantize(cx, x, Some(g), runs)?;
    }
    Ok(())
}

/// Quantize `x` (turned in groups of `convrot`) and run the IMMA product and the epilogue on `cu`.
fn product(cu: &Cuda, x: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor, convrot: Option<usize>) -> Result<CudaTensor> {
    let (xq, xs) = cu.quantize_int8(x, convrot)?;
    cu.int8_product(&xq, &xs, wq, ws, x.dtype)
}

fn gate_linear_int8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if !runs_int8(cx, "linear_int8") {
        return Ok(());
    }
    // (rows, K, N, ConvRot group): q|k|v, o, up|gate, down at 1024x1024 with a 128-token prompt;
    // o and down as a ConvRot file holds them; the odd shape.
    let cases = if cx.dtype == DType::BF16 {
        vec![
            (TOKENS, DIM, 3 * DIM, None),
            (TOKENS, DIM, DIM, None),
            (TOKENS, DIM, 2 * FFN, None),
            (TOKENS, FFN, DIM, None),
            (TOKENS, DIM, DIM, Some(GROUP)),
            (TOKENS, FFN, DIM, Some(GROUP)),
            (ODD_LINEAR.0, ODD_LINEAR.1, ODD_LINEAR.2, None),
        ]
    } else {
        vec![(TOKENS, DIM, DIM, None), (TOKENS, DIM, DIM, Some(GROUP)), (ODD_LINEAR.0, ODD_LINEAR.1, ODD_LINEAR.2, None)]
    };
    let bound = cx.out_bound(INT8_GEMM_F32);
    for (m, k, n, convrot) in cases {
        let x = stream_rows(cx, m, k)?;
        let (x, gx) = cx.exact(x, cx.dtype)?;
        let mut w = stream_rows(cx, n, k)?;
        w.data.iter_mut().for_each(|v| *v /= (k as f32).sqrt());
        let (wq, ws) = cx.cpu.quantize_rows_int8(&w, None)?;
        let gwq = cx.cuda.upload_as(&wq, DType::I8)?;
        let gws = cx.cuda.upload_as(&ws, DType::F32)?;
        let rows = cx.rng.subset(m, GEMM_REF_ROWS);
        let xs = Tensor::new(vec![rows.len(), k], rows.iter().flat_map(|&r| x.data[r * k..(r + 1) * k].iter().copied()).collect())?;
        let want = cx.cpu.linear_int8(&xs, &wq, &ws, convrot)?;
        let group = convrot.map_or(String::new(), |g| format!(", ConvRot {g}"));
        let s = format!("{m}x{k} · {k}x{n}{group}");
        let note = format!("CPU on {} of {m} rows", rows.len());
        let reversed = Tensor::new(vec![n], ws.data.iter().rev().copied().collect())?;
        let rev = cx.cuda.upload_as(&reversed, DType::F32);
        let name = if convrot.is_some() {
            "linear_int8 (moss_quantize_int8_rot + cuBLASLt IMMA + moss_int8_scale_rows)"
        } else {
            "linear_int8 (moss_quantize_int8 + cuBLASLt IMMA + moss_int8_scale_rows)"
        };
        let mut runs: Vec<(Kind, &str, Result<CudaTensor>)> = vec![
            (Kind::Gate, "", product(&cx.cuda, &gx, &gwq, &gws, convrot)),
            (
                Kind::Control,
                "scale vectors exchanged (transposed)",
                product(&cx.planted(&kernels::INT8_SCALE_ROWS, &controls::CTL_INT8_SCALE_SWAPPED), &gx, &gwq, &gws, convrot),
            ),
            (
                Kind::Control,
                "activation scale applied twice",
                product(&cx.planted(&kernels::INT8_SCALE_ROWS, &controls::CTL_INT8_SCALE_TWICE), &gx, &gwq, &gws, convrot),
            ),
            (Kind::Control, "weight scales in reverse channel order", rev.and_then(|r| product(&cx.cuda, &gx, &gwq, &r, convrot))),
        ];
        if convrot.is_some() {
            let short = cx.planted(&kernels::QUANTIZE_INT8_ROT, &controls::CTL_QUANTIZE_INT8_ROT_SHORT);
            runs.push((Kind::Control, "the turn's last stage left out", product(&short, &gx, &gwq, &gws, convrot)));
            runs.push((Kind::Control, "the activation not turned", product(&cx.cuda, &gx, &gwq, &gws, None)));
        }
        if n == 3 * k && convrot.is_none() {
            // q | k | v as an int8 file's stack kept as stored (three parts, codes then scales):
            // its codes multiplied in place; the control packs the parts in reverse order
            let kept = |order: &[usize]| -> Result<CudaTensor> {
                use moss_core::checkpoint::kept::{Format, Layout};
                let third = n / 3;
                let layout = Layout::new(k, &[(third, Format::Int8 { convrot: None }); 3]);
                let mut b = vec![0u8; layout.bytes];
                for (p, &j) in layout.parts.iter().zip(order) {
                    let codes = &wq.data[j * third * k..(j + 1) * third * k];
                    b[p.data..p.data + codes.len()].iter_mut().zip(codes).for_each(|(o, &c)| *o = c as i8 as u8);
                    let at = p.scales.expect("int8 scales");
                    for (r, v) in ws.data[j * third..(j + 1) * third].iter().enumerate() {
                        b[at + 4 * r..at + 4 * r + 4].copy_from_slice(&v.to_le_bytes());
                    }
                }
                cx.cuda.kept_int8_codes(&cx.cuda.upload_kept(&layout, &b)?)
            };
            let label = "linear_int8 of a kept int8 stack's codes (an int8 file's q|k|v)";
            let out = kept(&[0, 1, 2]).and_then(|q| product(&cx.cuda, &gx, &q, &gws, None));
            runs.push((Kind::Gate, label, out));
            let out = kept(&[2, 1, 0]).and_then(|q| product(&cx.cuda, &gx, &q, &gws, None));
            runs.push((Kind::Control, "kept stack: the parts in reverse order", out));
        }
        for (kind, what, out) in runs {
            let label = match kind {
                Kind::Gate if what.is_empty() => name.to_string(),
                Kind::Gate => what.to_string(),
                _ => format!("{name}, {what}"),
            };
            cx.judge(&label, &s, kind, bound, &note, out, &want, Some(&rows));
        }
    }
    Ok(())
}

/// `linear_int8` at the DiT's product shapes (bf16 activations): the activation's quantization
/// (plain and turned), the product with its epilogue, the whole op; CUDA events, median of 50
/// after 10.
pub fn time_int8(cuda: &Cuda) -> Result<()> {
    use dit::*;
    if let Some(why) = int8_refusal(cuda.gpu().compute_capability) {
        println!("  linear_int8: {why}");
        return Ok(());
    }
    let c = cuda.with_precision(Precision::Bf16);
    let mut rng = Rng::new(13);
    for (m, k, n) in [(TOKENS, DIM, 3 * DIM), (TOKENS, DIM, DIM), (TOKENS, DIM, 2 * FFN), (TOKENS, FFN, DIM)] {
        let x = c.upload_as(&Tensor::new(vec![m, k], rng.normals(m * k, 1.0))?, DType::BF16)?;
        let w = c.upload_as(&Tensor::new(vec![n, k], rng.normals(n * k, 0.02))?, DType::BF16)?;
        let (wq, ws) = c.quantize_int8(&w, None)?;
        let (xq, xs) = c.quantize_int8(&x, None)?;
        let tops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
        let quant = time_ms(&c, 10, 50, || c.quantize_int8(&x, None).map(|_| ()))?;
        let turned = time_ms(&c, 10, 50, || c.quantize_int8(&x, Some(GROUP)).map(|_| ()))?;
        let prod = time_ms(&c, 10, 50, || c.int8_product(&xq, &xs, &wq, &ws, DType::BF16).map(|_| ()))?;
        let whole = time_ms(&c, 10, 50, || c.linear_int8(&x, &wq, &ws, None).map(|_| ()))?;
        println!(
            "  linear_int8 {m}x{k} · {k}x{n}: {whole:.4} ms ({:.0} TOP/s): quantize {quant:.4} ms (ConvRot {GROUP}: {turned:.4} ms), product + epilogue {prod:.4} ms ({:.0} TOP/s)",
            tops(whole),
            tops(prod)
        );
    }
    Ok(())
}
