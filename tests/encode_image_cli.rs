//! `moss encode --image PIC -o LATENTS` end to end on the CPU: the latents file equals the
//! in-process encode (and diffusers' golden latents), `moss decode` turns it back into a picture
//! of the same size without `--size`, and bad pictures are refused with one line and nothing
//! written.

mod common;

use common::{assert_close, checkpoint, golden, Expected};
use moss::backend::cpu::Cpu;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-encode-image-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn moss(args: &[&str], ckpt: &str) -> Output {
    let model = golden().join(ckpt);
    let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).args(["--device", "cpu", "--model", model.to_str().unwrap()]).output().unwrap();
    println!("moss {args:?}: {}\n  stderr: {}", o.status, String::from_utf8_lossy(&o.stderr).trim());
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Failed with one line naming every string of `want`; `out` not written.
fn assert_refused(o: &Output, want: &[&str], out: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected a refusal, got success");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    for w in want {
        assert!(err.contains(w), "message does not name `{w}`: {err}");
    }
    assert!(!out.exists(), "{} was written despite the failure", out.display());
}

#[test]
fn encode_then_decode() {
    let exp = Expected::load("vae_encoder");
    for (ckpt, case) in [("tiny-a", 0), ("tiny-b", 1)] {
        let c = &exp.json["cases"][case];
        assert_eq!(c["name"], ckpt);
        let dir = scratch(ckpt);
        let png = golden().join("expected").join(c["png"].as_str().unwrap());
        let lat = dir.join("lat.safetensors");
        let o = moss(&["encode", "--image", s(&png), "-o", s(&lat)], ckpt);
        assert!(o.status.success(), "encode failed: {}", String::from_utf8_lossy(&o.stderr));
        let ck = checkpoint(ckpt);
        let (z, params) = moss::pipeline::read_latents(&lat, ck.dit.latent_channels, None).unwrap();
        assert!(params.is_none(), "an encoded picture carries no generation settings");
        let want = exp.tensor(&format!("{}.latents", c["key"].as_str().unwrap()));
        assert_eq!(z.shape, want.shape);
        assert_close(&format!("{ckpt}: moss encode --image vs diffusers"), &z.data, &want.data, 3e-6);
        // The same bits as the in-process encode.
        let x = moss::pipeline::read_init_picture(&png, "test").unwrap();
        let enc = moss::pipeline::load_vae_encoder(&Cpu, &ck, x.shape[2], x.shape[3]).unwrap();
        assert!(enc.encode(&Cpu, &x).unwrap().data == z.data, "{ckpt}: the file differs from the in-process encode");
        // moss decode reads the file back (size from the file) to a picture of the input's size.
        let back = dir.join("back.png");
        let o = moss(&["decode", s(&lat), "--out", s(&back)], ckpt);
        assert!(o.status.success(), "decode failed: {}", String::from_utf8_lossy(&o.stderr));
        let (px, w, h, _) = moss::png::decode(&std::fs::read(&back).unwrap()).unwrap();
        assert_eq!((w as u64, h as u64), (c["width"].as_u64().unwrap(), c["height"].as_u64().unwrap()));
        assert_eq!(px, moss::pipeline::decode_rgb(&Cpu, &ck, &z).unwrap(), "{ckpt}: decode of the encoded latents");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn bad_pictures_are_refused() {
    let dir = scratch("bad");
    let out = dir.join("lat.safetensors");
    // 40x40: not a multiple of 16.
    let odd = dir.join("odd.png");
    std::fs::write(&odd, moss::png::encode(&vec![128u8; 40 * 40 * 3], 40, 40, &Default::default()).unwrap()).unwrap();
    assert_refused(&moss(&["encode", "--image", s(&odd), "-o", s(&out)], "tiny-a"), &["40x40", "multiples of 16"], &out);
    // Not a picture at all; a truncated PNG; a missing file.
    let text = dir.join("note.png");
    std::fs::write(&text, "hello").unwrap();
    assert_refused(&moss(&["encode", "--image", s(&text), "-o", s(&out)], "tiny-a"), &["not a PNG, JPEG or WebP"], &out);
    let cut = dir.join("cut.png");
    let bytes = std::fs::read(golden().join("expected/enc-64x64.png")).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&moss(&["encode", "--image", s(&cut), "-o", s(&out)], "tiny-a"), &["cut.png"], &out);
    let missing = dir.join("missing.png");
    assert_refused(&moss(&["encode", "--image", s(&missing), "-o", s(&out)], "tiny-a"), &["missing.png"], &out);
    // The output over the input is refused before anything is read or written.
    let pic = dir.join("pic.png");
    std::fs::copy(golden().join("expected/enc-64x64.png"), &pic).unwrap();
    let o = moss(&["encode", "--image", s(&pic), "-o", s(&pic)], "tiny-a");
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&pic).unwrap(), std::fs::read(golden().join("expected/enc-64x64.png")).unwrap(), "the input was clobbered");
    // --image with a prompt: a usage error.
    let o = moss(&["encode", "--image", s(&pic), "--prompt", "x", "-o", s(&out)], "tiny-a");
    assert!(!o.status.success() && !out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
