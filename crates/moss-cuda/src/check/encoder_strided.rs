//! Gates of the encoder's fused-projection ops (`crates/moss-cuda/src/encoder/strided_row_ops.rs`,
//! `cuda/encoder/strided_row_ops.cu`) against the CPU twins (the `EncoderOps` defaults on `Cpu`: separate
//! linears, narrowed copies, f64 reductions), at the Qwen3.5-9B shapes, each with a planted
//! control the same comparison must reject. Listed in [`crate::check::encoder::GATES`].

use crate::check::encoder::{enc, enc_controls};
use crate::check::gates::{shape_str, Cx, Kind, F32_ELEMENTWISE, F32_GEMM, F32_NORM, F32_TRANSCENDENTAL};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{anyhow, Result};
use moss_core::backend::ops::encoder::Cols;
use moss_core::backend::ops::EncoderOps;
use moss_core::tensor::Tensor;

/// Rows of a GEMM output the CPU computes here (the GPU output is still checked for non-finite
/// values everywhere).
const REF_ROWS: usize = 32;

fn rows_of(t: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let w = t.shape[t.shape.len() - 1];
    Tensor::new(vec![rows.len(), w], rows.iter().flat_map(|&r| t.data[r * w..(r + 1) * w].iter().copied()).collect())
}

/// The DeltaNet's in_proj_qkv | z | a | b as one GEMM, two (qkv | z, a | b) and four writing one
/// output, and the MLP's gate | up as one; control: the parts
/// concatenated in the wrong order (z before qkv).
pub fn gate_linear_cat(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let inv = 1.0 / (HIDDEN as f64).sqrt();
    for l in LENGTHS {
        let (x, gx) = cx.input(&[l, HIDDEN], 1.0)?;
        let rows = cx.rng.subset(l, REF_ROWS);
        let xs = rows_of(&x, &rows)?;
        let note = format!("CPU on {} of {l} rows", rows.len());
        let b = cx.out_bound(F32_GEMM);
        let mut parts = vec![];
        for n in [CONV, V_HEADS * DV, V_HEADS, V_HEADS] {
            parts.push(cx.input(&[n, HIDDEN], inv)?);
        }
        let (cpu_w, gpu_w): (Vec<Tensor>, Vec<CudaTensor>) = parts.into_iter().unzip();
        let want = cx.cpu.linear_cat(&xs, &cpu_w)?;
        let s = format!("{l}x{HIDDEN} · {HIDDEN}x({CONV}+{}+{V_HEADS}+{V_HEADS})", V_HEADS * DV);
        for (groups, what, kind) in [
            (vec![vec![0, 1, 2, 3]], "enc linear_cat, qkv|z|a|b one GEMM", Kind::Gate),
            (vec![vec![0, 1], vec![2, 3]], "enc linear_cat, qkv|z and a|b", Kind::Gate),
            (vec![vec![0], vec![1], vec![2], vec![3]], "enc linear_cat, four GEMMs into one output", Kind::Gate),
            (vec![vec![1, 0, 2, 3]], "enc linear_cat, parts in the wrong order", Kind::Control),
        ] {
            let out = cx.cuda.cat_weights_grouped(&gpu_w, &groups).and_then(|ws| cx.cuda.linear_cat_op(&gx, &ws));
            cx.judge(what, &s, kind, b, &note, out, &want, Some(&rows));
        }
        if l == LENGTHS[1] {
            let (wg, gwg) = cx.input(&[FFN, HIDDEN], inv)?;
            let (wu, gwu) = cx.input(&[FFN, HIDDEN], inv)?;
            let want = cx.cpu.linear_cat(&xs, &[wg, wu])?;
            let s = format!("{l}x{HIDDEN} · {HIDDEN}x(2·{FFN})");
            let g2 = [gwg, gwu];
            for (groups, what, kind) in [
                (vec![vec![0, 1]], "enc linear_cat, gate|up one GEMM", Kind::Gate),
                (vec![vec![0], vec![1]], "enc linear_cat, gate and up into one output", Kind::Gate),
                (vec![vec![1, 0]], "enc linear_cat, up|gate swapped", Kind::Control),
            ] {
                let out = cx.cuda.cat_weights_grouped(&g2, &groups).and_then(|ws| cx.cuda.linear_cat_op(&gx, &ws));
                cx.judge(what, &s, kind, b, &note, out, &want, Some(&rows));
            }
        }
    }
    Ok(())
}

