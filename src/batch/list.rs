//! The list: one item a line (a prompt, or a JSON object of fields), parsed against the flags'
//! defaults; bad lines keep their index.

use super::*;
use crate::spec::{check_guidance, check_steps, PictureSpec};
use anyhow::Result;

/// The default `--name`.
pub const DEFAULT_NAME: &str = "{index:05}-{seed}.png";

/// The JSON fields a line may set.
pub const FIELDS: [&str; 15] = [
    "prompt",
    "negative",
    "seed",
    "size",
    "steps",
    "guidance",
    "sampler",
    "schedule",
    "cache",
    "guidance_window",
    "out",
    "init_image",
    "mask",
    "strength",
    "mask_blur",
];

/// Characters `{stem}` keeps when no width is given.
pub const STEM_LEN: usize = 40;

/// One picture of the list: the flags' settings with the line's own laid over them.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Position among the list's items, from 0.
    pub index: usize,
    /// Line number in the file, from 1.
    pub line: usize,
    pub spec: PictureSpec,
    /// The line's own output name (a template like `--name`), if it set one.
    pub out: Option<String>,
    /// The pictures the line starts from (`init_image`, `mask`: paths relative to the list's
    /// folder), read when the batch is planned.
    pub pictures: Option<PictureFiles>,
    /// The pictures, read and at the item's size (`spec.init_image` names them).
    pub init: Option<std::sync::Arc<crate::pipeline::Prepared>>,
}

/// An item's pictures in as its line names them; `strength` and `mask_blur` default to the flags'.
#[derive(Clone, Debug, PartialEq)]
pub struct PictureFiles {
    pub image: String,
    pub mask: Option<String>,
    pub strength: Option<f64>,
    pub mask_blur: Option<u32>,
    /// The line gives its `size` (else the picture's own is taken).
    pub sized: bool,
}

/// A line that cannot be rendered.
#[derive(Clone, Debug, PartialEq)]
pub struct BadLine {
    pub index: usize,
    pub line: usize,
    pub error: String,
}

/// The flags' own values must be usable before any line is read.
pub fn check_defaults(d: &PictureSpec) -> Result<()> {
    d.check().map_err(|e| anyhow::anyhow!("--{e}"))
}

/// Parse one non-blank line (item `index`, line number `line`).
/// `d` is the flags' spec; its seed is the base seed (item `index` gets `seed + index`).
pub fn parse_line(text: &str, index: usize, line: usize, d: &PictureSpec) -> Result<Item, String> {
    let spec = PictureSpec { prompt: String::new(), seed: d.seed.wrapping_add(index as u64), ..d.clone() };
    let mut it = Item { index, line, spec, out: None, pictures: None, init: None };
    let t = text.trim();
    if !t.starts_with('{') {
        it.spec.prompt = t.to_string();
        return Ok(it);
    }
    let v: serde_json::Value = serde_json::from_str(t).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v.as_object().ok_or("a line starting with `{` must be one JSON object")?;
    let string =
        |k: &str, v: &serde_json::Value| -> Result<String, String> { v.as_str().map(str::to_string).ok_or_else(|| format!("`{k}` must be a string, got {v}")) };
    let mut prompt = None;
    let (mut image, mut mask, mut strength, mut mask_blur) = (None, None, None, None);
    let path = |k: &str, v: &serde_json::Value| -> Result<String, String> {
        let p = string(k, v)?;
        if p.trim().is_empty() {
            return Err(format!("`{k}` is empty"));
        }
        Ok(p)
    };
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "prompt" => prompt = Some(string(k, v)?),
            "negative" => it.spec.negative = string(k, v)?,
            "seed" => it.spec.seed = v.as_u64().ok_or_else(|| format!("`seed` must be a whole number in 0..2^64, got {v}"))?,
            "size" => (it.spec.width, it.spec.height) = crate::options::parse_size(&string(k, v)?)?,
            "steps" => {
                let s = v.as_u64().ok_or_else(|| format!("`steps` must be a whole number, got {v}"))?;
                check_steps(s)?;
                it.spec.steps = s as u32;
            }
            "guidance" => {
                let g = v.as_f64().ok_or_else(|| format!("`guidance` must be a number, got {v}"))?;
                check_guidance(g)?;
                it.spec.guidance = g as f32;
            }
            "sampler" => it.spec.sampler = string(k, v)?.parse()?,
            "schedule" => it.spec.schedule = string(k, v)?.parse()?,
            "cache" => {
                it.spec.cache = crate::spec::cache_of_json(v)?;
                it.spec.cache.as_ref().map_or(Ok(()), crate::spec::check_cache)?;
            }
            "guidance_window" => it.spec.guidance_window = crate::spec::window_of_json(k, v)?,
            "out" => {
                let o = string(k, v)?;
                if o.trim().is_empty() {
                    return Err("`out` is empty".into());
                }
                Template::parse(&o).map_err(|e| format!("`out`: {e}"))?;
                it.out = Some(o);
            }
            "init_image" => image = Some(path(k, v)?),
            "mask" => mask = Some(path(k, v)?),
            "strength" => {
                let s = v.as_f64().ok_or_else(|| format!("`strength` must be a number, got {v}"))?;
                crate::spec::check_strength("`strength`", s)?;
                strength = Some(s);
            }
            "mask_blur" => {
                let b = v.as_u64().filter(|&b| b <= crate::spec::MAX_MASK_BLUR as u64);
                mask_blur =
                    Some(b.ok_or_else(|| format!("`mask_blur` must be a whole number of pixels in 0..={}, got {v}", crate::spec::MAX_MASK_BLUR))? as u32);
            }
            _ => return Err(format!("unknown field `{k}` (known: {})", FIELDS.join(", "))),
        }
    }
    it.spec.prompt = prompt.ok_or("the object has no `prompt`")?;
    it.spec.check_prompt()?;
    match image {
        Some(image) => {
            let sized = obj.get("size").is_some_and(|v| !v.is_null());
            it.pictures = Some(PictureFiles { image, mask, strength, mask_blur, sized })
        }
        None if mask.is_some() || strength.is_some() || mask_blur.is_some() => {
            let f = [("mask", mask.is_some()), ("strength", strength.is_some()), ("mask_blur", mask_blur.is_some())];
            return Err(format!("`{}` applies to a picture from a picture: give `init_image`", f.iter().find(|f| f.1).map_or("", |f| f.0)));
        }
        None => {}
    }
    Ok(it)
}

/// Parse a whole list (plain text, JSON Lines, or both mixed). Lines are split at `\n` (a `\r`
/// before it is dropped); each is decoded as UTF-8 on its own, so one bad line spoils only itself.
pub fn parse_list(bytes: &[u8], d: &PictureSpec) -> Vec<Result<Item, BadLine>> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let mut out = vec![];
    let mut index = 0;
    for (n, raw) in bytes.split(|&c| c == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = n + 1;
        let res = match std::str::from_utf8(raw) {
            Ok(t) if t.trim().is_empty() => continue,
            Ok(t) => parse_line(t, index, line, d),
            Err(e) => Err(format!("not valid UTF-8 (first bad byte at column {})", e.valid_up_to() + 1)),
        };
        out.push(res.map_err(|error| BadLine { index, line, error }));
        index += 1;
    }
    out
}
