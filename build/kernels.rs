//! Kernels declared once: the typed Rust launchers of every `extern "C" __global__` entry point,
//! generated from the kernels' own parameter lists (docs/DEVELOPERS.md, "Kernels declared once").
//!
//! build.rs runs the C preprocessor over the production and the check image's translation units
//! (the kernels' names and parameter lists are often written by macros) and hands the text to
//! [`parse`]; [`generate`] writes `OUT_DIR/kernels.rs`, which `crates/moss-cuda/src/kernels.rs`
//! includes. Pure std, so the crate's tests include this file too and run it on fixtures.
//!
//! Kernels group into families: names that differ only in a trailing run of element-type tokens
//! ([`VARIANT_TOKENS`]: `moss_add_bf16_f32`, `moss_copy2d_u16`) share a stem (`moss_add`). Every
//! member of a family must have the same Rust parameter list; the family becomes one `static`
//! (`ADD`: `Family<fn(Dev, Dev, Dev, i64, i64, i32)>`, check-image families in `controls`) and each
//! distinct parameter list one `launch` method, so a caller passing the wrong arguments does not
//! compile, and a kernel whose signature changes breaks its callers' build. Pointer parameters are
//! `Dev` (a device address with its element type); the launch picks the member whose pointee types
//! are the arguments' (`Elem`). Anything the generator cannot map one way stops the build, naming
//! the kernel.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One parameter of a kernel: its C name and spelling, and what the launcher passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    /// The C type as written (qualifiers kept, e.g. `const bf16*`).
    pub c: String,
    pub ty: Ty,
}

/// What a parameter is on the Rust side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ty {
    /// A device pointer to elements of this kind (an `Elem` variant name).
    Ptr(&'static str),
    /// A value passed as this Rust type (`i32`, `PermArgs`, `&TensorMap`, ...).
    Value(&'static str),
}

/// One `extern "C" __global__` entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    /// `file:line` of its definition (of the macro call that wrote it).
    pub at: String,
    pub params: Vec<Param>,
}

/// Pointee C types (after `using` aliases) and their `Elem` variant.
const POINTEES: [(&str, &str); 17] = [
    ("__nv_bfloat16", "BF16"),
    ("float", "F32"),
    ("__nv_fp8_e4m3", "F8E4M3"),
    ("__half", "F16"),
    ("double", "F64"),
    ("int", "I32"),
    ("long", "I64"),
    ("unsigned", "U32"),
    ("unsigned int", "U32"),
    ("uint32_t", "U32"),
    ("unsigned short", "U16"),
    ("unsigned char", "U8"),
    ("uint8_t", "U8"),
    ("uint2", "U32x2"),
    ("uint4", "U32x4"),
    ("float2", "F32x2"),
    ("void", "Void"),
];

/// Value C types and their Rust type. `long` is 64 bits: the kernels are built for LP64 hosts
/// (Linux x86-64 / aarch64). A `struct` passed by value is listed with the Rust type of the same
/// layout; a TMA descriptor (`__grid_constant__`) is passed by reference to the driver.
const VALUES: [(&str, &str); 16] = [
    ("int", "i32"),
    ("int32_t", "i32"),
    ("unsigned", "u32"),
    ("unsigned int", "u32"),
    ("uint32_t", "u32"),
    ("long", "i64"),
    ("long long", "i64"),
    ("int64_t", "i64"),
    ("unsigned long", "u64"),
    ("unsigned long long", "u64"),
    ("uint64_t", "u64"),
    ("size_t", "u64"),
    ("float", "f32"),
    ("double", "f64"),
    ("MossPerm", "PermArgs"),
    ("TmaMap", "&TensorMap"),
];

/// Trailing name tokens that tell members of one family apart: element types (`bf16`, `f32`, ...,
/// `to` as in `_f32_bf16_to_bf16`) and the byte-moving kernels' units (`u2` ... `u16`).
pub const VARIANT_TOKENS: [&str; 9] = ["bf16", "f32", "f16", "f8e4m3", "to", "u2", "u4", "u8", "u16"];

