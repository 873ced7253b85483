//! Compiles every `cuda/**/*.cu` outside the `sm90a` folders into one fatbin (sm_80, 86, 89, 90,
//! 100, 120, 121 and compute_90 PTX, as far as the found nvcc offers them) and embeds it. Without
//! nvcc the crate still builds; the binary then reports "built without CUDA kernels" when a GPU op
//! is asked for. Headers shared by every network live in `cuda/common` (on the include path).
//!
//! `cuda/*/sm90a/*.cu` (wgmma/TMA/setmaxnreg kernels, Hopper only) are compiled apart, for
//! `sm_90a` alone, into a second fatbin that the CUDA backend loads only on compute
//! capability 9.0 (cfg `moss_sm90a`).
//!
//! Each source set is compiled twice: the production image, and with `-DMOSS_CHECK_IMAGE` the
//! check image that only `moss check` loads (the planted controls; see cuda/common/common.cuh).
//!
//! The production compiles run with `-Xptxas -v`: the compiler's own report of every kernel's
//! registers, spills and static shared memory on every SM goes to `OUT_DIR/kernel_resources.tsv`
//! (the kernel contract, checked by `crates/moss-cuda/src/contract.rs`'s test).
//!
//! The kernels' launch constants (threads, tile sizes, shared memory) are written once, in
//! `cuda/*/launch.h`; this script turns each header into Rust constants (`OUT_DIR/launch.rs`,
//! `crates/moss-cuda/src/launch.rs`), with or without nvcc. See [`launch_constants`].
//!
//! Every kernel's parameter list is read from the sources (after the C preprocessor: the names and
//! parameters are often written by macros) into typed Rust launchers, `OUT_DIR/kernels.rs`
//! (`crates/moss-cuda/src/kernels.rs`), with or without nvcc; a kernel the generator cannot map
//! stops the build, naming it. See `build/kernels.rs` and [`kernel_launchers`].
//!
//! `MOSS_CUDA_ARCHS=90` (or any comma-separated subset of the list) builds for those SMs only:
//! a development build for one GPU in a fraction of the time. Releases leave it unset.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/kernels.rs"]
mod kernels;

const SMS: [&str; 7] = ["80", "86", "89", "90", "100", "120", "121"];
const ENV: [&str; 6] = ["NVCC", "CUDA_HOME", "CUDA_PATH", "PATH", "MOSS_NO_CUDA", "MOSS_CUDA_ARCHS"];

fn find_nvcc() -> Option<PathBuf> {
    let ok = |p: PathBuf| if p.is_file() { Some(p) } else { None };
    if let Some(p) = std::env::var_os("NVCC") {
        return ok(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            if let Some(p) = ok(PathBuf::from(d).join("bin/nvcc")) {
                return Some(p);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if let Some(p) = ok(d.join("nvcc")) {
                return Some(p);
            }
        }
    }
    if let Some(p) = ok(PathBuf::from("/usr/local/cuda/bin/nvcc")) {
        return Some(p);
    }
    // The PyPI wheel (nvidia-cuda-nvcc) inside an importable `nvidia` namespace package.
    let out = Command::new("python3").args(["-c", "import nvidia, os; print('\\n'.join(nvidia.__path__))"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|d| ok(Path::new(d).join("cu13/bin/nvcc")))
}

/// The git revision the binary is built from (`--version`), or "unknown" outside a checkout.
/// Read when this script runs (a fresh build, a change under cuda/, a switch of branch): not on
/// every commit, which would recompile every kernel; a development build may name an older one.
fn git_revision() {
    // HEAD, the branch it names and the packed refs: a commit moves one of them. (The CUDA
    // images are not rebuilt for it: see `cuda_stamp`.)
    let root = std::env::current_dir().unwrap();
    println!("cargo:rerun-if-changed={}", root.join(".git/HEAD").display());
    println!("cargo:rerun-if-changed={}", root.join(".git/packed-refs").display());
    if let Some(r) = std::fs::read_to_string(".git/HEAD").ok().and_then(|h| h.strip_prefix("ref: ").map(|r| r.trim().to_string())) {
        println!("cargo:rerun-if-changed={}", root.join(".git").join(r).display());
    }
    let rev = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=10"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MOSS_GIT_REV={rev}");
}

/// The repository root (the folder holding `cuda/`): this script builds the `moss-cuda` crate
/// (`crates/moss-cuda`), whose kernels live at the root.
fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    manifest.ancestors().find(|d| d.join("cuda/common").is_dir()).expect("cuda/common above the crate").to_path_buf()
}

