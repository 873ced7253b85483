//! Output names: the `--name` / `out` template over an item's index, line, seed, shard and
//! prompt stem, and the path checks that keep a list's outputs inside `--out-dir`.

use super::*;
use anyhow::Result;
use std::path::{Component, Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Part {
    Lit(String),
    /// A number, zero-padded to the width (0: as it is).
    Num(NumField, usize),
    /// The prompt slug, at most this many characters.
    Stem(usize),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum NumField {
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
pub(super) fn normalize(p: &Path) -> PathBuf {
    let out: PathBuf = p.components().filter(|c| *c != Component::CurDir).collect();
    if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    }
}

/// `p` with `.` and `..` folded lexically; None when a `..` climbs above the start.
pub(super) fn fold_dots(p: &Path) -> Option<PathBuf> {
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
pub(super) fn resolved(p: &Path) -> PathBuf {
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
