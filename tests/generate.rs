//! `moss generate --device cpu` end to end on the golden checkpoints, through the binary:
//! tokenizer, encoder, the 4-step CFG loop from seed 42, the VAE and the PNG, against the
//! picture golden/make_golden.py rendered (`golden/expected/<ckpt>.png`). Also: two runs give
//! identical bytes, `--save-latents` writes the final latents as raw little-endian f32 that
//! `moss decode` turns into the same picture, `--json` prints one JSON line, and plain output
//! (not a terminal) is just the path.

mod common;

use common::{golden, Expected};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Run {
    stdout: String,
    stderr: String,
}

fn moss(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
    let run = Run { stdout: String::from_utf8_lossy(&out.stdout).into_owned(), stderr: String::from_utf8_lossy(&out.stderr).into_owned() };
    assert!(out.status.success(), "moss {args:?} failed ({:?}): {}", out.status.code(), run.stderr);
    run
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-generate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn pixels(path: &Path) -> (Vec<u8>, u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (px, w, h, _) = moss::png::decode(&bytes).unwrap();
    (px, w, h)
}

/// At most this many of `n` RGB values may be off by one from the golden picture (none by more):
/// 1 in 400. Our fp32 pipeline differs from torch's in the last bits, which can flip a rounding,
/// above all the bf16 rounding of the encoder output: on tiny-a 4 of its 1600 values round the
/// other way than in torch (3 of them as the float64 yardstick `enc64` does), which moves 10 of
/// the 12288 values by one; the VAE alone moves 0 (tiny-a) and 2 (tiny-b).
fn off_by_one_allowed(n: usize) -> usize {
    (n / 400).max(16)
}

fn end_to_end(name: &str) {
    let e = Expected::load(name);
    let lp = &e.json["loop"];
    let text = e.loop_prompt();
    let (w, h) = (lp["width"].as_u64().unwrap(), lp["height"].as_u64().unwrap());
    let size = format!("{w}x{h}");
    let seed = lp["seed"].as_u64().unwrap().to_string();
    let steps = lp["steps"].as_u64().unwrap().to_string();
    let model = golden().join(name);
    let model = model.to_str().unwrap();
    let dir = scratch(name);
    let (png1, png2, png3) = (dir.join("one.png"), dir.join("two.png"), dir.join("decoded.png"));
    let (lat1, lat2) = (dir.join("one.f32"), dir.join("two.f32"));
    let p = |x: &Path| x.to_str().unwrap().to_string();

    // 1. The command line, the CLI defaults for guidance, negative and skip.
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        model,
        "--prompt",
        &text,
        "--seed",
        &seed,
        "--steps",
        &steps,
        "--size",
        &size,
        "--out",
        &p(&png1),
        "--save-latents",
        &p(&lat1),
    ]);
    assert_eq!(r.stdout, format!("{}\n", png1.display()), "{name}: plain output is the path alone");
    assert!(r.stderr.is_empty(), "{name}: stderr not empty when not a terminal: {:?}", r.stderr);

    let (got, gw, gh) = pixels(&png1);
    let (want, ww, wh) = pixels(&golden().join("expected").join(format!("{name}.png")));
    assert_eq!((gw, gh), (ww, wh), "{name}: picture size");
    assert_eq!((gw as u64, gh as u64), (w, h));
    let diffs: Vec<i32> = got.iter().zip(&want).map(|(&a, &b)| a as i32 - b as i32).collect();
    let off = diffs.iter().filter(|d| **d != 0).count();
    let worst = diffs.iter().map(|d| d.abs()).max().unwrap();
    println!("{name}: {off} of {} RGB values differ from golden/expected/{name}.png, by at most {worst}", got.len());
    let allowed = off_by_one_allowed(got.len());
    assert!(worst <= 1 && off <= allowed, "{name}: {off} values differ (allowed {allowed} off by one), worst by {worst}");

    // --save-latents: a safetensors file, `latents` f32 [1, 128, H/16, W/16] and the settings.
    let c = 128usize;
    let (lh, lw) = ((h / 16) as usize, (w / 16) as usize);
    let (z, params) = moss::pipeline::read_latents(&lat1, c, None).unwrap();
    assert_eq!(z.shape, [1, c, lh, lw], "{name}: latents shape");
    let params = params.expect("the latents carry their settings");
    assert_eq!((params.spec.seed.to_string(), params.spec.width as u64, params.spec.height as u64), (seed.clone(), w, h));
    // Through our own encoder the bound is looser than tests/dit.rs's 1e-5 on golden's contexts: a
    // last-bit difference of the encoder can flip a value's bf16 rounding at the stage boundary
    // (tiny-a: 4 of 1600 values flip, giving ~1.5e-5 after 4 steps).
    common::assert_close(&format!("{name} saved latents vs loop.latents"), &z.data, &e.tensor("loop.latents").data, 1e-4);

    // 2. The same picture with the loop's parameters spelled out, and --json.
    let guidance = lp["guidance"].as_f64().unwrap().to_string();
    let skip: Vec<String> = lp["uncond_skip"].as_array().unwrap().iter().map(|s| s.to_string()).collect();
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        model,
        "--prompt",
        &text,
        "--seed",
        &seed,
        "--steps",
        &steps,
        "--size",
        &size,
        "--out",
        &p(&png2),
        "--save-latents",
        &p(&lat2),
        "--guidance",
        &guidance,
        "--negative",
        lp["negative"].as_str().unwrap(),
        "--uncond-skip",
        &skip.join(","),
        "--json",
    ]);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{name}: --json prints one line, got {:?}", r.stdout);
    let j: serde_json::Value = serde_json::from_str(lines[0]).expect("--json output is JSON");
    assert_eq!(j["path"].as_str(), Some(png2.to_str().unwrap()), "{name}: json {j}");
    assert_eq!(j["seed"].as_u64(), lp["seed"].as_u64(), "{name}: json {j}");
    // The skip spelled out is the user's: past a checkpoint's last block (tiny-b has 2) it warns.
    let blocks = common::checkpoint(name).dit.num_layers;
    let past: Vec<&String> = skip.iter().filter(|s| s.parse::<usize>().unwrap() >= blocks).collect();
    let want = match past.is_empty() {
        true => String::new(),
        false => format!(
            "moss: warning: --uncond-skip {}: the transformer has {blocks} blocks (0..{}); an index past the last skips nothing\n",
            past.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","),
            blocks - 1
        ),
    };
    assert_eq!(r.stderr, want, "{name}: stderr");
    assert!(std::fs::read(&png1).unwrap() == std::fs::read(&png2).unwrap(), "{name}: two runs wrote different PNG bytes");
    assert!(std::fs::read(&lat1).unwrap() == std::fs::read(&lat2).unwrap(), "{name}: two runs wrote different latents");

    // 3. `moss decode` takes the saved latents (no --size needed) and gives the same picture,
    // metadata included; raw f32 latents still decode (with --size) to the same pixels.
    let r = moss(&["decode", &p(&lat1), "--out", &p(&png3), "--device", "cpu", "--model", model]);
    assert_eq!(r.stdout, format!("{}\n", png3.display()));
    assert!(std::fs::read(&png3).unwrap() == std::fs::read(&png1).unwrap(), "{name}: decode of the saved latents differs from generate's PNG");
    let raw = dir.join("raw.f32");
    std::fs::write(&raw, z.data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let png4 = dir.join("raw.png");
    moss(&["decode", &p(&raw), "--size", &size, "--out", &p(&png4), "--device", "cpu", "--model", model]);
    assert!(pixels(&png4).0 == got, "{name}: `moss decode` of raw latents gives other pixels");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generate_tiny_a() {
    end_to_end("tiny-a");
}

#[test]
fn generate_tiny_b() {
    end_to_end("tiny-b");
}
