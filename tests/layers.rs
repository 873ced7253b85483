//! The layers point one way: the backends know nothing of the command line, the pipeline, batch
//! mode or picture files, and no library module imports the CLI.

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines of `file` that name `crate::<m>` / `moss::<m>` / `use super::...<m>` for one of `mods`.
fn offending(file: &Path, mods: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut bad = vec![];
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for m in mods {
            for pat in [format!("crate::{m}"), format!("moss::{m}")] {
                let hit = code.match_indices(&pat).any(|(at, _)| {
                    let next = code[at + pat.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if hit {
                    bad.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    bad
}

#[test]
fn backends_do_not_know_the_front_end() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    rust_files(&root.join("src/backend"), &mut files);
    assert!(files.len() > 10, "src/backend has {} files: is the tree there?", files.len());
    let bad: Vec<_> = files.iter().flat_map(|f| offending(f, &["cli", "pipeline", "batch", "png"])).collect();
    assert!(bad.is_empty(), "src/backend names a front-end module:\n{}", bad.join("\n"));
}

#[test]
fn library_does_not_import_the_cli() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    rust_files(&root.join("src"), &mut files);
    let bad: Vec<_> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs") && !f.ends_with("cli.rs") && !f.starts_with(root.join("src/cli")))
        .flat_map(|f| offending(f, &["cli"]))
        .collect();
    assert!(bad.is_empty(), "library module imports the CLI:\n{}", bad.join("\n"));
}

/// The scanner itself must see a violation (planted control).
#[test]
fn scanner_sees_a_planted_import() {
    let dir = std::env::temp_dir().join(format!("moss-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("x.rs");
    std::fs::write(&f, "use crate::cli::Precision;\nuse crate::clip; // crate::cli in a comment\n").unwrap();
    let bad = offending(&f, &["cli"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
}
