//! Gate of [`DitOps::linear_qkv_norm_rope`] (the fused Hopper kernel
//! `moss_dit_linear_qkv_norm_rope`, or cuBLASLt + `qkv_norm_rope` where it does not run) against
//! the CPU twin, with planted controls; and its timing against the unfused pair at the DiT's shape.

use super::dit::qkv_rope_controls;
use super::dit_ops::{stream_rows, uniform_vec};
use super::gates::*;
use super::linear_situ_glu::pick_rows;
use super::linear_situ_glu_fp8::quantized;
use crate::dit::{QKV_FP8_KERNEL, QKV_KERNEL};
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::Result;
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::options::Precision;
use moss_core::tensor::Tensor;

/// The gate, in table order.
pub const GATES: &[(&str, GateFn)] = &[("dit linear_qkv_norm_rope", gate_linear_qkv), ("dit linear_qkv_norm_rope_fp8", gate_linear_qkv_fp8)];

const EPS: f64 = 1e-6;

/// RoPE tables `[n, 64]` of random angles, exact in `cx.dtype`.
fn rope_tables(cx: &mut Cx, n: usize) -> Result<[(Tensor, CudaTensor); 2]> {
    let half = dit::HEAD_DIM / 2;
    let theta: Vec<f64> = (0..n * half).map(|_| cx.rng.uniform() * 200.0 - 100.0).collect();
    let c = cx.exact(Tensor::new(vec![n, half], theta.iter().map(|t| t.cos() as f32).collect())?, cx.dtype)?;
    let s = cx.exact(Tensor::new(vec![n, half], theta.iter().map(|t| t.sin() as f32).collect())?, cx.dtype)?;
    Ok([c, s])
}

/// bf16: the op (on Hopper the fused kernel, persistent), else cuBLASLt + `qkv_norm_rope`, at the
/// DiT's shape (4224 x 3072 · 3072 x 9216, 24 heads: 1188 tiles, the persistent grid loops) and
/// two ragged ones (77 x 128 · 128 x 1536, 4 heads: one partial row tile, 2 K steps, fewer than the
/// ring's stages; 333 x 512 · 512 x 768, 2 heads: a partial last row tile, one tile each of q, k
/// and v, 8 K steps round the ring twice). The reference is the CPU twin at the unfused path's
/// rounding points: the product in f64 (the CPU `linear`), rounded to bf16 as the unfused path
/// stores it, then the CPU `qkv_norm_rope`; on 64 random rows at the DiT's shape, every row of the
/// others. Controls (DiT shape): k normed with q's weight, the rotation's sign flipped (Hopper: the
/// kernel's check-image twins); elsewhere the unfused pair with the planted `qkv_norm_rope`
/// (`moss_ctl`, k normed with q's weight). fp32 has no fused kernel: its op is the pair, each
/// gated on its own.
fn gate_linear_qkv(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(());
    }
    let hopper = cx.cuda.has_sm90a();
    for (case, (m, k, heads)) in [(TOKENS, DIM, HEADS), (77, 128, 4), (333, 512, 2)].into_iter().enumerate() {
        let n = 3 * heads * HEAD_DIM;
        let x = stream_rows(cx, m, k)?;
        let (x, gx) = cx.exact(x, DType::BF16)?;
        let (w, gw) = cx.input(&[n, k], 2.0 / (k as f64).sqrt())?;
        let (wq, gwq) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
        let (wk, gwk) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
        let [(c, gc), (sn, gs)] = rope_tables(cx, m)?;
        let rows = cx.rng.subset(m, if case == 0 { GEMM_REF_ROWS } else { m });
        let u = round_bf16(&cx.cpu.linear(&pick_rows(&x, &rows)?, &w, None)?);
        let want = cx.cpu.qkv_norm_rope(u, heads, &wq, &wk, &pick_rows(&c, &rows)?, &pick_rows(&sn, &rows)?, EPS)?;
        let s = format!("{m}x{k} · {k}x{n}, {heads} heads");
        let note = if rows.len() < m { format!("CPU on {} of {m} rows", rows.len()) } else { String::new() };
        let (bound, rows) = (BF16_OUT, Some(&rows[..]));
        let op = |cu: &Cuda| cu.linear_qkv_norm_rope(&gx, &gw, &gwq, &gwk, &gc, &gs, heads, EPS);
        if hopper {
            let out = op(&cx.cuda);
            cx.judge(&format!("linear_qkv_norm_rope (op: fused {QKV_KERNEL})"), &s, Kind::Gate, bound, &note, out, &want, rows);
            if case == 0 {
                for (twin, what) in [
                    (&controls::DIT_LINEAR_QKV_NORM_ROPE_K_WEIGHT_CONTROL, "k normed with q's weight"),
                    (&controls::DIT_LINEAR_QKV_NORM_ROPE_SIGN_CONTROL, "rotation's sign flipped"),
                ] {
                    let cu = cx.planted(&kernels::DIT_LINEAR_QKV_NORM_ROPE, twin);
                    let out = cu.linear_qkv_norm_rope_fused(&gx, &gw, None, &gwq, &gwk, &gc, &gs, heads, EPS);
                    cx.judge(&format!("linear_qkv_norm_rope (fused), {what}"), &s, Kind::Control, bound, &note, out, &want, rows);
                }
            }
        } else {
            let out = op(&cx.cuda);
            cx.judge("linear_qkv_norm_rope (cuBLASLt + qkv_norm_rope)", &s, Kind::Gate, bound, &note, out, &want, rows);
            if case == 0 {
                let cu = qkv_rope_controls(&cx.cuda);
                let out = cu.linear(&gx, &gw, None).and_then(|u| cu.qkv_norm_rope_op(u, heads, &gwq, &gwk, &gc, &gs, EPS));
                let what = "linear_qkv_norm_rope (cuBLASLt + qkv_norm_rope), k normed with q's weight";
                cx.judge(what, &s, Kind::Control, bound, &note, out, &want, rows);
            }
        }
    }
    Ok(())
}

