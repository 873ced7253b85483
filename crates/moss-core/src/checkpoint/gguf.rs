//! GGUF files (the single-file DiTs of ComfyUI-GGUF, stable-diffusion.cpp and Unsloth): the
//! header, metadata and tensor descriptors are read by the `gguf-rs-lib` crate (which checks every
//! descriptor's type, size, alignment and range against the file); the tensor data is memory-mapped
//! here and each tensor becomes a [`TensorInfo`] of its byte range. F32, F16 and BF16 tensors are
//! plain dtypes; the block types of [`GgmlType`] are [`Dtype::Ggml`], dequantized as they load.
//!
//! GGUF lists dimensions innermost first (`ne[0]` is a row's length); the shapes here are
//! PyTorch's (reversed). ComfyUI-GGUF's `comfy.gguf.orig_shape.<name>` metadata (a tensor stored
//! reshaped to rows of 256) gives the tensor's own shape.

use super::ggml::GgmlType;
use super::tensors::{Dtype, TensorInfo, TensorStore};
use anyhow::{bail, Context, Result};
use gguf_rs_lib::format::metadata::MetadataValue;
use gguf_rs_lib::prelude::GGUFFileReader;
use std::path::Path;

/// The first four bytes of a GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// Whether `path` starts with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && &head == MAGIC
}

/// The dtype of GGUF type `id`, or an error naming the tensor and the type.
fn dtype(name: &str, id: u32, type_name: &str) -> Result<Dtype> {
    Ok(match id {
        0 => Dtype::F32,
        1 => Dtype::F16,
        30 => Dtype::BF16,
        _ => match GgmlType::from_id(id) {
            Some(t) => Dtype::Ggml(t),
            None => bail!("`{name}` is {type_name}, a GGUF type moss does not read (it reads F32, F16, BF16, {})", GgmlType::ALL.map(|t| t.name()).join(", ")),
        },
    })
}

fn metadata_str(v: &MetadataValue) -> Option<String> {
    v.as_str().map(String::from)
}

/// The tensors of the GGUF file `path` as a store (names as the file has them), its format line
/// naming `general.architecture` when the file sets it.
pub fn open(path: &Path) -> Result<TensorStore> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let reader = GGUFFileReader::new(std::io::BufReader::new(file)).map_err(|e| anyhow::anyhow!("{} is not a GGUF file moss can read: {e}", path.display()))?;
    let meta = reader.metadata();
    let arch = meta.get("general.architecture").and_then(metadata_str);
    let dir = path.parent().unwrap_or(Path::new("."));
    let format = match &arch {
        Some(a) => format!("GGUF (general.architecture {a})"),
        None => "GGUF".to_string(),
    };
    let mut store = TensorStore::empty(dir, &format);
    let file = store.map(path)?;
    let base = reader.tensor_data_offset() as usize;
    for t in reader.tensor_infos() {
        let name = t.name().to_string();
        let kind = t.tensor_type();
        let dtype = dtype(&name, kind as u32, &kind.to_string())?;
        let mut shape: Vec<usize> = t.shape().dims().iter().rev().map(|&d| d as usize).collect();
        if let Some(MetadataValue::Array(a)) = meta.get(&format!("comfy.gguf.orig_shape.{name}")) {
            let orig: Vec<usize> = a.iter().filter_map(|v| v.as_u64().or_else(|| v.as_i64().map(|i| i.max(0) as u64))).map(|v| v as usize).collect();
            if orig.iter().product::<usize>() != shape.iter().product::<usize>() || orig.len() != a.iter().count() {
                bail!("{}: comfy.gguf.orig_shape.{name} {orig:?} does not hold the {shape:?} stored", path.display());
            }
            shape = orig;
        }
        let start = base + t.data_offset() as usize;
        let end = start + t.expected_data_size() as usize;
        if store.files[file].1.len() < end {
            bail!("{} is truncated: `{name}` ends past the end of the file", path.display());
        }
        if store.tensors.insert(name.clone(), TensorInfo::new(dtype, shape, file, start, end)).is_some() {
            bail!("{}: `{name}` is stored twice", path.display());
        }
    }
    Ok(store)
}
