//! Batch rendering (`moss generate --prompts FILE`): many pictures from one invocation, each
//! network loaded once per chunk.
//!
//! **The list.** One item per non-blank line (blank lines are not items). A line whose first
//! non-blank character is `{` is a JSON object with any of `prompt` (required), `negative`,
//! `seed`, `size` ("WxH"), `steps`, `guidance` and `out`; any other line is a prompt, its outer
//! whitespace trimmed. A JSON `null` means "not set". The flags give the defaults; a line's
//! fields override them. A line that cannot be used (invalid JSON or UTF-8, an unknown field, a
//! bad size or number) is reported with its line number and skipped; it still takes its index,
//! so fixing it later changes no other item's seed or name.
//!
//! **Index and seed.** An item's index is its position among the items of the file, from 0.
//! Its seed is its line's `seed`, else `--seed + index` (wrapping at 2^64): it depends on the
//! file only, not on sharding, skipping or chunking, so a picture is the same however the list
//! is split, and the same as `moss generate --prompt ... --seed <that seed>` renders it.
//!
//! **Names.** `--out-dir DIR` joined with the item's `out` (else `--name`), a template over
//! `{index}`, `{line}` (1-based line number), `{seed}`, `{shard}` (index % N) and `{stem}` (the
//! prompt as a file-name-safe slug); `{index:05}` zero-pads a number to 5 digits, `{stem:20}`
//! keeps at most 20 characters (40 by default); `{{` and `}}` are literal braces. A list is
//! untrusted input: an item's `out` may not leave `--out-dir` (`..`), an absolute `out` needs
//! `--allow-absolute-out`, and no output may be the list or a checkpoint file. Two items that would
//! write the same file (however spelt): the later one fails.
//!
//! **Shards.** `--shard K/N` (0 <= K < N) renders the items with `index % N == K`; the N shards
//! together render every item exactly once with no coordination. Bad lines are reported (and
//! fail) only in the shard that owns their index.
//!
//! **Stages.** The items to render are cut into chunks; per chunk the encoder is loaded, every
//! distinct text of the chunk encoded, the encoder freed, then the DiT loaded and every item
//! denoised, the DiT freed, then the VAE loaded and every item decoded and written (atomically,
//! with the same PNG metadata as a single `moss generate`). On the CPU a chunk is one picture
//! (written as soon as it is decoded); on CUDA its size follows from free memory ([`chunk_budget_bytes`]); `--chunk N` caps it.
//!
//! **Stopping.** SIGINT (Ctrl-C) or SIGTERM stops the run after the current denoising step (or
//! between two prompts or pictures of the other stages); files already written stay, no partial
//! file is left, and moss exits with 128 + the signal number. A second signal kills at once.

use crate::backend::cpu::Cpu;
use crate::backend::ops::{DitOps, EncoderOps, VaeOps};
use crate::backend::Device;
use crate::checkpoint::Checkpoint;
use crate::model::{dit::Dit, encoder::Encoder, vae::VaeDecoder};
use crate::pipeline::{self, Interrupted, Progress, Request};
use crate::prompt::PromptTokenizer;
use crate::tensor::Tensor;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

/// The default `--name`.
pub const DEFAULT_NAME: &str = "{index:05}-{seed}.png";

/// The JSON fields a line may set.
pub const FIELDS: [&str; 7] = ["prompt", "negative", "seed", "size", "steps", "guidance", "out"];

/// Characters `{stem}` keeps when no width is given.
pub const STEM_LEN: usize = 40;