fn main() {
    // Every path below is relative to the repository root.
    std::env::set_current_dir(repo_root()).unwrap();
    git_revision();
    for v in ENV {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rerun-if-changed={}", std::env::current_dir().unwrap().join("cuda").display());
    println!("cargo::rustc-check-cfg=cfg(moss_kernels)");
    println!("cargo::rustc-check-cfg=cfg(moss_sm90a)");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Always (also without nvcc): the host code launches with these.
    std::fs::write(out_dir.join("launch.rs"), launch_constants()).unwrap();
    std::fs::write(out_dir.join("kernels.rs"), kernel_launchers(&out_dir)).unwrap();
    let fatbin = out_dir.join("moss_kernels.fatbin");
    let fatbin_sm90a = out_dir.join("moss_kernels_sm90a.fatbin");
    // The images of the same sources, compiler and settings are already there (the script reran
    // for the git revision): keep them.
    let stamp = cuda_stamp();
    let stamp_file = out_dir.join("cuda.stamp");
    if let Ok(prev) = std::fs::read_to_string(&stamp_file) {
        if let Some(cfgs) = prev.strip_prefix(&format!("{stamp}\n")) {
            if ["moss_kernels.fatbin", "moss_check.fatbin", "kernel_resources.tsv"].iter().all(|f| out_dir.join(f).is_file()) {
                print!("{cfgs}");
                return;
            }
        }
    }
    let _ = std::fs::remove_file(&stamp_file);
    for f in ["moss_kernels.fatbin", "moss_kernels_sm90a.fatbin", "moss_check.fatbin", "moss_check_sm90a.fatbin"] {
        let _ = std::fs::remove_file(out_dir.join(f));
    }
    if std::env::var_os("MOSS_NO_CUDA").is_some() {
        println!("cargo:warning=MOSS_NO_CUDA set: building without CUDA kernels");
        return;
    }
    let Some(nvcc) = find_nvcc() else {
        println!("cargo:warning=nvcc not found (NVCC, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda, the nvidia-cuda-nvcc wheel): building without CUDA kernels");
        return;
    };

    let root = std::env::current_dir().unwrap();
    let unit = write_unit(false, &root, &out_dir.join("moss_kernels.cu")).expect("cuda/**/*.cu kernel files");

    let list = Command::new(&nvcc).arg("--list-gpu-code").output();
    let offered = match list {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => panic!("{} --list-gpu-code failed: is this a working nvcc?", nvcc.display()),
    };
    // MOSS_CUDA_ARCHS=90 (comma-separated) narrows the list for a quicker development build.
    let only: Option<Vec<String>> = std::env::var("MOSS_CUDA_ARCHS").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let mut archs = vec![];
    let mut gencode = vec![];
    for sm in SMS {
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == sm)) {
            continue;
        }
        if offered.lines().any(|l| l.trim() == format!("sm_{sm}")) {
            gencode.push(format!("-gencode=arch=compute_{sm},code=sm_{sm}"));
            archs.push(sm);
        }
    }
    if only.is_none() && offered.lines().any(|l| l.trim() == "sm_90") {
        gencode.push("-gencode=arch=compute_90,code=compute_90".to_string());
    }
    assert!(!archs.is_empty(), "{} offers none of sm_{:?}", nvcc.display(), SMS);
    let mut report = compile(&nvcc, &root, &unit, &gencode, &["-Xptxas", "-v"], &fatbin);
    compile(&nvcc, &root, &unit, &gencode, &["-DMOSS_CHECK_IMAGE"], &out_dir.join("moss_check.fatbin"));
    println!("cargo:rustc-cfg=moss_kernels");
    if archs.contains(&"90") {
        report += &build_sm90a(&nvcc, &root, &out_dir, &fatbin_sm90a);
    }
    std::fs::write(out_dir.join("kernel_resources.tsv"), resources(&report)).unwrap();
    println!("cargo:rustc-env=MOSS_KERNEL_ARCHS={}", archs.join(","));
    // What a later run with the same stamp prints instead of compiling.
    let mut cfgs = String::from("cargo:rustc-cfg=moss_kernels\n");
    if fatbin_sm90a.is_file() {
        cfgs += "cargo:rustc-cfg=moss_sm90a\n";
    }
    cfgs += &format!("cargo:rustc-env=MOSS_KERNEL_ARCHS={}\n", archs.join(","));
    std::fs::write(stamp_file, format!("{stamp}\n{cfgs}")).unwrap();
}

