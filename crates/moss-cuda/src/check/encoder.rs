//! The encoder's kernel gates (`cuda/encoder/encoder_ops.cu` against the CPU twins of
//! `backend/cpu/encoder.rs`), at the Qwen3.5-9B shapes for a 128- and a 4096-token prompt, each
//! with a planted control (`moss_ctl_enc_*`) that the same comparison must reject. Registered
//! in [`GATES`] (run by [`crate::check::gates::run_all`]).

use crate::check::gates::{shape_str, Cx, Kind, BF16_OUT, EXACT, F32_ELEMENTWISE, F32_GEMM, F32_NORM, F32_TRANSCENDENTAL};
use crate::encoder::delta_rule::gdr_seq_smem;
use crate::encoder::delta_rule_compact::{pick_state_pass, StatePass};
use crate::encoder::{EncAttn, GdrPath, ATTN_TILED_MAX};
use crate::kernels::{self, controls, Image};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::cpu::encoder::{delta_rule_chunked, DeltaInputs};
use moss_core::backend::ops::encoder::DELTA_CHUNK;
use moss_core::backend::ops::EncoderOps;
use moss_core::backend::Backend;
use moss_core::tensor::{rel_l2, Tensor};

/// Qwen3.5-9B's text backbone (spec 3.1).
pub mod enc {
    pub const LENGTHS: [usize; 2] = [128, 4096];
    pub const HIDDEN: usize = 4096;
    pub const FFN: usize = 12288;
    pub const HEADS: usize = 16;
    pub const KV_HEADS: usize = 4;
    pub const HEAD_DIM: usize = 256;
    pub const ROT: usize = 64;
    pub const THETA: f64 = 1e7;
    pub const K_HEADS: usize = 16;
    pub const V_HEADS: usize = 32;
    pub const DK: usize = 128;
    pub const DV: usize = 128;
    pub const CONV: usize = 2 * K_HEADS * DK + V_HEADS * DV;
    pub const CONV_K: usize = 4;
    pub const EPS: f64 = 1e-6;
    /// Rows of the embedding table the gate draws (the real one has 248k).
    pub const VOCAB: usize = 4096;
}

/// fp32 head norm + RoPE: the norm (`rsqrtf`, ≤ 2 ulp) then `sincosf` of an angle identical on
/// both sides (up to 4096 rad; full range reduction, ~1 ulp) and two products.
pub const F32_ROPE: f64 = 5e-6;
/// fp32 chunked delta rule against the f64 twin: fp32 dot products of length dk/64, the
/// forward substitution through `I + A` and a state carried over L/64 chunks in fp32; rounding
/// grows with the chunk count (≈ u·√(L/64·64) ≈ 4e-6 at L = 4096), the substitution can amplify
/// it a few times. 1e-4 leaves that an order of magnitude; a wrong formula is O(1e-2) or more.
pub const F32_DELTA: f64 = 1e-4;
/// A prompt length whose last delta-rule chunk is partial (200 = 3·64 + 8; the TMA kernel's q
/// rows past the prompt are zero-filled by the copy unit).
const GDR_PARTIAL: usize = 200;
/// Query rows the CPU computes for the 4096-token attention gate.
const ATTN_ROWS: usize = 48;

fn bound(cx: &Cx, f32_bound: f64) -> f64 {
    cx.out_bound(f32_bound)
}

/// The backend with every encoder kernel replaced by its planted twin (`moss_ctl_enc_*`), and the
/// generic RMSNorm by its twin without the `1 +` (what `add_rms_norm` falls back to for widths
/// its kernel does not take).
pub(crate) fn enc_controls(cuda: &Cuda) -> Cuda {
    cuda.with_image(Image::production().twins(|s| s.starts_with("moss_enc_")).swap(&kernels::RMS_NORM, &controls::CTL_RMS_NOPLUS))
}

