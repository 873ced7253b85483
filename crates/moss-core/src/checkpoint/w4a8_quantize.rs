//! `moss quantize --to w4a8 | w6a8`: comfy-kitchen's `asym_w4a8_int8` ([`super::comfy_quant`]),
//! the layout of Comfy-Org's W4A8 text encoders, made as comfy-kitchen 0.2.40's
//! `quantize_w4a8_int8_weight` makes it with its defaults (symmetric, groups of 16, float8 e4m3
//! group scales), ConvRot in groups of 256 (64 or 16 where 256 does not divide the rows):
//!
//! - the weight turned, `W_rot = W · Hᵀ` per group (in f64, rounded once);
//! - 4 bits: comfy-kitchen's frozen Lloyd-Max codebook (`_FIXED_LUT`, what it takes for ConvRot's
//!   Gaussian groups; its kurtosis probe and k-means fit for heavy-tailed layers are not done),
//!   group scale = the group's amax; 6 bits: the uniform levels −31..31, group scale = amax / 31;
//! - two passes of its alternating least squares (`scale = Σ w·l / Σ l²`, codes reassigned);
//! - row scale `s_channel = max |l · scale| / 127`, `s_rel = scale / s_channel` in e4m3;
//! - the final codes: per group the int8 grid `round(level · s_rel)` (clamped to ±127), each weight
//!   `w / s_channel` given its nearest grid level (ties to the lower); 6-bit codes stored `+ 32`.
//!   (The 6-bit grid-aware scale search is not done: comfy-kitchen's requantize path skips it too.)
//!
//! Every 2-D `.weight` but the norms, embedding tables and `lm_head` whose rows split into groups
//! is quantized; the rest stays as stored (bf16).

use super::comfy_quant::{turn_groups_back, w4a8_group_scales};
use crate::fp8::e4m3_from_f32;
use anyhow::Result;
use safetensors::tensor::Dtype as St;

/// comfy-kitchen's `_FIXED_LUT` (comfy_kitchen/tensor/w4a8_packed.py).
pub const FIXED_LUT: [f32; 16] = [
    -0.980602, -0.794529, -0.638165, -0.500986, -0.377321, -0.263187, -0.155210, -0.050720, 0.052541, 0.156985, 0.265284, 0.379533, 0.502636, 0.638953,
    0.794876, 0.980671,
];

const GROUP: usize = 16;
const ALS_ITERS: usize = 2;

/// The ConvRot group for rows of `k` (powers of 4: comfy-kitchen's regular Hadamard matrices).
pub fn convrot_group(k: usize) -> Option<usize> {
    [256, 64, 16].into_iter().find(|g| k.is_multiple_of(*g))
}

/// Whether the tensor `name` of `shape` is quantized at `bits`.
pub fn quantizable(name: &str, shape: &[usize], bits: u8) -> bool {
    let skip = ["norm", "embed_tokens", "lm_head"].iter().any(|s| name.contains(s));
    shape.len() == 2 && name.ends_with(".weight") && !skip && convrot_group(shape[1]).is_some() && (bits == 4 || shape[1].is_multiple_of(32))
}

/// Nearest of the sorted `levels` to `x` (ties to the lower, as comfy-kitchen's searchsorted pair).
fn nearest(levels: &[f32], x: f32) -> usize {
    let pos = levels.partition_point(|&l| l < x);
    let (lo, hi) = (pos.saturating_sub(1), pos.min(levels.len() - 1));
    if (x - levels[hi]).abs() < (x - levels[lo]).abs() {
        hi
    } else {
        lo
    }
}

