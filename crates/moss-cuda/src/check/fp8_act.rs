//! Gates of the DiT's producers of float8 activations (`--precision fp8`; host side
//! `backend/cuda/dit/fp8_act.rs`): each fused kernel against the CPU quantization
//! (`quantize_rows`, the arithmetic of `crates/moss-core/src/fp8.rs`) of the CUDA unfused op's output, bit for bit
//! (every code's value, every scale; the codes' bytes also against `moss_quantize_fp8` of that
//! output, the path the fused kernel replaces), at the DiT's shapes and a ragged one, each with a
//! planted control; and their timing against the unfused pair.

use super::dit_ops::{stream_rows, uniform_vec};
use super::gates::*;
use crate::kernels::{self, controls, Image};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::Backend;
use moss_core::options::Precision;
use moss_core::tensor::Tensor;

/// The producers' gates (listed in `check/fp8.rs` `GATES`).
pub const GATES: &[(&str, GateFn)] =
    &[("fp8 rms_norm_modulate", gate_rms_mod_fp8), ("fp8 gated_residual_norm_modulate", gate_gres_fp8), ("fp8 situ_glu", gate_situ_fp8)];

/// The norms' ragged shape: odd rows, a width not a multiple of 8 (the kernels' scalar path).
const ODD_NORM: (usize, usize) = (77, 99);
/// SiTU-GLU's ragged shape: odd rows, F a multiple of 8 (what the fused kernel takes) whose
/// vectors do not fill the block's threads (3 warps, the last partly idle).
const ODD_SITU: (usize, usize) = (77, 2056);

/// The norms' shapes `(rows, D)`: the joint stream's, the ragged one.
fn norm_shapes() -> [(usize, usize); 2] {
    [(dit::TOKENS, dit::DIM), ODD_NORM]
}

/// How far a fused producer's `(codes, scales)` is from the unfused path's: the CPU quantization
/// of the unfused op's output `dense` (codes by value, scales by bits), and the codes' bytes
/// against `moss_quantize_fp8` of it. `(error, note)`: the fraction of values that differ (0:
/// bit-exact), NaN when the run failed.
fn differences(cx: &Cx, fused: Result<(CudaTensor, CudaTensor)>, dense: &CudaTensor) -> (f64, String) {
    let run = || -> Result<(usize, usize, usize, usize)> {
        let (q, s) = fused?;
        let (gq, _) = cx.cuda.quantize_fp8(dense)?;
        cx.cuda.sync()?;
        let (want_q, want_s) = cx.cpu.quantize_rows(&cx.cuda.download(dense)?)?;
        let (got_q, got_s) = (cx.cuda.download(&q)?, cx.cuda.download(&s)?);
        ensure!(got_q.data.len() == want_q.data.len() && got_s.data.len() == want_s.data.len(), "{} codes, {} scales", got_q.data.len(), got_s.data.len());
        // NaN (a poisoned code or scale) never equals anything
        let codes = got_q.data.iter().zip(&want_q.data).filter(|(a, b)| a != b).count();
        let scales = got_s.data.iter().zip(&want_s.data).filter(|(a, b)| a.to_bits() != b.to_bits() || a.is_nan()).count();
        let bytes = cx.cuda.download_bytes(&q)?.iter().zip(cx.cuda.download_bytes(&gq)?).filter(|(a, b)| **a != *b).count();
        Ok((codes, scales, bytes, want_s.data.len()))
    };
    match run() {
        Ok((c, s, b, rows)) => {
            let n = dense.numel();
            (
                (c + s + b) as f64 / (2 * n + rows) as f64,
                format!("{c} of {n} codes, {s} of {rows} scales differ; {b} code bytes differ from moss_quantize_fp8's"),
            )
        }
        Err(e) => (f64::NAN, format!("[error: {e:#}]")),
    }
}

/// The norms' cases `(rows, D, the stream x's dtype)`: [`norm_shapes`] with x in the activation
/// dtype and, in a bf16 run, also f32 (the bf16 forward's residual stream).
fn norm_cases(cx: &Cx) -> Vec<(usize, usize, DType)> {
    let xs: &[DType] = if cx.dtype == DType::BF16 { &[DType::BF16, DType::F32] } else { &[DType::F32] };
    norm_shapes().into_iter().flat_map(|(r, d)| xs.iter().map(move |&t| (r, d, t))).collect()
}

