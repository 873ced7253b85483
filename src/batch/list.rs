//! The list: one item a line (a prompt, or a JSON object of fields), parsed against the flags'
//! defaults; bad lines keep their index.

use super::*;
use anyhow::Result;

/// The default `--name`.
pub const DEFAULT_NAME: &str = "{index:05}-{seed}.png";

/// The JSON fields a line may set.
pub const FIELDS: [&str; 7] = ["prompt", "negative", "seed", "size", "steps", "guidance", "out"];

/// Characters `{stem}` keeps when no width is given.
pub const STEM_LEN: usize = 40;

/// What the flags give every item that does not set its own.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    pub negative: String,
    /// The base seed: item `i` without a `seed` gets `seed + i`.
    pub seed: u64,
    pub steps: u32,
    pub guidance: f32,
    pub size: (u32, u32),
}

/// One picture of the list, with the defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Position among the file's items, from 0.
    pub index: usize,
    /// Line number in the file, from 1.
    pub line: usize,
    pub prompt: String,
    pub negative: String,
    pub seed: u64,
    pub steps: u32,
    pub guidance: f32,
    pub width: u32,
    pub height: u32,
    /// The line's own output name (a template like `--name`), if it set one.
    pub out: Option<String>,
}

/// A line that cannot be rendered.
#[derive(Clone, Debug, PartialEq)]
pub struct BadLine {
    pub index: usize,
    pub line: usize,
    pub error: String,
}

/// Steps in 1..=1000 and a finite guidance, as single `generate` checks them.
pub(super) fn check_numbers(steps: u64, guidance: f64) -> Result<(), String> {
    if !(1..=1000).contains(&steps) {
        return Err(format!("steps {steps} is not in 1..=1000 (the training timesteps)"));
    }
    if !guidance.is_finite() || !(guidance as f32).is_finite() {
        return Err(format!("guidance {guidance} is not a finite number"));
    }
    Ok(())
}

/// The flags' own values must be usable before any line is read.
pub fn check_defaults(d: &Defaults) -> Result<()> {
    check_numbers(d.steps as u64, d.guidance as f64).map_err(|e| anyhow::anyhow!("--{e}"))?;
    crate::options::parse_size(&format!("{}x{}", d.size.0, d.size.1)).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Parse one non-blank line (item `index`, line number `line`).
pub fn parse_line(text: &str, index: usize, line: usize, d: &Defaults) -> Result<Item, String> {
    let mut it = Item {
        index,
        line,
        prompt: String::new(),
        negative: d.negative.clone(),
        seed: d.seed.wrapping_add(index as u64),
        steps: d.steps,
        guidance: d.guidance,
        width: d.size.0,
        height: d.size.1,
        out: None,
    };
    let t = text.trim();
    if !t.starts_with('{') {
        it.prompt = t.to_string();
        return Ok(it);
    }
    let v: serde_json::Value = serde_json::from_str(t).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v.as_object().ok_or("a line starting with `{` must be one JSON object")?;
    let string = |k: &str, v: &serde_json::Value| -> Result<String, String> {
        v.as_str().map(str::to_string).ok_or_else(|| format!("`{k}` must be a string, got {v}"))
    };
    let mut prompt = None;
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "prompt" => prompt = Some(string(k, v)?),
            "negative" => it.negative = string(k, v)?,
            "seed" => it.seed = v.as_u64().ok_or_else(|| format!("`seed` must be a whole number in 0..2^64, got {v}"))?,
            "size" => (it.width, it.height) = crate::options::parse_size(&string(k, v)?)?,
            "steps" => {
                let s = v.as_u64().ok_or_else(|| format!("`steps` must be a whole number, got {v}"))?;
                check_numbers(s, 1.0)?;
                it.steps = s as u32;
            }
            "guidance" => {
                let g = v.as_f64().ok_or_else(|| format!("`guidance` must be a number, got {v}"))?;
                check_numbers(1, g)?;
                it.guidance = g as f32;
            }
            "out" => {
                let o = string(k, v)?;
                if o.trim().is_empty() {
                    return Err("`out` is empty".into());
                }
                Template::parse(&o).map_err(|e| format!("`out`: {e}"))?;
                it.out = Some(o);
            }
            _ => return Err(format!("unknown field `{k}` (known: {})", FIELDS.join(", "))),
        }
    }
    it.prompt = prompt.ok_or("the object has no `prompt`")?;
    Ok(it)
}

/// Parse a whole list (plain text, JSON Lines, or both mixed). Lines are split at `\n` (a `\r`
/// before it is dropped); each is decoded as UTF-8 on its own, so one bad line spoils only itself.
pub fn parse_list(bytes: &[u8], d: &Defaults) -> Vec<Result<Item, BadLine>> {
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
