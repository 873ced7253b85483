//! Gates of the e4m3 attention (`--precision fp8` on Hopper, [`crate::backend::cuda::dit::attention_fp8`])
//! against its CPU twin [`crate::backend::cpu::attention_fp8`], on a QK-normed and rotated packed
//! projection at the DiT's shapes (N = 4224 and 4108: a partial last tile):
//! - `moss_dit_attention_fp8_operands`: every q, k and V^T code and every scale bit for bit (QK-norm
//!   weights bf16 and f32); control: codes rounded toward zero.
//! - `moss_dit_flash_attention_fp8` (and its ping-pong build) on the GPU's operands against the twin's attention on its own
//!   (equal: the row above) operands, 32 query rows plus the last: [`FP8_ATTENTION`]. Controls: the
//!   planted kernel (running output not rescaled) and the real kernel without 1/√hd.
//!
//! - A probe of the key order: each query on one key, V spelling the key's index in bits.
//!
//! Not on GPUs without the sm_90a kernels (they run the bf16 attention at fp8).

use super::dit_ops::{stream_rows, uniform_vec};
use super::gates::*;
use crate::backend::cuda::dit::attention_fp8::Fp8Operands;
use crate::backend::cpu::attention_fp8 as twin;
use crate::backend::cuda::dit::attention_fp8::{
    FLASH_FP8_CONTROL, FLASH_FP8_KERNEL, FLASH_FP8_PINGPONG, FLASH_FP8_PINGPONG_CONTROL, OPERANDS_CONTROL, OPERANDS_KERNEL,
};
use crate::backend::cuda::ops::{Cuda, CudaTensor, DType};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use crate::fp8::e4m3_to_f32;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

pub const GATES: &[(&str, GateFn)] = &[
    ("dit attention fp8 key order", gate_key_order),
    ("dit attention fp8", gate_attention_fp8),
];

/// The GPU's e4m3 attention against the twin on equal codes and scales. What differs: the FP8
/// tensor cores keep ~14 bits in their accumulator (the scores move by ~1e-4 of themselves, P·V
/// less), the exponentials (ex2.approx against f64), f32 sums; so the P codes within ~1e-4 of a
/// rounding boundary of 256·p (~0.3% of them) round the other way, each moving its probability by
/// ~1/16: ~5e-3 on the output, with the bf16 output's ~1e-3. Twice that, under half of e4m3's own
/// 5.4e-2 from the exact attention (so the twin's arithmetic is what is checked); a control is O(1).
pub const FP8_ATTENTION: f64 = 2e-2;

/// A tensor's CPU values and its GPU copy.
type Pair = (Tensor, CudaTensor);

/// The packed projection `[n, 3·D]` as the DiT's attention gets it: q and k QK-normed (weights
/// in [0.5, 1.5]) and rotated, in bf16; with the weights (CPU values, GPU in `wdt`).
fn normed_qkv(cx: &mut Cx, n: usize, wdt: DType) -> Result<(Tensor, CudaTensor, [Pair; 2])> {
    use dit::*;
    let half = HEAD_DIM / 2;
    let x = stream_rows(cx, n * 3 * HEADS, HEAD_DIM)?;
    let x = Tensor::new(vec![n, 3 * DIM], x.data)?;
    let (wq, _) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
    let (wk, _) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
    let theta: Vec<f64> = (0..n * half).map(|_| cx.rng.uniform() * 200.0 - 100.0).collect();
    let c = Tensor::new(vec![n, half], theta.iter().map(|t| t.cos() as f32).collect())?;
    let s = Tensor::new(vec![n, half], theta.iter().map(|t| t.sin() as f32).collect())?;
    let normed = cx.cpu.qkv_norm_rope(x, HEADS, &wq, &wk, &c, &s, 1e-6)?;
    let (qkv, gqkv) = cx.exact(normed, DType::BF16)?;
    Ok((qkv, gqkv, [cx.exact(wq, wdt)?, cx.exact(wk, wdt)?]))
}

/// The operands' codes (q, k, V^T, as values) and scales.
type Codes = ([Vec<f32>; 3], Vec<f32>);

fn values(c: &[u8]) -> Vec<f32> {
    c.iter().map(|&x| e4m3_to_f32(x)).collect()
}

fn gpu_codes(cu: &Cuda, o: &Fp8Operands) -> Result<Codes> {
    cu.sync()?;
    let [q, k, vt] = [&o.q, &o.k, &o.vt].map(|t| cu.download_bytes(t).map(|b| values(&b)));
    Ok(([q?, k?, vt?], cu.download(&o.scales)?.data))
}

fn twin_codes(o: &twin::Operands) -> Codes {
    ([values(&o.q), values(&o.k), values(&o.vt())], o.scales.clone())
}