fn gate_embed(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for l in LENGTHS {
        let (table, gt) = cx.input(&[VOCAB, HIDDEN], 1.0)?;
        let ids: Vec<u32> = (0..l).map(|_| (cx.rng.next_u64() % (VOCAB as u64 - 1)) as u32).collect();
        let want = cx.cpu.embed(&table, &ids)?;
        let s = shape_str(&[&[VOCAB, HIDDEN], &[l]]);
        let out = cx.cuda.embed_rows(&gt, &ids);
        cx.judge("enc embed", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = enc_controls(&cx.cuda).embed_rows(&gt, &ids);
        cx.judge("enc embed, id + 1", &s, Kind::Control, EXACT, "", out, &want, None);
    }
    Ok(())
}

fn gate_head_rope(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for l in LENGTHS {
        for nh in [HEADS, KV_HEADS] {
            let shape = [l, nh, HEAD_DIM];
            let (x, gx) = cx.input(&shape, 3.0)?;
            let (w, gw) = cx.input(&[HEAD_DIM], 0.3)?;
            let want = cx.cpu.head_norm_rope(&x, &w, EPS, ROT, THETA)?;
            let s = shape_str(&[&shape]);
            let b = bound(cx, F32_ROPE);
            let out = cx.cuda.head_norm_rope_op(&gx, &gw, EPS, ROT, THETA);
            cx.judge("enc head_norm_rope", &s, Kind::Gate, b, "", out, &want, None);
            let out = enc_controls(&cx.cuda).head_norm_rope_op(&gx, &gw, EPS, ROT, THETA);
            cx.judge("enc head_norm_rope, position t+1", &s, Kind::Control, b, "", out, &want, None);
        }
    }
    Ok(())
}

/// The CPU twin's causal GQA attention (f64) for the query `rows` only: `[rows, H·hd]`.
fn causal_rows(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, rows: &[usize]) -> Result<Tensor> {
    let (nh, hd) = (q.shape[1], q.shape[2]);
    let mut out = vec![0f32; rows.len() * nh * hd];
    moss_core::backend::cpu::par_rows(&mut out, nh * hd, |r, row| moss_core::backend::cpu::encoder::causal_attention_row(q, k, v, scale, rows[r], row));
    Tensor::new(vec![rows.len(), nh * hd], out)
}

fn gate_attention(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    if !cx.cuda.has_sm90a() && cx.dtype == DType::BF16 {
        println!("  enc causal attention: no sm_90a kernels on this GPU/build; the wgmma kernel is not gated (not used either)");
    }
    // the real lengths and one with partial query and key tiles
    for l in [LENGTHS[0], LENGTHS[1], 777] {
        let (q, gq) = cx.input(&[l, HEADS, HEAD_DIM], 1.0)?;
        let (k, gk) = cx.input(&[l, KV_HEADS, HEAD_DIM], 1.0)?;
        let (v, gv) = cx.input(&[l, KV_HEADS, HEAD_DIM], 1.0)?;
        // Queries after head_norm are O(1) per dim: scores of spread ~√hd·scale = 1, peaky enough.
        let (want, rows, note) = if l <= 128 {
            (cx.cpu.causal_attention(&q, &k, &v, scale)?, None, String::new())
        } else {
            let mut rows = cx.rng.subset(l, ATTN_ROWS - 4);
            rows.extend([0, 1, l - 2, l - 1]);
            rows.sort();
            rows.dedup();
            let note = format!("CPU on {} of {l} query rows", rows.len());
            (causal_rows(&q, &k, &v, scale, &rows)?, Some(rows), note)
        };
        let want = Tensor::new(vec![want.numel() / (HEADS * HEAD_DIM), HEADS * HEAD_DIM], want.data)?;
        let s = shape_str(&[&[l, HEADS, HEAD_DIM], &[l, KV_HEADS, HEAD_DIM]]);
        let b = bound(cx, F32_GEMM);
        let cu = cx.cuda.clone();
        let view = |t: Result<CudaTensor>| t.and_then(|t| cu.reshape(&t, &[l, HEADS * HEAD_DIM]));
        // the flash kernel takes long bf16 prompts; the cuBLASLt path stays gated (the fp32 path)
        // (and on Hopper the wgmma flash kernel, the default there; the mma.sync one everywhere else)
        let flash_paths = flash_paths(cx);
        let paths: Vec<EncAttn> =
            if l > ATTN_TILED_MAX && cx.dtype == DType::BF16 { flash_paths.iter().copied().chain([EncAttn::Gemm]).collect() } else { vec![EncAttn::Flash] };
        for &path in &paths {
            let out = view(cx.cuda.causal_attention_on(&gq, &gk, &gv, scale, path));
            let (name, ctl) = if l <= ATTN_TILED_MAX {
                ("enc causal_attention (tiled kernel)", "enc causal_attention, KV head h % Hkv")
            } else if path == EncAttn::Flash && cx.dtype == DType::BF16 {
                ("enc causal_attention (flash, hd 256)", "enc causal_attention (flash), key t+1 leaks in")
            } else if path == EncAttn::Wgmma && cx.dtype == DType::BF16 {
                ("enc causal_attention (flash wgmma sm_90a, hd 256)", "enc causal_attention (flash wgmma), key t+1 leaks in")
            } else {
                ("enc causal_attention (cuBLASLt + causal softmax)", "enc causal_attention, key t+1 leaks in")
            };
            cx.judge(name, &s, Kind::Gate, b, &note, out, &want, rows.as_deref());
            let out = view(enc_controls(&cx.cuda).causal_attention_on(&gq, &gk, &gv, scale, path));
            cx.judge(ctl, &s, Kind::Control, b, &note, out, &want, rows.as_deref());
        }
        // The sigmoid output gate read out of a q_proj-shaped [L, H, 2·hd] input: the unfused
        // path (narrow, sigmoid, mul), what the model runs where gmulh does not take the shapes.
        if l > ATTN_TILED_MAX && cx.dtype == DType::BF16 {
            let (qg, gqg) = cx.input(&[l, HEADS, 2 * HEAD_DIM], 2.0)?;
            let picked: Vec<usize> = rows.clone().unwrap_or_else(|| (0..l).collect());
            let mut wg = want.clone();
            for (i, &r) in picked.iter().enumerate() {
                for h in 0..HEADS {
                    for c in 0..HEAD_DIM {
                        let g = qg.data[(r * HEADS + h) * 2 * HEAD_DIM + HEAD_DIM + c];
                        wg.data[(i * HEADS + h) * HEAD_DIM + c] *= moss_core::backend::cpu::sigmoid(g);
                    }
                }
            }
            let gs = shape_str(&[&[l, HEADS, HEAD_DIM], &[l, KV_HEADS, HEAD_DIM], &[l, HEADS, 2 * HEAD_DIM]]);
            let out = moss_core::backend::ops::encoder::causal_attention_gated_unfused(&cx.cuda, &gq, &gk, &gv, &gqg, scale);
            cx.judge("enc causal_attention_gated (unfused: narrow, sigmoid, mul)", &gs, Kind::Gate, b, &note, out, &wg, rows.as_deref());
        }
    }
    // The subset reference is the twin's loop: confirm it on a size the twin does in full.
    if cx.dtype == DType::F32 {
        let (l, nh, nkv, hd) = (80, 4, 2, 32);
        let q = Tensor::new(vec![l, nh, hd], cx.rng.normals(l * nh * hd, 1.0))?;
        let k = Tensor::new(vec![l, nkv, hd], cx.rng.normals(l * nkv * hd, 1.0))?;
        let v = Tensor::new(vec![l, nkv, hd], cx.rng.normals(l * nkv * hd, 1.0))?;
        let all: Vec<usize> = (0..l).collect();
        let twin = cx.cpu.causal_attention(&q, &k, &v, 0.3)?;
        let mine = causal_rows(&q, &k, &v, 0.3, &all)?;
        ensure!(rel_l2(&mine.data, &twin.data) == 0.0, "the gate's row-subset causal attention differs from the CPU twin");
    }
    Ok(())
}

/// The flash attention kernels this device runs: the mma.sync one, and on Hopper (sm_90a kernels
/// loaded) the wgmma one; other GPUs do not have it and do not gate it (said once in the log).
fn flash_paths(cx: &Cx) -> Vec<EncAttn> {
    if cx.cuda.has_sm90a() {
        vec![EncAttn::Flash, EncAttn::Wgmma]
    } else {
        vec![EncAttn::Flash]
    }
}

/// The (L, width) cases of the elementwise gates: the real widths (8-wide vector kernels) and one
/// width that is not a multiple of 8 (the scalar kernels).
fn widths(w: usize) -> [(usize, usize); 3] {
    [(enc::LENGTHS[0], w), (enc::LENGTHS[1], w), (enc::LENGTHS[0], w + 4)]
}

fn gate_silu_mul(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for (l, w) in widths(FFN) {
        let shape = [l, w];
        let (g, gg) = cx.input(&shape, 2.0)?;
        let (u, gu) = cx.input(&shape, 1.0)?;
        let want = cx.cpu.silu_mul(&g, &u)?;
        let s = shape_str(&[&shape]);
        let b = bound(cx, F32_ELEMENTWISE);
        let out = cx.cuda.silu_mul_op(&gg, &gu);
        cx.judge("enc silu_mul", &s, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).silu_mul_op(&gg, &gu);
        cx.judge("enc silu_mul, gate and up swapped", &s, Kind::Control, b, "", out, &want, None);
    }
    Ok(())
}

/// The conv at the real widths (conv8, 8 channels a thread), at a length with no multiple of 64
/// (777), and the scalar kernel on a width that is not a multiple of 8.
fn gate_conv(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for (l, c) in widths(CONV).into_iter().chain([(777, CONV)]) {
        let (x, gx) = cx.input(&[l, c], 1.0)?;
        let (w, gw) = cx.input(&[c, 1, CONV_K], 0.5)?;
        let want = cx.cpu.causal_conv1d_silu(&x, &w)?;
        let s = shape_str(&[&[l, c], &[c, 1, CONV_K]]);
        let b = bound(cx, F32_TRANSCENDENTAL);
        let out = cx.cuda.causal_conv1d_silu(&gx, &gw);
        cx.judge("enc causal_conv1d_silu", &s, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).causal_conv1d_silu(&gx, &gw);
        cx.judge("enc causal_conv1d_silu, taps reversed", &s, Kind::Control, b, "", out, &want, None);
    }
    Ok(())
}

fn gate_gdn_gates(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for l in LENGTHS {
        let (a, ga) = cx.input(&[l, V_HEADS], 3.0)?;
        let (bb, gb) = cx.input(&[l, V_HEADS], 3.0)?;
        // A_log = ln U(0.5, 16) as the model's init; dt_bias around 0 (some above the softplus
        // threshold of 20 together with a: a·3 spreads to ±10).
        let al: Vec<f32> = (0..V_HEADS).map(|_| (0.5 + 15.5 * cx.rng.uniform()).ln() as f32).collect();
        let (al, gal) = cx.exact(Tensor::new(vec![V_HEADS], al)?, DType::F32)?;
        let (dt, gdt) = cx.input_as(&[V_HEADS], 4.0, DType::F32)?;
        let (wg, wb) = cx.cpu.gdn_gates(&a, &bb, &al, &dt)?;
        let s = shape_str(&[&[l, V_HEADS]]);
        let (g, beta) = cx.cuda.gdn_gates_op(&ga, &gb, &gal, &gdt)?;
        cx.judge("enc gdn_gates: g", &s, Kind::Gate, F32_TRANSCENDENTAL, "f32 out", Ok(g), &wg, None);
        cx.judge("enc gdn_gates: beta", &s, Kind::Gate, F32_TRANSCENDENTAL, "f32 out", Ok(beta), &wb, None);
        let out = enc_controls(&cx.cuda).gdn_gates_op(&ga, &gb, &gal, &gdt).map(|(g, _)| g);
        cx.judge("enc gdn_gates: g without softplus", &s, Kind::Control, F32_TRANSCENDENTAL, "f32 out", out, &wg, None);
    }
    Ok(())
}

/// The delta rule with the planted twins (check image) of its state pass / output kernels, the
/// bf16 prep correct. (The prep's own twin: `cx.planted(&kernels::ENC_DELTA_RULE_PREP, ..)`.)
fn pass_controls(cuda: &Cuda) -> Cuda {
    cuda.with_image(Image::production().twins(|s| s.starts_with("moss_enc_") && s != kernels::ENC_DELTA_RULE_PREP.info.stem))
}

/// q, k, v are cut out of one conv-output-shaped input `[L, 2·Hk·dk + Hv·dv]`: the strided
/// kernels read it in place, the others take the narrowed copies; one CPU reference for all.
/// Every kernel the delta rule can take is gated with its planted control: bf16 `delta_rule_prep`
/// (control: T's lower-left block zero), then the Hopper state pass + output (`gdr_tma`),
/// `gdr_seq_tc` + `gdr_out_tc` and the compact `gdr_seq_compact` + `gdr_out_compact` (controls:
/// the state read undecayed); fp32 the SIMT kernels and the compact ones; both the one-kernel
/// sequential version (wide heads, unaligned bf16 rows, bf16 with Hv / Hk odd). The compact pair
/// (what GPUs of 99 KiB a block run) is gated on every GPU; a kernel whose shared memory this GPU
/// does not offer is said not gated (and is not used here either).
fn gate_delta_rule(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let heads = (K_HEADS, DK, V_HEADS, DV);
    let kd = K_HEADS * DK;
    let bf16 = cx.dtype == DType::BF16;
    let tma = bf16 && cx.cuda.has_sm90a();
    if bf16 && !tma {
        println!("  enc gated_delta_rule: no sm_90a kernels on this GPU/build; the Hopper state pass (cuda/encoder/sm90a/delta_rule_tma.cu) is not gated (not used either)");
    }
    let optin = cx.cuda.smem_optin();
    let wide = pick_state_pass(bf16, optin) == Some(StatePass::Wide);
    if !wide {
        println!("  enc gated_delta_rule: {optin} bytes of shared memory a block; the wide state pass (gdr_seq_tc / gdr_seq, up to 182 KiB) is not gated (not used either)");
    }
    let seq_fits = gdr_seq_smem(DK, DV).1 <= optin;
    if !seq_fits {
        println!("  enc gated_delta_rule: the sequential kernel needs {} bytes a block at dk {DK}, this GPU offers {optin}: not gated (the model's shapes take the chunked kernels)", gdr_seq_smem(DK, DV).1);
    }
    // the real lengths, and one whose last chunk is partial
    for l in LENGTHS.into_iter().chain([GDR_PARTIAL]) {
        let (qkv, gqkv) = cx.input(&[l, CONV], 1.0)?;
        let (q, k, v) = (
            cx.cpu.reshape(&cx.cpu.narrow(&qkv, 1, 0, kd)?, &[l, K_HEADS, DK])?,
            cx.cpu.reshape(&cx.cpu.narrow(&qkv, 1, kd, kd)?, &[l, K_HEADS, DK])?,
            cx.cpu.reshape(&cx.cpu.narrow(&qkv, 1, 2 * kd, V_HEADS * DV)?, &[l, V_HEADS, DV])?,
        );
        let cu = cx.cuda.clone();
        let (gq, gk, gv) = (
            cu.reshape(&cu.narrow(&gqkv, 1, 0, kd)?, &[l, K_HEADS, DK])?,
            cu.reshape(&cu.narrow(&gqkv, 1, kd, kd)?, &[l, K_HEADS, DK])?,
            cu.reshape(&cu.narrow(&gqkv, 1, 2 * kd, V_HEADS * DV)?, &[l, V_HEADS, DV])?,
        );
        // Per-step log-decays g = −exp(N(−2.5, 1)) (decays ~0.92 with spread), beta = sigmoid(N).
        let gs: Vec<f32> = cx.rng.normals(l * V_HEADS, 1.0).iter().map(|&z| -((z as f64 - 2.5).exp()) as f32).collect();
        let (g, gg) = cx.exact(Tensor::new(vec![l, V_HEADS], gs)?, DType::F32)?;
        let bs: Vec<f32> = cx.rng.normals(l * V_HEADS, 1.5).iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect();
        let (beta, gbeta) = cx.exact(Tensor::new(vec![l, V_HEADS], bs)?, DType::F32)?;
        let want = delta_rule_chunked(&DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta }, DELTA_CHUNK)?;
        let s = shape_str(&[&[l, K_HEADS, DK], &[l, V_HEADS, DV]]);
        let s2 = shape_str(&[&[l, CONV], &[l, V_HEADS, DV]]);
        if bf16 {
            let (b, note) = (BF16_OUT, "bf16 prep, TF32 state pass, fp32 state");
            // what the model runs (the Hopper kernel there)
            let out = cx.cuda.gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, GdrPath::Auto);
            cx.judge("enc gated_delta_rule (the default path), strided", &s2, Kind::Gate, b, note, out, &want, None);
            let mut paths = vec![];
            if tma {
                paths.push((GdrPath::Tma, "tma (state pass + output, cuda/encoder/sm90a/delta_rule_tma.cu)"));
            }
            if wide {
                paths.push((GdrPath::Tc, "seq_tc + out_tc"));
            }
            paths.push((GdrPath::Compact, "seq_compact + out_compact (<= 96 KiB)"));
            for (path, name) in paths {
                let out = cx.cuda.gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, path);
                cx.judge(&format!("enc gated_delta_rule {name}, strided"), &s2, Kind::Gate, b, note, out, &want, None);
                let out = pass_controls(&cx.cuda).gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, path);
                cx.judge(&format!("enc gated_delta_rule {name}, state read undecayed"), &s2, Kind::Control, b, note, out, &want, None);
                let out = cx.cuda.gated_delta_rule_on(&gq, &gk, &gv, &gg, &gbeta, path);
                cx.judge(&format!("enc gated_delta_rule {name}, contiguous q k v"), &s, Kind::Gate, b, note, out, &want, None);
            }
            // delta_rule_prep's own control (cuda/encoder/delta_rule_prep.cuh: (I + A)⁻¹ blockwise), the rest correct
            // (after it the wide state pass where it fits this GPU, else the compact one)
            let after_prep = if wide { GdrPath::Tc } else { GdrPath::Compact };
            let out =
                cx.planted(&kernels::ENC_DELTA_RULE_PREP, &controls::CTL_ENC_DELTA_RULE_PREP).gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, after_prep);
            cx.judge("enc gated_delta_rule prep tc3p, (I + A)⁻¹ lower-left block zero", &s2, Kind::Control, b, note, out, &want, None);
        } else {
            // fp32: the SIMT chunk kernels
            let (b, note) = (F32_DELTA, "fp32 SIMT");
            let out = cx.cuda.gated_delta_rule_on(&gq, &gk, &gv, &gg, &gbeta, GdrPath::Auto);
            cx.judge("enc gated_delta_rule (chunk-parallel, SIMT)", &s, Kind::Gate, b, note, out, &want, None);
            let out = pass_controls(&cx.cuda).gated_delta_rule_on(&gq, &gk, &gv, &gg, &gbeta, GdrPath::Auto);
            cx.judge("enc gated_delta_rule (SIMT), state read undecayed", &s, Kind::Control, b, note, out, &want, None);
            let out = cx.cuda.gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, GdrPath::Auto);
            cx.judge("enc gated_delta_rule (SIMT), q k v strided from conv out", &s2, Kind::Gate, b, note, out, &want, None);
            let out = pass_controls(&cx.cuda).gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, GdrPath::Auto);
            cx.judge("enc gated_delta_rule (SIMT) strided, state read undecayed", &s2, Kind::Control, b, note, out, &want, None);
            // the compact pair (<= 96 KiB a block, fp32 FMA), on every GPU
            let (name, note) = ("enc gated_delta_rule seq_compact + out_compact (<= 96 KiB)", "fp32 FMA");
            let out = cx.cuda.gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, GdrPath::Compact);
            cx.judge(&format!("{name}, strided"), &s2, Kind::Gate, b, note, out, &want, None);
            let out = pass_controls(&cx.cuda).gated_delta_rule_qkv_on(&gqkv, heads, &gg, &gbeta, GdrPath::Compact);
            cx.judge(&format!("{name}, state read undecayed"), &s2, Kind::Control, b, note, out, &want, None);
            let out = cx.cuda.gated_delta_rule_on(&gq, &gk, &gv, &gg, &gbeta, GdrPath::Compact);
            cx.judge(&format!("{name}, contiguous q k v"), &s, Kind::Gate, b, note, out, &want, None);
        }
        // the one-kernel sequential version (head dims above GDR_MAX_DIM, unaligned bf16 rows)
        if !seq_fits {
            continue;
        }
        let b = if bf16 { BF16_OUT } else { F32_DELTA };
        let out = cx.cuda.gated_delta_rule_seq(&gq, &gk, &gv, &gg, &gbeta);
        cx.judge("enc gated_delta_rule (sequential kernel)", &s, Kind::Gate, b, "fp32 state", out, &want, None);
        let out = enc_controls(&cx.cuda).gated_delta_rule_seq(&gq, &gk, &gv, &gg, &gbeta);
        cx.judge("enc gated_delta_rule (sequential), state read undecayed", &s, Kind::Control, b, "", out, &want, None);
    }
    Ok(())
}