/// C keywords a parameter type may be spelled with (so `unsigned int` is not read as the type
/// `unsigned` and a parameter named `int`).
const TYPE_WORDS: [&str; 9] = ["void", "char", "short", "int", "long", "float", "double", "unsigned", "signed"];
const QUALIFIERS: [&str; 6] = ["const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__"];

#[derive(Clone, Debug, PartialEq, Eq)]
struct Tok {
    text: String,
    at: String,
}

/// Tokens of preprocessed C++ with the `file:line` each came from (line markers `# N "file"` and
/// `#line N "file"` followed). Comments are gone after preprocessing; string and character
/// literals are single tokens; `::` is one token, every other punctuation character its own.
fn tokens(text: &str) -> Vec<Tok> {
    let mut out = vec![];
    // the file and line of the next line of text
    let (mut file, mut next) = (String::from("?"), 1usize);
    for raw in text.lines() {
        let line = next;
        next += 1;
        let t = raw.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            // a line marker: `# 12 "cuda/x.cu" 1` or `#line 12 "cuda/x.cu"`; other directives
            // (`#pragma`) carry no declarations
            let rest = rest.trim_start().strip_prefix("line").unwrap_or(rest).trim_start();
            let num: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(n) = num.parse::<usize>() {
                next = n;
                if let Some(q) = rest.find('"') {
                    if let Some(e) = rest[q + 1..].find('"') {
                        file = rest[q + 1..q + 1 + e].to_string();
                    }
                }
            }
            continue;
        }
        let at = format!("{file}:{line}");
        let b = raw.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i] as char;
            let start = i;
            if c.is_whitespace() {
                i += 1;
                continue;
            } else if c.is_ascii_alphabetic() || c == '_' {
                while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
            } else if c.is_ascii_digit() {
                while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                    i += 1;
                }
            } else if c == '"' || c == '\'' {
                i += 1;
                while i < b.len() && b[i] as char != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
            } else if c == ':' && b.get(i + 1) == Some(&b':') {
                i += 2;
            } else {
                i += c.len_utf8();
            }
            out.push(Tok { text: raw[start..i].to_string(), at: at.clone() });
        }
    }
    out
}

/// `using NAME = TYPE;` aliases of plain types; a name given two meanings maps to `None`.
fn aliases(toks: &[Tok]) -> BTreeMap<String, Option<String>> {
    let mut m: BTreeMap<String, Option<String>> = BTreeMap::new();
    for i in 0..toks.len() {
        if toks[i].text != "using" || toks.get(i + 2).is_none_or(|t| t.text != "=") {
            continue;
        }
        let Some(end) = toks[i + 3..].iter().position(|t| t.text == ";") else { continue };
        let meaning = toks[i + 3..i + 3 + end].iter().map(|t| t.text.as_str()).collect::<Vec<_>>().join(" ");
        let e = m.entry(toks[i + 1].text.clone()).or_insert_with(|| Some(meaning.clone()));
        if e.as_deref() != Some(meaning.as_str()) {
            *e = None;
        }
    }
    m
}