/// The consumers of the fused projections, reading their columns of one `[L, N]` output in
/// place: the conv, the DeltaNet gates, the gated RMSNorm's z, silu_mul's halves.
pub fn gate_cols(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let vd = V_HEADS * DV;
    let n = CONV + vd + 2 * V_HEADS;
    for l in LENGTHS {
        let (y, gy) = cx.input(&[l, n], 1.5)?;
        let sy = format!("columns of {l}x{n}");
        // conv of columns 0..CONV
        let (w, gw) = cx.input(&[CONV, 1, CONV_K], 0.5)?;
        let want = cx.cpu.causal_conv1d_silu_cols(Cols { of: &y, start: 0, len: CONV }, &w)?;
        let b = cx.out_bound(F32_TRANSCENDENTAL);
        let out = cx.cuda.conv_cols(&gy, 0, CONV, &gw);
        cx.judge("enc causal_conv1d_silu, strided", &sy, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).conv_cols(&gy, 0, CONV, &gw);
        cx.judge("enc causal_conv1d_silu strided, taps reversed", &sy, Kind::Control, b, "", out, &want, None);
        // gates of a, b = the last 2·Hv columns
        let al: Vec<f32> = (0..V_HEADS).map(|_| (0.5 + 15.5 * cx.rng.uniform()).ln() as f32).collect();
        let (al, gal) = cx.exact(Tensor::new(vec![V_HEADS], al)?, DType::F32)?;
        let (dt, gdt) = cx.input_as(&[V_HEADS], 4.0, DType::F32)?;
        let cols = (CONV + vd, CONV + vd + V_HEADS, V_HEADS);
        let (wg, wb) = cx.cpu.gdn_gates_cols(Cols { of: &y, start: cols.0, len: cols.2 }, Cols { of: &y, start: cols.1, len: cols.2 }, &al, &dt)?;
        let (g, beta) = match cx.cuda.gdn_gates_cols_in(&gy, cols, &gal, &gdt) {
            Ok((g, b)) => (Ok(g), Ok(b)),
            Err(e) => (Err(anyhow!("{e:#}")), Err(e)),
        };
        cx.judge("enc gdn_gates strided: g", &sy, Kind::Gate, F32_TRANSCENDENTAL, "f32 out", g, &wg, None);
        cx.judge("enc gdn_gates strided: beta", &sy, Kind::Gate, F32_TRANSCENDENTAL, "f32 out", beta, &wb, None);
        let out = enc_controls(&cx.cuda).gdn_gates_cols_in(&gy, cols, &gal, &gdt).map(|(g, _)| g);
        cx.judge("enc gdn_gates strided: g without softplus", &sy, Kind::Control, F32_TRANSCENDENTAL, "f32 out", out, &wg, None);
        // gated RMSNorm with z = columns CONV..CONV+vd
        let (x, gx) = cx.input(&[l, V_HEADS, DV], 1.0)?;
        let (wn, gwn) = cx.input(&[DV], 1.0)?;
        let want = cx.cpu.gated_rms_norm_cols(&x, Cols { of: &y, start: CONV, len: vd }, &wn, EPS)?;
        let b = cx.out_bound(F32_NORM.max(F32_TRANSCENDENTAL));
        let out = cx.cuda.gated_rms_norm_cols_in(&gx, &gy, CONV, &gwn, EPS);
        cx.judge("enc gated_rms_norm, z strided", &sy, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).gated_rms_norm_cols_in(&gx, &gy, CONV, &gwn, EPS);
        cx.judge("enc gated_rms_norm z strided, sigmoid gate", &sy, Kind::Control, b, "", out, &want, None);
        // silu_mul of the two halves of [L, 2·FFN]
        let (y2, gy2) = cx.input(&[l, 2 * FFN], 1.5)?;
        let want = cx.cpu.silu_mul_cols(Cols { of: &y2, start: 0, len: FFN }, Cols { of: &y2, start: FFN, len: FFN })?;
        let s2 = format!("halves of {l}x{}", 2 * FFN);
        let b = cx.out_bound(F32_ELEMENTWISE);
        let out = cx.cuda.silu_mul_cols_in(&gy2, FFN);
        cx.judge("enc silu_mul, gate|up halves", &s2, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).silu_mul_cols_in(&gy2, FFN);
        cx.judge("enc silu_mul halves, gate and up swapped", &s2, Kind::Control, b, "", out, &want, None);
    }
    Ok(())
}

