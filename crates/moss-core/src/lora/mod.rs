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
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

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
    /// A1111's hash of the file (12 hex digits, [`crate::checkpoint::hash::lora_hash`]), recorded
    /// in the metadata.
    pub hash: FileHash,
    /// The detected format (`peft`, `kohya`, `loha`, `lokr`, `diff`, or several joined by `+`).
    pub format: String,
    /// Parsed modules, each mapped onto checkpoint tensor names (their factors as stored in the
    /// file's mapping).
    pub modules: Vec<keys::Module>,
}

impl Lora {
    pub fn file_name(&self) -> String {
        self.spec.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// The name A1111 gives the adapter (its file name without the extension).
    pub fn stem(&self) -> String {
        self.spec.path.file_stem().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// An adapter file's hash ([`crate::checkpoint::hash::lora_hash`]), computed on a thread of its
/// own while the run goes on (it reads every byte of the file: ~0.3 s for a 300 MB adapter);
/// [`FileHash::get`] waits for it.
#[derive(Clone)]
pub struct FileHash(Arc<HashState>);

struct HashState {
    value: OnceLock<String>,
    thread: Mutex<Option<std::thread::JoinHandle<String>>>,
}

impl FileHash {
    /// The hash of `bytes`, started now.
    pub fn of(bytes: keys::Bytes) -> FileHash {
        let thread = std::thread::spawn(move || crate::checkpoint::hash::lora_hash((*bytes).as_ref()));
        FileHash(Arc::new(HashState { value: OnceLock::new(), thread: Mutex::new(Some(thread)) }))
    }

    /// A hash known already.
    pub fn known(hash: &str) -> FileHash {
        FileHash(Arc::new(HashState { value: OnceLock::from(hash.to_string()), thread: Mutex::new(None) }))
    }

    pub fn get(&self) -> &str {
        self.0.value.get_or_init(|| {
            let t = self.0.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
            t.and_then(|t| t.join().ok()).unwrap_or_default()
        })
    }
}

impl std::fmt::Display for FileHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl std::fmt::Debug for FileHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileHash({:?})", self.0.value.get())
    }
}

/// Read every adapter of `specs` and check each against the transformer's tensors (`model`, keys
/// without prefix): a key onto no tensor, a shape that does not fit, another model family, a
/// text-encoder key or an unreadable file fails here, before any weights are loaded.
pub fn load_all(specs: &[LoraSpec], model: &TensorStore) -> Result<Vec<Lora>> {
    specs.iter().map(|s| load(s, model)).collect()
}

fn load(spec: &LoraSpec, model: &TensorStore) -> Result<Lora> {
    let p = &spec.path;
    let file = std::fs::File::open(p).with_context(|| format!("cannot read LoRA {}", p.display()))?;
    // SAFETY: the adapter is read-only input; a file changed underneath us while mapped is outside
    // what we guard against (as with the checkpoint's mappings).
    let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot read LoRA {}", p.display()))?;
    let bytes: keys::Bytes = Arc::new(map);
    let unreadable = |e| anyhow::anyhow!("LoRA {} is not a readable safetensors file ({e:?})", p.display());
    let (n, meta) = safetensors::SafeTensors::read_metadata((*bytes).as_ref()).map_err(unreadable)?;
    // Deserializing checks every tensor's offsets against the file.
    safetensors::SafeTensors::deserialize((*bytes).as_ref()).map_err(unreadable)?;
    let base = 8 + n;
    let mut tensors = BTreeMap::new();
    for (name, info) in meta.tensors() {
        let dtype = crate::checkpoint::Dtype::from_st(info.dtype);
        let range = base + info.data_offsets.0..base + info.data_offsets.1;
        let m = keys::Mat::stored(info.shape.clone(), dtype, bytes.clone(), range).with_context(|| format!("LoRA {}: tensor `{name}`", p.display()))?;
        tensors.insert(name, m);
    }
    if tensors.is_empty() {
        bail!("LoRA {} holds no tensors", p.display());
    }
    let config_alpha = peft_config_alpha(p)?;
    let (modules, format) = keys::map(&tensors, model, config_alpha).with_context(|| format!("LoRA {}", p.display()))?;
    Ok(Lora { spec: spec.clone(), hash: FileHash::of(bytes), format, modules })
}

/// The PEFT `adapter_config.json` beside the adapter file `p` (read when it is there).
pub fn config_path(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.join("adapter_config.json"),
        _ => PathBuf::from("adapter_config.json"),
    }
}

/// `lora_alpha` of an `adapter_config.json` beside the file (PEFT writes alpha there, not in the
/// weights); `None` when there is no such file.
fn peft_config_alpha(p: &Path) -> Result<Option<f32>> {
    let cfg = config_path(p);
    if !cfg.is_file() {
        return Ok(None);
    }
    let v = crate::checkpoint::config::read_json(&cfg)?;
    Ok(v.get("lora_alpha").and_then(|a| a.as_f64()).map(|a| a as f32))
}