/// One matrix `[rows, k]` (f32) as (packed codes, s_rel e4m3 bytes, s_channel, ConvRot group).
pub fn w4a8_rows(v: &[f32], k: usize, bits: u8) -> (Vec<u8>, Vec<u8>, Vec<f32>, usize) {
    let cg = convrot_group(k).expect("quantizable rows");
    let mut w = v.to_vec();
    turn_groups_back(&mut w, cg);
    let table: Vec<f32> = if bits == 4 { FIXED_LUT.to_vec() } else { (-31..=31).map(|l| l as f32).collect() };
    let (mut packed, mut s_rel, mut s_channel) = (vec![], vec![], vec![]);
    for row in w.chunks(k) {
        // group scales by alternating least squares
        let mut scales = vec![];
        for g in row.chunks(GROUP) {
            let amax = g.iter().fold(0f32, |m, x| m.max(x.abs()));
            let mut s = if bits == 4 { amax.max(1e-8) } else { (amax / 31.0).max(1e-8) };
            let mut idx: Vec<usize> = g.iter().map(|x| nearest(&table, x / s)).collect();
            for _ in 0..ALS_ITERS {
                let (num, den) = g.iter().zip(&idx).fold((0f32, 0f32), |(n, d), (x, &i)| (n + x * table[i], d + table[i] * table[i]));
                s = (num / den.max(1e-8)).max(1e-8);
                idx = g.iter().map(|x| nearest(&table, x / s)).collect();
            }
            scales.push((s, idx));
        }
        let table = &table;
        let shifted_max = scales.iter().flat_map(|(s, idx)| idx.iter().map(move |&i| (table[i] * s).abs())).fold(0f32, f32::max);
        let sc = (shifted_max / 127.0).max(1e-8);
        let rel: Vec<u8> = scales.iter().map(|(s, _)| e4m3_from_f32(s / sc)).collect();
        let rel_f = w4a8_group_scales(&rel, false);
        // final codes against each group's int8 grid
        let mut codes = Vec::with_capacity(k);
        for (g, &r) in row.chunks(GROUP).zip(&rel_f) {
            let grid: Vec<f32> = table.iter().map(|l| (l * r).round_ties_even().clamp(-127.0, 127.0)).collect();
            codes.extend(g.iter().map(|x| nearest(&grid, x / sc) + if bits == 6 { 1 } else { 0 }));
        }
        packed.extend(codes.chunks(2).map(|p| (p[0] & 0xf) as u8 | ((p[1] & 0xf) as u8) << 4));
        if bits == 6 {
            packed.extend(codes.chunks(4).map(|p| p.iter().enumerate().fold(0u8, |b, (j, &c)| b | (((c >> 4) & 3) as u8) << (2 * j))));
        }
        s_rel.extend(rel);
        s_channel.push(sc);
    }
    (packed, s_rel, s_channel, cg)
}

/// The tensors of a quantized layer `stem` (`shape` `[rows, k]`, values `v`) as safetensors entries.
pub fn layer(stem: &str, shape: &[usize], v: &[f32], bits: u8) -> Result<Vec<(String, St, Vec<usize>, Vec<u8>)>> {
    let (rows, k) = (shape[0], shape[1]);
    let (codes, s_rel, s_channel, cg) = w4a8_rows(v, k, bits);
    let json = serde_json::to_vec(&serde_json::json!({"format": "asym_w4a8_int8", "group_size": GROUP, "convrot_groupsize": cg, "orig_dtype": "bfloat16"}))?;
    let mut out = vec![
        (format!("{stem}.weight"), St::I8, vec![rows, k * bits as usize / 8], codes),
        (format!("{stem}.weight_s_rel"), St::F8_E4M3, vec![rows, k / GROUP], s_rel),
        (format!("{stem}.weight_s_channel"), St::F32, vec![rows], s_channel.iter().flat_map(|s| s.to_le_bytes()).collect()),
    ];
    if bits == 4 {
        out.push((format!("{stem}.weight_codebook"), St::F32, vec![16], FIXED_LUT.iter().flat_map(|s| s.to_le_bytes()).collect()));
    }
    out.push((format!("{stem}.comfy_quant"), St::U8, vec![json.len()], json));
    Ok(out)
}
