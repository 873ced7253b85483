//! Gates of the DiT's fused ops (CPU twins in backend/cpu/dit.rs) and the sampler's CFG + Euler
//! step, each with its planted control.

use super::gates::*;
use crate::kernels::{self, controls, Image};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::tensor::{rel_l2, Tensor};

/// The DiT ops' gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[
    ("dit rms_norm_modulate", gate_rms_mod),
    ("dit qk_norm_rope", gate_qk_rope),
    ("dit attention", gate_attention),
    ("dit situ_glu", gate_situ),
    ("dit gated_residual", gate_gres),
    ("dit linear_f32", gate_linear_f32),
    ("cfg_euler", gate_cfg_euler),
];

// ---- the DiT's fused ops (CPU twins in backend/cpu/dit.rs) ------------------------------------

/// `[rows, d]` normals with per-row scales spread over e^±2, like a residual stream.
pub(crate) fn stream_rows(cx: &mut Cx, rows: usize, d: usize) -> Result<Tensor> {
    let scales: Vec<f32> = (0..rows).map(|_| (cx.rng.uniform() * 4.0 - 2.0).exp() as f32).collect();
    let mut x = Tensor::new(vec![rows, d], cx.rng.normals(rows * d, 1.0))?;
    for (r, row) in x.data.chunks_mut(d).enumerate() {
        row.iter_mut().for_each(|v| *v *= scales[r]);
    }
    Ok(x)
}

pub(crate) fn uniform_vec(cx: &mut Cx, d: usize, lo: f64, hi: f64) -> Result<(Tensor, CudaTensor)> {
    let v: Vec<f32> = (0..d).map(|_| (lo + (hi - lo) * cx.rng.uniform()) as f32).collect();
    cx.exact(Tensor::new(vec![d], v)?, cx.dtype)
}

fn gate_rms_mod(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let x = stream_rows(cx, TOKENS, DIM)?;
    let (x, gx) = cx.exact(x, cx.dtype)?;
    let (w, gw) = uniform_vec(cx, DIM, 0.5, 1.5)?;
    let (sh, gsh) = cx.input(&[DIM], 1.0)?;
    let (sc, gsc) = cx.input(&[DIM], 1.0)?;
    let want = cx.cpu.rms_norm_modulate(&x, &w, &sh, &sc, 1e-6)?;
    let s = shape_str(&[&[TOKENS, DIM], &[DIM]]);
    let bound = cx.out_bound(F32_NORM);
    let ctl = cx.cuda.with_image(Image::production().swap(&kernels::RMS_MOD, &controls::CTL_RMS_MOD).swap(&kernels::RMS_MOD_TO, &controls::CTL_RMS_MOD_TO));
    let out = cx.cuda.rms_norm_modulate_op(&gx, &gw, &gsh, &gsc, 1e-6);
    cx.judge("rms_norm_modulate", &s, Kind::Gate, bound, "", out, &want, None);
    let out = ctl.rms_norm_modulate_op(&gx, &gw, &gsh, &gsc, 1e-6);
    cx.judge("rms_norm_modulate, scale without the 1+", &s, Kind::Control, bound, "", out, &want, None);
    if cx.dtype == DType::BF16 {
        // The bf16 forward's f32 residual stream in, the bf16 activation out (`_f32_bf16_to_bf16`).
        let x = stream_rows(cx, TOKENS, DIM)?;
        let (x, gx) = cx.exact(x, DType::F32)?;
        let want = cx.cpu.rms_norm_modulate(&x, &w, &sh, &sc, 1e-6)?;
        let note = "x f32 (the stream), out bf16";
        for (kind, cu, what) in [(Kind::Gate, cx.cuda.clone(), "rms_norm_modulate"), (Kind::Control, ctl, "rms_norm_modulate, scale without the 1+")] {
            let out = cu.rms_norm_modulate_op(&gx, &gw, &gsh, &gsc, 1e-6).and_then(|o| bf16_out(o, "rms_norm_modulate"));
            cx.judge(what, &s, kind, BF16_OUT, note, out, &want, None);
        }
    }
    Ok(())
}

