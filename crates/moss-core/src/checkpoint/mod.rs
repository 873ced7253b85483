//! The checkpoint folder: finding it, reading its configs, memory-mapping its tensors and
//! checking that every tensor the configs imply is there with the right shape and dtype.

pub mod comfy_quant;
pub mod config;
pub mod expected;
pub mod ggml;
pub mod ggml_quantize;
pub mod gguf;
pub mod hash;
pub mod kept;
pub mod quantize;
pub mod scaled_fp8;
pub mod single_file;
pub mod tensors;
pub mod w4a8_quantize;

use anyhow::{bail, Context, Result};
use config::{DitConfig, EncoderConfig, VaeConfig};
use expected::Expected;
use std::path::{Path, PathBuf};
use std::sync::Arc;
pub use tensors::{Dtype, TensorInfo, TensorStore};

pub const DEFAULT_MODEL: &str = "OpenMOSS-Team/MOSS-Image-SFT";

/// The five components of `model_index.json`.
pub const COMPONENTS: [&str; 5] = ["scheduler", "text_encoder", "tokenizer", "transformer", "vae"];

/// Where a `--model` argument pointed.
#[derive(Clone, Debug)]
pub struct ModelLocation {
    pub root: PathBuf,
    /// The repo id (or the folder as given).
    pub id: String,
    /// The Hugging Face snapshot revision, when resolved through the cache.
    pub revision: Option<String>,
}

impl ModelLocation {
    /// The model's name as pictures and the server show it, never a path: the repo id (also for
    /// a Hugging Face snapshot folder given as a path), else the folder's own name.
    pub fn name(&self) -> String {
        if self.revision.is_some() {
            return self.id.clone();
        }
        let folder = std::fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        let up = |p: &Path, n: usize| p.ancestors().nth(n).and_then(|a| a.file_name()).map(|f| f.to_string_lossy().into_owned());
        if up(&folder, 1).as_deref() == Some("snapshots") {
            if let Some(repo) = up(&folder, 2).as_deref().and_then(|r| r.strip_prefix("models--")) {
                if let Some((owner, name)) = repo.split_once("--") {
                    return format!("{owner}/{name}");
                }
            }
        }
        up(&folder, 0).unwrap_or_else(|| "model".into())
    }
}

fn hub_cache_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![];
    if let Some(d) = std::env::var_os("HF_HUB_CACHE") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("HF_HOME") {
        dirs.push(PathBuf::from(d).join("hub"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(h).join(".cache/huggingface/hub"));
    }
    dirs
}

/// Resolve `--model`: an existing folder, or a repo id `owner/name` in the local Hugging Face
/// cache (`models--owner--name/snapshots/<rev>`, the revision `refs/main` names if present).
pub fn locate(spec: &str) -> Result<ModelLocation> {
    let p = Path::new(spec);
    if p.is_dir() {
        return Ok(ModelLocation { root: p.to_path_buf(), id: spec.to_string(), revision: None });
    }
    let looks_like_repo = spec.split('/').count() == 2 && !spec.starts_with('.') && !spec.starts_with('/');
    let mut looked = vec![];
    if looks_like_repo {
        let folder = format!("models--{}", spec.replace('/', "--"));
        for cache in hub_cache_dirs() {
            let repo = cache.join(&folder);
            looked.push(repo.join("snapshots").display().to_string());
            let snaps = repo.join("snapshots");
            if !snaps.is_dir() {
                continue;
            }
            let wanted = main_ref(&repo)?;
            let mut revs: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(&snaps)?
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| {
                    let t = e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
                    (t, e.file_name().to_string_lossy().into_owned())
                })
                .collect();
            revs.sort();
            let rev = match wanted.filter(|w| snaps.join(w).is_dir()) {
                Some(w) => Some(w),
                None => revs.last().map(|r| r.1.clone()),
            };
            if let Some(rev) = rev {
                return Ok(ModelLocation { root: snaps.join(&rev), id: spec.to_string(), revision: Some(rev) });
            }
        }
    } else {
        looked.push(format!("{} (no such folder)", p.display()));
    }
    let repo = if looks_like_repo { spec } else { DEFAULT_MODEL };
    bail!(
        "model `{spec}` not found; looked in: {}. Get the weights with \
         `hf download {repo}` (or `huggingface-cli download {repo}`) on a machine with \
         network access, then pass --model <folder> or set MOSS_MODEL",
        looked.join(", ")
    )
}