/// How many q, k and V^T codes and scales differ; NaN (a poisoned code) never equals anything.
fn mismatches(got: &Codes, want: &Codes) -> Result<[usize; 4]> {
    let differ = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x != y).count();
    let mut n = [0; 4];
    for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
        ensure!(g.len() == w.len(), "attention_fp8 operands: {} codes, expected {}", g.len(), w.len());
        n[i] = differ(g, w);
    }
    ensure!(got.1.len() == want.1.len(), "attention_fp8: {} scales, expected {}", got.1.len(), want.1.len());
    n[3] = differ(&got.1, &want.1);
    Ok(n)
}

/// A judged row of operands against `want`: the fraction of codes and scales that differ (the
/// note: which).
fn judge_codes(cx: &mut Cx, what: &str, s: &str, kind: Kind, got: Result<Fp8Operands>, want: &Codes) {
    let total = want.0.iter().map(Vec::len).sum::<usize>() + want.1.len();
    let (error, note) = match got.and_then(|o| gpu_codes(&cx.cuda, &o)).and_then(|g| mismatches(&g, want)) {
        Ok([q, k, vt, sc]) => ((q + k + vt + sc) as f64 / total as f64, format!("codes differ: q {q}, k {k}, V^T {vt}; scales {sc}")),
        Err(e) => (f64::NAN, format!("[error: {e:#}]")),
    };
    cx.judge_value(what, s, kind, EXACT, &note, error);
}

fn gate_attention_fp8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(()); // fp8 activations are bf16
    }
    if !cx.cuda.has_sm90a() {
        println!("  dit attention fp8: no sm_90a kernels on this GPU/build; not gated (not used either: --precision fp8 runs the bf16 attention)");
        return Ok(());
    }
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    for (n, wdt) in [(TOKENS, DType::BF16), (IMG + 12, DType::F32)] {
        let (qkv, gqkv, [(wq, gwq), (wk, gwk)]) = normed_qkv(cx, n, wdt)?;
        let want = twin::operands(&qkv, HEADS, &wq, &wk)?;
        let s = format!("{} (QK-norm {})", shape_str(&[&[n, 3 * DIM]]), wdt.name());
        let want_codes = twin_codes(&want);
        for (kind, kernel, what) in [
            (Kind::Gate, OPERANDS_KERNEL, "attention_fp8 operands (q, k, V^T codes + scales, bit-exact)"),
            (Kind::Control, OPERANDS_CONTROL, "attention_fp8 operands rounding toward zero"),
        ] {
            let out = cx.cuda.attention_fp8_operands_with(&gqkv, HEADS, &gwq, &gwk, kernel);
            judge_codes(cx, what, &s, kind, out, &want_codes);
        }
        let mut rows = cx.rng.subset(n - 1, ATTN_REF_ROWS);
        rows.push(n - 1);
        let twin_out = twin::attention_rows(&want, scale, &rows)?;
        let note = format!("CPU twin on {} of {n} query rows", rows.len());
        let cu = cx.cuda.clone();
        let run = |kernel: &str, scale: f64| -> Result<CudaTensor> {
            let o = cu.attention_fp8_operands_with(&gqkv, HEADS, &gwq, &gwk, OPERANDS_KERNEL)?;
            cu.flash_attention_fp8_with(&o, scale, kernel)
        };
        for (kernel, control) in [(FLASH_FP8_KERNEL, FLASH_FP8_CONTROL), (FLASH_FP8_PINGPONG, FLASH_FP8_PINGPONG_CONTROL)] {
            cx.judge(&format!("attention_fp8 ({kernel})"), &s, Kind::Gate, FP8_ATTENTION, &note, run(kernel, scale), &twin_out, Some(&rows));
            cx.judge(&format!("{kernel}: output not rescaled"), &s, Kind::Control, FP8_ATTENTION, &note, run(control, scale), &twin_out, Some(&rows));
            cx.judge(&format!("{kernel} without 1/sqrt(hd)"), &s, Kind::Control, FP8_ATTENTION, &note, run(kernel, 1.0), &twin_out, Some(&rows));
        }
        // the op as the DiT calls it
        let out = cu.attention_packed_fp8(&gqkv, HEADS, scale, &gwq, &gwk);
        cx.judge("attention_packed_fp8 (the op)", &s, Kind::Gate, FP8_ATTENTION, &note, out, &twin_out, Some(&rows));
    }
    Ok(())
}

