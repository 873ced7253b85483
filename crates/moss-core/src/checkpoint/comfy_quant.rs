//! ComfyUI's quantized safetensors (`comfy_quant`), as convert-to-quant 1.3.4 writes them: a
//! quantized linear `<stem>` stores `<stem>.weight` (the codes), `<stem>.weight_scale` (f32) and
//! `<stem>.comfy_quant`, a U8 tensor holding the layer's JSON (`{"format": ..., "per_row": true,
//! "convrot": true, "convrot_groupsize": 256, "orig_dtype": ...}`); an `input_scale` may sit
//! beside them (activation calibration, unused when the weights are dequantized).
//!
//! - `int8_tensorwise`: int8 codes `[out, in]`, scale `[out, 1]` / `[out]` (per row) or `[]` / `[1]`
//!   (one for the tensor): `W = q · scale` (convert-to-quant's `TensorWiseINT8Layout.dequantize`,
//!   an f32 product).
//! - with `convrot`: the codes were taken of `W_rot = W · Hᵀ`, each row's groups of
//!   `convrot_groupsize` values turned by the normalized Hadamard matrix `H` of convert-to-quant's
//!   `build_hadamard` (regular Kronecker powers of its `H4` for powers of 4, Sylvester's otherwise).
//!   `H` is orthogonal and symmetric, so the weight is `W = W_rot · H`: that is what moss loads
//!   (on the CPU; the product `(x·H)·W_rotᵀ` that ComfyUI runs is the same map).
//! - `float8_e4m3fn` (one scale) and `float8_e4m3fn_rowwise`: F8_E4M3 codes with `weight_scale`,
//!   read by [`super::scaled_fp8`].
//! - `asym_w4a8_int8` (comfy-kitchen's `AsymW4A8Int8Layout`, the W4A8 text encoders): ConvRot
//!   weights in groups of `group_size` (16) codes of 4 bits (`K/2` bytes a row, even column in the
//!   low nibble) or 6 bits (that nibble plane, then `K/4` bytes of each code's top 2 bits, column
//!   `c` in byte `c/4` at bit `2·(c%4)`); beside them `<stem>.weight_s_rel` (float8 e4m3, raw U8
//!   bytes or f32, `[rows, K/group]`), `<stem>.weight_s_channel` (f32 `[rows]`), optionally
//!   `<stem>.weight_codebook` (f32 `[16]`) and `<stem>.weight_correction` (`[K/group, rows]`).
//!   comfy-kitchen's `dequantize_w4a8_int8_weight`: the int8 grid value
//!   `clamp(round(level · s_rel), ±127)` (level: the codebook's, else `c − 8` / `c − 32`), times
//!   `s_channel` (plus the correction), turned back by ConvRot's `H` like int8. The side tensors
//!   are attached to the weight ([`super::tensors::GroupScales`]) and leave the store's list.
//! - other formats (block-wise int8 or float8, mxfp8, nvfp4, convrot_w4a4, awq): refused, naming
//!   the tensor.

use super::tensors::{decode_f32, Dtype, GroupScales, RowScales, TensorInfo, TensorStore};
use anyhow::{bail, ensure, Context, Result};

/// One layer's `comfy_quant` JSON.
#[derive(serde::Deserialize, Debug)]
struct Layer {
    format: String,
    #[serde(default)]
    convrot: bool,
    convrot_groupsize: Option<usize>,
    group_size: Option<usize>,
}

/// The `comfy_quant` formats of W4A8: ComfyUI's name and the aliases other tools write.
const W4A8_FORMATS: [&str; 3] = ["asym_w4a8_int8", "w4a8_int8", "w4a8"];