/// A fingerprint of what the CUDA images are built from: every file under `cuda/` (names and
/// bytes) and the environment the build reads. FNV-1a, stable across Rust versions.
fn cuda_stamp() -> String {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
            if p.is_dir() {
                files(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut all = vec![];
    files(Path::new("cuda"), &mut all);
    all.sort();
    let mut h: u64 = 0xcbf29ce484222325;
    let mut eat = |b: &[u8]| {
        for &x in b.iter().chain(&[0xff]) {
            h = (h ^ x as u64).wrapping_mul(0x100000001b3);
        }
    };
    eat(env!("CARGO_PKG_VERSION").as_bytes());
    for v in ENV {
        eat(std::env::var_os(v).unwrap_or_default().as_encoded_bytes());
    }
    for p in &all {
        eat(p.as_os_str().as_encoded_bytes());
        eat(&std::fs::read(p).unwrap_or_default());
    }
    eat(&std::fs::read("build.rs").unwrap_or_default());
    format!("{h:016x}")
}

/// nvcc `unit` into `fatbin` for the `gencode` targets, with `defines`; returns what it said
/// on stderr (with `-Xptxas -v`: the resource report).
fn compile(nvcc: &Path, root: &Path, unit: &Path, gencode: &[String], defines: &[&str], fatbin: &Path) -> String {
    let out = Command::new(nvcc)
        .args(["--fatbin", "-O3", "--threads=0", "-std=c++17"])
        .args(gencode)
        .args(defines)
        .arg("-I")
        .arg(root.join("cuda/common"))
        .arg("-o")
        .arg(fatbin)
        .arg(unit)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "nvcc failed compiling {} {defines:?}:\n{stderr}", unit.display());
    stderr
}

/// The ptxas report (`-Xptxas -v`) as rows `kernel  sm  registers  stack  spill_stores
/// spill_loads  static_smem` (bytes), one per entry function and SM.
fn resources(report: &str) -> String {
    let num = |l: &str, unit: &str| -> u64 {
        // "N <unit>" somewhere in the line
        l.split(',').find_map(|p| p.trim().strip_suffix(unit).and_then(|n| n.trim().rsplit(' ').next()?.parse().ok())).unwrap_or(0)
    };
    let mut rows = String::from("kernel\tsm\tregisters\tstack\tspill_stores\tspill_loads\tstatic_smem\n");
    let mut cur: Option<(String, String, [u64; 5])> = None;
    let mut props_of = String::new();
    let flush = |cur: &mut Option<(String, String, [u64; 5])>, rows: &mut String| {
        if let Some((k, sm, v)) = cur.take() {
            rows.push_str(&format!("{k}\t{sm}\t{}\t{}\t{}\t{}\t{}\n", v[0], v[1], v[2], v[3], v[4]));
        }
    };
    for l in report.lines() {
        if let Some(rest) = l.split("Compiling entry function '").nth(1) {
            flush(&mut cur, &mut rows);
            let mut it = rest.split('\'');
            let k = it.next().unwrap_or("").to_string();
            let sm = it.nth(1).unwrap_or("").trim_start_matches("sm_").to_string();
            cur = Some((k, sm, [0; 5]));
        } else if let Some(f) = l.split("Function properties for ").nth(1) {
            props_of = f.trim().to_string();
        } else if l.contains("bytes stack frame") {
            if let Some((k, _, v)) = cur.as_mut().filter(|c| c.0 == props_of) {
                let _ = k;
                v[1] = l.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
                v[2] = num(l, "bytes spill stores");
                v[3] = num(l, "bytes spill loads");
            }
        } else if l.contains("Used ") && l.contains(" registers") {
            if let Some((_, _, v)) = cur.as_mut() {
                v[0] = l.split("Used ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok()).unwrap_or(0);
                v[4] = num(l, "bytes smem");
            }
        }
    }
    flush(&mut cur, &mut rows);
    rows
}

/// The Hopper-only unit: every `cuda/*/sm90a/*.cu`, `sm_90a` machine code only (production and
/// check images).
fn build_sm90a(nvcc: &Path, root: &Path, out_dir: &Path, fatbin: &Path) -> String {
    let Some(unit) = write_unit(true, root, &out_dir.join("moss_kernels_sm90a.cu")) else { return String::new() };
    let gencode = ["-gencode=arch=compute_90a,code=sm_90a".to_string()];
    let report = compile(nvcc, root, &unit, &gencode, &["-Xptxas", "-v"], fatbin);
    compile(nvcc, root, &unit, &gencode, &["-DMOSS_CHECK_IMAGE"], &out_dir.join("moss_check_sm90a.fatbin"));
    println!("cargo:rustc-cfg=moss_sm90a");
    report
}

/// Every `.cu` under `dir` (recursively), sorted.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "cu") {
            out.push(p);
        }
    }
}

