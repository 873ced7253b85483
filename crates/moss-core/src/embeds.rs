//! The `moss encode` file: a safetensors file with the prompt's (and the negative's) hidden
//! states as the pipeline keeps them (bf16, or F32 at `--precision fp32`), and the prompt text
//! and token ids in metadata.

use crate::options::Precision;
use crate::prompt::{Cut, MAX_TOKENS};
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::path::Path;

/// One encoded prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    pub text: String,
    pub ids: Vec<u32>,
    /// `[L, hidden]` (bf16-representable values at `--precision bf16`).
    pub hidden: Tensor,
}

/// The contents of an embeds file.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeds {
    pub cond: Encoded,
    pub uncond: Encoded,
    pub model: String,
    /// `--max-tokens` of the encode (files without it: the limit, 4096).
    pub max_tokens: usize,
    /// What it cut (files without it: nothing).
    pub cut: Cut,
}

/// The tensor's values as `dtype` (BF16 rounds to nearest even; F32 as they are).
fn stored_bytes(t: &Tensor, dtype: safetensors::Dtype) -> Vec<u8> {
    match dtype {
        safetensors::Dtype::BF16 => t.data.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        _ => t.data.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    }
}

/// The file's bytes: BF16 tensors at bf16 (and at fp8 and int8, whose encoder is the bf16 one), F32 at fp32.
pub fn to_bytes(e: &Embeds, precision: Precision) -> Result<Vec<u8>> {
    let dtype = match precision {
        Precision::Bf16 | Precision::Fp8 | Precision::Int8 => safetensors::Dtype::BF16,
        Precision::Fp32 => safetensors::Dtype::F32,
    };
    let (c, u) = (stored_bytes(&e.cond.hidden, dtype), stored_bytes(&e.uncond.hidden, dtype));
    let views = vec![
        ("cond".to_string(), safetensors::tensor::TensorView::new(dtype, e.cond.hidden.shape.clone(), &c)?),
        ("uncond".to_string(), safetensors::tensor::TensorView::new(dtype, e.uncond.hidden.shape.clone(), &u)?),
    ];
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "moss-embeds-1".to_string());
    meta.insert("model".to_string(), e.model.clone());
    meta.insert("prompt".to_string(), e.cond.text.clone());
    meta.insert("negative".to_string(), e.uncond.text.clone());
    meta.insert("prompt_ids".to_string(), serde_json::to_string(&e.cond.ids)?);
    meta.insert("negative_ids".to_string(), serde_json::to_string(&e.uncond.ids)?);
    meta.insert("max_tokens".to_string(), e.max_tokens.to_string());
    for (k, v) in [("prompt_tokens_before_cut", e.cut.prompt), ("negative_tokens_before_cut", e.cut.negative)] {
        if let Some(n) = v {
            meta.insert(k.to_string(), n.to_string());
        }
    }
    Ok(safetensors::tensor::serialize(views, Some(meta))?)
}

pub fn read(path: &Path) -> Result<Embeds> {
    let bytes = crate::bounded::read_bounded(path, crate::bounded::MAX_EMBEDS, "embeds")?;
    let bad = |why: String| anyhow::anyhow!("{} is not a moss embeds file: {why}", path.display());
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("{e:?}")))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{e:?}")))?;
    let m = meta.metadata().clone().unwrap_or_default();
    if m.get("format").map(String::as_str) != Some("moss-embeds-1") {
        bail!(bad("no `format: moss-embeds-1` metadata".into()));
    }
    let get = |k: &str| m.get(k).cloned().ok_or_else(|| bad(format!("metadata `{k}` missing")));
    let tensor = |k: &str| -> Result<Tensor> {
        let v = st.tensor(k).map_err(|_| bad(format!("tensor `{k}` missing")))?;
        let data = match (v.dtype(), v.shape().len()) {
            (safetensors::Dtype::BF16, 2) => v.data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            (safetensors::Dtype::F32, 2) => v.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            _ => bail!(bad(format!("`{k}` must be 2-D bf16 or f32"))),
        };
        Tensor::new(v.shape().to_vec(), data)
    };
    let ids = |k: &str| -> Result<Vec<u32>> { serde_json::from_str(&get(k)?).map_err(|e| bad(format!("`{k}`: {e}"))) };
    let number = |k: &str| -> Result<Option<usize>> { m.get(k).map(|v| v.parse().map_err(|_| bad(format!("`{k}` is not a number: {v:?}")))).transpose() };
    let e = Embeds {
        cond: Encoded { text: get("prompt")?, ids: ids("prompt_ids")?, hidden: tensor("cond")? },
        uncond: Encoded { text: get("negative")?, ids: ids("negative_ids")?, hidden: tensor("uncond")? },
        model: get("model")?,
        max_tokens: number("max_tokens")?.unwrap_or(MAX_TOKENS),
        cut: Cut { prompt: number("prompt_tokens_before_cut")?, negative: number("negative_tokens_before_cut")? },
    };
    if !(1..=MAX_TOKENS).contains(&e.max_tokens) {
        bail!(bad(format!("`max_tokens` {} is not in 1..={MAX_TOKENS}", e.max_tokens)));
    }
    for (k, x) in [("cond", &e.cond), ("uncond", &e.uncond)] {
        crate::tensor::ensure_finite(&format!("embeds {} tensor `{k}`", path.display()), &x.hidden.data)?;
        if x.hidden.shape[0] != x.ids.len() || x.ids.is_empty() {
            bail!(bad(format!("`{k}` has {} rows for {} token ids", x.hidden.shape[0], x.ids.len())));
        }
    }
    if e.cond.hidden.shape[1] != e.uncond.hidden.shape[1] {
        bail!(bad(format!("`cond` is {} wide but `uncond` {}", e.cond.hidden.shape[1], e.uncond.hidden.shape[1])));
    }
    Ok(e)
}
