//! Gates of the gated attention's ops on the joined projection (`crates/moss-cuda/src/encoder/attention_qkv_gate.rs`,
//! `cuda/encoder/attention_qkv_gate.cu`) against the CPU twins (the `EncoderOps` defaults on `Cpu`: narrowed copies,
//! `head_norm_rope` twice, the separate gate ops), at the Qwen3.5-9B shapes, each with a planted
//! control the same comparison must reject. Listed in [`crate::check::encoder::GATES`].

use crate::check::encoder::{enc, enc_controls, F32_ROPE};
use crate::check::gates::{shape_str, Cx, Kind, EXACT, F32_ELEMENTWISE, F32_GEMM};
use anyhow::Result;
use moss_core::backend::ops::EncoderOps;
use moss_core::backend::Backend;
use moss_core::tensor::Tensor;

/// Query rows the CPU computes for the long attention gates.
const ATTN_ROWS: usize = 48;

/// Width of the joined q|gate, k, v projection.
fn width() -> usize {
    use enc::*;
    (2 * HEADS + 2 * KV_HEADS) * HEAD_DIM
}

/// q and k normed + RoPE'd and v copied out of y (`qkrope`, and the default `rope_tab` + `qkrope_t`,
/// bit for bit the same); control: position t + 1 (in `rope_tab` for the table path).
pub fn gate_qkv_rope(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let heads = (HEADS, KV_HEADS, HEAD_DIM);
    for l in [LENGTHS[0], LENGTHS[1], 777] {
        let n = width();
        let (y, gy) = cx.input(&[l, n], 3.0)?;
        let (wq, gwq) = cx.input(&[HEAD_DIM], 0.3)?;
        let (wk, gwk) = cx.input(&[HEAD_DIM], 0.3)?;
        let (q, k, v) = cx.cpu.attn_qkv_norm_rope(&y, heads, &wq, &wk, EPS, ROT, THETA)?;
        let s = shape_str(&[&[l, n]]);
        let b = cx.out_bound(F32_ROPE);
        for (cu, kind) in [(cx.cuda.clone(), Kind::Gate), (enc_controls(&cx.cuda), Kind::Control)] {
            let r = cu.attn_qkv_rope(&gy, heads, &gwq, &gwk, EPS, ROT, THETA);
            let r = r.and_then(|o| o.ok_or_else(|| anyhow::anyhow!("qkrope_t refused the shapes")));
            let (oq, ok, ov) = match r {
                Ok((a, b, c)) => (Ok(a), Ok(b), Ok(c)),
                Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(anyhow::anyhow!("{e:#}")), Err(anyhow::anyhow!("{e:#}"))),
            };
            if kind == Kind::Control {
                cx.judge("enc attn_qkv_norm_rope q (qkrope_t), position t+1", &s, kind, b, "", oq, &q, None);
                cx.judge("enc attn_qkv_norm_rope k (qkrope_t), position t+1", &s, kind, b, "", ok, &k, None);
                continue;
            }
            cx.judge("enc attn_qkv_norm_rope q (qkrope_t, in place)", &s, kind, b, "", oq, &q, None);
            cx.judge("enc attn_qkv_norm_rope k (qkrope_t, in place)", &s, kind, b, "", ok, &k, None);
            cx.judge("enc attn_qkv_norm_rope v (qkrope_t, copied)", &s, kind, EXACT, "", ov, &v, None);
        }
        // the split path (the fallback for shapes qkrope_t does not take) on the same inputs
        let r = moss_core::backend::ops::encoder::attn_qkv_split(&cx.cuda, &gy, heads, &gwq, &gwk, EPS, ROT, THETA);
        cx.judge("enc attn_qkv_norm_rope q (split: narrow + head_norm_rope)", &s, Kind::Gate, b, "", r.map(|t| t.0), &q, None);
    }
    Ok(())
}