/// One translation unit at `unit` that includes every `cuda/**/*.cu` inside (`sm90a`) or outside
/// an `sm90a` folder (sorted): one fatbin, unique kernel names. None when there is no such file.
fn write_unit(sm90a: bool, root: &Path, unit: &Path) -> Option<PathBuf> {
    let mut all = vec![];
    sources(Path::new("cuda"), &mut all);
    let mut sources: Vec<PathBuf> = all.into_iter().filter(|p| p.components().any(|c| c.as_os_str() == "sm90a") == sm90a).collect();
    if sources.is_empty() {
        return None;
    }
    sources.sort();
    let text: String = sources.iter().map(|s| format!("#include \"{}\"\n", root.join(s).display())).collect();
    std::fs::write(unit, text).unwrap();
    Some(unit.to_path_buf())
}

/// The typed launchers of every kernel of the production and the check image (`build/kernels.rs`):
/// each image's two translation units ([`write_unit`]) through the host C++ preprocessor (the
/// `cc` crate's compiler, `-E`; the CUDA headers stand in as empty files, none of their macros
/// writes a kernel's name or parameters), parsed and generated. Needs no nvcc.
fn kernel_launchers(out_dir: &Path) -> String {
    let root = std::env::current_dir().unwrap();
    let stubs = out_dir.join("kernel_headers");
    std::fs::create_dir_all(&stubs).unwrap();
    let mut all = vec![];
    sources(Path::new("cuda"), &mut all);
    for f in all.iter().chain(headers(Path::new("cuda")).iter()) {
        for l in std::fs::read_to_string(f).unwrap_or_default().lines() {
            if let Some(h) = l.trim().strip_prefix("#include <").and_then(|r| r.split('>').next()) {
                std::fs::write(stubs.join(h), "").unwrap();
            }
        }
    }
    let mut images: [Vec<kernels::Kernel>; 2] = [vec![], vec![]];
    for (image, check) in [false, true].into_iter().enumerate() {
        for sm90a in [false, true] {
            let name = format!("kernels_{}{}.cpp", if check { "check" } else { "production" }, if sm90a { "_sm90a" } else { "" });
            let Some(unit) = write_unit(sm90a, &root, &out_dir.join(name)) else { continue };
            let mut b = cc::Build::new();
            b.cpp(true).std("c++17").cargo_metadata(false).include(&stubs).include(root.join("cuda/common")).define("__CUDACC__", None).file(&unit);
            if check {
                b.define("MOSS_CHECK_IMAGE", None);
            }
            let text =
                b.try_expand().unwrap_or_else(|e| panic!("preprocessing {} for the kernels' signatures (the host C++ compiler, CXX): {e}", unit.display()));
            let text = String::from_utf8_lossy(&text).replace(&format!("{}/", root.display()), "");
            let found = kernels::parse(&text).unwrap_or_else(|e| panic!("reading the kernels' signatures: {e}"));
            images[image].extend(found);
        }
    }
    kernels::generate(&images[0], &images[1]).unwrap_or_else(|e| panic!("generating the kernels' launchers: {e}"))
}

