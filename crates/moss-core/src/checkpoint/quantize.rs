//! `moss quantize`: a folder's transformer (or text encoder: int8 only) written as one quantized file, in the layouts moss
//! reads back ([`super::single_file`]) and the projects that define them read:
//!
//! - GGUF (`q8_0`, `q4_0`, `q4_k`, `q5_k`, `q6_k`): ComfyUI-GGUF's conventions (its
//!   `tools/convert.py`): names as ComfyUI's MOSS checkpoint has them (no prefix, `layers.N.proj.qkv`
//!   fused), 1-D and small (≤ 1024 values) tensors F32, matrices in the type asked for where their
//!   rows divide into its blocks, else `Q8_0` (rows of a multiple of 32), else BF16.
//!   `general.architecture` is `moss_image` (moss's choice: no published MOSS GGUF header was
//!   available to copy).
//! - comfy_quant safetensors (`int8`, `int8-convrot`): what convert-to-quant 1.3.4 writes with
//!   `--int8 --scaling_mode row --simple [--convrot]` ([`super::comfy_quant`]): every matrix int8
//!   with one f32 scale a row (`1 / (127 / amax)` as convert-to-quant's torch computes it; with ConvRot the
//!   groups of 256, else 64, turned by `H` first, as convert-to-quant picks them), biases and
//!   norms as stored. convert-to-quant's bias correction (calibration on random activations) is
//!   not done.
//!
//! - comfy_quant W4A8 (`w4a8`, `w6a8`): comfy-kitchen's `asym_w4a8_int8` ([`super::w4a8_quantize`]).
//!
//! The file is written beside its destination and renamed into place when complete.

use super::comfy_quant::turn_groups_back;
use super::ggml::GgmlType;
use super::ggml_quantize;
use super::tensors::{Dtype, TensorStore};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// What `--to` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Gguf(GgmlType),
    Int8 {
        convrot: bool,
    },
    /// comfy-kitchen's W4A8 (`bits` 4) or W6A8 (6).
    W4a8 {
        bits: u8,
    },
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Target, String> {
        Ok(match s {
            "q8_0" => Target::Gguf(GgmlType::Q8_0),
            "q4_0" => Target::Gguf(GgmlType::Q4_0),
            "q4_k" => Target::Gguf(GgmlType::Q4_K),
            "q5_k" => Target::Gguf(GgmlType::Q5_K),
            "q6_k" => Target::Gguf(GgmlType::Q6_K),
            "int8" => Target::Int8 { convrot: false },
            "int8-convrot" => Target::Int8 { convrot: true },
            "w4a8" => Target::W4a8 { bits: 4 },
            "w6a8" => Target::W4a8 { bits: 6 },
            _ => return Err(format!("`{s}`: give q8_0, q4_0, q4_k, q5_k, q6_k, int8, int8-convrot, w4a8 or w6a8")),
        })
    }
}

/// The transformer's tensors in ComfyUI's naming: `layers.N.proj.{q,k,v}.weight` fused into
/// `layers.N.proj.qkv.weight` (rows `[q ; k ; v]`), as (name, shape, f32 values).
fn comfy_tensors(store: &TensorStore) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>> {
    let mut out = BTreeMap::new();
    for (name, info) in &store.tensors {
        let values = store.values(info).with_context(|| format!("reading `{name}`"))?;
        out.insert(name.clone(), (info.shape.clone(), values));
    }
    let fused: Vec<String> = out.keys().filter_map(|k| k.strip_suffix(".proj.q.weight").filter(|s| s.starts_with("layers.")).map(String::from)).collect();
    for stem in fused {
        let parts: Vec<(Vec<usize>, Vec<f32>)> = ["q", "k", "v"]
            .iter()
            .map(|p| out.remove(&format!("{stem}.proj.{p}.weight")).with_context(|| format!("`{stem}.proj.{p}.weight` is missing")))
            .collect::<Result<_>>()?;
        let mut shape = parts[0].0.clone();
        shape[0] = parts.iter().map(|p| p.0[0]).sum();
        out.insert(format!("{stem}.proj.qkv.weight"), (shape, parts.into_iter().flat_map(|p| p.1).collect()));
    }
    Ok(out.into_iter().map(|(k, (s, v))| (k, s, v)).collect())
}