/// Every `extern "C" __global__` entry point of a preprocessed translation unit, in order; a
/// kernel declared and defined (or defined twice, identically) counts once.
pub fn parse(text: &str) -> Result<Vec<Kernel>, String> {
    let toks = tokens(text);
    let alias = aliases(&toks);
    let mut out: Vec<Kernel> = vec![];
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text != "__global__" {
            i += 1;
            continue;
        }
        let at = toks[i].at.clone();
        let c_linkage = i >= 2 && toks[i - 2].text == "extern" && toks[i - 1].text == "\"C\"";
        // `void`, attributes with their arguments (`__launch_bounds__(..)`), then the name
        let mut j = i + 1;
        let mut void = false;
        let name = loop {
            let t = toks.get(j).ok_or_else(|| format!("{at}: a kernel without a name"))?;
            if t.text == "void" {
                void = true;
                j += 1;
            } else if t.text.starts_with("__") && toks.get(j + 1).is_some_and(|n| n.text == "(") {
                j = close(&toks, j + 1).ok_or_else(|| format!("{at}: unclosed `{}(`", t.text))? + 1;
            } else if is_ident(&t.text) && toks.get(j + 1).is_some_and(|n| n.text == "(") {
                break t.text.clone();
            } else {
                return Err(format!("{at}: cannot read the kernel after `__global__` at `{}`", t.text));
            }
        };
        let fail = |why: String| format!("kernel `{name}` ({at}): {why}");
        if !c_linkage {
            return Err(fail("a `__global__` function without `extern \"C\"`: moss launches kernels by their C names (MOSS_KERNEL)".into()));
        }
        if !void {
            return Err(fail("a kernel returns `void`".into()));
        }
        let open = j + 1;
        let end = close(&toks, open).ok_or_else(|| fail("unclosed parameter list".into()))?;
        let params = params(&toks[open + 1..end], &alias).map_err(fail)?;
        match toks.get(end + 1).map(|t| t.text.as_str()) {
            Some("{") | Some(";") => {}
            other => return Err(fail(format!("expected the body or `;` after the parameters, found {other:?}"))),
        }
        match out.iter().find(|k| k.name == name) {
            Some(k) if k.params.iter().map(|p| &p.ty).eq(params.iter().map(|p| &p.ty)) => {}
            Some(k) => return Err(fail(format!("declared twice with different parameters (also at {})", k.at))),
            None => out.push(Kernel { name, at, params }),
        }
        i = end;
    }
    Ok(out)
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The index of the `)` closing the `(` at `open`.
fn close(toks: &[Tok], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// The parameters between a kernel's parentheses.
fn params(toks: &[Tok], alias: &BTreeMap<String, Option<String>>) -> Result<Vec<Param>, String> {
    if toks.is_empty() || (toks.len() == 1 && toks[0].text == "void") {
        return Ok(vec![]);
    }
    let mut parts: Vec<&[Tok]> = vec![];
    let (mut depth, mut from) = (0i32, 0);
    for (k, t) in toks.iter().enumerate() {
        match t.text.as_str() {
            "(" | "<" | "[" => depth += 1,
            ")" | ">" | "]" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&toks[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&toks[from..]);
    parts.iter().enumerate().map(|(n, p)| param(n, p, alias)).collect()
}

fn param(n: usize, toks: &[Tok], alias: &BTreeMap<String, Option<String>>) -> Result<Param, String> {
    let c = toks.iter().map(|t| t.text.as_str()).collect::<Vec<_>>().join(" ").replace(" *", "*").replace(" :: ", "::");
    let bad = |why: &str| Err(format!("parameter {} `{c}`: {why}", n + 1));
    let words: Vec<&str> = toks.iter().map(|t| t.text.as_str()).filter(|w| !QUALIFIERS.contains(w)).collect();
    if words.iter().any(|w| ["=", "[", "&", "(", "..."].contains(w)) {
        return bad("defaults, arrays, references, function pointers and variadics are not launchable arguments");
    }
    let stars = words.iter().filter(|w| **w == "*").count();
    let star_at = words.iter().position(|w| *w == "*");
    if stars > 1 {
        return bad("a pointer to a pointer");
    }
    // The name: a trailing identifier after the type (after the `*`, or after a type of two or
    // more words whose last is not a C type keyword).
    let mut ty: Vec<&str> = words.clone();
    let mut name = format!("arg{}", n + 1);
    if let Some(last) = ty.last().copied() {
        let named = is_ident(last)
            && !TYPE_WORDS.contains(&last)
            && match star_at {
                Some(s) => s + 1 == ty.len() - 1,
                None => ty.len() >= 2 && ty[ty.len() - 2] != "::",
            };
        if named {
            name = last.to_string();
            ty.pop();
        }
    }
    if star_at.is_some_and(|s| s + 1 != ty.len()) {
        return bad("cannot tell the type from the name");
    }
    ty.retain(|w| *w != "*");
    let mut base = ty.join(" ").replace(" :: ", "::");
    if let Some(meaning) = alias.get(&base) {
        match meaning {
            Some(m) => base = m.clone(),
            None => return bad(&format!("`{base}` is aliased (`using`) to different types")),
        }
    }
    if base.is_empty() {
        return bad("no type");
    }
    let short = base.rsplit("::").next().unwrap_or(&base);
    let found = if star_at.is_some() {
        POINTEES.iter().find(|(t, _)| *t == base).map(|&(_, e)| Ty::Ptr(e))
    } else {
        VALUES.iter().find(|(t, _)| *t == base || (t.starts_with(|c: char| c.is_ascii_uppercase()) && *t == short)).map(|&(_, r)| Ty::Value(r))
    };
    match found {
        Some(ty) => Ok(Param { name, c, ty }),
        None => bad(&format!(
            "the C type `{base}{}` has no launcher type (build/kernels.rs {})",
            if star_at.is_some() { "*" } else { "" },
            if star_at.is_some() { "POINTEES" } else { "VALUES" }
        )),
    }
}

/// A kernel's family stem: its name without the trailing run of [`VARIANT_TOKENS`], and `_to`
/// where the run held one (`moss_rms_mod_f32_bf16_to_bf16` is of `moss_rms_mod_to`: a norm whose
/// output type is not its input's, a kernel apart).
pub fn stem(name: &str) -> String {
    let mut s = name;
    let mut to = false;
    while let Some((head, tail)) = s.rsplit_once('_') {
        if !VARIANT_TOKENS.contains(&tail) || head.is_empty() {
            break;
        }
        to |= tail == "to";
        s = head;
    }
    if to {
        format!("{s}_to")
    } else {
        s.to_string()
    }
}

/// The Rust parameter list of a kernel's launcher (`Dev` for pointers).
fn rust_types(k: &Kernel) -> Vec<&'static str> {
    k.params
        .iter()
        .map(|p| match p.ty {
            Ty::Ptr(_) => "Dev",
            Ty::Value(r) => r,
        })
        .collect()
}

fn elems(k: &Kernel) -> Vec<&'static str> {
    k.params
        .iter()
        .filter_map(|p| match p.ty {
            Ty::Ptr(e) => Some(e),
            Ty::Value(_) => None,
        })
        .collect()
}

/// Whether one argument list could select both members (equal pointee types or `void` at
/// every pointer parameter).
fn overlap(a: &[&str], b: &[&str]) -> bool {
    a.iter().zip(b).all(|(x, y)| x == y || *x == "Void" || *y == "Void")
}

struct Family<'a> {
    stem: String,
    check: bool,
    members: Vec<&'a Kernel>,
}