/// The e4m3 gates' shapes `(M, K, heads)`: the DiT's and a ragged one (333 x 512 · 512 x 768, 2
/// heads: a partial last row tile).
const FP8_CASES: [(usize, usize, usize); 2] = [(dit::TOKENS, dit::DIM, dit::HEADS), (333, 512, 2)];

/// The e4m3 q|k|v product's inputs (GPU, and the CPU's values): x and W quantized row-wise (x
/// stream rows, W of std 2/√K), the QK-norm weights in [0.5, 1.5], RoPE tables.
struct Fp8QkvInputs {
    pub x: ((CudaTensor, CudaTensor), (Tensor, Tensor)),
    pub w: ((CudaTensor, CudaTensor), (Tensor, Tensor)),
    pub wq: (Tensor, CudaTensor),
    pub wk: (Tensor, CudaTensor),
    pub cos: (Tensor, CudaTensor),
    pub sin: (Tensor, CudaTensor),
}

fn fp8_qkv_inputs(cx: &mut Cx, m: usize, k: usize, heads: usize) -> Result<Fp8QkvInputs> {
    let x = stream_rows(cx, m, k)?;
    let (_, gx) = cx.exact(x, DType::BF16)?;
    let (_, gw) = cx.input(&[3 * heads * dit::HEAD_DIM, k], 2.0 / (k as f64).sqrt())?;
    let (x, w) = (quantized(cx, &gx)?, quantized(cx, &gw)?);
    let (wq, wk) = (uniform_vec(cx, dit::HEAD_DIM, 0.5, 1.5)?, uniform_vec(cx, dit::HEAD_DIM, 0.5, 1.5)?);
    let [cos, sin] = rope_tables(cx, m)?;
    Ok(Fp8QkvInputs { x, w, wq, wk, cos, sin })
}

/// The e4m3 kernel (Hopper only; elsewhere the op is `linear_fp8_quantized` + `qkv_norm_rope`,
/// each gated on its own) at the DiT's shape and a ragged one (333 x 512 · 512 x 768, 2 heads),
/// against the CPU twin at the unfused fp8 path's rounding points: `linear_fp8_quantized` of the
/// same codes and scales (f64), rounded to bf16, then `qkv_norm_rope`. The kernel keeps a tile's
/// whole K in the tensor cores' accumulator (~1e-4 on these sums). Controls (DiT shape): k normed
/// with q's weight, the rotation's sign flipped (the kernel's check-image twins).
fn gate_linear_qkv_fp8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 || !cx.cuda.has_sm90a() {
        return Ok(());
    }
    for (case, (m, k, heads)) in FP8_CASES.into_iter().enumerate() {
        let n = 3 * heads * HEAD_DIM;
        let Fp8QkvInputs { x: ((xq, xs), (hxq, hxs)), w: ((wq8, ws), (hwq, hws)), wq: (wq, gwq), wk: (wk, gwk), cos: (c, gc), sin: (sn, gs) } =
            fp8_qkv_inputs(cx, m, k, heads)?;
        let rows = cx.rng.subset(m, if case == 0 { GEMM_REF_ROWS } else { m });
        let hxs_rows = Tensor::new(vec![rows.len()], rows.iter().map(|&r| hxs.data[r]).collect())?;
        let u = round_bf16(&cx.cpu.linear_fp8_quantized(&pick_rows(&hxq, &rows)?, &hxs_rows, &hwq, &hws)?);
        let want = cx.cpu.qkv_norm_rope(u, heads, &wq, &wk, &pick_rows(&c, &rows)?, &pick_rows(&sn, &rows)?, EPS)?;
        let s = format!("{m}x{k} · {k}x{n} (e4m3), {heads} heads");
        let note = if rows.len() < m { format!("CPU on {} of {m} rows", rows.len()) } else { String::new() };
        let rows = Some(&rows[..]);
        let run = |cu: &Cuda| cu.linear_qkv_norm_rope_fused(&xq, &wq8, Some((&xs, &ws)), &gwq, &gwk, &gc, &gs, heads, EPS);
        let out = run(&cx.cuda);
        cx.judge(&format!("linear_qkv_norm_rope_fp8 ({QKV_FP8_KERNEL})"), &s, Kind::Gate, BF16_OUT, &note, out, &want, rows);
        if case == 0 {
            for (twin, what) in [
                (&controls::DIT_LINEAR_QKV_NORM_ROPE_FP8_K_WEIGHT_CONTROL, "k normed with q's weight"),
                (&controls::DIT_LINEAR_QKV_NORM_ROPE_FP8_SIGN_CONTROL, "rotation's sign flipped"),
            ] {
                let out = run(&cx.planted(&kernels::DIT_LINEAR_QKV_NORM_ROPE_FP8, twin));
                cx.judge(&format!("linear_qkv_norm_rope_fp8 (fused), {what}"), &s, Kind::Control, BF16_OUT, &note, out, &want, rows);
            }
        }
    }
    Ok(())
}