// ---------------------------------------------------------------------------------------------
// The list

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
fn check_numbers(steps: u64, guidance: f64) -> Result<(), String> {
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

// ---------------------------------------------------------------------------------------------
// Names

#[derive(Clone, Debug, PartialEq)]
enum Part {
    Lit(String),
    /// A number, zero-padded to the width (0: as it is).
    Num(NumField, usize),
    /// The prompt slug, at most this many characters.
    Stem(usize),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum NumField {
    Index,
    Line,
    Seed,
    Shard,
}

/// A file name template (`--name`, or a line's `out`).
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

/// The values a template is filled with.
pub struct NameVars<'a> {
    pub index: usize,
    pub line: usize,
    pub seed: u64,
    pub shard: usize,
    pub prompt: &'a str,
}

impl Template {
    pub fn parse(src: &str) -> Result<Template, String> {
        let bad = |why: String| format!("name template `{src}`: {why}");
        let mut parts = vec![];
        let mut lit = String::new();
        let mut it = src.chars().peekable();
        while let Some(c) = it.next() {
            match c {
                '{' if it.peek() == Some(&'{') => {
                    it.next();
                    lit.push('{');
                }
                '}' if it.peek() == Some(&'}') => {
                    it.next();
                    lit.push('}');
                }
                '}' => return Err(bad("a lone `}` (write `}}` for a brace)".into())),
                '{' => {
                    let mut field = String::new();
                    loop {
                        match it.next() {
                            Some('}') => break,
                            Some(c) => field.push(c),
                            None => return Err(bad("a `{` is not closed (write `{{` for a brace)".into())),
                        }
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Self::field(&field).map_err(bad)?);
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        if parts.is_empty() {
            return Err(bad("it is empty".into()));
        }
        Ok(Template { parts })
    }

    fn field(f: &str) -> Result<Part, String> {
        let (name, spec) = match f.split_once(':') {
            Some((n, s)) => (n.trim(), Some(s.trim())),
            None => (f.trim(), None),
        };
        let width = |spec: &str| -> Result<usize, String> {
            match spec.parse::<usize>() {
                Ok(w) if (1..=64).contains(&w) => Ok(w),
                _ => Err(format!("`{{{f}}}`: the width must be a number in 1..=64")),
            }
        };
        let num = |field: NumField| -> Result<Part, String> {
            match spec {
                None => Ok(Part::Num(field, 0)),
                Some(s) if s.starts_with('0') && s.len() > 1 => Ok(Part::Num(field, width(&s[1..])?)),
                Some(_) => Err(format!("`{{{f}}}`: numbers take `:0N` (zero-padded to N digits), e.g. `{{{name}:05}}`")),
            }
        };
        match name {
            "index" => num(NumField::Index),
            "line" => num(NumField::Line),
            "seed" => num(NumField::Seed),
            "shard" => num(NumField::Shard),
            "stem" => Ok(Part::Stem(match spec {
                None => STEM_LEN,
                Some(s) => width(s)?,
            })),
            _ => Err(format!("unknown field `{{{f}}}` (known: index, line, seed, shard, stem)")),
        }
    }

    pub fn render(&self, v: &NameVars) -> String {
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(l) => s.push_str(l),
                Part::Num(f, w) => {
                    let n = match f {
                        NumField::Index => v.index as u64,
                        NumField::Line => v.line as u64,
                        NumField::Seed => v.seed,
                        NumField::Shard => v.shard as u64,
                    };
                    s.push_str(&format!("{n:0w$}", w = *w));
                }
                Part::Stem(w) => s.push_str(&stem(v.prompt, *w)),
            }
        }
        s
    }
}

/// The prompt as a file-name-safe slug: letters and digits (any script) lowercased, every other
/// run of characters one `-`, no `-` at either end, at most `max` characters; "prompt" if
/// nothing is left.
pub fn stem(prompt: &str, max: usize) -> String {
    let mut s = String::new();
    let mut n = 0;
    for c in prompt.chars() {
        if n >= max {
            break;
        }
        if c.is_alphanumeric() {
            for l in c.to_lowercase() {
                s.push(l);
            }
            n += 1;
        } else if !s.is_empty() && !s.ends_with('-') {
            s.push('-');
            n += 1;
        }
    }
    let s = s.trim_end_matches('-');
    if s.is_empty() {
        "prompt".to_string()
    } else {
        s.to_string()
    }
}

/// The path without its `.` components (`./out/./a.png` is `out/a.png`), so two spellings of
/// one file are seen as one. `..` is kept: folding it could point elsewhere through a symlink.
fn normalize(p: &Path) -> PathBuf {
    let out: PathBuf = p.components().filter(|c| *c != Component::CurDir).collect();
    if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    }
}

/// `p` with `.` and `..` folded lexically; None when a `..` climbs above the start.
fn fold_dots(p: &Path) -> Option<PathBuf> {
    let mut out: Vec<Component> = vec![];
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {}
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out.iter().collect())
}

/// The file `p` names, for clash detection: absolute, the deepest existing folder resolved
/// through symbolic links, `.` and `..` folded.
fn resolved(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let abs = fold_dots(&abs).unwrap_or(abs);
    let mut base = abs.clone();
    let mut rest = vec![];
    while let Some(parent) = base.parent().map(Path::to_path_buf) {
        rest.push(base.file_name().map(|n| n.to_os_string()).unwrap_or_default());
        base = parent;
        if let Ok(real) = std::fs::canonicalize(&base) {
            return rest.iter().rev().fold(real, |acc, n| acc.join(n));
        }
    }
    abs
}

// ---------------------------------------------------------------------------------------------
// Shards and the plan

/// `--shard K/N`: this process renders the items with `index % N == K`, K counting from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub k: usize,
    pub n: usize,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { k: 0, n: 1 }
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let (k, n) = s.split_once('/').ok_or_else(|| format!("shard `{s}` is not K/N (e.g. 0/4)"))?;
        let p = |v: &str| v.trim().parse::<usize>().map_err(|_| format!("shard `{s}` is not K/N (e.g. 0/4)"));
        let (k, n) = (p(k)?, p(n)?);
        if n == 0 {
            return Err(format!("shard `{s}`: N must be at least 1"));
        }
        if k >= n {
            return Err(format!("shard `{s}`: K counts from 0, so it must be below N (0/{n} .. {}/{n})", n - 1));
        }
        Ok(Shard { k, n })
    }
}

impl Shard {
    pub fn of(&self, index: usize) -> usize {
        index % self.n
    }
    pub fn owns(&self, index: usize) -> bool {
        self.of(index) == self.k
    }
}

/// An item this process renders, and its file.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub item: Item,
    pub path: PathBuf,
}

/// What to do with this shard's items.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub jobs: Vec<Job>,
    /// Items (of this shard) that cannot be rendered, in file order.
    pub bad: Vec<BadLine>,
    /// Items whose file is already there (`--skip-existing`).
    pub skipped: Vec<Job>,
    /// Items that belong to other shards.
    pub elsewhere: usize,
}