/// The revision a cached repo's `refs/main` names, if the file is there: one plain name inside
/// `snapshots/` (a commit hash); a path (`../..`, `a/b`) is refused.
fn main_ref(repo: &Path) -> Result<Option<String>> {
    let path = repo.join("refs/main");
    if !path.is_file() {
        return Ok(None);
    }
    let text = crate::bounded::read_text_bounded(&path, crate::bounded::MAX_REF, "the revision file")?;
    let rev = text.trim();
    if rev.is_empty() {
        return Ok(None);
    }
    let plain = matches!(Path::new(rev).components().collect::<Vec<_>>()[..], [std::path::Component::Normal(_)]);
    if !plain || rev.contains(['/', '\\', '\0']) {
        bail!("{} names {rev:?}, not a snapshot in {}: refusing it", path.display(), repo.join("snapshots").display());
    }
    Ok(Some(rev.to_string()))
}

/// An opened checkpoint: its location and every component's config (tensors are mapped per
/// stage with [`Checkpoint::open_component`]).
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub loc: ModelLocation,
    pub encoder: EncoderConfig,
    pub dit: DitConfig,
    pub vae: VaeConfig,
    pub scheduler: crate::schedule::ScheduleConfig,
    /// Adapters merged into the transformer's tensors as a backend loads them ([`crate::lora`]).
    pub loras: Arc<crate::lora::Plan>,
    /// Components given as one file each instead of their folder's weights.
    pub files: ComponentFiles,
    /// The transformer's A1111 `Model hash` ([`hash`]), once [`Checkpoint::start_model_hash`].
    pub model_hash: hash::ModelHash,
}

/// The first tensor of `c` the CUDA backend cannot run, as its one-line refusal ([`kept::gpu_refusal`]).
pub fn first_refused_on_gpu(c: &Component) -> Option<String> {
    c.store.tensors.iter().filter(|(k, _)| k.starts_with(&c.prefix)).find_map(|(k, t)| kept::gpu_refusal(k, t))
}

/// The single-file components (`--transformer FILE`, `--text-encoder FILE`,
/// [`single_file`]); their configs still come from the folder.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComponentFiles {
    pub transformer: Option<PathBuf>,
    pub text_encoder: Option<PathBuf>,
}

impl ComponentFiles {
    /// The file given for component `name`, if any.
    pub fn of(&self, name: &str) -> Option<&Path> {
        match name {
            "transformer" => self.transformer.as_deref(),
            "text_encoder" => self.text_encoder.as_deref(),
            _ => None,
        }
    }
}

/// One component's tensors with the prefix its keys carry.
pub struct Component {
    pub name: &'static str,
    pub store: TensorStore,
    /// Prepended to the model's names (`language_model.` for the encoder).
    pub prefix: String,
    /// The LoRA updates of its tensors (empty but for the transformer with adapters attached).
    pub loras: Arc<crate::lora::Plan>,
}