/// Read every `<stem>.comfy_quant` of `store`, attach the row scales of its int8 weight, check the
/// float8 ones are of a kind [`super::scaled_fp8`] reads, and refuse the rest by name. Returns the
/// formats found (empty: not a `comfy_quant` file).
pub fn resolve(store: &mut TensorStore) -> Result<Vec<String>> {
    let layers: Vec<String> = store.tensors.keys().filter(|k| k.ends_with(".comfy_quant")).cloned().collect();
    let mut formats = vec![];
    for key in layers {
        let stem = key.strip_suffix(".comfy_quant").expect("filtered");
        let info = store.tensors[&key].clone();
        let layer: Layer = serde_json::from_slice(store.bytes(&info)).with_context(|| format!("`{key}` does not hold comfy_quant JSON"))?;
        let weight = format!("{stem}.weight");
        let scale_name = format!("{stem}.weight_scale");
        let Some(w) = store.tensors.get(&weight).cloned() else { bail!("`{key}` describes `{weight}`, which is missing") };
        match layer.format.as_str() {
            "int8_tensorwise" => {
                ensure!(w.dtype == Dtype::I8 && w.shape.len() == 2, "`{weight}` is {} {:?}: int8_tensorwise needs an I8 matrix", w.dtype.name(), w.shape);
                let s = store.tensors.get(&scale_name).cloned().with_context(|| format!("`{weight}` (int8) has no `{scale_name}`"))?;
                ensure!(s.dtype == Dtype::F32, "`{scale_name}` is {}, expected f32", s.dtype.name());
                let rows = w.shape[0];
                let scale = match s.shape.as_slice() {
                    [r] | [r, 1] if *r == rows => s,
                    [] | [1] => s,
                    other => bail!("`{scale_name}` has shape {other:?}: one scale a row ([{rows}] or [{rows}, 1]) or one for `{weight}` ([] or [1])"),
                };
                let convrot = match (layer.convrot, layer.convrot_groupsize) {
                    (false, _) => None,
                    (true, Some(g)) if g >= 2 && g.is_power_of_two() && w.shape[1] % g == 0 => Some(g),
                    (true, g) => bail!("`{key}`: ConvRot group size {g:?} does not divide `{weight}`'s {} columns into powers of two", w.shape[1]),
                };
                let t = store.tensors.get_mut(&weight).expect("present");
                t.row_scales = Some(Box::new(RowScales { scale, convrot, scale_name, groups: None }));
            }
            f if W4A8_FORMATS.contains(&f) => resolve_w4a8(store, stem, &layer)?,
            "float8_e4m3fn" | "float8_e4m3fn_rowwise" => {
                ensure!(w.dtype == Dtype::F8E4M3, "`{weight}` is {}, but `{key}` says {}", w.dtype.name(), layer.format);
            }
            other => bail!("`{weight}` is stored as comfy_quant `{other}`, which moss does not read (it reads int8_tensorwise, with or without ConvRot, asym_w4a8_int8 and float8_e4m3fn)"),
        }
        let f = match store.tensors[&weight].dtype {
            Dtype::W4a8 { bits } => format!("{} ({bits}-bit codes)", layer.format),
            _ if layer.convrot => format!("{} + ConvRot", layer.format),
            _ => layer.format.clone(),
        };
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    Ok(formats)
}

/// A W4A8 layer `stem`: its codes, group scales, row scales, codebook and correction checked
/// against each other (comfy-kitchen's `validate_w4a8_operands`), the weight retyped
/// [`Dtype::W4a8`] with its logical shape `[rows, K]`, the side tensors attached to it.
fn resolve_w4a8(store: &mut TensorStore, stem: &str, layer: &Layer) -> Result<()> {
    let weight = format!("{stem}.weight");
    let w = store.tensors[&weight].clone();
    let fmt = &layer.format;
    ensure!(w.dtype == Dtype::I8 && w.shape.len() == 2, "`{weight}` is {} {:?}: {fmt} needs an I8 matrix of packed codes", w.dtype.name(), w.shape);
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let side = |suffix: &str| {
        let n = format!("{stem}.weight_{suffix}");
        store.tensors.get(&n).cloned().map(|t| (n, t))
    };
    let (s_rel_name, s_rel) = side("s_rel").or_else(|| side("scale")).with_context(|| format!("`{weight}` ({fmt}) has no `{stem}.weight_s_rel`"))?;
    ensure!(
        matches!(s_rel.dtype, Dtype::F8E4M3 | Dtype::F32 | Dtype::Other) && s_rel.shape.len() == 2 && s_rel.shape[0] == rows,
        "`{s_rel_name}` is {} {:?}: the group scales of `{weight}` are float8 e4m3 (or its bytes) or f32 [{rows}, K/group]",
        s_rel.dtype.name(),
        s_rel.shape
    );
    let group = layer.group_size.unwrap_or(16);
    let k = s_rel.shape[1] * group;
    let bits = if k > 0 && cols * 8 == k * 4 {
        4u8
    } else if k > 0 && cols * 8 == k * 6 {
        6
    } else {
        bail!("`{weight}` has rows of {cols} bytes: not {k} codes (`{s_rel_name}` [{rows}, {}] in groups of {group}) of 4 or 6 bits", s_rel.shape[1])
    };
    ensure!(
        group >= 4
            && (16 % group == 0 || group.is_multiple_of(16))
            && k.is_multiple_of(16)
            && (bits == 4 || (k.is_multiple_of(32) && group.is_multiple_of(16))),
        "`{weight}`: groups of {group} over {k} columns at {bits} bits is not a W4A8 layout comfy-kitchen defines"
    );
    let cg = layer.convrot_groupsize.unwrap_or(256);
    ensure!(
        cg >= 2 && cg.is_power_of_two() && k.is_multiple_of(cg),
        "`{stem}.comfy_quant`: ConvRot group size {cg} does not divide `{weight}`'s {k} columns into powers of two"
    );
    let (scale_name, scale) = side("s_channel").with_context(|| format!("`{weight}` ({fmt}) has no `{stem}.weight_s_channel` (its row scales)"))?;
    ensure!(scale.dtype == Dtype::F32 && scale.numel() == rows, "`{scale_name}` is {} {:?}, expected f32 [{rows}]", scale.dtype.name(), scale.shape);
    let codebook = side("codebook");
    if let Some((n, c)) = &codebook {
        ensure!(bits == 4 && c.dtype == Dtype::F32 && c.shape == [16], "`{n}` is {} {:?}: a codebook is f32 [16], of 4-bit codes", c.dtype.name(), c.shape);
        ensure!(super::tensors::first_non_finite(Dtype::F32, store.bytes(c)).is_none(), "`{n}` holds a non-finite level");
    }
    let correction = side("correction");
    if let Some((n, c)) = &correction {
        let float = matches!(c.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32);
        ensure!(
            bits == 4 && float && c.shape == [k / group, rows],
            "`{n}` is {} {:?}: a correction is float [{}, {rows}], of 4-bit codes",
            c.dtype.name(),
            c.shape,
            k / group
        );
    }
    let mut names = vec![s_rel_name.clone(), scale_name.clone()];
    names.extend(codebook.iter().chain(&correction).map(|(n, _)| n.clone()));
    for n in names {
        store.tensors.remove(&n);
    }
    let groups = GroupScales { s_rel, group, codebook: codebook.map(|c| c.1), correction: correction.map(|c| (c.1, 0)), s_rel_name };
    let t = store.tensors.get_mut(&weight).expect("present");
    t.dtype = Dtype::W4a8 { bits };
    t.shape = vec![rows, k];
    t.row_scales = Some(Box::new(RowScales { scale, convrot: Some(cg), scale_name, groups: Some(Box::new(groups)) }));
    Ok(())
}

/// The level of each code of a W4A8 weight of `bits`: the stored codebook, else uniform around
/// zero (`c − 2^(bits−1)`).
pub fn w4a8_levels(bits: u8, codebook: Option<&[f32]>) -> Vec<f32> {
    match codebook {
        Some(c) => c.to_vec(),
        None => (0..1i32 << bits).map(|c| (c - (1 << (bits - 1))) as f32).collect(),
    }
}

/// The group scales `s_rel` (`bytes`, float8 e4m3 codes, or f32 when `f32`) as f32.
pub fn w4a8_group_scales(bytes: &[u8], f32: bool) -> Vec<f32> {
    static E4M3: std::sync::LazyLock<[f32; 256]> = std::sync::LazyLock::new(|| std::array::from_fn(|c| crate::fp8::e4m3_to_f32(c as u8)));
    if f32 {
        decode_f32(Dtype::F32, bytes).expect("f32")
    } else {
        bytes.iter().map(|&b| E4M3[b as usize]).collect()
    }
}

/// Code `c` of a packed W4A8 row of `k` codes at `bits`.
fn w4a8_code(row: &[u8], k: usize, bits: u8, c: usize) -> usize {
    let low = (row[c / 2] >> (4 * (c % 2))) & 0xf;
    let high = if bits == 6 { (row[k / 2 + c / 4] >> (2 * (c % 4))) & 3 } else { 0 };
    (low | high << 4) as usize
}

/// The int8 grid values of packed W4A8 `codes` (rows of `k` codes at `bits`, groups of `group`
/// with scales `s_rel`): `clamp(round(level · s_rel), ±127)` (an f32 product, rounded half to even
/// as torch's `round`), comfy-kitchen's `_dequant_int4_grouped_to_int8`.
pub fn w4a8_grid(codes: &[u8], k: usize, bits: u8, group: usize, s_rel: &[f32], levels: &[f32]) -> Vec<i8> {
    let row_bytes = k * bits as usize / 8;
    let mut out = Vec::with_capacity(codes.len() * 8 / bits as usize);
    for (r, row) in codes.chunks(row_bytes).enumerate() {
        let s = &s_rel[r * (k / group)..(r + 1) * (k / group)];
        out.extend((0..k).map(|c| (levels[w4a8_code(row, k, bits, c)] * s[c / group]).round_ties_even().clamp(-127.0, 127.0) as i8));
    }
    out
}

/// The values of a W4A8 weight: [`w4a8_grid`] times the row scales, plus the correction
/// (`correction(j, r)` of group `j`, row `r`) when stored, each group of `convrot` turned back
/// as int8's are ([`turn_back`], summed in f64, rounded once).
pub fn w4a8_values(grid: &[i8], scales: &[f32], k: usize, group: usize, convrot: usize, correction: Option<&dyn Fn(usize, usize) -> f32>) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(grid.len());
    for (r, (row, &s)) in grid.chunks(k).zip(scales).enumerate() {
        match correction {
            None => out.extend(row.iter().map(|&q| q as f32 * s)),
            Some(f) => out.extend(row.iter().enumerate().map(|(c, &q)| q as f32 * s + f(c / group, r))),
        }
    }
    turn_groups_back(&mut out, convrot);
    out
}