/// The control of `linear_add_rms_norm`'s x': its GEMM (`linear_into`) with the residual left
/// out of the epilogue.
fn linear_without_residual(cu: &Cuda, a: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
    let (n, k, rows) = (w.shape[0], w.shape[1], a.rows());
    let xo = cu.alloc(w.dtype, &[rows, n])?;
    cu.blas().linear_into(&cu.gpu().stream, w.dtype, (rows, n, k), a.ptr(), w.ptr(), None, xo.ptr(), n)?;
    Ok(xo)
}

/// The output projections with the residual in the GEMM epilogue, then the norm alone: o_proj /
/// out_proj (K = 4096) and down_proj (K = 12288). Controls: the residual left out (x'), the norm
/// weight without its 1 + (n).
pub fn gate_linear_add(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for l in LENGTHS {
        for k in [HIDDEN, FFN] {
            let (a, ga) = cx.input(&[l, k], 1.0)?;
            let (w, gw) = cx.input(&[HIDDEN, k], 1.0 / (k as f64).sqrt())?;
            let (res, gres) = cx.input(&[l, HIDDEN], 1.0)?;
            let (wn, gwn) = cx.input(&[HIDDEN], 0.3)?;
            let rows = cx.rng.subset(l, REF_ROWS);
            let (wx, wnrm) = cx.cpu.linear_add_rms_norm(&rows_of(&a, &rows)?, &w, &rows_of(&res, &rows)?, &wn, EPS)?;
            let s = format!("{l}x{k} · {k}x{HIDDEN} + {l}x{HIDDEN}");
            let note = format!("CPU on {} of {l} rows", rows.len());
            let b = cx.out_bound(F32_GEMM);
            let (ox, on) = match cx.cuda.linear_add_rms_norm_op(&ga, &gw, &gres, &gwn, EPS) {
                Ok((x, n)) => (Ok(x), Ok(n)),
                Err(e) => (Err(anyhow!("{e:#}")), Err(e)),
            };
            cx.judge("enc linear_add_rms_norm: res + a·wᵀ (epilogue)", &s, Kind::Gate, b, &note, ox, &wx, Some(&rows));
            cx.judge("enc linear_add_rms_norm: norm (rms1)", &s, Kind::Gate, b, &note, on, &wnrm, Some(&rows));
            let out = linear_without_residual(&cx.cuda, &ga, &gw);
            cx.judge("enc linear_add_rms_norm, residual left out", &s, Kind::Control, b, &note, out, &wx, Some(&rows));
            let out = enc_controls(&cx.cuda).linear_add_rms_norm_op(&ga, &gw, &gres, &gwn, EPS).map(|(_, n)| n);
            cx.judge("enc linear_add_rms_norm, norm weight without 1 +", &s, Kind::Control, b, &note, out, &wnrm, Some(&rows));
        }
    }
    Ok(())
}

/// The gated attention's output gate in one kernel (`gmulh` with the row stride 2·H·hd):
/// `o · sigmoid(gate)`, the gate read in place out of the q_proj output `[L, H, 2·hd]`. Control:
/// the gate of head h + 1.
pub fn gate_attn_gate(cx: &mut Cx) -> Result<()> {
    use enc::*;
    for l in LENGTHS {
        let (o, go) = cx.input(&[l, HEADS * HEAD_DIM], 1.0)?;
        let (qg, gqg) = cx.input(&[l, HEADS, 2 * HEAD_DIM], 2.0)?;
        let mut want = o.clone();
        for r in 0..l * HEADS {
            for c in 0..HEAD_DIM {
                let g = qg.data[r * 2 * HEAD_DIM + HEAD_DIM + c] as f64;
                let v = &mut want.data[r * HEAD_DIM + c];
                *v = (*v as f64 / (1.0 + (-g).exp())) as f32;
            }
        }
        let s = shape_str(&[&[l, HEADS * HEAD_DIM], &[l, HEADS, 2 * HEAD_DIM]]);
        let b = cx.out_bound(F32_ELEMENTWISE);
        for (cu, kind, what) in [
            (cx.cuda.clone(), Kind::Gate, "enc attn_gate (gmulh on q_proj's [L, H, 2·hd], gate in place)"),
            (enc_controls(&cx.cuda), Kind::Control, "enc attn_gate, the gate of head h + 1"),
        ] {
            let out = cu.attn_gate(&go, &gqg).and_then(|o| o.ok_or_else(|| anyhow!("no kernel for this width")));
            cx.judge(what, &s, kind, b, "", out, &want, None);
        }
    }
    Ok(())
}
