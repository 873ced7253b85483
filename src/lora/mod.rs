//! LoRA adapters merged into the transformer's weights at load.
//!
//! Formats are told apart by their keys and mapped onto the checkpoint's own tensor names
//! ([`keys`]): PEFT/diffusers (`lora_A`/`lora_B`), kohya/ComfyUI (`lora_down`/`lora_up`/`alpha`,
//! dotted or underscore names), LyCORIS LoHa (`hada_*`) and LoKr (`lokr_*`), full differences
//! (`diff`, `diff_b`), and LoRAs for a fused `proj.qkv` applied to the split q, k, v rows.
//! The merge ([`merge`]) is `W + scale * (alpha/rank) * B A` in fp32, every LoRA added up, then
//! rounded once to the stored dtype. It happens tensor by tensor as the backend loads each weight
//! ([`plan`] says which updates a tensor gets; `Backend::merge_lora` applies them): on the host
//! for the CPU backend, on the GPU for the CUDA one (`cuda/dit/lora_merge.cu`), with the same
//! arithmetic, so both backends see the same weights.

pub mod keys;
pub mod merge;
pub mod plan;

pub use plan::{Plan, Term};

use crate::checkpoint::TensorStore;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// `--lora PATH[:SCALE]`: one adapter and its strength (default 1).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    pub path: PathBuf,
    pub scale: f32,
}

impl LoraSpec {
    /// Parse `PATH[:SCALE]`; a tail after the last `:` that is not a number stays in the path.
    pub fn parse(s: &str) -> Result<LoraSpec, String> {
        if s.is_empty() {
            return Err("--lora needs a file".into());
        }
        if let Some((p, tail)) = s.rsplit_once(':') {
            if let Ok(scale) = tail.parse::<f32>() {
                if !scale.is_finite() {
                    return Err(format!("--lora {s}: the scale must be a finite number"));
                }
                if p.is_empty() {
                    return Err(format!("--lora {s}: no file before the scale"));
                }
                return Ok(LoraSpec { path: PathBuf::from(p), scale });
            }
        }
        Ok(LoraSpec { path: PathBuf::from(s), scale: 1.0 })
    }
}

/// One adapter read and checked against the transformer: its deltas by target tensor.
#[derive(Clone, Debug)]
pub struct Lora {
    pub spec: LoraSpec,
    /// A short content hash (FNV-1a 64 of the file, 12 hex digits), recorded in the metadata.
    pub hash: String,
    /// The detected format (`peft`, `kohya`, `loha`, `lokr`, `diff`, or several joined by `+`).
    pub format: String,
    /// Parsed modules, each mapped onto checkpoint tensor names.
    pub modules: Vec<keys::Module>,
}

impl Lora {
    pub fn file_name(&self) -> String {
        self.spec.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// FNV-1a 64 of `bytes`, as 12 hex digits.
pub fn short_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")[..12].to_string()
}

/// Read every adapter of `specs` and check each against the transformer's tensors (`model`, keys
/// without prefix): a key onto no tensor, a shape that does not fit, another model family, a
/// text-encoder key or an unreadable file fails here, before any weights are loaded.
pub fn load_all(specs: &[LoraSpec], model: &TensorStore) -> Result<Vec<Lora>> {
    specs.iter().map(|s| load(s, model)).collect()
}

fn load(spec: &LoraSpec, model: &TensorStore) -> Result<Lora> {
    let p = &spec.path;
    let bytes = std::fs::read(p).with_context(|| format!("cannot read LoRA {}", p.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("LoRA {} is not a readable safetensors file ({e:?})", p.display()))?;
    let mut tensors = std::collections::BTreeMap::new();
    for (name, view) in st.tensors() {
        let data = to_f32(&view).with_context(|| format!("LoRA {}: tensor `{name}`", p.display()))?;
        tensors.insert(name, (view.shape().to_vec(), data));
    }
    if tensors.is_empty() {
        bail!("LoRA {} holds no tensors", p.display());
    }
    let config_alpha = peft_config_alpha(p)?;
    let (modules, format) = keys::map(&tensors, model, config_alpha).with_context(|| format!("LoRA {}", p.display()))?;
    Ok(Lora { spec: spec.clone(), hash: short_hash(&bytes), format, modules })
}

/// `lora_alpha` of an `adapter_config.json` beside the file (PEFT writes alpha there, not in the
/// weights); `None` when there is no such file.
fn peft_config_alpha(p: &Path) -> Result<Option<f32>> {
    let cfg = p.parent().unwrap_or(Path::new(".")).join("adapter_config.json");
    if !cfg.is_file() {
        return Ok(None);
    }
    let v = crate::checkpoint::config::read_json(&cfg)?;
    Ok(v.get("lora_alpha").and_then(|a| a.as_f64()).map(|a| a as f32))
}

fn to_f32(v: &safetensors::tensor::TensorView) -> Result<Vec<f32>> {
    use safetensors::Dtype as D;
    let b = v.data();
    Ok(match v.dtype() {
        D::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        D::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        D::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        D::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        d => bail!("unsupported dtype {d:?}"),
    })
}