/// The head's last linear with its product kept in f32 (`linear_f32`, the velocity) at the
/// DiT's head shape (4096 image tokens · 3072 → 128), bf16 inputs: against the CPU product (f64
/// accumulation) on 64 random rows at fp32's GEMM bound. Control: the product rounded to bf16 on
/// the way (`linear`, then cast), what the velocity was before. At fp32 the op is `linear`, gated
/// in the generic table.
fn gate_linear_f32(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(());
    }
    let x = stream_rows(cx, IMG, DIM)?;
    let (x, gx) = cx.exact(x, DType::BF16)?;
    let (w, gw) = cx.input(&[128, DIM], 1.0 / (DIM as f64).sqrt())?;
    let rows = cx.rng.subset(IMG, GEMM_REF_ROWS);
    let want = cx.cpu.linear(&super::linear_situ_glu::pick_rows(&x, &rows)?, &w, None)?;
    let s = format!("{IMG}x{DIM} · {DIM}x128");
    let note = format!("out f32; CPU on {} of {IMG} rows", rows.len());
    let out = cx.cuda.linear_f32(&gx, &gw);
    cx.judge("linear_f32 (the velocity)", &s, Kind::Gate, F32_GEMM, &note, out, &want, Some(&rows));
    let out = cx.cuda.linear(&gx, &gw, None).and_then(|y| cx.cuda.cast(&y, DType::F32));
    cx.judge("linear_f32, the product rounded to bf16", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
    Ok(())
}

/// `t` if it is bf16 (the activation dtype a norm of the f32 stream writes), else an error.
pub(crate) fn bf16_out(t: CudaTensor, what: &str) -> Result<CudaTensor> {
    ensure!(t.dtype == DType::BF16, "{what}: output {} where bf16 was expected", t.dtype.name());
    Ok(t)
}