/// The CPU's gated attention rows: `attn(q, k, v)[rows] · σ(gate out of y)`, `[rows, H·hd]`.
fn gated_rows(q: &Tensor, k: &Tensor, v: &Tensor, y: &Tensor, scale: f64, rows: &[usize]) -> Result<Tensor> {
    let (nh, hd) = (q.shape[1], q.shape[2]);
    let ld = y.shape[1];
    let mut out = vec![0f32; rows.len() * nh * hd];
    moss_core::backend::cpu::par_rows(&mut out, nh * hd, |r, row| {
        moss_core::backend::cpu::encoder::causal_attention_row(q, k, v, scale, rows[r], row);
        for h in 0..nh {
            for c in 0..hd {
                let g = y.data[rows[r] * ld + h * 2 * hd + hd + c];
                row[h * hd + c] *= moss_core::backend::cpu::sigmoid(g);
            }
        }
    });
    Tensor::new(vec![rows.len(), nh * hd], out)
}

/// The output gate read in place out of y: alone (`gmulh`; control: the gate of head h + 1), and the whole
/// [`EncoderOps::causal_attention_gated_y`] as the model runs it.
pub fn gate_attn_gate_y(cx: &mut Cx) -> Result<()> {
    use enc::*;
    let n = width();
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    for l in [LENGTHS[0], LENGTHS[1], 777] {
        let (y, gy) = cx.input(&[l, n], 2.0)?;
        // gmulh alone, against the twin's narrow + sigmoid + mul
        let (o, go) = cx.input(&[l, HEADS * HEAD_DIM], 1.0)?;
        let g = cx.cpu.narrow(&cx.cpu.reshape(&cx.cpu.narrow(&y, 1, 0, 2 * HEADS * HEAD_DIM)?, &[l, HEADS, 2 * HEAD_DIM])?, 2, HEAD_DIM, HEAD_DIM)?;
        let want = cx.cpu.mul(&o, &cx.cpu.sigmoid(&cx.cpu.reshape(&g, &[l, HEADS * HEAD_DIM])?)?)?;
        let s = shape_str(&[&[l, HEADS * HEAD_DIM], &[l, n]]);
        let b = cx.out_bound(F32_ELEMENTWISE);
        let none = || anyhow::anyhow!("gmulh refused the shapes");
        let out = cx.cuda.attn_gate_y(&go, &gy, (HEADS, HEAD_DIM)).and_then(|o| o.ok_or_else(none));
        cx.judge("enc attn_gate (gmulh, gate in place in y)", &s, Kind::Gate, b, "", out, &want, None);
        let out = enc_controls(&cx.cuda).attn_gate_y(&go, &gy, (HEADS, HEAD_DIM)).and_then(|o| o.ok_or_else(none));
        cx.judge("enc attn_gate (gmulh), gate of head h+1", &s, Kind::Control, b, "", out, &want, None);

        // the whole gated attention on y's gate
        let (q, gq) = cx.input(&[l, HEADS, HEAD_DIM], 1.0)?;
        let (k, gk) = cx.input(&[l, KV_HEADS, HEAD_DIM], 1.0)?;
        let (v, gv) = cx.input(&[l, KV_HEADS, HEAD_DIM], 1.0)?;
        let rows: Vec<usize> = if l <= 128 {
            (0..l).collect()
        } else {
            let mut r = cx.rng.subset(l, ATTN_ROWS - 4);
            r.extend([0, 1, l - 2, l - 1]);
            r.sort();
            r.dedup();
            r
        };
        let note = if rows.len() < l { format!("CPU on {} of {l} query rows", rows.len()) } else { String::new() };
        let want = gated_rows(&q, &k, &v, &y, scale, &rows)?;
        let s = shape_str(&[&[l, HEADS, HEAD_DIM], &[l, KV_HEADS, HEAD_DIM], &[l, n]]);
        let b = cx.out_bound(F32_GEMM);
        let out = cx.cuda.causal_attention_gated_y(&gq, &gk, &gv, &gy, scale);
        cx.judge("enc causal_attention_gated_y (model path: default kernels)", &s, Kind::Gate, b, &note, out, &want, Some(&rows));
    }
    Ok(())
}