/// Each group of `g` of `values` (row-major, `g` dividing the rows) turned by ConvRot's normalized
/// `H` (`v ← v·H/√g`, summed in f64, rounded once): the turn back, and (`H` symmetric) the turn
/// `W·Hᵀ` a quantizer gives the weight.
pub fn turn_groups_back(values: &mut [f32], g: usize) {
    let norm = 1.0 / (g as f64).sqrt();
    let mut turned = vec![0f64; g];
    for group in values.chunks_mut(g) {
        turned.iter_mut().zip(group.iter()).for_each(|(t, &v)| *t = v as f64);
        turn_back(&mut turned);
        group.iter_mut().zip(&turned).for_each(|(v, t)| *v = (t * norm) as f32);
    }
}

/// The int8 grid values of the W4A8 weight `info` ([`w4a8_grid`]); a non-finite group scale is an
/// error naming its tensor.
pub fn w4a8_grid_of(store: &TensorStore, info: &TensorInfo) -> Result<Vec<i8>> {
    let Dtype::W4a8 { bits } = info.dtype else { bail!("a {} tensor is not W4A8", info.dtype.name()) };
    let gs = info.row_scales.as_ref().and_then(|r| r.groups.as_ref()).context("a W4A8 tensor without its group scales")?;
    let s_rel = w4a8_group_scales(store.bytes(&gs.s_rel), gs.s_rel.dtype == Dtype::F32);
    if let Some(bad) = s_rel.iter().find(|v| !v.is_finite()) {
        bail!("`{}` holds {bad}: a scale must be finite", gs.s_rel_name);
    }
    // the codebook's levels were checked finite at open (`resolve_w4a8`)
    let book = gs.codebook.as_ref().map(|c| decode_f32(Dtype::F32, store.bytes(c)).expect("f32"));
    Ok(w4a8_grid(store.bytes(info), info.shape[1], bits, gs.group, &s_rel, &w4a8_levels(bits, book.as_deref())))
}

