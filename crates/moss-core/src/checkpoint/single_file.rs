//! A component given as one file (`--transformer FILE`, `--text-encoder FILE`): a GGUF file
//! ([`super::gguf`]) or a safetensors file, bf16 or ComfyUI `comfy_quant` ([`super::comfy_quant`]),
//! recognised by its first bytes. Its tensor names become the diffusers folder's:
//!
//! - a prefix every DiT key carries is dropped: `model.diffusion_model.` (ComfyUI checkpoints and
//!   stable-diffusion.cpp's GGUFs; in a file that holds other models too, only the keys under it
//!   are kept), `diffusion_model.` or `transformer.`; ComfyUI-GGUF's files have none;
//! - ComfyUI's fused `layers.N.proj.qkv.weight` `[3·D, D]` (rows `[q ; k ; v]`) becomes
//!   `layers.N.proj.{q,k,v}.weight`, each a third of its rows (a byte range: ggml blocks and int8
//!   rows never cross a row).
//!
//! The configs, tokenizer and VAE still come from the model folder.

use super::tensors::TensorStore;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Prefixes of DiT keys in single-file checkpoints, most specific first.
const DIT_PREFIXES: [&str; 3] = ["model.diffusion_model.", "diffusion_model.", "transformer."];

/// Open `path` as component `name` (`transformer` or `text_encoder`), names mapped as above.
pub fn open(path: &Path, name: &str) -> Result<TensorStore> {
    if !path.is_file() {
        bail!("--{} {}: no such file", name.replace('_', "-"), path.display());
    }
    let mut store = if super::gguf::is_gguf(path) {
        super::gguf::open(path)?
    } else {
        let mut s = TensorStore::open_file(path).with_context(|| format!("{} is neither a GGUF nor a safetensors file", path.display()))?;
        let formats = super::comfy_quant::resolve(&mut s)?;
        if !formats.is_empty() {
            s.format = format!("comfy_quant safetensors ({})", formats.join(", "));
        }
        s
    };
    if name == "text_encoder" && super::gguf::is_gguf(path) {
        let first = store.tensors.keys().next().cloned().unwrap_or_default();
        bail!("{}: a GGUF text encoder (llama.cpp's tensor names, `{first}` ...) is not read yet; give a safetensors text encoder", path.display());
    }
    store.single_file = true;
    if name == "transformer" {
        strip_prefix(&mut store);
        split_fused_qkv(&mut store)?;
    }
    Ok(store)
}

fn strip_prefix(store: &mut TensorStore) {
    let keys: Vec<String> = store.tensors.keys().cloned().collect();
    let mixed = keys.iter().any(|k| k.starts_with(DIT_PREFIXES[0]));
    let prefix = if mixed {
        DIT_PREFIXES[0]
    } else {
        match DIT_PREFIXES.iter().find(|p| keys.iter().all(|k| k.starts_with(*p))) {
            Some(p) => p,
            None => return,
        }
    };
    let old = std::mem::take(&mut store.tensors);
    store.tensors = old.into_iter().filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v))).collect();
}

fn split_fused_qkv(store: &mut TensorStore) -> Result<()> {
    let fused: Vec<String> = store.tensors.keys().filter(|k| k.starts_with("layers.") && k.ends_with(".proj.qkv.weight")).cloned().collect();
    for key in fused {
        let stem = key.strip_suffix(".qkv.weight").expect("filtered");
        let info = store.tensors.remove(&key).expect("listed");
        let rows = info.shape.first().copied().unwrap_or(0);
        if info.shape.len() != 2 || rows % 3 != 0 {
            bail!("`{key}` has shape {:?}: a fused [q ; k ; v] matrix needs rows divisible by 3", info.shape);
        }
        for (i, part) in ["q", "k", "v"].iter().enumerate() {
            let name = format!("{stem}.{part}.weight");
            if store.tensors.contains_key(&name) {
                bail!("`{key}` and `{name}` are both stored: which one applies is not clear");
            }
            store.tensors.insert(name, info.row_slice(i * rows / 3, (i + 1) * rows / 3));
        }
    }
    Ok(())
}