/// The families of both images, sorted by stem; errors name the kernels.
fn families<'a>(production: &'a [Kernel], check: &'a [Kernel]) -> Result<Vec<Family<'a>>, String> {
    let mut by: BTreeMap<String, Family<'a>> = BTreeMap::new();
    for (is_check, ks) in [(false, production), (true, check)] {
        for (i, k) in ks.iter().enumerate() {
            if let Some(first) = ks[..i].iter().find(|o| o.name == k.name) {
                return Err(format!("kernel `{}` is defined in two translation units of one image ({} and {})", k.name, first.at, k.at));
            }
            if let Some(other) = (if is_check { production } else { check }).iter().find(|o| o.name == k.name) {
                return Err(format!("kernel `{}` ({}) is in both images (also at {}): a kernel is production or a planted control", k.name, k.at, other.at));
            }
            let s = stem(&k.name);
            let f = by.entry(s.clone()).or_insert_with(|| Family { stem: s, check: is_check, members: vec![] });
            if f.check != is_check {
                return Err(format!(
                    "kernel `{}` ({}) shares the family `{}` with `{}` of the other image: name the planted control apart",
                    k.name, k.at, f.stem, f.members[0].name
                ));
            }
            let first = f.members.first().copied();
            if let Some(first) = first {
                if rust_types(first) != rust_types(k) {
                    return Err(format!(
                        "kernels `{}` ({}) and `{}` ({}) of the family `{}` take different parameters: ({}) vs ({})",
                        first.name,
                        first.at,
                        k.name,
                        k.at,
                        f.stem,
                        rust_types(first).join(", "),
                        rust_types(k).join(", ")
                    ));
                }
                if let Some(o) = f.members.iter().find(|o| overlap(&elems(o), &elems(k))) {
                    return Err(format!(
                        "kernels `{}` and `{}` ({}) of the family `{}`: their pointer types cannot tell them apart",
                        o.name, k.name, k.at, f.stem
                    ));
                }
            }
            f.members.push(k);
        }
    }
    for f in by.values() {
        let id = rust_name(&f.stem);
        if !is_ident(&id) || id.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("kernel `{}`: its family `{}` has no Rust name", f.members[0].name, f.stem));
        }
    }
    Ok(by.into_values().collect())
}