/// `x [rows, d]` in `xt` like the joint stream, the norm's weight and modulation vectors `[d]`.
fn norm_inputs(cx: &mut Cx, rows: usize, d: usize, xt: DType) -> Result<(CudaTensor, [CudaTensor; 3])> {
    let x = stream_rows(cx, rows, d)?;
    let (_, gx) = cx.exact(x, xt)?;
    let (_, w) = uniform_vec(cx, d, 0.5, 1.5)?;
    let (_, shift) = cx.input(&[d], 1.0)?;
    let (_, scale) = cx.input(&[d], 1.0)?;
    Ok((gx, [w, shift, scale]))
}

/// The shape's note for an f32 stream in a bf16 run (the norm rounded to bf16 before its codes).
fn stream_note(cx: &Cx, xt: DType) -> &'static str {
    if xt != cx.dtype {
        " (x f32, the stream)"
    } else {
        ""
    }
}

fn gate_rms_mod_fp8(cx: &mut Cx) -> Result<()> {
    for (rows, d, xt) in norm_cases(cx) {
        let (x, [w, sh, sc]) = norm_inputs(cx, rows, d, xt)?;
        let dense = cx.cuda.rms_norm_modulate_op(&x, &w, &sh, &sc, 1e-6)?;
        let s = format!("{rows}x{d}{}", stream_note(cx, xt));
        let ctl = cx.cuda.with_image(
            Image::production().swap(&kernels::RMS_MOD_FP8, &controls::CTL_RMS_MOD_FP8).swap(&kernels::RMS_MOD_FP8_TO, &controls::CTL_RMS_MOD_FP8_TO),
        );
        for (kind, cu, what) in
            [(Kind::Gate, cx.cuda.clone(), "rms_norm_modulate_fp8 (fused, bit-exact)"), (Kind::Control, ctl, "rms_norm_modulate_fp8, each lane's own amax")]
        {
            let (error, note) = differences(cx, cu.rms_norm_modulate_fp8_op(&x, &w, &sh, &sc, 1e-6), &dense);
            cx.judge_value(what, &s, kind, EXACT, &note, error);
        }
    }
    Ok(())
}