/// The values of the W4A8 weight `info` ([`w4a8_grid_of`], [`w4a8_values`]).
fn dequantize_w4a8(store: &TensorStore, info: &TensorInfo, rs: &RowScales, gs: &GroupScales) -> Result<Vec<f32>> {
    let k = info.shape[1];
    let grid = w4a8_grid_of(store, info)?;
    let scales = row_scales(store, info, rs)?;
    let convrot = rs.convrot.expect("W4A8 is ConvRot");
    Ok(match &gs.correction {
        None => w4a8_values(&grid, &scales, k, gs.group, convrot, None),
        Some((c, row0)) => {
            let all = decode_f32(c.dtype, store.bytes(c)).expect("float");
            let n = c.shape[1];
            w4a8_values(&grid, &scales, k, gs.group, convrot, Some(&|j, r| all[j * n + row0 + r]))
        }
    })
}

/// The scale of each of `info`'s rows.
fn row_scales(store: &TensorStore, info: &TensorInfo, rs: &RowScales) -> Result<Vec<f32>> {
    let rows = info.shape.first().copied().unwrap_or(1);
    let s = super::tensors::decode_f32(Dtype::F32, store.bytes(&rs.scale)).expect("f32");
    if let Some(bad) = s.iter().find(|v| !v.is_finite()) {
        bail!("`{}` holds {bad}: a scale must be finite", rs.scale_name);
    }
    Ok(if s.len() == rows { s } else { vec![s[0]; rows] })
}

