//! Weights stored as float8 (community FP8 checkpoints): a linear's `<stem>.weight` holds F8_E4M3
//! (`float8_e4m3fn`) codes `q` `[out, in]` and a scale tensor beside it gives `W = q · scale`.
//! Two namings are read: `<stem>.weight_scale` (shape `[]` or `[1]`: one scale for the tensor;
//! `[out]` or `[out, 1]`: one per output row) and ComfyUI's `<stem>.scale_weight` (the same
//! shapes; ComfyUI writes a scalar). F8_E5M2 weights are refused by name.

use super::{Component, Dtype, TensorInfo};
use crate::tensor::Tensor;
use anyhow::{bail, ensure, Context, Result};

/// The scale tensors' suffixes, in the order they are looked for.
pub const SCALE_SUFFIXES: [&str; 2] = ["weight_scale", "scale_weight"];

/// The refusal of a float8 e5m2 tensor.
pub fn refuse_e5m2(full: &str) -> anyhow::Error {
    anyhow::anyhow!("`{full}` is stored as F8_E5M2 (float8 e5m2); moss reads float8 weights only as F8_E4M3 (float8_e4m3fn) with a scale")
}

/// The full name of the scale tensor of the float8 weight `name` (inside `c`, ending in `.weight`).
fn scale_name(c: &Component, name: &str) -> Result<String> {
    let full = c.full_name(name);
    let stem = full.strip_suffix(".weight").with_context(|| format!("`{full}`: a float8 tensor that is not a `.weight`"))?;
    let found: Vec<String> = SCALE_SUFFIXES.iter().map(|s| format!("{stem}.{s}")).filter(|n| c.store.get(n).is_some()).collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!(
            "`{full}` is stored as float8 e4m3 without its scale: neither `{stem}.weight_scale` nor `{stem}.scale_weight` is in {}",
            c.store.dir.display()
        ),
        _ => bail!("`{full}` has two scales, `{}` and `{}`: which one applies is not clear", found[0], found[1]),
    }
}

/// The per-row scales of the float8 weight `name` (`W[n, :] = q[n, :] · scale[n]`): a per-tensor
/// scale repeated for every row. Errors: the scale missing, of a shape that is neither per
/// tensor nor per row, or not finite.
pub fn row_scales(c: &Component, name: &str) -> Result<Vec<f32>> {
    let info = c.info(name)?;
    let rows = info.shape.first().copied().unwrap_or(1);
    let sname = scale_name(c, name)?;
    let sinfo = c.store.get(&sname).expect("found by scale_name");
    let per_tensor = matches!(sinfo.shape.as_slice(), [] | [1]);
    let per_row = matches!(sinfo.shape.as_slice(), [r] | [r, 1] if *r == rows);
    ensure!(
        per_tensor || per_row,
        "`{sname}` has shape {:?}: the scale of `{}` {:?} must be one value ([] or [1]) or one a row ([{rows}] or [{rows}, 1])",
        sinfo.shape,
        c.full_name(name),
        info.shape
    );
    let (_, s) = c.store.to_f32(&sname)?;
    if let Some(bad) = s.iter().find(|v| !v.is_finite()) {
        bail!("`{sname}` holds {bad}: a scale must be finite");
    }
    Ok(if per_tensor { vec![s[0]; rows] } else { s })
}

/// Whether the checkpoint tensor `info` is a float8 weight, refusing the float8 kind moss does not
/// read.
pub fn is_fp8(c: &Component, name: &str, info: &TensorInfo) -> Result<bool> {
    match info.dtype {
        Dtype::F8E4M3 => Ok(true),
        Dtype::F8E5M2 => Err(refuse_e5m2(&c.full_name(name))),
        _ => Ok(false),
    }
}

/// The float8 weight `name` dequantized on the host: `W[n, k] = q[n, k] · scale[n]` in f32.
pub fn dequantized(c: &Component, name: &str) -> Result<Tensor> {
    let scales = row_scales(c, name)?;
    let (shape, mut q) = c.f32(name)?;
    let cols = q.len() / scales.len().max(1);
    for (row, s) in q.chunks_mut(cols.max(1)).zip(&scales) {
        row.iter_mut().for_each(|v| *v *= s);
    }
    Tensor::new(shape, q)
}

/// [`dequantized`] with the component's LoRA updates of `name` merged in on the host, in fp32
/// ([`crate::lora::merge::merge_tensor`] onto the f32 product; no rounding to a stored dtype:
/// the backend's upload rounds to its storage precision), timed on the plan's clock.
pub fn dequantized_merged(c: &Component, name: &str) -> Result<Tensor> {
    let mut w = dequantized(c, name)?;
    let terms = c.lora_terms(name);
    if !terms.is_empty() {
        let t = std::time::Instant::now();
        let shape = w.shape.clone();
        crate::lora::merge::merge_tensor(&mut w.data, &shape, Dtype::F32, &terms)
            .with_context(|| format!("merging LoRA updates into `{}` (dequantized from float8)", c.full_name(name)))?;
        c.loras.clock.add_host(t.elapsed().as_secs_f64());
    }
    Ok(w)
}
