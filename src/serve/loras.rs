//! Per-request LoRAs (`moss serve --lora-dir DIR`): the adapters of DIR by name, what a request's
//! `lora` field chooses, and the server's answer to `GET /v1/loras`.
//!
//! DIR holds `NAME.safetensors` files, and `NAME/` folders with an `adapter_model.safetensors`
//! (PEFT's layout, its `adapter_config.json` beside it); every one is read and checked against
//! the transformer at start-up (a bad one stops the server before it binds, as `--lora` does). A
//! request names adapters, never paths: `"lora": [{"name": "NAME", "scale": 0.8}, ...]`, at most
//! [`MAX_PER_REQUEST`], each name once, in the order their updates add up (as `generate --lora`
//! flags). The engine merges a request's set into the transformer before its pictures (and keeps
//! it for the next request: [`crate::model::dit::loras`]); the queue runs requests of the loaded
//! set together ([`super::queue`]).

use super::api::ApiError;
use crate::checkpoint::TensorStore;
use crate::lora::{Lora, LoraSpec};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Most adapters one request may name.
pub const MAX_PER_REQUEST: usize = 4;

/// Longest adapter name.
const MAX_NAME: usize = 128;

/// The adapters a server offers, by name (empty without `--lora-dir`).
#[derive(Default)]
pub struct Registry {
    adapters: BTreeMap<String, Lora>,
    /// Whether the server was started with `--lora-dir` (else a request's `lora` is refused).
    offered: bool,
}

/// A name a request may use: letters, digits, `.`, `_`, `-`, not starting with `.`.
fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME && !s.starts_with('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// The adapter files of `dir` by name; other entries are left out, each with a log line.
fn scan(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("--lora-dir {}: cannot read the folder", dir.display()))?;
    for e in entries {
        let path = e.with_context(|| format!("--lora-dir {}: cannot list the folder", dir.display()))?.path();
        let file_name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let (name, file) = if path.is_dir() {
            let f = path.join("adapter_model.safetensors");
            if !f.is_file() {
                continue;
            }
            (file_name, f)
        } else if let Some(stem) = file_name.strip_suffix(".safetensors") {
            (stem.to_string(), path.clone())
        } else {
            continue;
        };
        if !is_name(&name) {
            super::log(&format!("--lora-dir: left out {}: a LoRA's name takes letters, digits, `.`, `_` and `-`", path.display()));
            continue;
        }
        if let Some(other) = out.insert(name.clone(), file.clone()) {
            bail!("--lora-dir {}: two adapters are named `{name}` ({} and {})", dir.display(), other.display(), file.display());
        }
    }
    Ok(out)
}

impl Registry {
    /// Every adapter of `dir`, read and checked against the transformer's tensors (`model`).
    pub fn open(dir: &Path, model: &TensorStore) -> Result<Registry> {
        let files = scan(dir)?;
        let specs: Vec<LoraSpec> = files.values().map(|p| LoraSpec { path: p.clone(), scale: 1.0 }).collect();
        let loaded = crate::lora::load_all(&specs, model)?;
        Ok(Registry { adapters: files.into_keys().zip(loaded).collect(), offered: true })
    }