/// The GGUF type of one tensor under `t` (ComfyUI-GGUF's rules, module doc).
fn gguf_type(shape: &[usize], t: GgmlType) -> (u32, Option<GgmlType>) {
    let numel: usize = shape.iter().product();
    let row = shape.last().copied().unwrap_or(1);
    if shape.len() < 2 || numel <= 1024 {
        (0, None)
    } else if row % t.block_values() == 0 {
        (t.id(), Some(t))
    } else if row % 32 == 0 {
        (GgmlType::Q8_0.id(), Some(GgmlType::Q8_0))
    } else {
        (30, None)
    }
}

fn gguf_bytes(shape: &[usize], v: &[f32], id: u32, t: Option<GgmlType>) -> Result<Vec<u8>> {
    Ok(match (id, t) {
        (_, Some(t)) => ggml_quantize::quantize(t, v, shape.last().copied().unwrap_or(1))?,
        (0, None) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
    })
}

fn write_gguf(tensors: &[(String, Vec<usize>, Vec<f32>)], t: GgmlType, out: &mut std::fs::File) -> Result<()> {
    use gguf_rs_lib::format::metadata::MetadataValue;
    use gguf_rs_lib::prelude::{GGUFFileWriter, GGUFHeader, Metadata};
    use gguf_rs_lib::tensor::{TensorData, TensorInfo, TensorShape, TensorType};
    let e = |e: gguf_rs_lib::GGUFError| anyhow::anyhow!("writing GGUF: {e}");
    let mut meta = Metadata::new();
    meta.insert("general.architecture".into(), MetadataValue::String("moss_image".into()));
    meta.insert("general.quantization_version".into(), MetadataValue::U32(2));
    let data = par_map(tensors, |(_, shape, v)| {
        let (id, q) = gguf_type(shape, t);
        Ok((id, gguf_bytes(shape, v, id, q)?))
    })?;
    let mut infos = vec![];
    let mut offset = 0u64;
    for ((name, shape, _), (id, bytes)) in tensors.iter().zip(&data) {
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        infos.push(TensorInfo::new(name.clone(), TensorShape::new(dims).map_err(e)?, TensorType::from_u32(*id).map_err(e)?, offset));
        offset += (bytes.len() as u64).div_ceil(32) * 32;
    }
    let mut w = GGUFFileWriter::new(std::io::BufWriter::new(out));
    w.write_header(&GGUFHeader::new(infos.len() as u64, meta.len() as u64)).map_err(e)?;
    w.write_metadata(&meta).map_err(e)?;
    w.write_tensor_infos(&infos).map_err(e)?;
    w.align_for_tensor_data().map_err(e)?;
    for ((_, bytes), info) in data.into_iter().zip(&infos) {
        w.write_tensor_data(info, &TensorData::new_owned(bytes)).map_err(e)?;
    }
    w.finalize().map_err(e)?.flush()?;
    Ok(())
}

/// The ConvRot group convert-to-quant takes for rows of `k` values (`resolve_int8_convrot_group_size`
/// with its default 256).
fn convrot_group(k: usize) -> Option<usize> {
    [256, 64].into_iter().find(|g| k.is_multiple_of(*g))
}

/// One matrix as int8 codes and row scales (convert-to-quant's arithmetic, module doc).
fn int8_rows(v: &[f32], cols: usize, group: Option<usize>) -> (Vec<i8>, Vec<f32>) {
    let mut w = v.to_vec();
    if let Some(g) = group {
        // W_rot = W · Hᵀ = W · H per group of g (H symmetric), in f64 by the fast transform
        turn_groups_back(&mut w, g);
    }
    let (mut codes, mut scales) = (Vec::with_capacity(w.len()), vec![]);
    for row in w.chunks(cols) {
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        if group.is_some() {
            let scale = (amax / 127.0).max(1e-30);
            codes.extend(row.iter().map(|x| (x / scale).round_ties_even().clamp(-128.0, 127.0) as i8));
            scales.push(scale);
        } else {
            // torch's `127.0 / t` is `t.reciprocal() * 127.0`: two roundings, kept for equal codes
            let q = (1.0 / amax.max(1e-12)) * 127.0;
            codes.extend(row.iter().map(|x| (x * q).clamp(-127.0, 127.0).round_ties_even() as i8));
            scales.push(1.0 / q);
        }
    }
    (codes, scales)
}

