//! Gates of the byte-floor row kernels (`crates/moss-cuda/src/encoder/row_ops.rs`, `cuda/encoder/row_ops.cu`)
//! against the CPU twins, at the Qwen3.5-9B shapes (plus a length that is no multiple of the
//! conv's token run), each with a planted control the same comparison must reject. The previous
//! kernels keep their own rows (check/encoder.rs, check/encoder_strided.rs; `rms1` here). Listed in
//! [`crate::check::encoder::GATES`].

use crate::check::encoder::{enc, enc_controls};
use crate::check::gates::{shape_str, Cx, Kind, EXACT, F32_ELEMENTWISE, F32_NORM, F32_TRANSCENDENTAL};
use crate::encoder::row_ops::{CONV_KERNEL, CONV_TT, CONV_V, GRMS};
use crate::ops::DType;
use anyhow::{anyhow, Result};
use moss_core::backend::ops::encoder::Cols;
use moss_core::backend::ops::EncoderOps;
use moss_core::backend::Backend;
use moss_core::tensor::Tensor;

/// A kernel that declined the shape fails its gate.
fn some<T>(r: Result<Option<T>>) -> Result<T> {
    r.and_then(|o| o.ok_or_else(|| anyhow!("no kernel for this shape")))
}

/// Values exact in bf16, so one reference serves the f32 and the bf16 copy.
fn bf16_exact(v: Vec<f32>) -> Vec<f32> {
    v.into_iter().map(|x| half::bf16::from_f32(x).to_f32()).collect()
}

/// The conv (K = 4, [`CONV_KERNEL`]) with the DeltaNet gates as extra blocks of its launch, and
/// alone, columns read in place out of `[L, qkv | z | a | b]`; A_log and dt_bias as f32 and as
/// bf16. Controls: taps reversed (conv), softplus left out (g).
pub fn gate_convg(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let vd = V_HEADS * DV;
    let n = CONV + vd + 2 * V_HEADS;
    let cols = (CONV + vd, CONV + vd + V_HEADS, V_HEADS);
    for l in [100, LENGTHS[0], LENGTHS[1]] {
        let (y, gy) = cx.input(&[l, n], 1.5)?;
        let (w, gw) = cx.input(&[CONV, 1, CONV_K], 0.5)?;
        let al = bf16_exact((0..V_HEADS).map(|_| (0.5 + 15.5 * cx.rng.uniform()).ln() as f32).collect());
        let dt = bf16_exact(cx.rng.normals(V_HEADS, 4.0));
        let (al, dt) = (Tensor::new(vec![V_HEADS], al)?, Tensor::new(vec![V_HEADS], dt)?);
        let want = cx.cpu.causal_conv1d_silu_cols(Cols { of: &y, start: 0, len: CONV }, &w)?;
        let (wg, wb) = cx.cpu.gdn_gates_cols(Cols { of: &y, start: cols.0, len: cols.2 }, Cols { of: &y, start: cols.1, len: cols.2 }, &al, &dt)?;
        let sy = format!("columns of {l}x{n}");
        let bc = cx.out_bound(F32_TRANSCENDENTAL);
        for gdt in [DType::F32, DType::BF16] {
            let (_, gal) = cx.exact(al.clone(), gdt)?;
            let (_, gdtb) = cx.exact(dt.clone(), gdt)?;
            let gn = if gdt == DType::BF16 { "bf16" } else { "f32" };
            let note = format!("{CONV_KERNEL}: {CONV_V} channels x {CONV_TT} tokens a thread, A_log/dt_bias {gn}");
            let r = cx.cuda.convg_cols(&gy, (0, CONV), &gw, Some((cols, &gal, &gdtb)));
            let (c, g, b) = match some(r) {
                Ok((c, Some((g, b)))) => (Ok(c), Ok(g), Ok(b)),
                Ok((_, None)) => (Err(anyhow!("no gates")), Err(anyhow!("no gates")), Err(anyhow!("no gates"))),
                Err(e) => (Err(anyhow!("{e:#}")), Err(anyhow!("{e:#}")), Err(e)),
            };
            cx.judge("enc convg: causal_conv1d_silu", &sy, Kind::Gate, bc, &note, c, &want, None);
            cx.judge("enc convg: gates g", &sy, Kind::Gate, F32_TRANSCENDENTAL, &format!("{note}, f32 out"), g, &wg, None);
            cx.judge("enc convg: gates beta", &sy, Kind::Gate, F32_TRANSCENDENTAL, &format!("{note}, f32 out"), b, &wb, None);
            let r = enc_controls(&cx.cuda).convg_cols(&gy, (0, CONV), &gw, Some((cols, &gal, &gdtb)));
            let (c, g) = match some(r) {
                Ok((c, g)) => (Ok(c), g.map(|(g, _)| g).ok_or_else(|| anyhow!("no gates"))),
                Err(e) => (Err(anyhow!("{e:#}")), Err(e)),
            };
            cx.judge("enc convg, taps reversed", &sy, Kind::Control, bc, &note, c, &want, None);
            cx.judge("enc convg: g without softplus", &sy, Kind::Control, F32_TRANSCENDENTAL, &format!("{note}, f32 out"), g, &wg, None);
            if gdt == DType::F32 {
                let r = cx.cuda.convg_cols(&gy, (0, CONV), &gw, None);
                cx.judge("enc convg: conv alone", &sy, Kind::Gate, bc, CONV_KERNEL, some(r).map(|(c, _)| c), &want, None);
            }
        }
    }
    Ok(())
}