    pub fn len(&self) -> usize {
        self.adapters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    pub fn offered(&self) -> bool {
        self.offered
    }

    /// The most device memory one tensor's merge can take for any request's set.
    pub fn scratch_bound(&self) -> usize {
        crate::lora::Plan::scratch_bound(&self.adapters.values().cloned().collect::<Vec<_>>(), MAX_PER_REQUEST)
    }

    /// `GET /v1/loras`: each adapter's name, format, short hash and module count (no paths).
    pub fn list(&self) -> Value {
        let data: Vec<Value> = self
            .adapters
            .iter()
            .map(|(name, l)| json!({"id": name, "object": "lora", "format": l.format, "hash": l.hash.get(), "modules": l.modules.len()}))
            .collect();
        json!({"object": "list", "max_per_request": MAX_PER_REQUEST, "data": data})
    }

    /// A request's `lora` field (absent or `null`: none), checked against the adapters offered.
    pub fn choose(&self, v: Option<&Value>) -> Result<LoraSet, ApiError> {
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(LoraSet::default()) };
        let items = v.as_array().ok_or_else(|| bad("invalid_type", format!("`lora` must be a list of {{\"name\", \"scale\"}} objects, got {v}")))?;
        if items.is_empty() {
            return Ok(LoraSet::default());
        }
        if !self.offered {
            return Err(bad("unsupported_value", "this server offers no per-request LoRAs (start it with --lora-dir DIR)"));
        }
        if items.len() > MAX_PER_REQUEST {
            return Err(bad("invalid_value", format!("`lora` names {} adapters; at most {MAX_PER_REQUEST} a request", items.len())));
        }
        let mut set = LoraSet::default();
        for (i, it) in items.iter().enumerate() {
            let o = it.as_object().ok_or_else(|| bad("invalid_type", format!("`lora[{i}]` must be an object {{\"name\", \"scale\"}}, got {it}")))?;
            if let Some(k) = o.keys().find(|k| !["name", "scale"].contains(&k.as_str())) {
                return Err(bad("unknown_parameter", format!("`lora[{i}]`: unknown field `{k}` (known: name, scale)")));
            }
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| bad("invalid_type", format!("`lora[{i}].name` must be a string")))?;
            if !is_name(name) {
                return Err(bad("invalid_value", format!("`lora[{i}].name` must be the name of an adapter this server offers (GET /v1/loras), not a path")));
            }
            let scale = match o.get("scale").filter(|s| !s.is_null()) {
                None => 1.0,
                Some(s) => {
                    let x = s.as_f64().ok_or_else(|| bad("invalid_type", format!("`lora[{i}].scale` must be a number, got {s}")))?;
                    if !(x as f32).is_finite() {
                        return Err(bad("invalid_value", format!("`lora[{i}].scale` {x} is not a finite number")));
                    }
                    x as f32
                }
            };
            let Some(l) = self.adapters.get(name) else {
                return Err(bad("lora_not_found", format!("no LoRA named `{name}` here ({} offered: GET /v1/loras)", self.adapters.len())));
            };
            if set.0.iter().any(|(n, _)| n == name) {
                return Err(bad("invalid_value", format!("`lora` names `{name}` twice")));
            }
            set.0.push((name.to_string(), Lora { spec: LoraSpec { path: l.spec.path.clone(), scale }, ..l.clone() }));
        }
        Ok(set)
    }
}

fn bad(code: &'static str, msg: impl Into<String>) -> ApiError {
    ApiError::bad("lora", code, msg)
}

/// The adapters one request merges, by name, each at its scale, in the order they add up.
#[derive(Clone, Debug, Default)]
pub struct LoraSet(Vec<(String, Lora)>);

/// Two sets are the same when they give the same weights and the same metadata: the same names,
/// in the same order, at the same scales (bit for bit: `-0` is not `0` in the metadata).
impl PartialEq for LoraSet {
    fn eq(&self, o: &LoraSet) -> bool {
        self.0.len() == o.0.len() && self.0.iter().zip(&o.0).all(|(a, b)| a.0 == b.0 && a.1.spec.scale.to_bits() == b.1.spec.scale.to_bits())
    }
}

impl LoraSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The adapters, at this set's scales.
    pub fn adapters(&self) -> Vec<Lora> {
        self.0.iter().map(|(_, l)| l.clone()).collect()
    }

    /// `name:scale, ...` (`none` when empty), for log lines.
    pub fn line(&self) -> String {
        if self.0.is_empty() {
            return "none".into();
        }
        self.0.iter().map(|(n, l)| format!("{n}:{}", l.spec.scale)).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
impl LoraSet {
    /// A set of adapters with these names and no updates (for the queue's tests).
    pub fn named(names: &[&str]) -> LoraSet {
        let l = |n: &str| Lora {
            spec: LoraSpec { path: format!("{n}.safetensors").into(), scale: 1.0 },
            hash: crate::lora::FileHash::known(""),
            format: "test".into(),
            modules: vec![],
        };
        LoraSet(names.iter().map(|n| (n.to_string(), l(n))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_not_paths() {
        for ok in ["style", "my-lora_v2.1", "A"] {
            assert!(is_name(ok), "{ok}");
        }
        for bad in ["", ".hidden", "..", "../x", "a/b", "a\\b", "/etc/passwd", "a b", "x\0", "ü", &"x".repeat(129)] {
            assert!(!is_name(bad), "{bad:?}");
        }
    }
}
