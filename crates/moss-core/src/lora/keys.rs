//! LoRA key names → the transformer's tensor names, per format.

use super::merge::Values;
use crate::checkpoint::{Dtype, TensorStore};
use anyhow::{bail, ensure, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Bytes a [`Mat`] is stored in: the adapter file's mapping (or any byte buffer).
pub type Bytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A tensor of the LoRA file: its shape and values. Read from a file it stays as stored (bytes of
/// the file's mapping, bf16, f16, f32 or f64), converted where it is used: the GPU merge uploads
/// the stored bytes as they are, the host merge converts the rows it needs.
#[derive(Clone)]
pub struct Mat {
    pub shape: Vec<usize>,
    data: Data,
}

#[derive(Clone)]
enum Data {
    F32(Arc<[f32]>),
    Stored { dtype: Dtype, bytes: Bytes, start: usize, end: usize },
}

impl Mat {
    /// A tensor of f32 values.
    pub fn new(shape: Vec<usize>, values: Vec<f32>) -> Mat {
        Mat { shape, data: Data::F32(values.into()) }
    }

    /// The tensor stored as `dtype` in `bytes[range]` (little-endian); bf16, f16, f32 and f64 only.
    pub fn stored(shape: Vec<usize>, dtype: Dtype, bytes: Bytes, range: std::ops::Range<usize>) -> Result<Mat> {
        ensure!(matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32 | Dtype::F64), "unsupported dtype {}", dtype.name());
        let numel: usize = shape.iter().product();
        ensure!(range.end <= (*bytes).as_ref().len() && range.len() == numel * dtype.size(), "{} bytes for {numel} values of {}", range.len(), dtype.name());
        Ok(Mat { shape, data: Data::Stored { dtype, bytes, start: range.start, end: range.end } })
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The dtype of a tensor kept as stored (`None`: f32 values).
    pub fn stored_dtype(&self) -> Option<Dtype> {
        match &self.data {
            Data::F32(_) => None,
            Data::Stored { dtype, .. } => Some(*dtype),
        }
    }

    /// Values `start .. start + len` (in row-major order), as stored.
    pub fn elements(&self, start: usize, len: usize) -> Values<'_> {
        match &self.data {
            Data::F32(v) => Values::F32(std::borrow::Cow::Borrowed(&v[start..start + len])),
            Data::Stored { dtype, bytes, start: s, end } => {
                let es = dtype.size();
                let b = &(**bytes).as_ref()[*s..*end];
                Values::Stored { dtype: *dtype, bytes: &b[start * es..(start + len) * es] }
            }
        }
    }

    /// Every value, as stored.
    pub fn view(&self) -> Values<'_> {
        self.elements(0, self.numel())
    }

    /// Every value as f32 (exact: the stored dtypes convert without rounding, f64 but for its
    /// rounding to f32).
    pub fn values(&self) -> std::borrow::Cow<'_, [f32]> {
        self.view().into_f32()
    }
}

impl std::fmt::Debug for Mat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = match &self.data {
            Data::F32(_) => "f32 values",
            Data::Stored { dtype, .. } => dtype.name(),
        };
        write!(f, "Mat({:?}, {dtype})", self.shape)
    }
}

/// What one module of an adapter adds to its weight.
#[derive(Clone, Debug)]
pub enum Delta {
    /// `up [out, r] · down [r, in]`, times `alpha / r` (alpha defaults to r).
    LowRank { up: Mat, down: Mat, alpha: Option<f32> },
    /// LyCORIS LoHa: `(w1a · w1b) ⊙ (w2a · w2b)`, times `alpha / r` (1 without alpha).
    LoHa { w1a: Mat, w1b: Mat, w2a: Mat, w2b: Mat, alpha: Option<f32> },
    /// LyCORIS LoKr: `kron(w1, w2)`, each full or a product `a · b`; `alpha / r` when factored.
    LoKr { w1: Factor, w2: Factor, alpha: Option<f32> },
    /// A full-weight (or bias) difference.
    Full(Mat),
}

#[derive(Clone, Debug)]
pub enum Factor {
    Full(Mat),
    Product(Mat, Mat),
}

/// One module of an adapter mapped onto checkpoint tensors.
#[derive(Clone, Debug)]
pub struct Module {
    /// The adapter's key stem as written in the file.
    pub key: String,
    /// Target tensors (full checkpoint names) and their shapes; several for a fused `proj.qkv`
    /// (the delta's rows split in order).
    pub targets: Vec<(String, Vec<usize>)>,
    pub delta: Delta,
}