/// The per-row scales of the int8 weight `info` (a per-tensor scale repeated per row): what
/// `--precision int8` multiplies its stored codes by.
pub fn int8_row_scales(store: &TensorStore, info: &TensorInfo) -> Result<Vec<f32>> {
    let rs = info.row_scales.as_ref().context("an int8 tensor without its comfy_quant scales")?;
    row_scales(store, info, rs)
}

/// The normalized Hadamard matrix of size `n` (a power of two) as convert-to-quant's
/// `build_hadamard` makes it, unnormalized (±1): `H4^{⊗k}` for `n = 4^k`, Sylvester's for the other
/// powers of two. The normalization `1/√n` is applied by the caller.
pub fn hadamard_signs(n: usize) -> Vec<i8> {
    let power_of_4 = n.trailing_zeros().is_multiple_of(2);
    let (mut h, mut size, base): (Vec<i8>, usize, Vec<i8>) = if power_of_4 {
        let h4 = vec![1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, 1];
        (h4.clone(), 4, h4)
    } else {
        (vec![1], 1, vec![1, 1, 1, -1])
    };
    let step = if power_of_4 { 4 } else { 2 };
    while size < n {
        // kron(h, base): row (i·step + a), column (j·step + b) = h[i][j] · base[a][b]
        let m = size * step;
        let mut k = vec![0i8; m * m];
        for i in 0..size {
            for j in 0..size {
                for a in 0..step {
                    for b in 0..step {
                        k[(i * step + a) * m + j * step + b] = h[i * size + j] * base[a * step + b];
                    }
                }
            }
        }
        h = k;
        size = m;
    }
    h
}

/// The values of the int8 weight `info`: `q · scale` per row, and with ConvRot each group turned
/// back ([`dequantize_rows`]).
pub fn dequantize(store: &TensorStore, info: &TensorInfo) -> Result<Vec<f32>> {
    let codes = store.bytes(info);
    let Some(rs) = &info.row_scales else {
        return Ok(codes.iter().map(|&c| c as i8 as f32).collect());
    };
    if let Some(gs) = &rs.groups {
        return dequantize_w4a8(store, info, rs, gs);
    }
    let scales = row_scales(store, info, rs)?;
    let cols = info.numel() / scales.len().max(1);
    Ok(dequantize_rows(codes, &scales, cols, rs.convrot))
}