fn gate_gres_fp8(cx: &mut Cx) -> Result<()> {
    for (rows, d, xt) in norm_cases(cx) {
        let (x, [w, sh, sc]) = norm_inputs(cx, rows, d, xt)?;
        let (_, y) = cx.input(&[rows, d], 1.0)?;
        let (_, gate) = cx.input(&[d], 1.0)?;
        let (xo, dense) = cx.cuda.gres_norm_mod_op(&x, &y, &gate, &w, &sh, &sc, 1e-6)?;
        let s = format!("{rows}x{d}{}", stream_note(cx, xt));
        let ctl = cx.cuda.with_image(
            Image::production().swap(&kernels::GRES_MOD_FP8, &controls::CTL_GRES_MOD_FP8).swap(&kernels::GRES_MOD_FP8_TO, &controls::CTL_GRES_MOD_FP8_TO),
        );
        for (kind, cu, what) in [
            (Kind::Gate, cx.cuda.clone(), "gated_residual_norm_modulate_fp8 (fused)"),
            (Kind::Control, ctl, "gated_residual_norm_modulate_fp8, codes toward 0"),
        ] {
            let out = cu.gres_norm_mod_fp8_op(&x, &y, &gate, &w, &sh, &sc, 1e-6);
            // the new stream: the unfused kernel's, bit for bit
            let stream = out.as_ref().map_err(|e| anyhow::anyhow!("{e:#}")).and_then(|(got, _)| {
                let bits = |t: &CudaTensor| cx.cuda.download(t).map(|t| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                Ok(bits(got)?.iter().zip(bits(&xo)?).filter(|(a, b)| **a != *b).count())
            });
            let (error, note) = differences(cx, out.map(|(_, q)| q), &dense);
            let (error, note) = match stream {
                Ok(0) => (error, format!("{note}; the stream bit-exact")),
                Ok(k) => (f64::NAN, format!("{note}; {k} of {} stream values differ", rows * d)),
                Err(e) => (f64::NAN, format!("{note} [stream: {e}]")),
            };
            cx.judge_value(what, &s, kind, EXACT, &note, error);
        }
    }
    Ok(())
}

fn gate_situ_fp8(cx: &mut Cx) -> Result<()> {
    for (rows, f) in [(dit::TOKENS, dit::FFN), ODD_SITU] {
        let (_, x) = cx.input(&[rows, 2 * f], 4.0)?;
        let dense = cx.cuda.situ_glu_op(&x)?;
        let form = if cx.dtype == DType::BF16 { "fast form" } else { "libm form" };
        let s = format!("{rows}x{} -> {rows}x{f}", 2 * f);
        let ctl = cx
            .cuda
            .with_image(Image::production().swap(&kernels::SITU_FP8, &controls::CTL_SITU_FP8).swap(&kernels::SITU_FAST_FP8, &controls::CTL_SITU_FAST_FP8));
        for (kind, cu, what) in [
            (Kind::Gate, cx.cuda.clone(), format!("situ_glu_fp8 ({form}, fused, bit-exact)")),
            (Kind::Control, ctl, "situ_glu_fp8, amax of the first warp only".to_string()),
        ] {
            let (error, note) = differences(cx, cu.situ_glu_fp8_op(&x), &dense);
            cx.judge_value(&what, &s, kind, EXACT, &note, error);
        }
    }
    Ok(())
}

/// The fused producers against the unfused op + `moss_quantize_fp8` at the DiT's shapes (bf16, the
/// activations of `--precision fp8`), CUDA events, median of 50 after 10; and what that saves a
/// forward of the 42 blocks (two norms and one SiTU-GLU a block).
pub fn time_fp8_act(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Bf16);
    let mut rng = Rng::new(13);
    let mut up = |shape: &[usize], std: f64| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(shape.iter().product(), std))?, DType::BF16);
    let (x, y, v) = (up(&[TOKENS, DIM], 1.0)?, up(&[TOKENS, DIM], 1.0)?, up(&[DIM], 0.5)?);
    let u = up(&[TOKENS, 2 * FFN], 4.0)?;
    let q = |t: Result<CudaTensor>| t.and_then(|t| c.quantize_fp8(&t)).map(|_| ());
    let ms = |f: &mut dyn FnMut() -> Result<()>| time_ms(&c, 10, 50, f);
    let rms = (ms(&mut || c.rms_norm_modulate_fp8_op(&x, &v, &v, &v, 1e-6).map(|_| ()))?, ms(&mut || q(c.rms_norm_modulate_op(&x, &v, &v, &v, 1e-6)))?);
    let gres = (
        ms(&mut || c.gres_norm_mod_fp8_op(&x, &y, &v, &v, &v, &v, 1e-6).map(|_| ()))?,
        ms(&mut || q(c.gres_norm_mod_op(&x, &y, &v, &v, &v, &v, 1e-6).map(|(_, n)| n)))?,
    );
    let situ = (ms(&mut || c.situ_glu_fp8_op(&u).map(|_| ()))?, ms(&mut || q(c.situ_glu_op(&u)))?);
    for (op, shape, (fused, unfused)) in [
        ("rms_norm_modulate", format!("{TOKENS}x{DIM}"), rms),
        ("gated_residual_norm_modulate", format!("{TOKENS}x{DIM}"), gres),
        ("situ_glu", format!("{TOKENS}x{}", 2 * FFN), situ),
    ] {
        println!("  {op} -> fp8 {shape}: fused {fused:.4} ms, unfused (the op + moss_quantize_fp8) {unfused:.4} ms");
    }
    let saved = 42.0 * (2.0 * (gres.1 - gres.0) + (situ.1 - situ.0));
    println!("  fp8 producers: {saved:.2} ms less a forward of 42 blocks (2 norms + 1 situ_glu a block)");
    Ok(())
}