/// Key suffixes by the part they name (PEFT with or without the adapter name `default`).
const PARTS: [(&str, &str); 21] = [
    (".lora_A.default.weight", "down"),
    (".lora_B.default.weight", "up"),
    (".lora_A.weight", "down"),
    (".lora_B.weight", "up"),
    (".lora_down.weight", "down"),
    (".lora_up.weight", "up"),
    (".lora.down.weight", "down"),
    (".lora.up.weight", "up"),
    (".alpha", "alpha"),
    (".hada_w1_a", "hada_w1_a"),
    (".hada_w1_b", "hada_w1_b"),
    (".hada_w2_a", "hada_w2_a"),
    (".hada_w2_b", "hada_w2_b"),
    (".lokr_w1_a", "lokr_w1_a"),
    (".lokr_w1_b", "lokr_w1_b"),
    (".lokr_w2_a", "lokr_w2_a"),
    (".lokr_w2_b", "lokr_w2_b"),
    (".lokr_w1", "lokr_w1"),
    (".lokr_w2", "lokr_w2"),
    (".diff_b", "diff_b"),
    (".diff", "diff"),
];

/// Wrappers trainers put before the model's own names.
const PREFIXES: [&str; 6] = ["base_model.model.", "model.diffusion_model.", "diffusion_model.", "transformer.", "unet.", "model."];

/// Names of other families' blocks (SD/SDXL UNets, Flux, SD3, DiT-style `transformer_blocks`).
const OTHER_FAMILY: [&str; 9] =
    ["down_blocks", "up_blocks", "mid_block", "input_blocks", "output_blocks", "middle_block", "double_blocks", "single_blocks", "transformer_blocks"];

fn is_text_encoder(stem: &str) -> bool {
    ["lora_te", "text_encoder", "te.", "te1", "te2", "language_model", "text_model", "model.language_model"].iter().any(|p| stem.starts_with(p))
}

/// Split `key` into the module stem and the part it names.
fn split(key: &str) -> Option<(&str, &'static str)> {
    PARTS.iter().find_map(|(suf, part)| key.strip_suffix(suf).map(|s| (s, *part)))
}

fn strip_prefixes(mut s: &str) -> &str {
    while let Some(rest) = PREFIXES.iter().find_map(|p| s.strip_prefix(p)) {
        s = rest;
    }
    s
}

/// The checkpoint module a stem names (dotted, or kohya's underscore form via `underscored`),
/// with its target tensors.
fn resolve(stem: &str, model: &TensorStore, underscored: &HashMap<String, String>) -> Option<Vec<(String, Vec<usize>)>> {
    let s = strip_prefixes(stem);
    let s = ["lora_unet_", "lora_transformer_", "lycoris_"].iter().find_map(|p| s.strip_prefix(p)).unwrap_or(s);
    let dotted = if model.get(&format!("{s}.weight")).is_some() || s.ends_with(".qkv") { s.to_string() } else { underscored.get(s).cloned()? };
    let one = |m: &str| model.get(&format!("{m}.weight")).map(|i| (m.to_string(), i.shape.clone()));
    if let Some(t) = one(&dotted) {
        return Some(vec![t]);
    }
    // A fused q|k|v LoRA onto the split q, k, v weights.
    let stem = dotted.strip_suffix("qkv")?;
    ["q", "k", "v"].iter().map(|x| one(&format!("{stem}{x}"))).collect()
}