/// The values of int8 `codes` (rows of `cols`) with one scale a row: `q · scale` (an f32 product),
/// and with ConvRot each group of `g` turned back (`W = W_rot · H`, summed in f64, rounded once).
pub fn dequantize_rows(codes: &[u8], scales: &[f32], cols: usize, convrot: Option<usize>) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(codes.len());
    for (row, s) in codes.chunks(cols.max(1)).zip(scales) {
        out.extend(row.iter().map(|&c| c as i8 as f32 * s));
    }
    if let Some(g) = convrot {
        turn_groups_back(&mut out, g);
    }
    out
}

/// `v ← vᵀ·H` for convert-to-quant's unnormalized Hadamard matrix of `v.len()` ([`hadamard_signs`]),
/// as a fast transform: one pass of `H4` (powers of 4) or `H2` (otherwise) per base-4 / base-2 digit
/// of the index, since `H` is the Kronecker power of that factor. Every value of a group is a
/// multiple of one power of two `u` (the f32 products `q · s` of one row's scale `s`, at least
/// `2^(ilogb(s) − 23)`) below `2^31·u`, so every partial sum is exact in f64 and the result equals
/// the direct sum `Σ_k v_k·H[k][j]` (`cuda/dit/dequant.cu` sums the same integers in 64 bits).
pub fn turn_back(v: &mut [f64]) {
    let g = v.len();
    let r = if g.trailing_zeros().is_multiple_of(2) { 4 } else { 2 };
    let mut stride = 1;
    while stride < g {
        for base in (0..g).step_by(stride * r) {
            for b in base..base + stride {
                if r == 4 {
                    let (x0, x1, x2, x3) = (v[b], v[b + stride], v[b + 2 * stride], v[b + 3 * stride]);
                    // y_a = Σ_b x_b · H4[b][a]
                    v[b] = x0 + x1 + x2 - x3;
                    v[b + stride] = x0 + x1 - x2 + x3;
                    v[b + 2 * stride] = x0 - x1 + x2 + x3;
                    v[b + 3 * stride] = -x0 + x1 + x2 + x3;
                } else {
                    let (x0, x1) = (v[b], v[b + stride]);
                    v[b] = x0 + x1;
                    v[b + stride] = x0 - x1;
                }
            }
        }
        stride *= r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast transform is the direct sum with [`hadamard_signs`]: on int8 codes times one f32
    /// scale (the values it is given), bit for bit, for both constructions.
    #[test]
    fn fast_transform_is_the_direct_sum() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        for g in [2, 4, 8, 16, 128, 256, 1024] {
            let h = hadamard_signs(g);
            for _ in 0..20 {
                let s = f32::from_bits(0x3000_0000 + (next() as u32 % 0x0800_0000));
                let v: Vec<f64> = (0..g).map(|_| ((next() % 255) as i32 - 127) as f32 * s).map(|x| x as f64).collect();
                let direct: Vec<f64> = (0..g).map(|j| (0..g).map(|k| v[k] * h[k * g + j] as f64).sum()).collect();
                let mut fast = v.clone();
                turn_back(&mut fast);
                assert_eq!(fast, direct, "group {g}, scale {s}");
            }
        }
    }

    /// `H·Hᵀ = n·I` and `H = Hᵀ` for both constructions (so `W_rot · H` undoes `W · Hᵀ`).
    #[test]
    fn hadamard_is_symmetric_and_orthogonal() {
        for n in [4, 8, 16, 32, 64, 256] {
            let h = hadamard_signs(n);
            for i in 0..n {
                for j in 0..n {
                    let dot: i32 = (0..n).map(|k| h[i * n + k] as i32 * h[j * n + k] as i32).sum();
                    assert_eq!(dot, if i == j { n as i32 } else { 0 }, "n {n} rows {i} {j}");
                    assert_eq!(h[i * n + j], h[j * n + i], "n {n}");
                }
            }
        }
        // convert-to-quant's H4 (regular: every row sums to 2)
        assert_eq!(hadamard_signs(4), [1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, 1]);
    }
}