/// The check image's families named as the planted twin of a production family (`moss_ctl_X` of
/// `moss_X`), which must take its parameters.
fn twins<'f, 'a>(fams: &'f [Family<'a>]) -> Result<Vec<(&'f Family<'a>, &'f Family<'a>)>, String> {
    let mut out = vec![];
    for c in fams.iter().filter(|f| f.check) {
        let Some(rest) = c.stem.strip_prefix("moss_ctl_") else { continue };
        let Some(p) = fams.iter().find(|p| !p.check && p.stem == format!("moss_{rest}")) else { continue };
        let (pk, ck) = (p.members[0], c.members[0]);
        if rust_types(pk) != rust_types(ck) {
            return Err(format!(
                "the planted control `{}` ({}) takes other parameters than its production twin `{}` ({}): ({}) vs ({})",
                ck.name,
                ck.at,
                pk.name,
                pk.at,
                rust_types(ck).join(", "),
                rust_types(pk).join(", ")
            ));
        }
        out.push((p, c));
    }
    Ok(out)
}

/// The Rust name of a family: its stem without `moss_`, upper case.
pub fn rust_name(stem: &str) -> String {
    stem.strip_prefix("moss_").unwrap_or(stem).to_ascii_uppercase()
}

/// The marker type of a parameter list: `fn(Dev, i64)`.
fn signature(types: &[&str]) -> String {
    format!("fn({})", types.join(", "))
}