impl Checkpoint {
    pub fn open(loc: ModelLocation) -> Result<Checkpoint> {
        let root = &loc.root;
        let index_path = root.join("model_index.json");
        if !index_path.is_file() {
            bail!("{} has no model_index.json: not a MOSS-Image pipeline folder", root.display());
        }
        let index = config::read_json(&index_path)?;
        let class = index.get("_class_name").and_then(|c| c.as_str()).unwrap_or("");
        if class != "MOSSImagePipeline" {
            bail!("{}: _class_name is {class:?}, expected \"MOSSImagePipeline\"", index_path.display());
        }
        for c in COMPONENTS {
            if index.get(c).is_none() {
                bail!("{}: component `{c}` is not listed", index_path.display());
            }
            if !root.join(c).is_dir() {
                bail!("{}: component folder `{c}/` is missing", root.display());
            }
        }
        Ok(Checkpoint {
            encoder: EncoderConfig::from_file(&root.join("text_encoder/config.json"))?,
            dit: DitConfig::from_file(&root.join("transformer/config.json"))?,
            vae: VaeConfig::from_file(&root.join("vae/config.json"))?,
            scheduler: config::scheduler_from_file(&root.join("scheduler/scheduler_config.json"))?,
            loras: Default::default(),
            files: Default::default(),
            model_hash: Default::default(),
            loc,
        })
    }

    /// [`Checkpoint::open`] with components given as single files.
    pub fn open_with(loc: ModelLocation, files: ComponentFiles) -> Result<Checkpoint> {
        Ok(Checkpoint { files, ..Checkpoint::open(loc)? })
    }

    /// The tensors of component `name`: its single file if one was given, else its folder.
    pub fn store(&self, name: &str) -> Result<TensorStore> {
        match self.files.of(name) {
            Some(f) => single_file::open(f, name),
            None => TensorStore::open(&self.loc.root.join(name)),
        }
    }

    /// Start computing the transformer's `Model hash` beside the run ([`hash::ModelHash`]).
    pub fn start_model_hash(&self) {
        if self.model_hash.started() {
            return;
        }
        if let Ok(store) = TensorStore::open(&self.loc.root.join("transformer")) {
            self.model_hash.start(store.files.iter().map(|f| f.0.clone()).collect());
        }
    }

    /// The transformer's `Model hash` (10 hex digits), computed now if not started before.
    pub fn model_hash(&self) -> Option<&str> {
        self.start_model_hash();
        self.model_hash.get()
    }

    pub fn tokenizer_path(&self) -> PathBuf {
        self.loc.root.join("tokenizer/tokenizer.json")
    }

    /// Read and check the adapters `specs` against the transformer's tensors; a backend merges
    /// them into each tensor it loads from [`Checkpoint::open_component`]`("transformer")`.
    pub fn attach_loras(&mut self, specs: &[crate::lora::LoraSpec]) -> Result<()> {
        if specs.is_empty() {
            return Ok(());
        }
        let store = self.store("transformer")?;
        let t = std::time::Instant::now();
        let mut plan = crate::lora::Plan::new(crate::lora::load_all(specs, &store)?);
        plan.read_s = t.elapsed().as_secs_f64();
        self.loras = Arc::new(plan);
        Ok(())
    }

    /// For memory plans (the tensors' sizes): the same as [`Checkpoint::open_component`], which
    /// merges nothing itself (LoRAs merge as each tensor loads).
    pub fn open_component_for_plan(&self, name: &'static str) -> Result<Component> {
        self.open_component(name)
    }

    /// Map `text_encoder`, `transformer` or `vae` and check it against its config.
    pub fn open_component(&self, name: &'static str) -> Result<Component> {
        let store = self.store(name)?;
        let (prefix, expected) = match name {
            "text_encoder" => {
                let prefix = ["language_model.", "model.language_model."]
                    .into_iter()
                    .find(|p| store.tensors.keys().any(|k| k.starts_with(p)))
                    .with_context(|| format!("{}: no tensor under `language_model.` or `model.language_model.`", store.dir.display()))?;
                (prefix.to_string(), expected::encoder(&self.encoder))
            }
            "transformer" => (String::new(), expected::dit(&self.dit)),
            "vae" => (String::new(), expected::vae(&self.vae)),
            _ => bail!("unknown component {name}"),
        };
        let loras = if name == "transformer" { self.loras.clone() } else { Default::default() };
        let comp = Component { name, store, prefix, loras };
        let (defaulted, file) = match name {
            "text_encoder" => (&self.encoder.defaulted, "text_encoder/config.json"),
            "transformer" => (&self.dit.defaulted, "transformer/config.json"),
            _ => (&self.vae.defaulted, "vae/config.json"),
        };
        let checked = comp.validate(&expected).and_then(|_| comp.check_block_counts(self));
        if let Err(e) = checked {
            return Err(if defaulted.is_empty() {
                e
            } else {
                e.context(format!("{file} leaves out {}, so the real model's values were assumed", defaulted.join(", ")))
            });
        }
        Ok(comp)
    }
}

