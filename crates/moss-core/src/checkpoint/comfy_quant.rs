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
//! - other formats (block-wise int8 or float8, mxfp8, nvfp4): refused, naming the tensor.

use super::tensors::{Dtype, RowScales, TensorInfo, TensorStore};
use anyhow::{bail, ensure, Context, Result};

/// One layer's `comfy_quant` JSON.
#[derive(serde::Deserialize, Debug)]
struct Layer {
    format: String,
    #[serde(default)]
    convrot: bool,
    convrot_groupsize: Option<usize>,
}

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
                t.row_scales = Some(Box::new(RowScales { scale, convrot, scale_name }));
            }
            "float8_e4m3fn" | "float8_e4m3fn_rowwise" => {
                ensure!(w.dtype == Dtype::F8E4M3, "`{weight}` is {}, but `{key}` says {}", w.dtype.name(), layer.format);
            }
            other => bail!("`{weight}` is stored as comfy_quant `{other}`, which moss does not read (it reads int8_tensorwise, with or without ConvRot, and float8_e4m3fn)"),
        }
        let f = if layer.convrot { format!("{} + ConvRot", layer.format) } else { layer.format.clone() };
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    Ok(formats)
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
        let norm = 1.0 / (g as f64).sqrt();
        let mut turned = vec![0f64; g];
        for group in out.chunks_mut(g) {
            turned.iter_mut().zip(group.iter()).for_each(|(t, &v)| *t = v as f64);
            turn_back(&mut turned);
            group.iter_mut().zip(&turned).for_each(|(v, t)| *v = (t * norm) as f32);
        }
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