/// Names, shards and skips: every item's file is computed (all shards, so a clash between two
/// shards' items is found by both the same way); this shard's items are kept.
pub fn plan(
    entries: Vec<Result<Item, BadLine>>,
    out_dir: &Path,
    name: &Template,
    shard: Shard,
    skip_existing: bool,
    allow_absolute: bool,
) -> Plan {
    let mut p = Plan::default();
    let mut owner: HashMap<PathBuf, usize> = HashMap::new();
    for e in entries {
        let res = e.and_then(|it| {
            let tpl = match &it.out {
                Some(o) => Template::parse(o).map_err(|error| BadLine { index: it.index, line: it.line, error })?,
                None => name.clone(),
            };
            let vars = NameVars { index: it.index, line: it.line, seed: it.seed, shard: shard.of(it.index), prompt: &it.prompt };
            let rendered = tpl.render(&vars);
            let path = normalize(&out_dir.join(&rendered));
            let bad = |error: String| BadLine { index: it.index, line: it.line, error };
            if rendered.ends_with('/') || path.file_name().is_none() {
                return Err(bad(format!("output name `{rendered}` names no file")));
            }
            if Path::new(&rendered).is_absolute() {
                if !allow_absolute {
                    return Err(bad(format!("output `{rendered}` is an absolute path (allowed with --allow-absolute-out)")));
                }
            } else if fold_dots(Path::new(&rendered)).is_none() {
                return Err(bad(format!("output `{rendered}` leaves --out-dir")));
            }
            crate::picture::Format::of(Path::new(&rendered)).map_err(|e| bad(e.to_string()))?;
            let key = resolved(&path);
            if let Some(first) = owner.get(&key) {
                return Err(bad(format!("output {} is already line {first}'s", path.display())));
            }
            owner.insert(key, it.line);
            Ok(Job { item: it, path })
        });
        let index = match &res {
            Ok(j) => j.item.index,
            Err(b) => b.index,
        };
        if !shard.owns(index) {
            p.elsewhere += 1;
            continue;
        }
        match res {
            Err(b) => p.bad.push(b),
            Ok(j) if j.path.is_dir() => {
                let error = format!("output path {} is a folder", j.path.display());
                p.bad.push(BadLine { index: j.item.index, line: j.item.line, error });
            }
            Ok(j) if skip_existing && j.path.exists() => p.skipped.push(j),
            Ok(j) => p.jobs.push(j),
        }
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Chunks

/// Host bytes one job holds between the stages: the hidden states of its texts (f32) and its
/// latents (f32).
pub fn job_bytes(text_tokens: usize, hidden: usize, latent_channels: usize, width: u32, height: u32) -> u64 {
    let latents = latent_channels as u64 * (width / 16) as u64 * (height / 16) as u64;
    4 * (text_tokens as u64 * hidden as u64 + latents)
}

/// How many bytes a chunk's in-flight data (hidden states and latents, kept between the
/// stages) may take on `device`. CPU: no limit, a chunk is the whole list.
pub fn chunk_budget_bytes(device: Device) -> u64 {
    match device {
        Device::Cpu => u64::MAX,
        Device::Cuda(n) => cuda_chunk_budget_bytes(n),
    }
}

/// The CUDA chunk budget. The stages hand their outputs (hidden states, latents) to each other
/// as host tensors, and only one stage's weights and working memory are on the GPU at a time
/// (checked up front by `pipeline::preflight_cuda`), so what a chunk holds between stages lives in
/// host memory: a quarter of the host's available memory (8 GiB if /proc/meminfo is unreadable).
pub fn cuda_chunk_budget_bytes(_ordinal: usize) -> u64 {
    host_available_bytes().map(|b| b / 4).unwrap_or(8 << 30)
}

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Cut jobs of these costs into consecutive chunks: each takes jobs while its sum stays within
/// `budget` and it has fewer than `max_items` (None: no cap); a chunk has at least one job.
pub fn plan_chunks(costs: &[u64], budget: u64, max_items: Option<usize>) -> Vec<Range<usize>> {
    let cap = max_items.unwrap_or(usize::MAX).max(1);
    let mut out = vec![];
    let mut start = 0;
    let mut sum = 0u64;
    for (i, &c) in costs.iter().enumerate() {
        if i > start && (i - start >= cap || sum.saturating_add(c) > budget) {
            out.push(start..i);
            start = i;
            sum = 0;
        }
        sum = sum.saturating_add(c);
    }
    if start < costs.len() {
        out.push(start..costs.len());
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Stopping

static STOP: AtomicI32 = AtomicI32::new(0);

/// The signal that asked the batch to stop (2: SIGINT, 15: SIGTERM), if one did.
pub fn stop_signal() -> Option<i32> {
    match STOP.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Ask the running batch to stop after its current step, as a signal does.
pub fn request_stop(signal: i32) {
    let _ = STOP.compare_exchange(0, signal.max(1), Ordering::SeqCst, Ordering::SeqCst);
}

#[cfg(unix)]
mod signals {
    pub const SIGINT: i32 = 2;
    pub const SIGTERM: i32 = 15;
    const SIG_DFL: usize = 0;
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    extern "C" fn on_signal(sig: i32) {
        super::request_stop(sig);
        // A second signal kills at once (signal(2) is async-signal-safe).
        unsafe {
            signal(sig, SIG_DFL);
        }
    }
    pub fn install() {
        let h = on_signal as extern "C" fn(i32) as usize;
        unsafe {
            signal(SIGINT, h);
            signal(SIGTERM, h);
        }
    }
}

/// Make SIGINT and SIGTERM stop the batch cleanly (see the module notes).
pub fn install_stop_handler() {
    #[cfg(unix)]
    signals::install();
}

// ---------------------------------------------------------------------------------------------
// The run

/// Everything `moss generate --prompts` was given.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// The list; `-` reads stdin.
    pub prompts: PathBuf,
    /// Adapters merged into the transformer once, before the first picture.
    pub loras: Vec<crate::lora::LoraSpec>,
    pub defaults: Defaults,
    pub out_dir: PathBuf,
    pub name: String,
    pub skip_existing: bool,
    /// Let a list item's `out` be an absolute path (off by default: a list is untrusted input).
    pub allow_absolute_out: bool,
    pub shard: Shard,
    pub chunk: Option<usize>,
    pub uncond_skip: Vec<usize>,
    pub skip_window: (f64, f64),
    pub max_tokens: usize,
    pub model: String,
    pub device: Device,
    pub precision: crate::options::Precision,
    /// JPEG quality (`--quality`) for the items written as JPEG.
    pub quality: Option<u8>,
}

/// A written picture.
#[derive(Clone, Debug)]
pub struct Finished {
    pub index: usize,
    pub line: usize,
    pub path: PathBuf,
    pub seed: u64,
    pub steps: u32,
    pub width: u32,
    pub height: u32,
    /// This picture's own compute: encoding its texts (0 when an earlier item of its chunk had
    /// the same ones), denoising, decoding and writing. Weight loading is not in them.
    pub encode_s: f64,
    pub denoise_s: f64,
    pub decode_s: f64,
    /// Seconds since the batch started.
    pub elapsed_s: f64,
}

impl Finished {
    pub fn json(&self) -> String {
        serde_json::json!({
            "index": self.index,
            "line": self.line,
            "path": self.path.display().to_string(),
            "seed": self.seed,
            "steps": self.steps,
            "width": self.width,
            "height": self.height,
            "timings": {"encode_s": self.encode_s, "denoise_s": self.denoise_s, "decode_s": self.decode_s,
                        "total_s": self.encode_s + self.denoise_s + self.decode_s},
            "elapsed_s": self.elapsed_s,
        })
        .to_string()
    }
}

/// How a batch ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub written: usize,
    /// Items of this shard that were not rendered: bad lines and failed renders.
    pub failed: usize,
    pub skipped: usize,
    pub elsewhere: usize,
    /// The signal that stopped the run early.
    pub stopped_by: Option<i32>,
}

/// What the batch tells the user (the CLI draws bars on a terminal; the default says nothing).
pub trait BatchProgress {
    /// The work ahead: `pictures` to render, with `steps` denoising steps in all.
    fn begin(&mut self, _pictures: usize, _steps: u64) {}
    /// Stage `name` ("encode", "denoise", "decode") of chunk `chunk` of `chunks` (from 0) starts.
    fn stage(&mut self, _name: &str, _chunk: usize, _chunks: usize) {}
    /// Work on `job` starts in the current stage: `i` of the `n` in it (from 0).
    fn item(&mut self, _job: &Job, _i: usize, _n: usize) {}
    /// A denoising step of the current picture ended.
    fn step(&mut self, _done: usize, _total: usize) {}
    fn finished(&mut self, _f: &Finished) {}
    /// An item failed; `msg` starts with `FILE:LINE:`.
    fn failed(&mut self, msg: &str) {
        eprintln!("moss: error: {msg}");
    }
    fn warn(&mut self, msg: &str) {
        eprintln!("moss: warning: {msg}");
    }
}

pub struct Quiet;
impl BatchProgress for Quiet {}

/// Read the list: a file, or stdin for `-`.
fn read_list(p: &Path) -> Result<(Vec<u8>, String)> {
    if p.as_os_str() == "-" {
        let mut b = vec![];
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("cannot read the prompts from stdin")?;
        Ok((b, "<stdin>".to_string()))
    } else {
        let b = std::fs::read(p).with_context(|| format!("cannot read prompts {}", p.display()))?;
        Ok((b, p.display().to_string()))
    }
}

/// Token ids of a job's texts (the negative only with guidance != 1).
struct Texts {
    prompt: Vec<u32>,
    negative: Option<Vec<u32>>,
    cut: pipeline::Cut,
}

/// `moss generate --prompts`: plan, then render this shard's items chunk by chunk.
pub fn run(o: &BatchOptions, progress: &mut dyn BatchProgress) -> Result<Summary> {
    let t0 = Instant::now();
    check_defaults(&o.defaults)?;
    let name = Template::parse(&o.name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let example = name.render(&NameVars { index: 0, line: 1, seed: o.defaults.seed, shard: 0, prompt: "" });
    crate::picture::Format::of(Path::new(&example)).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let (bytes, src) = read_list(&o.prompts)?;
    std::fs::create_dir_all(&o.out_dir).with_context(|| format!("cannot create --out-dir {}", o.out_dir.display()))?;
    crate::output::check(&o.out_dir.join(".moss-batch-probe.png"))?;
    let mut ck = pipeline::open_checkpoint(&o.model)?;
    ck.attach_loras(&o.loras)?;

    let entries = parse_list(&bytes, &o.defaults);
    let plan = plan(entries, &o.out_dir, &name, o.shard, o.skip_existing, o.allow_absolute_out);
    if let Some(q) = o.quality {
        let jpeg = |j: &Job| crate::picture::Format::of(&j.path).ok() == Some(crate::picture::Format::Jpeg);
        if !plan.jobs.iter().chain(&plan.skipped).any(jpeg) {
            anyhow::bail!("--quality {q} applies to JPEG pictures (.jpg, .jpeg), and this batch writes none");
        }
        crate::picture::check(Path::new("x.jpg"), Some(q))?;
    }
    let mut sum = Summary { skipped: plan.skipped.len(), elsewhere: plan.elsewhere, ..Default::default() };
    for b in &plan.bad {
        progress.failed(&format!("{src}:{}: {}", b.line, b.error));
        sum.failed += 1;
    }

    // Folders and tokens, still before any weights are read. No output may be an input.
    let ck_files = crate::output::files_below(&ck.loc.root);
    let mut inputs: Vec<(&str, &Path)> = ck_files.iter().map(|f| ("a checkpoint file", f.as_path())).collect();
    if !crate::output::is_stdout(&o.prompts) {
        inputs.push(("the prompts list", &o.prompts));
    }
    let inputs = crate::output::Inputs::new(&inputs);
    let tok = PromptTokenizer::from_file(&ck.tokenizer_path())?;
    let mut folders: HashMap<PathBuf, Result<(), String>> = HashMap::new();
    let mut jobs = vec![];
    let mut texts = vec![];
    for j in plan.jobs {
        let at = format!("{src}:{}", j.item.line);
        let dir = j.path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        let ok = folders
            .entry(dir.clone())
            .or_insert_with(|| {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create folder {}", dir.display()))
                    .and_then(|_| crate::output::check(&j.path))
                    .map_err(|e| format!("{e:#}"))
            })
            .clone();
        let tk = ok.map_err(anyhow::Error::msg).and_then(|_| {
            crate::output::target(&j.path)?;
            crate::output::check_against(&[("the output", &j.path)], &inputs)?;
            let mut enc = |t: &str, what: &str| -> Result<(Vec<u32>, Option<usize>)> {
                let tk = tok.encode(t, o.max_tokens)?;
                if let Some(n) = tk.truncated_from {
                    progress.warn(&format!("{at}: {what} has {n} tokens; keeping the first {}", o.max_tokens));
                }
                Ok((tk.ids, tk.truncated_from))
            };
            let (prompt, prompt_cut) = enc(&j.item.prompt, "prompt")?;
            let (negative, negative_cut) = match j.item.guidance != 1.0 {
                true => enc(&j.item.negative, "negative prompt").map(|(ids, cut)| (Some(ids), cut))?,
                false => (None, None),
            };
            Ok(Texts { prompt, negative, cut: pipeline::Cut { prompt: prompt_cut, negative: negative_cut } })
        });
        match tk {
            Ok(t) => {
                jobs.push(j);
                texts.push(t);
            }
            Err(e) => {
                progress.failed(&format!("{at}: {e:#}"));
                sum.failed += 1;
            }
        }
    }
    if jobs.is_empty() {
        return Ok(sum);
    }

    let hidden = ck.encoder.hidden_size;
    let c = ck.dit.latent_channels;
    let costs: Vec<u64> = jobs
        .iter()
        .zip(&texts)
        .map(|(j, t)| {
            let n = t.prompt.len() + t.negative.as_ref().map_or(0, |v| v.len());
            job_bytes(n, hidden, c, j.item.width, j.item.height)
        })
        .collect();
    // On the CPU a picture takes minutes or hours and a weight load well under its time: chunks
    // of one write every picture as soon as it is decoded, so a stopped list keeps its work.
    let max_items = o.chunk.or(match o.device {
        Device::Cpu => Some(1),
        Device::Cuda(_) => None,
    });
    let chunks = plan_chunks(&costs, chunk_budget_bytes(o.device), max_items);
    progress.begin(jobs.len(), jobs.iter().map(|j| j.item.steps as u64).sum());
    let ctx = Ctx { ck: &ck, o, src: &src, t0 };
    let r = match o.device {
        Device::Cpu => render(&Cpu, &ctx, &jobs, &texts, &chunks, progress, &mut sum),
        Device::Cuda(n) => {
            let cu = pipeline::cuda(n, o.precision)?;
            let tokens = texts.iter().map(|t| t.prompt.len().max(t.negative.as_ref().map_or(0, |v| v.len()))).max();
            let sizes: Vec<(u32, u32)> = jobs.iter().map(|j| (j.item.width, j.item.height)).collect();
            if let Some(l) = tokens {
                pipeline::preflight_cuda(&cu, &ck, Some(l), &sizes)?;
            }
            render(&cu, &ctx, &jobs, &texts, &chunks, progress, &mut sum)
        }
    };
    match r {
        Ok(()) => Ok(sum),
        Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
            sum.stopped_by = Some(stop_signal().unwrap_or(2));
            Ok(sum)
        }
        Err(e) => Err(e),
    }
}

struct Ctx<'a> {
    ck: &'a Checkpoint,
    o: &'a BatchOptions,
    src: &'a str,
    t0: Instant,
}

impl Ctx<'_> {
    fn request(&self, j: &Job, t: &Texts) -> Request {
        let it = &j.item;
        Request {
            prompt: it.prompt.clone(),
            negative: it.negative.clone(),
            seed: it.seed,
            steps: it.steps,
            guidance: it.guidance,
            width: it.width,
            height: it.height,
            out: j.path.clone(),
            save_latents: None,
            embeds: None,
            prompt_file: None,
            device: self.o.device,
            uncond_skip: self.o.uncond_skip.clone(),
            skip_window: self.o.skip_window,
            max_tokens: self.o.max_tokens,
            precision: self.o.precision,
            // --quality is for the batch's JPEG pictures; its PNG and WebP ones have none.
            quality: self.o.quality.filter(|_| crate::picture::Format::of(&j.path).ok() == Some(crate::picture::Format::Jpeg)),
            cut: t.cut,
        }
    }
}

fn check_stop() -> Result<()> {
    if stop_signal().is_some() {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// Steps of one picture go to the batch's progress; the stop request is asked after each.
struct Steps<'a>(&'a mut dyn BatchProgress);

impl Progress for Steps<'_> {
    fn step(&mut self, done: usize, total: usize) {
        self.0.step(done, total);
    }
    fn warn(&mut self, msg: &str) {
        self.0.warn(msg);
    }
    fn cancelled(&self) -> bool {
        stop_signal().is_some()
    }
}

/// Per-picture state through the stages of a chunk.
#[derive(Default)]
struct Slot {
    failed: bool,
    encode_s: f64,
    denoise_s: f64,
    latents: Option<Tensor>,
}

/// Render the chunks; a failing item is reported and the rest go on; a failing component load
/// ends the run (Err), as does a stop request (Err(Interrupted)).
fn render<B: EncoderOps + DitOps + VaeOps>(
    b: &B,
    cx: &Ctx,
    jobs: &[Job],
    texts: &[Texts],
    chunks: &[Range<usize>],
    progress: &mut dyn BatchProgress,
    sum: &mut Summary,
) -> Result<()> {
    let ck = cx.ck;
    for (ci, range) in chunks.iter().enumerate() {
        let jobs = &jobs[range.clone()];
        let texts = &texts[range.clone()];
        let mut slots: Vec<Slot> = jobs.iter().map(|_| Slot::default()).collect();
        let fail = |slot: &mut Slot, j: &Job, e: &anyhow::Error, progress: &mut dyn BatchProgress, sum: &mut Summary| {
            progress.failed(&format!("{}:{}: {e:#}", cx.src, j.item.line));
            slot.failed = true;
            sum.failed += 1;
        };

        // 1. Encode every distinct text once; then the encoder is freed.
        progress.stage("encode", ci, chunks.len());
        let mut hidden: HashMap<&[u32], Tensor> = HashMap::new();
        {
            let comp = ck.open_component("text_encoder")?;
            let enc = Encoder::load(b, &comp, &ck.encoder)?;
            for (i, (j, t)) in jobs.iter().zip(texts).enumerate() {
                progress.item(j, i, jobs.len());
                let t1 = Instant::now();
                for ids in std::iter::once(&t.prompt).chain(t.negative.as_ref()) {
                    if hidden.contains_key(ids.as_slice()) {
                        continue;
                    }
                    check_stop()?;
                    match pipeline::hidden_states(b, &enc, ids, cx.o.precision) {
                        Ok(h) => {
                            hidden.insert(ids.as_slice(), h);
                        }
                        Err(e) => {
                            fail(&mut slots[i], j, &e, progress, sum);
                            break;
                        }
                    }
                }
                slots[i].encode_s = t1.elapsed().as_secs_f64();
            }
        }

        if slots.iter().all(|s| s.failed) {
            continue;
        }

        // 2. Denoise every picture with the DiT loaded once; then it is freed.
        progress.stage("denoise", ci, chunks.len());
        b.release_cached()?; // the encoder is gone
        {
            let comp = ck.open_component("transformer")?;
            let dit = Dit::load(b, &comp, &ck.dit)?;
            for (i, (j, t)) in jobs.iter().zip(texts).enumerate() {
                if slots[i].failed {
                    continue;
                }
                check_stop()?;
                progress.item(j, i, jobs.len());
                let cond = &hidden[t.prompt.as_slice()];
                let uncond = t.negative.as_ref().map_or(cond, |n| &hidden[n.as_slice()]);
                let t1 = Instant::now();
                match pipeline::denoise_with(b, &dit, ck, &cx.request(j, t), cond, uncond, &mut Steps(&mut *progress)) {
                    Ok(z) => slots[i].latents = Some(z),
                    Err(e) if e.downcast_ref::<Interrupted>().is_some() => return Err(e),
                    Err(e) => fail(&mut slots[i], j, &e, progress, sum),
                }
                slots[i].denoise_s = t1.elapsed().as_secs_f64();
            }
        }
        drop(hidden);
        b.release_cached()?; // the DiT is gone
        if slots.iter().all(|s| s.latents.is_none()) {
            continue;
        }

        // 3. Decode and write every picture with the VAE loaded once.
        progress.stage("decode", ci, chunks.len());
        let comp = ck.open_component("vae")?;
        let vae = VaeDecoder::load(b, &comp, &ck.vae)?;
        for (i, j) in jobs.iter().enumerate() {
            let Some(z) = slots[i].latents.take() else { continue };
            check_stop()?;
            progress.item(j, i, jobs.len());
            let t1 = Instant::now();
            let req = cx.request(j, &texts[i]);
            let res = pipeline::picture_bytes(b, &vae, ck, &req, &z, &mut Steps(&mut *progress))
                .and_then(|bytes| crate::output::write(&j.path, &bytes));
            match res {
                Ok(()) => {
                    sum.written += 1;
                    progress.finished(&Finished {
                        index: j.item.index,
                        line: j.item.line,
                        path: j.path.clone(),
                        seed: j.item.seed,
                        steps: j.item.steps,
                        width: j.item.width,
                        height: j.item.height,
                        encode_s: slots[i].encode_s,
                        denoise_s: slots[i].denoise_s,
                        decode_s: t1.elapsed().as_secs_f64(),
                        elapsed_s: cx.t0.elapsed().as_secs_f64(),
                    });
                }
                Err(e) => fail(&mut slots[i], j, &e, progress, sum),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> Defaults {
        Defaults { negative: "blurry".into(), seed: 100, steps: 4, guidance: 3.0, size: (64, 64) }
    }

    fn vars(index: usize, seed: u64, prompt: &str) -> NameVars<'_> {
        NameVars { index, line: index + 2, seed, shard: index % 3, prompt }
    }

    #[test]
    fn plain_json_and_blank_lines() {
        let text = b"\xef\xbb\xbfa cat  \r\n\n   \n{\"prompt\": \"a dog\", \"seed\": 7, \"size\": \"96x64\", \"steps\": 2, \"guidance\": 1, \"negative\": \"\", \"out\": \"x/{index}.png\"}\n{\"prompt\":\"p\",\"seed\":null}\n  {not json\n";
        let v = parse_list(text, &d());
        assert_eq!(v.len(), 4);
        let a = v[0].as_ref().unwrap();
        assert_eq!((a.index, a.line, a.prompt.as_str(), a.seed, a.negative.as_str()), (0, 1, "a cat", 100, "blurry"));
        let b = v[1].as_ref().unwrap();
        assert_eq!((b.index, b.line, b.prompt.as_str(), b.seed), (1, 4, "a dog", 7));
        assert_eq!((b.width, b.height, b.steps, b.guidance, b.negative.as_str()), (96, 64, 2, 1.0, ""));
        assert_eq!(b.out.as_deref(), Some("x/{index}.png"));
        let c = v[2].as_ref().unwrap();
        assert_eq!((c.index, c.seed, c.steps), (2, 102, 4), "null leaves the default");
        let e = v[3].as_ref().unwrap_err();
        assert_eq!((e.index, e.line), (3, 6));
        assert!(e.error.contains("invalid JSON"), "{}", e.error);
    }

    #[test]
    fn bad_fields() {
        let bad = |line: &str, needle: &str| {
            let e = parse_line(line, 0, 1, &d()).unwrap_err();
            assert!(e.contains(needle), "{line}: {e:?} lacks {needle:?}");
        };
        bad(r#"{"prompt": "x", "size": "100x64"}"#, "multiple of 16");
        bad(r#"{"prompt": "x", "size": "8192x64"}"#, "cap");
        bad(r#"{"prompt": "x", "size": 64}"#, "`size` must be a string");
        bad(r#"{"prompt": "x", "steps": 0}"#, "steps 0");
        bad(r#"{"prompt": "x", "steps": 1001}"#, "steps 1001");
        bad(r#"{"prompt": "x", "steps": 2.5}"#, "whole number");
        bad(r#"{"prompt": "x", "seed": -1}"#, "seed");
        bad(r#"{"prompt": "x", "guidance": "3"}"#, "number");
        bad(r#"{"prompt": "x", "guidance": 1e300}"#, "finite");
        bad(r#"{"prompt": "x", "sede": 1}"#, "unknown field `sede`");
        bad(r#"{"prompt": "x", "out": "{nope}.png"}"#, "unknown field `{nope}`");
        bad(r#"{"prompt": "x", "out": ""}"#, "empty");
        bad(r#"{"seed": 1}"#, "no `prompt`");
        bad(r#"{"prompt": 5}"#, "must be a string");
        bad(r#"{"prompt": "x"} trailing"#, "invalid JSON");
        let e = &parse_list(b"ok\n\xff\xfe bad\nok\n", &d())[1];
        assert_eq!(e.as_ref().unwrap_err().line, 2);
        assert!(e.as_ref().unwrap_err().error.contains("UTF-8"));
        assert!(check_defaults(&Defaults { steps: 0, ..d() }).unwrap_err().to_string().contains("--steps"));
    }

    #[test]
    fn templates() {
        let t = |s: &str, v: &NameVars| Template::parse(s).unwrap().render(v);
        assert_eq!(t(DEFAULT_NAME, &vars(7, 42, "")), "00007-42.png");
        assert_eq!(t("{index}-{line:03}-{seed:06}-{shard}.png", &vars(12, 5, "")), "12-014-000005-0.png");
        assert_eq!(t("{{x}}/{stem}.png", &vars(0, 0, "A Cat, on a MAT!  (oil)")), "{x}/a-cat-on-a-mat-oil.png");
        assert_eq!(t("{stem:5}", &vars(0, 0, "Hello world")), "hello");
        assert_eq!(t("{stem:6}", &vars(0, 0, "Hello world")), "hello", "no dash at the end");
        assert_eq!(t("{stem}", &vars(0, 0, "  !!! ")), "prompt");
        assert_eq!(t("{stem}", &vars(0, 0, "東京の猫")), "東京の猫");
        assert_eq!(t("{index:05}", &vars(123456, 0, "")), "123456", "wider numbers are kept whole");
        for (bad, needle) in [
            ("{foo}.png", "unknown field"),
            ("{index.png", "not closed"),
            ("a}.png", "lone"),
            ("{index:5}", ":0N"),
            ("{index:0x}", "width"),
            ("{stem:0}", "width"),
            ("", "empty"),
        ] {
            let e = Template::parse(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn shards() {
        assert_eq!("1/4".parse::<Shard>(), Ok(Shard { k: 1, n: 4 }));
        assert_eq!("0/1".parse::<Shard>(), Ok(Shard::default()));
        assert!("4/4".parse::<Shard>().unwrap_err().contains("counts from 0"));
        assert!("0/0".parse::<Shard>().unwrap_err().contains("at least 1"));
        assert!("1".parse::<Shard>().unwrap_err().contains("K/N"));
        assert!("-1/4".parse::<Shard>().is_err());
        let n = 3;
        let mut seen = vec![0; 10];
        for k in 0..n {
            let s = Shard { k, n };
            for (i, c) in seen.iter_mut().enumerate() {
                if s.owns(i) {
                    *c += 1;
                }
            }
        }
        assert_eq!(seen, vec![1; 10]);
    }

    #[test]
    fn plans_name_shard_and_refuse_clashes() {
        let text = b"a\nb\n{\"prompt\":\"c\",\"out\":\"00000-100.png\"}\n{\"prompt\":\"d\",\"out\":\"./x.png\"}\n{\"prompt\":\"e\",\"out\":\"x.png\"}\n{bad\n";
        let dir = Path::new("/tmp/moss-plan-unit");
        let name = Template::parse(DEFAULT_NAME).unwrap();
        let p = plan(parse_list(text, &d()), dir, &name, Shard::default(), false, false);
        let names: Vec<String> = p.jobs.iter().map(|j| j.path.display().to_string()).collect();
        assert_eq!(names, ["/tmp/moss-plan-unit/00000-100.png", "/tmp/moss-plan-unit/00001-101.png", "/tmp/moss-plan-unit/x.png"]);
        let bad: Vec<(usize, bool)> = p.bad.iter().map(|b| (b.line, b.error.contains("already line"))).collect();
        assert_eq!(bad, [(3, true), (5, true), (6, false)], "{:?}", p.bad);
        // Shard 1/2 owns indices 1, 3, 5: item 3 (d) renders, 5 (bad) fails, 1 renders.
        let p = plan(parse_list(text, &d()), dir, &name, Shard { k: 1, n: 2 }, false, false);
        assert_eq!(p.jobs.iter().map(|j| j.item.index).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(p.bad.iter().map(|b| b.index).collect::<Vec<_>>(), [5]);
        assert_eq!(p.elsewhere, 3);
    }

    #[test]
    fn plans_keep_items_inside_the_out_dir() {
        let dir = std::env::temp_dir().join(format!("moss-plan-escape-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("x")).unwrap();
        let abs = dir.join("same.png");
        let text = format!(
            "{{\"prompt\":\"a\",\"out\":\"same.png\"}}\n{{\"prompt\":\"b\",\"out\":\"x/../same.png\"}}\n\
             {{\"prompt\":\"c\",\"out\":\"{}\"}}\n{{\"prompt\":\"d\",\"out\":\"../keep.png\"}}\n\
             {{\"prompt\":\"e\",\"out\":\"x/../../keep.png\"}}\n{{\"prompt\":\"f\",\"out\":\"x/ok.png\"}}\n",
            abs.display()
        );
        let name = Template::parse(DEFAULT_NAME).unwrap();
        let p = plan(parse_list(text.as_bytes(), &d()), &dir, &name, Shard::default(), false, false);
        assert_eq!(p.jobs.iter().map(|j| j.item.line).collect::<Vec<_>>(), [1, 6]);
        let why: Vec<(usize, &str)> = p.bad.iter().map(|b| (b.line, b.error.as_str())).collect();
        assert!(why[0].0 == 2 && why[0].1.contains("already line 1"), "{why:?}");
        assert!(why[1].0 == 3 && why[1].1.contains("absolute"), "{why:?}");
        assert!(why[2].0 == 4 && why[2].1.contains("leaves --out-dir"), "{why:?}");
        assert!(why[3].0 == 5 && why[3].1.contains("leaves --out-dir"), "{why:?}");
        // With the opt-in, the absolute spelling of line 1's file is a clash, not a second file.
        let p = plan(parse_list(text.as_bytes(), &d()), &dir, &name, Shard::default(), false, true);
        assert!(p.bad.iter().any(|b| b.line == 3 && b.error.contains("already line 1")), "{:?}", p.bad);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn chunks() {
        assert_eq!(plan_chunks(&[1, 1, 1, 1, 1], u64::MAX, None), vec![0..5]);
        assert_eq!(plan_chunks(&[1, 1, 1, 1, 1], u64::MAX, Some(2)), vec![0..2, 2..4, 4..5]);
        assert_eq!(plan_chunks(&[5, 5, 5, 20, 1], 10, None), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(plan_chunks(&[], 10, None), Vec::<Range<usize>>::new());
        assert_eq!(chunk_budget_bytes(Device::Cpu), u64::MAX, "on the cpu a chunk is the whole list");
        assert_eq!(job_bytes(10, 64, 128, 64, 32), 4 * (640 + 128 * 8));
    }
}