/// Map every key of an adapter onto the transformer; returns the modules and the format name.
pub fn map(tensors: &BTreeMap<String, Mat>, model: &TensorStore, config_alpha: Option<f32>) -> Result<(Vec<Module>, String)> {
    let mut underscored = HashMap::new();
    for name in model.tensors.keys() {
        if let Some(m) = name.strip_suffix(".weight") {
            underscored.insert(m.replace('.', "_"), m.to_string());
            if let Some(stem) = m.strip_suffix(".q") {
                underscored.insert(format!("{stem}.qkv").replace('.', "_"), format!("{stem}.qkv"));
            }
        }
    }
    let mut groups: BTreeMap<&str, HashMap<&'static str, &Mat>> = BTreeMap::new();
    let mut unknown = vec![];
    for (key, m) in tensors {
        match split(key) {
            Some((stem, part)) => {
                groups.entry(stem).or_default().insert(part, m);
            }
            None => unknown.push(key.as_str()),
        }
    }
    let all: Vec<&str> = tensors.keys().map(String::as_str).collect();
    if let Some(k) = all.iter().find(|k| OTHER_FAMILY.iter().any(|f| k.contains(f))) {
        bail!("made for another model family (key `{k}`); MOSS-Image names its blocks `layers.N.proj.*`");
    }
    if let Some(k) = all.iter().find(|k| is_text_encoder(strip_prefixes(k))) {
        bail!(
            "touches the text encoder (key `{k}`): moss applies LoRAs to the transformer only; \
             use an adapter without text-encoder keys"
        );
    }
    if !unknown.is_empty() {
        bail!("{} key(s) of no known LoRA format: {}", unknown.len(), first_few(&unknown));
    }
    let mut modules = vec![];
    let mut unmapped = vec![];
    let mut formats: Vec<&str> = vec![];
    for (stem, parts) in &groups {
        let Some(targets) = resolve(stem, model, &underscored) else {
            unmapped.push(*stem);
            continue;
        };
        let alpha = parts.get("alpha").map(|a| a.values().first().copied().unwrap_or(0.0));
        let get = |p: &str| parts.get(p).map(|m| (*m).clone());
        let mut push = |delta: Delta, targets: Vec<(String, Vec<usize>)>, fmt: &'static str| {
            modules.push(Module { key: stem.to_string(), targets, delta });
            if !formats.contains(&fmt) {
                formats.push(fmt);
            }
        };
        if let Some(d) = get("diff_b") {
            let bias: Vec<(String, Vec<usize>)> = targets.iter().map(|(n, s)| (format!("{n}.bias"), vec![s[0]])).collect();
            if bias.iter().any(|(n, _)| model.get(n).is_none()) {
                bail!("`{stem}.diff_b`: `{}` has no bias", targets[0].0);
            }
            push(Delta::Full(d), bias, "diff");
        }
        let weights: Vec<(String, Vec<usize>)> = targets.iter().map(|(n, s)| (format!("{n}.weight"), s.clone())).collect();
        let (delta, fmt) = if let (Some(up), Some(down)) = (get("up"), get("down")) {
            let peft = tensors.keys().any(|k| k.starts_with(&format!("{stem}.lora_A")));
            let alpha = alpha.or(if peft { config_alpha } else { None });
            (Delta::LowRank { up, down, alpha }, if peft { "peft" } else { "kohya" })
        } else if let (Some(w1a), Some(w1b), Some(w2a), Some(w2b)) = (get("hada_w1_a"), get("hada_w1_b"), get("hada_w2_a"), get("hada_w2_b")) {
            (Delta::LoHa { w1a, w1b, w2a, w2b, alpha }, "loha")
        } else if parts.keys().any(|p| p.starts_with("lokr_")) {
            let factor = |n: &str| match (get(n), get(&format!("{n}_a")), get(&format!("{n}_b"))) {
                (Some(w), _, _) => Ok(Factor::Full(w)),
                (None, Some(a), Some(b)) => Ok(Factor::Product(a, b)),
                _ => Err(anyhow::anyhow!("`{stem}`: LoKr without a complete `{n}`")),
            };
            (Delta::LoKr { w1: factor("lokr_w1")?, w2: factor("lokr_w2")?, alpha }, "lokr")
        } else if let Some(d) = get("diff") {
            (Delta::Full(d), "diff")
        } else if parts.contains_key("diff_b") {
            continue;
        } else {
            let have: Vec<&str> = parts.keys().copied().collect();
            bail!("`{stem}`: an incomplete module (has only {})", have.join(", "));
        };
        push(delta, weights, fmt);
    }
    if !unmapped.is_empty() {
        let sample: Vec<&str> = model
            .tensors
            .keys()
            .filter_map(|k| k.strip_suffix(".weight"))
            .filter(|k| (k.starts_with("layers.0.") || !k.starts_with("layers.")) && !k.contains("norm"))
            .collect();
        bail!("{} module(s) map onto no transformer tensor: {}; the model has e.g. {}", unmapped.len(), first_few(&unmapped), first_few(&sample));
    }
    for m in &modules {
        super::merge::check_shape(m)?;
    }
    Ok((modules, formats.join("+")))
}

fn first_few(names: &[&str]) -> String {
    let mut s: Vec<String> = names.iter().take(4).map(|n| format!("`{n}`")).collect();
    if names.len() > 4 {
        s.push(format!("... ({} more)", names.len() - 4));
    }
    s.join(", ")
}
