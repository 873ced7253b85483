//! Shards and the plan: which items this process renders, their output paths, and the chunks
//! the stages run in (by memory cost).

use super::*;
use crate::backend::Device;
use anyhow::Result;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

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
pub fn plan(entries: Vec<Result<Item, BadLine>>, out_dir: &Path, name: &Template, shard: Shard, skip_existing: bool, allow_absolute: bool) -> Plan {
    let mut p = Plan::default();
    let mut owner: HashMap<PathBuf, usize> = HashMap::new();
    for e in entries {
        let res = e.and_then(|it| {
            let tpl = match &it.out {
                Some(o) => Template::parse(o).map_err(|error| BadLine { index: it.index, line: it.line, error })?,
                None => name.clone(),
            };
            let vars = NameVars { index: it.index, line: it.line, seed: it.spec.seed, shard: shard.of(it.index), prompt: &it.spec.prompt };
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
/// (planned up front by `crate::plan::run`), so what a chunk holds between stages lives in
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