/// A probe of the e4m3 attention's key order: every query attends to one key (q = 3·k of a
/// random other token, entries ±1: the match scores 3·128/√128 ≈ 34, the rest ~N(0, 9), so the
/// match carries all but ~1e-9 of the weight), and V holds each token's index in bits (channel
/// b of token j is bit b of j: 0 and 1 are exact in e4m3). The output's channels then spell the
/// key each query landed on: the row is the fraction of queries that landed elsewhere (0), and
/// the note shows which index bits differ, so a wrong V^T order (a bit below 32) or a wrong tile
/// (above) shows itself. Control: the planted kernel (the running output not rescaled).
fn gate_key_order(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 || !cx.cuda.has_sm90a() {
        return Ok(());
    }
    let (n, d) = (TOKENS, DIM);
    let bits = usize::BITS as usize - n.leading_zeros() as usize;
    let target: Vec<usize> = (0..n).map(|_| (cx.rng.uniform() * n as f64) as usize % n).collect();
    let sign: Vec<f32> = (0..n * d).map(|_| if cx.rng.uniform() < 0.5 { -1.0 } else { 1.0 }).collect();
    let mut qkv = vec![0f32; n * 3 * d];
    for (i, row) in qkv.chunks_mut(3 * d).enumerate() {
        for c in 0..d {
            row[c] = 3.0 * sign[target[i] * d + c];
            row[d + c] = sign[i * d + c];
            let b = c % HEAD_DIM;
            row[2 * d + c] = if b < bits { ((i >> b) & 1) as f32 } else { 0.5 };
        }
    }
    let (_, gqkv) = cx.exact(Tensor::new(vec![n, 3 * d], qkv)?, DType::BF16)?;
    let (_, ones) = cx.exact(Tensor::new(vec![HEAD_DIM], vec![1.0; HEAD_DIM])?, DType::BF16)?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let cu = cx.cuda.clone();
    let s = format!("{} (one key a query, V = the key's index in bits)", shape_str(&[&[n, 3 * d]]));
    for (kind, kernel, what) in [
        (Kind::Gate, FLASH_FP8_KERNEL, "attention_fp8 key order (queries on the wrong key)"),
        (Kind::Control, FLASH_FP8_CONTROL, "attention_fp8 key order, output not rescaled"),
    ] {
        let out = cu.attention_fp8_operands_with(&gqkv, HEADS, &ones, &ones, OPERANDS_KERNEL).and_then(|o| cu.flash_attention_fp8_with(&o, scale, kernel));
        let (error, note) = match out.and_then(|o| cu.download(&o)) {
            Ok(o) => {
                let (mut wrong, mut xor) = (0usize, 0usize);
                for (i, row) in o.data.chunks(d).enumerate() {
                    for h in 0..HEADS {
                        let got = (0..bits).fold(0usize, |j, b| j | (((row[h * HEAD_DIM + b] > 0.5) as usize) << b));
                        if got != target[i] || row[h * HEAD_DIM + bits..(h + 1) * HEAD_DIM].iter().any(|&v| (v - 0.5).abs() > 1e-2) {
                            wrong += 1;
                            xor |= got ^ target[i];
                        }
                    }
                }
                (wrong as f64 / (n * HEADS) as f64, format!("{wrong} of {} (query, head) rows; index bits that differ: {xor:#b}", n * HEADS))
            }
            Err(e) => (f64::NAN, format!("[error: {e:#}]")),
        };
        cx.judge_value(what, &s, kind, EXACT, &note, error);
    }
    Ok(())
}

/// `moss check` timing: the e4m3 attention (operands + kernel, and the kernel alone) against the
/// bf16 attention the other precisions run, at N = 4224.
pub fn time_attention_fp8(c: &Cuda) -> Result<()> {
    use dit::*;
    if !c.has_sm90a() {
        return Ok(());
    }
    let mut rng = Rng::new(11);
    let n = TOKENS;
    let x = c.upload_as(&Tensor::new(vec![n, 3 * DIM], rng.normals(n * 3 * DIM, 0.5))?, DType::BF16)?;
    let w = c.upload_as(&Tensor::new(vec![HEAD_DIM], vec![1.0; HEAD_DIM])?, DType::BF16)?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let flops = 4.0 * (n * n * DIM) as f64;
    let line = |what: &str, ms: f64| println!("  attention {n}x{HEADS}x{HEAD_DIM} {what}: {ms:.4} ms  ({:.0} TFLOP/s)", flops / (ms * 1e-3) / 1e12);
    line("bf16 (packed q|k|v)", time_ms(c, 10, 50, || c.attention_packed(&x, HEADS, scale).map(|_| ()))?);
    line("e4m3 (operands + attention)", time_ms(c, 10, 50, || c.attention_packed_fp8(&x, HEADS, scale, &w, &w).map(|_| ()))?);
    let o = c.attention_fp8_operands_with(&x, HEADS, &w, &w, OPERANDS_KERNEL)?;
    line("e4m3 (attention kernel alone)", time_ms(c, 10, 50, || c.flash_attention_fp8_with(&o, scale, FLASH_FP8_KERNEL).map(|_| ()))?);
    line("e4m3 (ping-pong kernel alone)", time_ms(c, 10, 50, || c.flash_attention_fp8_with(&o, scale, FLASH_FP8_PINGPONG).map(|_| ()))?);
    Ok(())
}