fn gate_gated_rms(cx: &mut Cx) -> Result<()> {
    use enc::*;
    // the real head dim (16 lanes per row, vectors) and one that is not a multiple of 8 (warp per row)
    for (l, dv) in [(LENGTHS[0], DV), (LENGTHS[1], DV), (LENGTHS[0], DV + 4)] {
        let shape = [l, V_HEADS, dv];
        let (x, gx) = cx.input(&shape, 1.0)?;
        let (z, gz) = cx.input(&shape, 2.0)?;
        let (w, gw) = cx.input(&[dv], 1.0)?;
        let want = cx.cpu.gated_rms_norm(&x, &z, &w, EPS)?;
        let s = shape_str(&[&shape]);
        let b = bound(cx, F32_NORM.max(F32_TRANSCENDENTAL));
        let out = cx.cuda.gated_rms_norm_op(&gx, &gz, &gw, EPS);
        cx.judge("enc gated_rms_norm", &s, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).gated_rms_norm_op(&gx, &gz, &gw, EPS);
        cx.judge("enc gated_rms_norm, sigmoid gate", &s, Kind::Control, b, "", out, &want, None);
    }
    Ok(())
}

fn gate_add_rms(cx: &mut Cx) -> Result<()> {
    use enc::*;
    // the real width (block per row) and one that is not a multiple of 8 (generic add + rms_norm)
    for (l, d) in [(LENGTHS[0], HIDDEN), (LENGTHS[1], HIDDEN), (LENGTHS[0], HIDDEN + 4)] {
        let shape = [l, d];
        let (x, gx) = cx.input(&shape, 1.0)?;
        let (h, gh) = cx.input(&shape, 1.0)?;
        let (w, gw) = cx.input(&[d], 0.3)?;
        let (wx, wn) = cx.cpu.add_rms_norm(&x, &h, &w, EPS)?;
        let s = shape_str(&[&shape]);
        let bx = bound(cx, F32_ELEMENTWISE);
        let bn = bound(cx, F32_NORM);
        let (ox, on) = match cx.cuda.add_rms_norm_op(&gx, &gh, &gw, EPS) {
            Ok((a, b)) => (Ok(a), Ok(b)),
            Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(e)),
        };
        cx.judge("enc add_rms_norm: x + h", &s, Kind::Gate, bx, "", ox, &wx, None);
        cx.judge("enc add_rms_norm: norm", &s, Kind::Gate, bn, "", on, &wn, None);
        let on = enc_controls(&cx.cuda).add_rms_norm_op(&gx, &gh, &gw, EPS).map(|(_, n)| n);
        cx.judge("enc add_rms_norm, weight without 1 +", &s, Kind::Control, bn, "", on, &wn, None);
    }
    Ok(())
}