/// The fused kernel (as production launches it) against cuBLASLt `linear` + `qkv_norm_rope` at the
/// DiT's shape, bf16: CUDA events, median of 10 after 3 warm-up runs; TFLOP/s of the product
/// (2·M·K·3D).
pub fn time_linear_qkv(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Bf16);
    let (m, k, n) = (TOKENS, DIM, 3 * DIM);
    let mut rng = Rng::new(12);
    let mut up = |shape: &[usize], std: f64| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(shape.iter().product(), std))?, DType::BF16);
    let (x, w) = (up(&[m, k], 1.0)?, up(&[n, k], 0.02)?);
    let (wq, wk, cs, sn) = (up(&[HEAD_DIM], 1.0)?, up(&[HEAD_DIM], 1.0)?, up(&[m, HEAD_DIM / 2], 0.7)?, up(&[m, HEAD_DIM / 2], 0.7)?);
    let tflops = |ms: f64| 2.0 * (m * k * n) as f64 / (ms * 1e-3) / 1e12;
    let timed = |f: &dyn Fn() -> Result<CudaTensor>| time_ms(&c, 3, 10, || f().map(|_| ()));
    let lin = timed(&|| c.linear(&x, &w, None))?;
    let pair = timed(&|| c.qkv_norm_rope(c.linear(&x, &w, None)?, HEADS, &wq, &wk, &cs, &sn, EPS))?;
    println!("timing: linear_qkv_norm_rope {m}x{k} · {k}x{n}, {HEADS} heads, bf16, CUDA events, median of 10 after 3 warm-up runs");
    println!("  cuBLASLt linear + qkv_norm_rope: {pair:.4} ms ({:.0} TFLOP/s; the linear alone {lin:.4} ms, {:.0} TFLOP/s)", tflops(pair), tflops(lin));
    if !c.has_sm90a() {
        println!("  fused {QKV_KERNEL}: not on this GPU (sm_90a only): the op runs the pair");
        return Ok(());
    }
    let ms = timed(&|| c.linear_qkv_norm_rope_fused(&x, &w, None, &wq, &wk, &cs, &sn, HEADS, EPS))?;
    println!("  fused {QKV_KERNEL} (persistent): {ms:.4} ms ({:.0} TFLOP/s), {:.3}x the pair", tflops(ms), pair / ms);
    // e4m3 (`--precision fp8`): cuBLASLt's fp8 product + qkv_norm_rope against the e4m3 kernel
    let c8 = cuda.with_precision(Precision::Fp8);
    let ((xq, xs), (w8, ws)) = (c8.quantize_fp8(&x)?, c8.quantize_fp8(&w)?);
    let timed8 = |f: &dyn Fn() -> Result<CudaTensor>| time_ms(&c8, 3, 10, || f().map(|_| ()));
    let pair8 = timed8(&|| c8.qkv_norm_rope(c8.linear_fp8_quantized(&xq, &xs, &w8, &ws)?, HEADS, &wq, &wk, &cs, &sn, EPS))?;
    let ms8 = timed8(&|| c8.linear_qkv_norm_rope_fused(&xq, &w8, Some((&xs, &ws)), &wq, &wk, &cs, &sn, HEADS, EPS))?;
    println!(
        "  e4m3: linear_fp8_quantized + qkv_norm_rope {pair8:.4} ms; fused {QKV_FP8_KERNEL} {ms8:.4} ms ({:.0} TFLOP/s), {:.3}x the pair",
        tflops(ms8),
        pair8 / ms8
    );
    Ok(())
}