/// `OUT_DIR/kernels.rs`: the launchers of the production image's kernels and, in `controls`, the
/// check image's. The including module provides `Family`, `FamilyInfo`, `Member`, `Elem`, `Dev`,
/// `Cfg`, `Cuda`, `Result`, `PermArgs`, `TensorMap` and `arg`.
pub fn generate(production: &[Kernel], check: &[Kernel]) -> Result<String, String> {
    let fams = families(production, check)?;
    let mut rs = String::from(
        "// Generated by build.rs (build/kernels.rs) from the `extern \"C\" __global__` kernels of\n// cuda/**/*.cu: edit the kernels, not this.\n",
    );
    let mut sigs: BTreeMap<Vec<&str>, ()> = BTreeMap::new();
    for f in &fams {
        sigs.insert(rust_types(f.members[0]), ());
    }
    for types in sigs.keys() {
        let mut args = vec!["cfg: impl Into<Cfg>".to_string()];
        let (mut into, mut pick, mut slots) = (vec![], vec![], vec![]);
        for (i, t) in types.iter().enumerate() {
            let a = format!("a{i}");
            if *t == "Dev" {
                args.push(format!("{a}: impl Into<Dev>"));
                into.push(a.clone());
                pick.push(format!("{a}.elem"));
                slots.push(format!("arg(&{a}.ptr)"));
            } else if let Some(by_ref) = t.strip_prefix('&') {
                args.push(format!("{a}: &{by_ref}"));
                slots.push(format!("arg({a})"));
            } else {
                args.push(format!("{a}: {t}"));
                slots.push(format!("arg(&{a})"));
            }
        }
        let _ = write!(
            rs,
            "\nimpl Family<{sig}> {{\n    /// Launch the member of this family whose pointer parameters' element types are the arguments'\n    /// on `cuda`'s stream (a check-image view launches its planted twin instead).\n    #[allow(clippy::too_many_arguments)]\n    pub fn launch(&self, cuda: &Cuda, {args}) -> Result<()> {{\n",
            sig = signature(types),
            args = args.join(", ")
        );
        for a in &into {
            let _ = writeln!(rs, "        let {a}: Dev = {a}.into();");
        }
        let _ = write!(rs, "        cuda.launch_family(&self.info, cfg.into(), &[{}], &mut [{}])\n    }}\n}}\n", pick.join(", "), slots.join(", "));
    }
    for check in [false, true] {
        if check {
            rs.push_str("\n/// The check image's kernels: the planted controls `moss check` launches through a\n/// [`Cuda::with_image`] view in place of their production twins.\npub mod controls {\n    use super::*;\n");
        }
        let pad = if check { "    " } else { "" };
        for f in fams.iter().filter(|f| f.check == check) {
            let k0 = f.members[0];
            let base = f.stem.strip_suffix("_to").filter(|_| f.members.iter().all(|k| !k.name.starts_with(&f.stem))).unwrap_or(&f.stem);
            let variants: Vec<&str> = f.members.iter().map(|k| k.name[base.len()..].trim_start_matches('_')).collect();
            let names = if variants.iter().all(|v| v.is_empty()) { format!("`{}`", f.stem) } else { format!("`{base}_{{{}}}`", variants.join(", ")) };
            let c_params = k0.params.iter().map(|p| p.c.as_str()).collect::<Vec<_>>().join(", ");
            let _ = writeln!(rs, "\n{pad}/// {names} ({}): `{}({c_params})`.", k0.at, k0.name);
            let _ = writeln!(rs, "{pad}pub static {}: Family<{}> = Family::new(FamilyInfo {{", rust_name(&f.stem), signature(&rust_types(k0)));
            let _ = writeln!(rs, "{pad}    stem: \"{}\",\n{pad}    members: &[", f.stem);
            for k in &f.members {
                let e = elems(k).iter().map(|e| format!("Elem::{e}")).collect::<Vec<_>>().join(", ");
                let _ = writeln!(rs, "{pad}        Member {{ name: \"{}\", elems: &[{e}] }},", k.name);
            }
            let _ = writeln!(rs, "{pad}    ],\n{pad}}});");
        }
        if check {
            let twins = twins(&fams)?;
            let pairs: Vec<String> = twins.iter().map(|(p, c)| format!("(&super::{}.info, &{}.info)", rust_name(&p.stem), rust_name(&c.stem))).collect();
            let _ = writeln!(
                rs,
                "\n    /// The planted twins by name (`moss_ctl_X` of `moss_X`), with the same parameters.\n    pub static TWINS: &[(&FamilyInfo, &FamilyInfo)] = &[{}];",
                pairs.join(", ")
            );
        }
        let list: Vec<String> = fams.iter().filter(|f| f.check == check).map(|f| format!("&{}.info", rust_name(&f.stem))).collect();
        let _ = writeln!(
            rs,
            "\n{pad}/// Every family of the {} image.\n{pad}pub static ALL: &[&FamilyInfo] = &[{}];",
            if check { "check" } else { "production" },
            list.join(", ")
        );
        if check {
            rs.push_str("}\n");
        }
    }
    Ok(rs)
}
