//! What a daily Stable Diffusion user trips over in the first hour (issue 40), on the tiny
//! checkpoint on the CPU: `--from` keeps the LoRAs (found by name, checked by hash), blank prompts
//! are refused, ignored settings are said once, the short flags people type, no silent
//! overwrite, the model recorded by name, AUTOMATIC1111 pictures read by `--from` and `info`, the
//! download hint, and a man page per subcommand.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn moss_in(dir: Option<&Path>, args: &[&str]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moss"));
    c.args(args).env_remove("MOSS_MODEL");
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let o = c.output().unwrap();
    Run { code: o.status.code(), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

fn moss(args: &[&str]) -> Run {
    moss_in(None, args)
}

fn ok(args: &[&str]) -> Run {
    let r = moss(args);
    assert_eq!(r.code, Some(0), "moss {}: {}", args.join(" "), r.stderr);
    r
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-first-hour-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> String {
    common::golden().join("tiny-a").display().to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn info(p: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["info", "--json", s(p)]).stdout).unwrap()
}

/// A one-line refusal (exit 1) whose line holds every word of `words`.
fn refused(r: &Run, words: &[&str]) {
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {}", r.stderr);
    for w in words {
        assert!(r.stderr.contains(w), "`{w}` not in: {}", r.stderr);
    }
}

/// `--from` on a picture made with `--lora` renders with that LoRA: found next to the picture
/// and checked by hash; not found, or found with another hash, is one line naming the file and
/// the hash, and nothing is written.
#[test]
fn from_keeps_the_loras() {
    let d = scratch("lora");
    let m = tiny();
    let lora = common::golden().join("lora/kohya.safetensors");
    let a = d.join("a.png");
    ok(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a fox",
        "--steps",
        "2",
        "--size",
        "64x64",
        "--lora",
        &format!("{}:0.7", s(&lora)),
        "-q",
        "-o",
        s(&a),
    ]);
    let plain = d.join("plain.png");
    ok(&["generate", "--device", "cpu", "--model", &m, "--prompt", "a fox", "--steps", "2", "--size", "64x64", "-q", "-o", s(&plain)]);
    assert!(std::fs::read(&a).unwrap() != std::fs::read(&plain).unwrap(), "the LoRA changed nothing");
    let rec = info(&a)["loras"][0].as_str().unwrap().to_string();
    let hash = rec.rsplit(':').next().unwrap().to_string();
    assert!(rec.starts_with("kohya.safetensors:0.7:") && hash.len() == 12, "{rec}");

    // Not next to the picture, not in the current folder: refused by name and hash.
    let b = d.join("b.png");
    let r = moss(&["generate", "--from", s(&a), "--model", &m, "-o", s(&b)]);
    refused(&r, &["kohya.safetensors", &hash, "--lora"]);
    assert!(!b.exists());
    // Another file of that name: its hash is not the recorded one.
    std::fs::copy(common::golden().join("lora/qkv.safetensors"), d.join("kohya.safetensors")).unwrap();
    let r = moss(&["generate", "--from", s(&a), "--model", &m, "-o", s(&b)]);
    refused(&r, &["kohya.safetensors", &hash, "has hash"]);
    // The right file next to the picture: the same picture, byte for byte.
    std::fs::copy(&lora, d.join("kohya.safetensors")).unwrap();
    ok(&["generate", "--from", s(&a), "--model", &m, "-q", "-o", s(&b)]);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "--from did not render with the LoRA");
    // In the current folder works as well.
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::rename(d.join("kohya.safetensors"), elsewhere.join("kohya.safetensors")).unwrap();
    let c = d.join("c.png");
    let r = moss_in(Some(&elsewhere), &["generate", "--from", s(&a), "--model", &m, "-q", "-o", s(&c)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&c).unwrap());
    // --lora given beside --from wins, with a warning that it is not the recorded one.
    let e = d.join("e.png");
    let r = moss(&["generate", "--from", s(&a), "--model", &m, "--lora", s(&lora), "-o", s(&e)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("warning") && r.stderr.contains("kohya.safetensors:0.7"), "{}", r.stderr);
    assert_eq!(info(&e)["loras"][0].as_str().unwrap(), format!("kohya.safetensors:1:{hash}"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The server's rule on the command line: a blank prompt (or prompt file) is one line, exit 1,
/// before any work.
#[test]
fn blank_prompts_are_refused() {
    let d = scratch("blank");
    let m = tiny();
    let out = d.join("o.png");
    let base = ["generate", "--device", "cpu", "--model", &m, "--steps", "1", "--size", "64x64", "--out", s(&out)];
    refused(&moss(&[&base[..], &["--prompt", "   "]].concat()), &["--prompt", "empty"]);
    let f = d.join("p.txt");
    std::fs::write(&f, "").unwrap();
    refused(&moss(&[&base[..], &["--prompt-file", s(&f)]].concat()), &[s(&f), "empty"]);
    std::fs::write(&f, " \n\t\n").unwrap();
    refused(&moss(&[&base[..], &["--prompt-file", s(&f)]].concat()), &[s(&f), "empty"]);
    assert!(!out.exists());
    let emb = d.join("e.safetensors");
    refused(&moss(&["encode", "--device", "cpu", "--model", &m, "--prompt", "\n", "--out", s(&emb)]), &["empty"]);
    assert!(!emb.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Settings that change nothing are said, once each.
#[test]
fn ignored_settings_are_said_once() {
    let d = scratch("ignored");
    let m = tiny();
    let base = ["generate", "--device", "cpu", "--model", &m, "--prompt", "a red fox in the snow", "--steps", "1", "--size", "64x64", "--seed", "1"];
    let out = |n: &str| d.join(n).display().to_string();
    let r = ok(&[&base[..], &["--guidance", "1", "--negative", "dog", "--out", &out("1.png")]].concat());
    assert_eq!(r.stderr.matches("--negative is not used at --guidance 1").count(), 1, "{}", r.stderr);
    let r = ok(&[&base[..], &["--max-vram", "4", "--out", &out("2.png")]].concat());
    assert_eq!(r.stderr.matches("--max-vram limits GPU memory; with --device cpu it only shapes the plan").count(), 1, "{}", r.stderr);
    // --max-tokens cuts the prompt (said) and the empty negative's template (not worth a word).
    let r = ok(&[&base[..], &["--max-tokens", "5", "--out", &out("3.png")]].concat());
    assert_eq!(r.stderr.matches("warning: prompt has").count(), 1, "{}", r.stderr);
    assert!(!r.stderr.contains("negative"), "{}", r.stderr);
    // -q says nothing.
    assert!(ok(&[&base[..], &["--guidance", "1", "--negative", "dog", "-q", "--out", &out("4.png")]].concat()).stderr.is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

/// `-p -n -s -W -H --cfg-scale` are `--prompt --negative --seed --size --guidance`; `--seed -1`
/// is a random seed; `-W`/`-H` beside `--size` is refused.
#[test]
fn short_flags_people_type() {
    let d = scratch("short");
    let m = tiny();
    let (a, b) = (d.join("a.png"), d.join("b.png"));
    ok(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a cat",
        "--negative",
        "dog",
        "--seed",
        "5",
        "--size",
        "64x48",
        "--guidance",
        "2.5",
        "--steps",
        "1",
        "-q",
        "-o",
        s(&a),
    ]);
    ok(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "-p",
        "a cat",
        "-n",
        "dog",
        "-s",
        "5",
        "-W",
        "64",
        "-H",
        "48",
        "--cfg-scale",
        "2.5",
        "--steps",
        "1",
        "-q",
        "-o",
        s(&b),
    ]);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "the short forms render another picture");
    let c = d.join("c.png");
    let r = ok(&["generate", "--device", "cpu", "--model", &m, "-p", "a cat", "--seed", "-1", "--steps", "1", "-W", "64", "-H", "64", "-o", s(&c)]);
    let said: u64 =
        r.stderr.trim().strip_prefix("moss: seed ").and_then(|t| t.strip_suffix(" (random)")).unwrap_or_else(|| panic!("{}", r.stderr)).parse().unwrap();
    assert_eq!(info(&c)["seed"].as_u64(), Some(said));
    let r = moss(&["generate", "-p", "x", "--size", "64x64", "-H", "32"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("--size") && r.stderr.contains("--height"), "{}", r.stderr);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A second `moss generate` does not replace a picture: refused before any work (the file left
/// as it was) unless `--force`/`-y`; FIFOs, devices and stdout are written every time; several
/// pictures (`--count`, batch lists) are refused the same way, `--skip-existing` skips them.
#[test]
fn no_silent_overwrite() {
    let d = scratch("overwrite");
    let m = tiny();
    let out = d.join("moss.png");
    let run =
        |extra: &[&str]| moss(&[&["generate", "--device", "cpu", "--model", &m, "--prompt", "a cat", "--steps", "1", "--size", "64x64", "-q"], extra].concat());
    assert_eq!(run(&["--seed", "1", "-o", s(&out)]).code, Some(0));
    let first = std::fs::read(&out).unwrap();
    let r = run(&["--seed", "2", "-o", s(&out)]);
    refused(&r, &[s(&out), "exists", "--force"]);
    assert!(std::fs::read(&out).unwrap() == first, "the refused run touched the file");
    // A link to it is the same file.
    let link = d.join("link.png");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    refused(&run(&["--seed", "2", "-o", s(&link)]), &["exists"]);
    // The default name too (moss.png in the current folder).
    let r = moss_in(Some(&d), &["generate", "--device", "cpu", "--model", &m, "--prompt", "a cat", "--steps", "1", "--size", "64x64", "-q"]);
    refused(&r, &["moss.png", "exists"]);
    for force in ["--force", "-y"] {
        assert_eq!(run(&["--seed", "2", force, "-o", s(&out)]).code, Some(0));
        assert!(std::fs::read(&out).unwrap() != first, "{force} did not replace it");
    }
    // --save-latents is an output too.
    let lat = d.join("z.safetensors");
    std::fs::write(&lat, b"keep").unwrap();
    refused(&run(&["-o", s(&d.join("new.png")), "--save-latents", s(&lat)]), &["z.safetensors", "exists"]);
    assert_eq!(std::fs::read(&lat).unwrap(), b"keep");
    // Devices and stdout, again and again.
    for _ in 0..2 {
        assert_eq!(run(&["-o", "/dev/null"]).code, Some(0));
        let r = run(&["-o", "-"]);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
    }
    // A FIFO is written through (a reader on the other end), twice.
    let fifo = d.join("pipe.png");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for _ in 0..2 {
        let reader = {
            let f = fifo.clone();
            std::thread::spawn(move || std::fs::read(f).unwrap())
        };
        assert_eq!(run(&["-o", s(&fifo)]).code, Some(0));
        assert!(reader.join().unwrap().starts_with(b"\x89PNG"));
    }
    // --count: the second run is refused whole, before any work.
    let tpl = d.join("fox.png");
    assert_eq!(run(&["--count", "2", "--seed", "10", "-o", s(&tpl)]).code, Some(0));
    let r = run(&["--count", "3", "--seed", "10", "-o", s(&tpl)]);
    refused(&r, &["fox-10.png", "(and 1 more)", "--skip-existing", "--force"]);
    assert!(!d.join("fox-12.png").exists());
    let r = run(&["--count", "3", "--seed", "10", "--skip-existing", "-o", s(&tpl)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(d.join("fox-12.png").is_file());
    // A batch list likewise.
    let list = d.join("l.txt");
    std::fs::write(&list, "a cat\n").unwrap();
    let out_dir = d.join("renders");
    let batch = |extra: &[&str]| {
        moss(
            &[&["generate", "--device", "cpu", "--model", &m, "--steps", "1", "--size", "64x64", "-q", "--prompts", s(&list), "--out-dir", s(&out_dir)], extra]
                .concat(),
        )
    };
    assert_eq!(batch(&[]).code, Some(0));
    refused(&batch(&[]), &["00000-42.png", "exists", "--skip-existing"]);
    assert_eq!(batch(&["--skip-existing"]).code, Some(0));
    assert_eq!(batch(&["--force"]).code, Some(0));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The picture names its model by its folder's name (never a path) with A1111's `Model hash`;
/// `--from` finds the model by that name (here: a folder of that name in the current folder).
#[test]
fn the_model_is_recorded_by_name() {
    let d = scratch("name");
    let m = tiny();
    let a = d.join("a.png");
    ok(&["generate", "--device", "cpu", "--model", &m, "--prompt", "a fox", "--steps", "1", "--size", "64x64", "-q", "--out", s(&a)]);
    let j = info(&a);
    assert_eq!(j["model"], "tiny-a");
    let hash = j["model_hash"].as_str().unwrap_or_else(|| panic!("{j}"));
    assert!(hash.len() == 10 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash}");
    let text = ok(&["info", s(&a)]).stdout;
    assert!(text.contains(&format!("Model hash: {hash}, Model: tiny-a,")), "{text}");
    let root = std::fs::canonicalize(common::golden()).unwrap();
    let bytes = std::fs::read(&a).unwrap();
    assert!(!bytes.windows(root.as_os_str().len()).any(|w| w == root.as_os_str().as_encoded_bytes()), "the picture holds the model's path");
    // --from: the model by name, from the folder it is in; elsewhere, one line asking for --model.
    let b = d.join("b.png");
    let r = moss_in(Some(&common::golden()), &["generate", "--from", s(&a), "-q", "--out", s(&b)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&b).unwrap() == bytes);
    refused(&moss_in(Some(&d), &["generate", "--from", s(&a), "--out", s(&d.join("c.png"))]), &["tiny-a", "--model"]);
    // Another model than the recorded one (tiny-b): said, and rendered.
    let tb = common::golden().join("tiny-b").display().to_string();
    let r = moss(&["generate", "--from", s(&a), "--model", &tb, "--out", s(&d.join("e.png"))]);
    assert!(r.stderr.contains(&format!("was made with model tiny-a (hash {hash})")), "{}", r.stderr);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The parameters text AUTOMATIC1111 1.10 writes for a txt2img picture with hires fix.
const A1111_TEXT: &str = "a lighthouse at dusk, oil painting\nNegative prompt: blurry, lowres\n\
    Steps: 3, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 1234, Size: 64x48, \
    Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, Denoising strength: 0.7, Clip skip: 2, \
    Hires upscale: 2, Hires steps: 10, Hires upscaler: Latent, Version: v1.10.1";

/// A PNG as A1111 saves it: the `parameters` tEXt chunk, pixels of its own.
fn a1111_png(path: &Path, text: &str) {
    let f = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), 8, 8);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.add_text_chunk("parameters".into(), text.into()).unwrap();
    let mut w = enc.write_header().unwrap();
    w.write_image_data(&[128u8; 8 * 8 * 3]).unwrap();
}

/// An AUTOMATIC1111 picture: `moss info` shows its text and names what moss does not reproduce;
/// `--from` renders its prompt, negative, steps, CFG scale, seed and size (the picture moss
/// renders from those flags) and names the rest on stderr.
#[test]
fn an_a1111_picture_is_rendered_again_by_from() {
    let d = scratch("a1111");
    let m = tiny();
    let pic = d.join("00012-1234.png");
    a1111_png(&pic, A1111_TEXT);
    let r = ok(&["info", s(&pic)]);
    assert_eq!(r.stdout.trim_end(), A1111_TEXT);
    for w in ["Hires upscale: 2", "Clip skip: 2", "Model: v1-5-pruned-emaonly (hash 6ce0161689)"] {
        assert!(r.stderr.contains(w), "`{w}` not named: {}", r.stderr);
    }
    // The sampler and schedule are taken (moss has both), so they are not among what is not reproduced.
    let not_reproduced = r.stderr.split("does not reproduce").nth(1).unwrap_or_default();
    assert!(!not_reproduced.contains("Sampler") && !not_reproduced.contains("Schedule type"), "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_str(&ok(&["info", "--json", s(&pic)]).stdout).unwrap();
    assert_eq!(
        (j["prompt"].as_str(), j["negative"].as_str(), j["seed"].as_u64(), j["steps"].as_u64()),
        (Some("a lighthouse at dusk, oil painting"), Some("blurry, lowres"), Some(1234), Some(3))
    );
    assert_eq!((j["guidance"].as_f64(), j["width"].as_u64(), j["height"].as_u64()), (Some(6.5), Some(64), Some(48)));

    let again = d.join("again.png");
    let r = ok(&["generate", "--from", s(&pic), "--model", &m, "--device", "cpu", "--out", s(&again)]);
    assert_eq!(r.stderr.trim().lines().count(), 1, "one note: {}", r.stderr);
    for w in [
        "prompt, negative prompt, steps, sampler, schedule type, CFG scale, seed and size",
        "Hires upscale: 2",
        "Denoising strength: 0.7",
        "Model: v1-5-pruned-emaonly (hash 6ce0161689)",
    ] {
        assert!(r.stderr.contains(w), "`{w}` not named: {}", r.stderr);
    }
    let want = d.join("want.png");
    ok(&[
        "generate",
        "--model",
        &m,
        "--device",
        "cpu",
        "--prompt",
        "a lighthouse at dusk, oil painting",
        "--negative",
        "blurry, lowres",
        "--steps",
        "3",
        "--sampler",
        "dpm++2m",
        "--schedule",
        "karras",
        "--guidance",
        "6.5",
        "--seed",
        "1234",
        "--size",
        "64x48",
        "-q",
        "--out",
        s(&want),
    ]);
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&want).unwrap(), "--from of the A1111 picture is not the picture of its settings");
    // A flag beside it still wins.
    let other = d.join("other.png");
    ok(&["generate", "--from", s(&pic), "--model", &m, "--device", "cpu", "--steps", "1", "-q", "--out", s(&other)]);
    assert_eq!(info(&other)["steps"].as_u64(), Some(1));
    // Text that is no A1111 settings line is refused by name.
    let junk = d.join("junk.png");
    a1111_png(&junk, "just a caption");
    refused(&moss(&["info", s(&junk)]), &["junk.png", "settings line"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The hint for a repo id that is not downloaded names that repo.
#[test]
fn the_download_hint_names_the_repo_asked_for() {
    let d = scratch("hint");
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["check", "--model", "OpenMOSS-Team/MOSS-Image-Base"])
        .env("HOME", &d)
        .env("HF_HUB_CACHE", &d)
        .env_remove("HF_HOME")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("hf download OpenMOSS-Team/MOSS-Image-Base") && !e.contains("SFT"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `moss man --out-dir DIR`: moss.1 and a page per subcommand.
#[test]
fn a_man_page_per_subcommand() {
    let d = scratch("man");
    let r = ok(&["man", "--out-dir", s(&d)]);
    for page in ["moss.1", "moss-generate.1", "moss-serve.1", "moss-info.1", "moss-encode.1", "moss-decode.1", "moss-check.1"] {
        let t = std::fs::read_to_string(d.join(page)).unwrap_or_else(|e| panic!("{page}: {e}; wrote: {}", r.stdout));
        assert!(t.starts_with(".ie") || t.contains(".TH"), "{page} is not a man page");
    }
    let g = std::fs::read_to_string(d.join("moss-generate.1")).unwrap();
    assert!(g.contains(".TH moss-generate") && g.contains("\\-\\-force"), "{g}");
    std::fs::remove_dir_all(&d).unwrap();
}
