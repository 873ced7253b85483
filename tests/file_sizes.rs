//! No source file over 600 lines: a file that grows past it is split by what its parts do. Every
//! file of code the repository holds (Rust, CUDA, C++, Python, shell) is counted, tests included.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;
const ROOTS: &[&str] = &["src", "crates", "cuda", "build", "build.rs", "tests", "tools", "bench", "golden", ".ci"];
const CODE: &[&str] = &["rs", "cu", "cuh", "h", "cpp", "py", "sh"];

fn code_files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap().path();
            // Build outputs and Python caches are not the repository's.
            if !matches!(e.file_name().and_then(|n| n.to_str()), Some("target" | "__pycache__")) {
                code_files(&e, out);
            }
        }
    } else if p.extension().and_then(|e| e.to_str()).is_some_and(|e| CODE.contains(&e)) || p.parent().and_then(Path::file_name).is_some_and(|d| d == ".ci") {
        out.push(p.to_path_buf());
    }
}

/// The files of `texts` longer than [`MAX_LINES`], with their lengths.
fn too_long<'a>(texts: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    texts.into_iter().map(|(name, text)| (name, text.lines().count())).filter(|&(_, n)| n > MAX_LINES).map(|(name, n)| format!("{name}: {n} lines")).collect()
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    for r in ROOTS {
        code_files(&root.join(r), &mut files);
    }
    assert!(files.len() > 300, "only {} files found under {ROOTS:?}", files.len());
    let texts: Vec<(String, String)> =
        files.iter().map(|f| (f.strip_prefix(root).unwrap().display().to_string(), String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned())).collect();
    let long = too_long(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())));
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

/// The control: a planted file of 601 lines is seen, one of 600 is not.
#[test]
fn a_planted_long_file_is_seen() {
    let (long, ok) = ("x\n".repeat(MAX_LINES + 1), "x\n".repeat(MAX_LINES));
    assert_eq!(too_long([("long.rs", long.as_str()), ("ok.rs", ok.as_str())]), vec![format!("long.rs: {} lines", MAX_LINES + 1)]);
}