/// The encoder's gates, in table order (chained after the others' in [`crate::check::gates::run_all`]).
pub const GATES: &[(&str, crate::check::gates::GateFn)] = &[
    ("enc embed", gate_embed),
    ("enc head_norm_rope", gate_head_rope),
    ("enc causal_attention", gate_attention),
    ("enc silu_mul", gate_silu_mul),
    ("enc causal_conv1d_silu", gate_conv),
    ("enc gdn_gates", gate_gdn_gates),
    ("enc gated_delta_rule", gate_delta_rule),
    ("enc gated_rms_norm", gate_gated_rms),
    ("enc add_rms_norm", gate_add_rms),
    ("enc linear_cat", crate::check::encoder_strided::gate_linear_cat),
    ("enc strided consumers", crate::check::encoder_strided::gate_cols),
    ("enc linear_add_rms_norm", crate::check::encoder_strided::gate_linear_add),
    ("enc attn_gate", crate::check::encoder_strided::gate_attn_gate),
    ("enc convg", crate::check::encoder_rows::gate_convg),
    ("enc floor rows", crate::check::encoder_rows::gate_floor_rows),
    ("enc attn_qkv_norm_rope", crate::check::encoder_attention::gate_qkv_rope),
    ("enc causal_attention_gated_y", crate::check::encoder_attention::gate_attn_gate_y),
];
