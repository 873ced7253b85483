//! `moss decode latents.f32 --out pic.png` end to end on the CPU: the square size inferred from
//! the file length, `--size WxH` for a non-square picture, refusals that name the length they
//! expected, no output file on any failure, and the written pixels equal to the in-process decode.

mod common;

use common::{checkpoint, golden, Expected};
use moss::backend::cpu::Cpu;
use moss::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh scratch folder for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-decode-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Little-endian f32 bytes, as `--save-latents` writes them.
fn latents_bytes(z: &Tensor) -> Vec<u8> {
    z.data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn decode(ckpt: &str, latents: &Path, out: &Path, extra: &[&str]) -> Output {
    let model = golden().join(ckpt);
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .arg("decode")
        .arg(latents)
        .arg("--out")
        .arg(out)
        .args(["--device", "cpu", "--model", model.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    println!("moss decode {} {extra:?} ({ckpt}): {}\n  stderr: {}", latents.display(), o.status, String::from_utf8_lossy(&o.stderr).trim());
    o
}

/// The command failed, its message names every string in `want`, and it left nothing behind
/// (no output picture, no partial file).
fn assert_refused(o: &Output, want: &[&str], dir: &Path, out: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected a refusal, got success");
    for w in want {
        assert!(err.contains(w), "message does not name `{w}`: {err}");
    }
    assert!(!out.exists(), "{} was written despite the failure", out.display());
    let left: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| !n.ends_with(".f32")).collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

/// The written PNG has the expected size and exactly the in-process decode's pixels.
fn assert_png_matches(ckpt: &str, z: &Tensor, out: &Path, w: u32, h: u32) {
    let (px, pw, ph, _) = moss::png::decode(&std::fs::read(out).unwrap()).unwrap();
    assert_eq!((pw, ph), (w, h), "picture size");
    let want = moss::pipeline::decode_rgb(&Cpu, &checkpoint(ckpt), z).unwrap();
    let differ = px.iter().zip(&want).filter(|(a, b)| a != b).count();
    println!("{ckpt}: {differ} of {} values differ from the in-process decode", px.len());
    assert_eq!(differ, 0, "the written pixels differ from the in-process decode");
}

#[test]
fn square_latents_infer_their_size() {
    let dir = scratch("square");
    let exp = Expected::load("tiny-a");
    let z = exp.tensor("loop.latents");
    assert_eq!(z.shape, vec![1, 128, 4, 4]);
    let lat = dir.join("lat.f32");
    std::fs::write(&lat, latents_bytes(&z)).unwrap();
    let out = dir.join("pic.png");
    let o = decode("tiny-a", &lat, &out, &[]);
    assert!(o.status.success(), "decode failed: {}", String::from_utf8_lossy(&o.stderr));
    assert_png_matches("tiny-a", &z, &out, 64, 64);
    // --size naming the same picture works as well.
    let out2 = dir.join("pic2.png");
    assert!(decode("tiny-a", &lat, &out2, &["--size", "64x64"]).status.success());
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn non_square_latents_need_the_size() {
    let dir = scratch("nonsquare");
    let exp = Expected::load("tiny-b");
    let z = exp.tensor("loop.latents");
    assert_eq!(z.shape, vec![1, 128, 4, 6], "tiny-b is 96x64 (W x H)");
    let lat = dir.join("lat.f32");
    std::fs::write(&lat, latents_bytes(&z)).unwrap();
    let out = dir.join("pic.png");
    // 128 channels · 4 bytes · 4 · 6 = 12288 bytes: 24 cells, no square.
    let o = decode("tiny-b", &lat, &out, &[]);
    assert_refused(&o, &["12288 bytes", "--size", "8192", "12800"], &dir, &out);
    let o = decode("tiny-b", &lat, &out, &["--size", "96x64"]);
    assert!(o.status.success(), "decode failed: {}", String::from_utf8_lossy(&o.stderr));
    assert_png_matches("tiny-b", &z, &out, 96, 64);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wrong_length_is_refused_naming_the_expected_length() {
    let dir = scratch("length");
    let z = Expected::load("tiny-a").tensor("loop.latents");
    let mut bytes = latents_bytes(&z);
    bytes.extend_from_slice(&[0, 0, 0, 0]); // 8196 bytes: no whole number of latent cells
    let lat = dir.join("lat.f32");
    std::fs::write(&lat, &bytes).unwrap();
    let out = dir.join("pic.png");
    assert_refused(&decode("tiny-a", &lat, &out, &[]), &["8196 bytes", "8192"], &dir, &out);
    assert_refused(&decode("tiny-a", &lat, &out, &["--size", "64x64"]), &["8196 bytes", "exactly 8192"], &dir, &out);
    // An empty file fits nothing either.
    std::fs::write(&lat, []).unwrap();
    assert_refused(&decode("tiny-a", &lat, &out, &[]), &["0 bytes", "16x16 needs 512 bytes"], &dir, &out);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mismatched_size_is_refused() {
    let dir = scratch("size");
    let out = dir.join("pic.png");
    // A 64x64 file (8192 bytes) given as 96x64 (which needs 12288), and the other way round.
    let lat = dir.join("a.f32");
    std::fs::write(&lat, latents_bytes(&Expected::load("tiny-a").tensor("loop.latents"))).unwrap();
    assert_refused(&decode("tiny-a", &lat, &out, &["--size", "96x64"]), &["8192 bytes", "exactly 12288"], &dir, &out);
    let lat = dir.join("b.f32");
    std::fs::write(&lat, latents_bytes(&Expected::load("tiny-b").tensor("loop.latents"))).unwrap();
    assert_refused(&decode("tiny-b", &lat, &out, &["--size", "64x64"]), &["12288 bytes", "exactly 8192"], &dir, &out);
    let _ = std::fs::remove_dir_all(&dir);
}
