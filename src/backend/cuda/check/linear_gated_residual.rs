//! Gate of [`DitOps::linear_gated_residual`] (the fused Hopper kernel
//! `moss_dit_linear_gated_residual`, or cuBLASLt + `gated_residual` where it does not run) against
//! the CPU twin, with a planted control; and its timing, as the block would use it, against the
//! path it would replace.

use super::dit_ops::{stream_rows, uniform_vec};
use super::gates::*;
use super::linear_situ_glu::pick_rows;
use crate::backend::cuda::dit::GRES_KERNEL;
use crate::backend::cuda::ops::{Cuda, DType};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use crate::options::Precision;
use crate::tensor::Tensor;
use anyhow::Result;

/// The bound of the f32 stream's gated residual: the product is rounded to bf16 on both sides, and
/// where the GPU's fp32 and the CPU's f64 accumulation straddle a bf16 rounding boundary (a
/// fraction ~1e-4 of the products) the two differ by one bf16 ulp of `y·gate`: ~5e-5 relative.
/// The stream itself rounds once, to f32. A stream stored as bf16 would be ~1e-3 off.
const F32_STREAM: f64 = 3e-4;

/// The gate, in table order.
pub const GATES: &[(&str, GateFn)] = &[("dit linear_gated_residual", gate_linear_gres)];

/// bf16: the op (on Hopper the fused kernel, persistent), else cuBLASLt + `gated_residual`, at the
/// DiT's o shape (4224 x 3072 · 3072 x 3072), its ffn_down shape (4224 x 8192 · 8192 x 3072) and a
/// ragged one (333 x 512 · 512 x 512: a partial last row tile, 8 K steps round the ring twice).
/// The reference is the CPU twin at the unfused path's rounding points: the product in f64 (the
/// CPU `linear`) rounded to bf16 as the unfused path stores it, then the CPU `gated_residual`; on
/// 64 random rows at the DiT's shapes, every row of the other. Control (o shape): the gate read 8
/// columns off (Hopper: the kernel's check-image twin); elsewhere the unfused pair with the planted
/// `gated_residual` (`moss_ctl`). fp32 has no fused kernel: its op is the pair, each gated on its own.
fn gate_linear_gres(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(());
    }
    let hopper = cx.cuda.has_sm90a();
    let cases = [(TOKENS, DIM, DIM, DType::BF16), (TOKENS, FFN, DIM, DType::BF16), (333, 512, 512, DType::BF16), (TOKENS, DIM, DIM, DType::F32)];
    for (case, (m, k, d, xt)) in cases.into_iter().enumerate() {
        let a = stream_rows(cx, m, k)?;
        let (a, ga) = cx.exact(a, DType::BF16)?;
        let (w, gw) = cx.input(&[d, k], 2.0 / (k as f64).sqrt())?;
        let x = stream_rows(cx, m, d)?;
        let (x, gx) = cx.exact(x, xt)?;
        let (gate, gg) = uniform_vec(cx, d, -1.0, 1.0)?;
        let rows = cx.rng.subset(m, if case < 2 { GEMM_REF_ROWS } else { m });
        let y = round_bf16(&cx.cpu.linear(&pick_rows(&a, &rows)?, &w, None)?);
        let want = cx.cpu.gated_residual(&pick_rows(&x, &rows)?, &y, &gate)?;
        let s = format!("{m}x{k} · {k}x{d}{}", if xt == DType::F32 { ", x f32 (the stream)" } else { "" });
        let note = if rows.len() < m { format!("CPU on {} of {m} rows", rows.len()) } else { String::new() };
        let (bound, rows) = (if xt == DType::F32 { F32_STREAM } else { BF16_OUT }, Some(&rows[..]));
        let out = cx.cuda.linear_gated_residual(&ga, &gw, &gx, &gg);
        if hopper {
            cx.judge(&format!("linear_gated_residual (op: fused {GRES_KERNEL})"), &s, Kind::Gate, bound, &note, out, &want, rows);
            if case == 0 || xt == DType::F32 {
                let out = cx.cuda.linear_gated_residual_fused(&ga, &gw, &gx, &gg, &format!("{GRES_KERNEL}_gate_shift_control"));
                cx.judge("linear_gated_residual (fused), gate read 8 columns off", &s, Kind::Control, bound, &note, out, &want, rows);
            }
        } else {
            cx.judge("linear_gated_residual (cuBLASLt + gated_residual)", &s, Kind::Gate, bound, &note, out, &want, rows);
            if case == 0 {
                let cu = cx.cuda.clone();
                let out = cu.linear(&ga, &gw, None).and_then(|y| cu.gated_residual_with(&gx, &y, &gg, "moss_ctl"));
                cx.judge("linear_gated_residual (cuBLASLt + gated_residual), planted gres", &s, Kind::Control, bound, &note, out, &want, rows);
            }
        }
    }
    Ok(())
}

/// As the block would run it, bf16, at the o and the ffn_down shapes, on a bf16 and on an f32
/// stream: cuBLASLt `linear` + `gated_residual_norm_modulate` (today's path) against the fused
/// kernel + `rms_norm_modulate` (the path it would be): CUDA events, median of 10 after 3 warm-up runs.
pub fn time_linear_gres(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Bf16);
    let mut rng = Rng::new(13);
    let mut up = |shape: &[usize], std: f64, dt: DType| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(shape.iter().product(), std))?, dt);
    let xs = [up(&[TOKENS, DIM], 1.0, DType::BF16)?, up(&[TOKENS, DIM], 1.0, DType::F32)?];
    let (gate, nw, shift, scale) = (up(&[DIM], 0.5, DType::BF16)?, up(&[DIM], 1.0, DType::BF16)?, up(&[DIM], 0.5, DType::BF16)?, up(&[DIM], 0.5, DType::BF16)?);
    let eps = 1e-6;
    println!("timing: linear_gated_residual, bf16, CUDA events, median of 10 after 3 warm-up runs");
    for (what, k) in [("o", DIM), ("ffn_down", FFN)] {
        let (a, w) = (up(&[TOKENS, k], 1.0, DType::BF16)?, up(&[DIM, k], 0.02, DType::BF16)?);
        for x in &xs {
            let pair = time_ms(&c, 3, 10, || c.gated_residual_norm_modulate(x, &c.linear(&a, &w, None)?, &gate, &nw, &shift, &scale, eps).map(|_| ()))?;
            let s = format!("{TOKENS}x{k} · {k}x{DIM}, stream {}", x.dtype.name());
            println!("  {what} {s}: cuBLASLt linear + gated_residual_norm_modulate: {pair:.4} ms");
            if !c.has_sm90a() {
                println!("  {what} {s}: fused {GRES_KERNEL}: not on this GPU (sm_90a only)");
                continue;
            }
            let fused = || c.rms_norm_modulate(&c.linear_gated_residual_fused(&a, &w, x, &gate, GRES_KERNEL)?, &nw, &shift, &scale, eps);
            let ms = time_ms(&c, 3, 10, || fused().map(|_| ()))?;
            println!("  {what} {s}: fused {GRES_KERNEL} + rms_norm_modulate: {ms:.4} ms, {:.3}x the pair", pair / ms);
        }
    }
    Ok(())
}