/// The entries of a safetensors file, as (name, dtype, shape, bytes), written to `out`.
type Entry = (String, safetensors::tensor::Dtype, Vec<usize>, Vec<u8>);

fn write_entries(owned: &[Entry], out: &mut std::fs::File) -> Result<()> {
    use safetensors::tensor::TensorView;
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| Ok((n.clone(), TensorView::new(*d, s.clone(), b).map_err(|e| anyhow::anyhow!("`{n}`: {e:?}"))?)))
        .collect::<Result<_>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| anyhow::anyhow!("writing safetensors: {e:?}"))?;
    out.write_all(&bytes)?;
    Ok(())
}

fn bf16_entry(name: &str, shape: &[usize], v: &[f32]) -> Entry {
    (name.to_string(), safetensors::tensor::Dtype::BF16, shape.to_vec(), v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect())
}

fn write_w4a8(tensors: &[(String, Vec<usize>, Vec<f32>)], bits: u8, out: &mut std::fs::File) -> Result<()> {
    let layers = par_map(tensors, |(name, shape, v)| match name.strip_suffix(".weight").filter(|_| super::w4a8_quantize::quantizable(name, shape, bits)) {
        Some(stem) => super::w4a8_quantize::layer(stem, shape, v, bits),
        None => Ok(vec![bf16_entry(name, shape, v)]),
    })?;
    write_entries(&layers.concat(), out)
}

fn write_int8(tensors: &[(String, Vec<usize>, Vec<f32>)], convrot: bool, out: &mut std::fs::File) -> Result<()> {
    use safetensors::tensor::Dtype as St;
    let quantized = par_map(tensors, |(name, shape, v)| {
        Ok(match name.strip_suffix(".weight").filter(|_| shape.len() == 2) {
            Some(_) => {
                let group = if convrot { convrot_group(shape[1]) } else { None };
                Some((group, int8_rows(v, shape[1], group)))
            }
            None => None,
        })
    })?;
    let mut owned: Vec<Entry> = vec![];
    for ((name, shape, v), q) in tensors.iter().zip(quantized) {
        match name.strip_suffix(".weight").zip(q) {
            Some((stem, (group, (codes, scales)))) => {
                let mut layer = serde_json::json!({"format": "int8_tensorwise", "orig_dtype": "torch.bfloat16", "per_row": true});
                if let Some(g) = group {
                    layer["convrot"] = true.into();
                    layer["convrot_groupsize"] = g.into();
                }
                let json = serde_json::to_vec(&layer)?;
                owned.push((name.clone(), St::I8, shape.clone(), codes.iter().map(|&c| c as u8).collect()));
                owned.push((format!("{stem}.weight_scale"), St::F32, vec![shape[0], 1], scales.iter().flat_map(|s| s.to_le_bytes()).collect()));
                owned.push((format!("{stem}.comfy_quant"), St::U8, vec![json.len()], json));
            }
            None => owned.push(bf16_entry(name, shape, v)),
        }
    }
    write_entries(&owned, out)
}

/// `f` of every item, on every core (each thread takes the next item), in the items' order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> Result<R> + Sync) -> Result<Vec<R>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len().max(1));
    let mut done: Vec<(usize, Result<R>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = vec![];
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break mine };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a quantize thread panicked")).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Write `store` (a diffusers `transformer/` or `text_encoder/` folder; only the transformer's
/// `layers.N.proj.{q,k,v}` are fused) as `target` to `out`; returns the bytes written.
pub fn write(store: &TensorStore, target: Target, out: &Path) -> Result<u64> {
    for (name, info) in &store.tensors {
        if !matches!(info.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            bail!("`{name}` is {}: moss quantize reads a bf16, f16 or f32 folder", info.dtype.name());
        }
    }
    let tensors = comfy_tensors(store)?;
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.partial", out.file_name().and_then(|f| f.to_str()).unwrap_or("moss-quantize")));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        match target {
            Target::Gguf(t) => write_gguf(&tensors, t, &mut f)?,
            Target::Int8 { convrot } => write_int8(&tensors, convrot, &mut f)?,
            Target::W4a8 { bits } => write_w4a8(&tensors, bits, &mut f)?,
        }
        f.sync_all()?;
        std::fs::rename(&tmp, out).with_context(|| format!("cannot move the file into {}", out.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    Ok(std::fs::metadata(out)?.len())
}