/// silu_mul8v (halves of `[L, 2·FFN]`), gated_rms_norm_wide (z in place), rms1w and the previous rms1 (the
/// norm after the GEMM's residual epilogue), embed8. Controls: each kernel's planted bug.
pub fn gate_floor_rows(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let vd = V_HEADS * DV;
    let n = CONV + vd + 2 * V_HEADS;
    for l in LENGTHS {
        // silu_mul
        let (y2, gy2) = cx.input(&[l, 2 * FFN], 1.5)?;
        let want = cx.cpu.silu_mul_cols(Cols { of: &y2, start: 0, len: FFN }, Cols { of: &y2, start: FFN, len: FFN })?;
        let s2 = format!("halves of {l}x{}", 2 * FFN);
        let b = cx.out_bound(F32_ELEMENTWISE);
        let out = some(cx.cuda.silu_mul8v(&gy2, FFN));
        cx.judge("enc silu_mul8v, gate|up halves", &s2, Kind::Gate, b, "", out, &want, None);
        let out = some(enc_controls(&cx.cuda).silu_mul8v(&gy2, FFN));
        cx.judge("enc silu_mul8v, gate and up swapped", &s2, Kind::Control, b, "", out, &want, None);
        drop((y2, gy2));
    }
    // gated RMSNorm, z in place: gated_rms_norm_row16 (a row a 16-lane group, fast SiLU; the default) and gated_rms_norm_wide
    // (heads over 128), at an odd length and the model's two
    for l in [101, LENGTHS[0], LENGTHS[1]] {
        let (y, gy) = cx.input(&[l, n], 1.5)?;
        let (x, gx) = cx.input(&[l, V_HEADS, DV], 1.0)?;
        let (wn, gwn) = cx.input(&[DV], 1.0)?;
        let want = cx.cpu.gated_rms_norm_cols(&x, Cols { of: &y, start: CONV, len: vd }, &wn, EPS)?;
        let sy = format!("columns of {l}x{n}");
        let b = cx.out_bound(F32_NORM.max(F32_TRANSCENDENTAL));
        for k in GRMS {
            let name = k.info.stem.trim_start_matches("moss_enc_");
            let out = some(cx.cuda.grms_cols(&gx, &gy, CONV, &gwn, EPS, k));
            cx.judge(&format!("enc {name}, z strided"), &sy, Kind::Gate, b, "", out, &want, None);
            let out = some(enc_controls(&cx.cuda).grms_cols(&gx, &gy, CONV, &gwn, EPS, k));
            cx.judge(&format!("enc {name}, sigmoid gate"), &sy, Kind::Control, b, "", out, &want, None);
        }
    }
    // the norm after the residual epilogue: hidden (two vectors a thread) and 8192 (four)
    for (l, d) in [(LENGTHS[0], HIDDEN), (LENGTHS[1], HIDDEN), (LENGTHS[0], 2 * HIDDEN)] {
        let (x, gx) = cx.input(&[l, d], 1.0)?;
        let (w, gw) = cx.input(&[d], 0.3)?;
        let want = cx.cpu.rms_norm(&x, Some(&w), EPS, true)?;
        let s = shape_str(&[&[l, d]]);
        let b = cx.out_bound(F32_NORM);
        let out = cx.cuda.rms1w(&gx, &gw, EPS);
        cx.judge("enc rms1w", &s, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).rms1w(&gx, &gw, EPS);
        cx.judge("enc rms1w, weight without 1 +", &s, Kind::Control, b, "", out, &want, None);
    }
    // embed
    for l in LENGTHS {
        let (table, gt) = cx.input(&[VOCAB, HIDDEN], 1.0)?;
        let ids: Vec<u32> = (0..l).map(|_| (cx.rng.next_u64() % (VOCAB as u64 - 1)) as u32).collect();
        let want = cx.cpu.embed(&table, &ids)?;
        let s = shape_str(&[&[VOCAB, HIDDEN], &[l]]);
        let out = some(cx.cuda.embed8(&gt, &ids));
        cx.judge("enc embed8", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = some(enc_controls(&cx.cuda).embed8(&gt, &ids));
        cx.judge("enc embed8, id + 1", &s, Kind::Control, EXACT, "", out, &want, None);
    }
    Ok(())
}