fn gate_qk_rope(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let half = HEAD_DIM / 2;
    let x = stream_rows(cx, TOKENS * HEADS, HEAD_DIM)?;
    let (x, gx) = cx.exact(Tensor::new(vec![TOKENS, HEADS, HEAD_DIM], x.data)?, cx.dtype)?;
    let (w, gw) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
    let theta: Vec<f64> = (0..TOKENS * half).map(|_| cx.rng.uniform() * 200.0 - 100.0).collect();
    let (c, gc) = cx.exact(Tensor::new(vec![TOKENS, half], theta.iter().map(|t| t.cos() as f32).collect())?, cx.dtype)?;
    let (sn, gs) = cx.exact(Tensor::new(vec![TOKENS, half], theta.iter().map(|t| t.sin() as f32).collect())?, cx.dtype)?;
    let want = cx.cpu.qk_norm_rope(&x, &w, &c, &sn, 1e-6)?;
    let s = shape_str(&[&[TOKENS, HEADS, HEAD_DIM], &[TOKENS, half]]);
    let bound = cx.out_bound(F32_NORM);
    let out = cx.cuda.qk_norm_rope_op(&gx, &gw, &gc, &gs, 1e-6);
    cx.judge("qk_norm_rope", &s, Kind::Gate, bound, "", out, &want, None);
    let out = cx.planted(&kernels::QK_ROPE, &controls::CTL_QK_ROPE).qk_norm_rope_op(&gx, &gw, &gc, &gs, 1e-6);
    cx.judge("qk_norm_rope, rotating the other way", &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

/// The CPU twin's attention (f64 scores, max, exp-weighted sum) for the query `rows` only.
pub(crate) fn attention_rows(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, rows: &[usize]) -> Result<Tensor> {
    let (nh, hd) = (q.shape[1], q.shape[2]);
    let mut out = vec![0f32; rows.len() * nh * hd];
    moss_core::backend::cpu::par_rows(&mut out, nh * hd, |r, row| moss_core::backend::cpu::dit::attention_row(q, k, v, scale, rows[r], row));
    Tensor::new(vec![rows.len(), nh * hd], out)
}

fn gate_attention(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let shape = [TOKENS, HEADS, HEAD_DIM];
    let (q, gq) = cx.input(&shape, 2.0)?;
    let (k, gk) = cx.input(&shape, 1.0)?;
    let (v, gv) = cx.input(&shape, 1.0)?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let rows = cx.rng.subset(TOKENS, ATTN_REF_ROWS);
    let want = attention_rows(&q, &k, &v, scale, &rows)?;
    let s = shape_str(&[&shape]);
    let bound = cx.out_bound(F32_GEMM);
    let note = format!("CPU on {} of {TOKENS} query rows", rows.len());
    let cu = cx.cuda.clone();
    let view = |t: Result<CudaTensor>| t.and_then(|t| cu.reshape(&t, &[TOKENS, HEADS * HEAD_DIM]));
    let out = view(cx.cuda.attention_gemm(&gq, &gk, &gv, scale));
    cx.judge("attention (cuBLASLt + softmax)", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
    let out = view(cx.planted(&kernels::SOFTMAX, &controls::CTL_SOFTMAX).attention_gemm(&gq, &gk, &gv, scale));
    cx.judge("attention, normaliser short of 64 keys", &s, Kind::Control, bound, &note, out, &want, Some(&rows));
    let out = view(cx.cuda.attention_gemm(&gq, &gk, &gv, 1.0));
    cx.judge("attention without the 1/sqrt(hd) scale", &s, Kind::Control, bound, &note, out, &want, Some(&rows));
    // The subset reference is the CPU twin's loop: confirm on a size the twin itself can do.
    if cx.dtype == DType::F32 {
        let small = [96, 2, HEAD_DIM];
        let (a, b, c) = (
            Tensor::new(small.to_vec(), cx.rng.normals(96 * 2 * HEAD_DIM, 2.0))?,
            Tensor::new(small.to_vec(), cx.rng.normals(96 * 2 * HEAD_DIM, 1.0))?,
            Tensor::new(small.to_vec(), cx.rng.normals(96 * 2 * HEAD_DIM, 1.0))?,
        );
        let all: Vec<usize> = (0..96).collect();
        let twin = cx.cpu.attention(&a, &b, &c, scale)?;
        let mine = attention_rows(&a, &b, &c, scale, &all)?;
        ensure!(rel_l2(&mine.data, &twin.data) == 0.0, "the gate's row-subset attention reference differs from the CPU twin");
    }
    Ok(())
}

/// `cuda` with SiTU-GLU's planted twins (up and gate swapped), both forms.
pub(crate) fn situ_controls(cuda: &Cuda) -> Cuda {
    cuda.with_image(Image::production().swap(&kernels::SITU, &controls::CTL_SITU).swap(&kernels::SITU_FAST, &controls::CTL_SITU_FAST))
}

fn gate_situ(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let shape = [TOKENS, 2 * FFN];
    let (x, gx) = cx.input(&shape, 4.0)?;
    let want = cx.cpu.situ_glu(&x)?;
    let s = shape_str(&[&shape]);
    let bound = cx.out_bound(F32_TRANSCENDENTAL);
    // bf16 runs the fast form (`moss_situ_fast_bf16`), fp32 the libm one.
    let what = if cx.dtype == DType::BF16 { " (fast form)" } else { "" };
    let out = cx.cuda.situ_glu_op(&gx);
    cx.judge(&format!("situ_glu{what}"), &s, Kind::Gate, bound, "", out, &want, None);
    let out = situ_controls(&cx.cuda).situ_glu_op(&gx);
    cx.judge(&format!("situ_glu{what}, up and gate swapped"), &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

fn gate_gres(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let (x, gx) = cx.input(&[TOKENS, DIM], 1.0)?;
    let (y, gy) = cx.input(&[TOKENS, DIM], 1.0)?;
    let (g, gg) = cx.input(&[DIM], 1.0)?;
    let want = cx.cpu.gated_residual(&x, &y, &g)?;
    let s = shape_str(&[&[TOKENS, DIM], &[DIM]]);
    let bound = cx.out_bound(F32_ELEMENTWISE);
    let out = cx.cuda.gated_residual_op(&gx, &gy, &gg);
    cx.judge("gated_residual", &s, Kind::Gate, bound, "", out, &want, None);
    let out = cx.planted(&kernels::GRES, &controls::CTL_GRES).gated_residual_op(&gx, &gy, &gg);
    cx.judge("gated_residual with 1+gate", &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

fn gate_cfg_euler(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::F32 {
        return Ok(()); // the latents and the update are f32 at either precision
    }
    let shape = [1, LATENT, 64, 64];
    let (x, gx) = cx.input(&shape, 1.0)?;
    let (c, gc) = cx.input(&shape, 1.0)?;
    let (u, gu) = cx.input(&shape, 1.0)?;
    let (g, ds) = (3.0f32, -0.05f32);
    let s = shape_str(&[&shape]);
    let want = cx.cpu.cfg_euler(&x, &c, Some(&u), g, ds)?;
    let out = cx.cuda.cfg_euler(&gx, &gc, Some(&gu), g, ds);
    cx.judge("cfg_euler", &s, Kind::Gate, F32_ELEMENTWISE, "", out, &want, None);
    let out = cx.cuda.cfg_euler(&gx, &gu, Some(&gc), g, ds);
    cx.judge("cfg_euler, cond and uncond swapped", &s, Kind::Control, F32_ELEMENTWISE, "", out, &want, None);
    let want = cx.cpu.cfg_euler(&x, &c, None, g, ds)?;
    let out = cx.cuda.cfg_euler(&gx, &gc, None, g, ds);
    cx.judge("cfg_euler (no uncond)", &s, Kind::Gate, F32_ELEMENTWISE, "", out, &want, None);
    let out = cx.cuda.cfg_euler(&gx, &gc, None, g, -ds);
    cx.judge("cfg_euler stepping backwards", &s, Kind::Control, F32_ELEMENTWISE, "", out, &want, None);
    Ok(())
}
