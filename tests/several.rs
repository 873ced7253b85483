//! `--count` / `--seeds`: one prompt, several seeds, rendered as batch items held in memory (no
//! temporary list file), and refused where several files cannot go.

use std::path::Path;
use std::process::Command;

fn moss() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moss"))
}

fn golden(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden").join(name).display().to_string()
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("moss-several-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn count_writes_numbered_files_and_no_temporary_list() {
    let dir = scratch("count");
    let tmp = scratch("count-tmp");
    let out = moss()
        .env("TMPDIR", &tmp)
        .current_dir(&dir)
        .args(["generate", "--device", "cpu", "--model", &golden("tiny-a"), "--prompt", "a cat", "--steps", "1", "--size", "32x32"])
        .args(["--count", "2", "--seed", "42", "-o", "pic.png", "-q"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(names(&dir), ["pic-42.png", "pic-43.png"]);
    assert!(names(&tmp).is_empty(), "temporary files left or written: {:?}", names(&tmp));
}

#[test]
fn count_to_stdout_is_refused() {
    let dir = scratch("stdout");
    let out = moss()
        .current_dir(&dir)
        .args(["generate", "--device", "cpu", "--model", &golden("tiny-a"), "--prompt", "a cat", "--steps", "1", "--size", "32x32"])
        .args(["--count", "2", "-o", "-"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("several files"), "{err}");
    assert!(out.stdout.is_empty());
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
}