impl Component {
    pub fn full_name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The LoRA updates of tensor `name` (inside the component), in the order they add up.
    pub fn lora_terms(&self, name: &str) -> Vec<crate::lora::Term<'_>> {
        if self.loras.is_empty() {
            return vec![];
        }
        self.loras.terms(&self.full_name(name))
    }

    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        let full = self.full_name(name);
        self.store.get(&full).with_context(|| format!("{}: tensor `{full}` is missing", self.store.dir.display()))
    }

    /// A tensor as f32, by its name inside the component.
    pub fn f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.store.to_f32(&self.full_name(name))
    }

    /// Rows `ids` of the 2-D tensor `name` (`[rows, width]`) as f32 `[ids.len(), width]`, read
    /// from the mapping row by row (only those rows' bytes are touched): a host gather, e.g. a
    /// prompt's rows of an embedding table that stays on the host. An id past the rows is an error.
    pub fn rows_f32(&self, name: &str, ids: &[u32]) -> Result<crate::tensor::Tensor> {
        let info = self.info(name)?;
        anyhow::ensure!(info.shape.len() == 2, "`{name}` is {:?}, not a table of rows", info.shape);
        let (rows, width) = (info.shape[0], info.shape[1]);
        let mut data = Vec::with_capacity(ids.len() * width);
        for &id in ids {
            anyhow::ensure!((id as usize) < rows, "token id {id} is outside the embedding table of {rows}");
            let row = info.row_slice(id as usize, id as usize + 1);
            data.extend(self.store.values(&row).with_context(|| format!("reading `{name}`"))?);
        }
        crate::tensor::Tensor::new(vec![ids.len(), width], data)
    }

    /// Fail on the first expected tensor that is missing, has another shape or another dtype.
    pub fn validate(&self, expected: &[Expected]) -> Result<()> {
        for e in expected {
            let full = self.full_name(&e.name);
            let Some(info) = self.store.get(&full) else {
                bail!("checkpoint incomplete: `{full}` is missing from {}/ (expected {} {:?})", self.store.dir.display(), e.dtype.name(), e.shape);
            };
            if info.shape != e.shape {
                bail!("checkpoint mismatch: `{full}` in {} has shape {:?}, the config implies {:?}", self.store.file_of(info).display(), info.shape, e.shape);
            }
            if info.dtype == Dtype::F8E5M2 {
                return Err(scaled_fp8::refuse_e5m2(&full));
            }
            if info.dtype == Dtype::F8E4M3 && e.scaled_fp8 {
                scaled_fp8::row_scales(self, &e.name)?;
                continue;
            }
            if self.store.single_file && e.dtype == Dtype::BF16 {
                self.check_single_file_tensor(&full, info)?;
                continue;
            }
            if info.dtype != e.dtype {
                let fp8 = if info.dtype == Dtype::F8E4M3 { " (moss reads float8 only in the main blocks' matrices)" } else { "" };
                bail!("checkpoint mismatch: `{full}` in {} is {}, expected {}{fp8}", self.store.file_of(info).display(), info.dtype.name(), e.dtype.name());
            }
        }
        Ok(())
    }

    /// A tensor of a single-file component where the folder has bf16: any float dtype, or ggml
    /// blocks / int8 with row scales (dequantized as it loads); else one line naming it and its type.
    fn check_single_file_tensor(&self, full: &str, info: &TensorInfo) -> Result<()> {
        match info.dtype {
            Dtype::BF16 | Dtype::F16 | Dtype::F32 | Dtype::Ggml(_) | Dtype::W4a8 { .. } => Ok(()),
            Dtype::I8 if info.row_scales.is_some() => Ok(()),
            Dtype::I8 => bail!("`{full}` in {} is int8 without a comfy_quant description or scales: moss cannot run it", self.store.file_of(info).display()),
            d => bail!(
                "`{full}` in {} is {}: moss cannot run it (floats, GGUF blocks, int8 with row scales, W4A8 and float8 e4m3 with scales are read)",
                self.store.file_of(info).display(),
                d.name()
            ),
        }
    }

    /// Stored numbered blocks beyond what the config names (a `num_layers` smaller than the file's
    /// blocks) are an error, not silently ignored.
    fn check_block_counts(&self, ck: &Checkpoint) -> Result<()> {
        let (pattern, count, key) = match self.name {
            "text_encoder" => ("layers.", ck.encoder.num_layers(), "num_hidden_layers"),
            "transformer" => ("layers.", ck.dit.num_layers, "num_layers"),
            _ => ("decoder.up_blocks.", ck.vae.decoder_block_out_channels.len(), "decoder_block_out_channels"),
        };
        let prefix = self.full_name(pattern);
        let most = self.store.tensors.keys().filter_map(|k| k.strip_prefix(&prefix)?.split('.').next()?.parse::<usize>().ok()).max();
        if let Some(m) = most.filter(|&m| m >= count) {
            bail!("{}: stores `{prefix}{m}.*` but the config's {key} gives {count} blocks; the config and the tensors disagree", self.store.dir.display());
        }
        if self.name == "vae" {
            let per = ck.vae.layers_per_block + 1;
            let res = self.full_name("decoder.up_blocks.");
            let most = self
                .store
                .tensors
                .keys()
                .filter_map(|k| {
                    let rest = k.strip_prefix(&res)?;
                    let (_, r) = rest.split_once(".resnets.")?;
                    r.split('.').next()?.parse::<usize>().ok()
                })
                .max();
            if let Some(m) = most.filter(|&m| m >= per) {
                bail!(
                    "{}: stores `decoder.up_blocks.*.resnets.{m}.*` but layers_per_block {} gives {per} resnets a block",
                    self.store.dir.display(),
                    ck.vae.layers_per_block
                );
            }
        }
        Ok(())
    }

    /// The first tensor (by name) of this component holding a NaN or an infinity, with the index of
    /// its first bad element. A bit test on the stored bytes, spread over the cores: memory-bound
    /// (about the page cache's read speed; 28 GB at full size).
    pub fn first_non_finite(&self) -> Option<(String, usize)> {
        let names: Vec<(&String, &TensorInfo)> = self.store.tensors.iter().filter(|(k, _)| k.starts_with(&self.prefix)).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
        let found: Vec<Option<(String, usize)>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let names = &names;
                    sc.spawn(move || {
                        names
                            .iter()
                            .skip(t)
                            .step_by(threads)
                            .find_map(|(k, info)| tensors::first_non_finite(info.dtype, self.store.bytes(info)).map(|i| (k.to_string(), i)))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(None)).collect()
        });
        found.into_iter().flatten().min()
    }

    /// Parameters, bytes and dtypes of the tensors this component uses (its prefix, minus
    /// `visual.*` / `lm_head.*`).
    pub fn summary(&self) -> (usize, usize, Vec<&'static str>) {
        let mut params = 0;
        let mut bytes = 0;
        let mut dtypes = vec![];
        for (k, t) in &self.store.tensors {
            if !k.starts_with(&self.prefix) {
                continue;
            }
            params += t.numel();
            bytes += t.end - t.start;
            if !dtypes.contains(&t.dtype.name()) {
                dtypes.push(t.dtype.name());
            }
        }
        (params, bytes, dtypes)
    }
}