/// Every `.cuh` / `.h` under `dir` (recursively).
fn headers(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
        if p.is_dir() {
            out.extend(headers(&p));
        } else if p.extension().is_some_and(|e| e == "cuh" || e == "h") {
            out.push(p);
        }
    }
    out
}

/// Every `cuda/*/launch.h` as Rust: `#define NAME EXPR` becomes `pub const NAME: usize = EXPR;`,
/// `#define NAME(A, B) EXPR` becomes `pub const fn NAME(A: usize, B: usize) -> usize { EXPR }`,
/// the `//` lines above a define its doc comment. A header holds only those lines, `#pragma
/// once` and comments; EXPR is integer literals, names defined above (or the parameters),
/// `+ - * / %` and parentheses, which C and Rust evaluate alike on non-negative values. Anything
/// else stops the build, naming the line.
fn launch_constants() -> String {
    let mut headers = vec![];
    let Ok(dirs) = std::fs::read_dir("cuda") else { return String::new() };
    for d in dirs.filter_map(|e| e.ok().map(|e| e.path())) {
        if d.join("launch.h").is_file() {
            headers.push(d.join("launch.h"));
        }
    }
    headers.sort();
    let ident = |s: &str| s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    let expr_ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || " _+-*/%()".contains(c));
    let mut rs = String::from("// Generated by build.rs from cuda/*/launch.h: edit the headers, not this.\n");
    for h in headers {
        let text = std::fs::read_to_string(&h).unwrap();
        rs.push_str(&format!("\n// ---- {} ----\n", h.display()));
        let mut doc = vec![];
        for (i, line) in text.lines().enumerate() {
            let bad = |why: &str| -> ! { panic!("{}:{}: {why}: `{line}`", h.display(), i + 1) };
            let l = line.trim();
            if let Some(c) = l.strip_prefix("//") {
                doc.push(c.trim().to_string());
                continue;
            }
            if l.is_empty() || l == "#pragma once" {
                doc.clear();
                continue;
            }
            let Some(def) = l.strip_prefix("#define ") else { bad("a launch header holds only `#define NAME EXPR` lines and comments") };
            let def = def.split("//").next().unwrap().trim();
            let (head, expr) = match def.find([' ', '(']) {
                Some(p) if def[p..].starts_with('(') => {
                    let close = def.find(')').unwrap_or_else(|| bad("unclosed parameter list"));
                    (&def[..close + 1], def[close + 1..].trim())
                }
                Some(p) => (&def[..p], def[p..].trim()),
                None => bad("a define without a value"),
            };
            if !expr_ok(expr) {
                bad("the value may hold only integers, names, + - * / % and parentheses");
            }
            for d in &doc {
                rs.push_str(&format!("/// {d}\n"));
            }
            doc.clear();
            match head.split_once('(') {
                None if ident(head) => rs.push_str(&format!("pub const {head}: usize = {expr};\n")),
                Some((name, params)) if ident(name) => {
                    let params: Vec<&str> = params.trim_end_matches(')').split(',').map(str::trim).collect();
                    if !params.iter().all(|p| ident(p)) {
                        bad("parameters are upper-case names");
                    }
                    let args: Vec<String> = params.iter().map(|p| format!("{p}: usize")).collect();
                    rs.push_str(&format!("#[allow(non_snake_case)]\npub const fn {name}({}) -> usize {{\n    {expr}\n}}\n", args.join(", ")));
                }
                _ => bad("names are upper case (A-Z, 0-9, _)"),
            }
        }
    }
    rs
}
