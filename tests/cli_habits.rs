//! The command line people expect: clap's whole messages, help for a bare `moss`, a quiet exit on a
//! closed pipe, `--version` with the revision and kernels, completions and a man page, `moss info`,
//! `generate --from` (byte-identical), `--seed random`, true metadata (with `--embeds`; the trimmed
//! prompt and what `--max-tokens` cut), and a warning for `--uncond-skip` past the last block.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

fn moss(args: &[&str]) -> Run {
    let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
    Run { code: o.status.code(), stdout: o.stdout, stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

fn text(r: &Run) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-habits-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> String {
    common::golden().join("tiny-a").display().to_string()
}

#[test]
fn clap_messages_in_full() {
    let r = moss(&[]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("Usage:") && r.stderr.contains("generate") && r.stderr.contains("serve"), "{}", r.stderr);
    let r = moss(&["generate", "--promt", "x"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("--prompt") && r.stderr.contains("Usage:"), "no suggestion: {}", r.stderr);
    let r = moss(&["decode", "x.f32"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("--out") && r.stderr.contains("Usage:"), "the missing argument is not named: {}", r.stderr);
    let r = moss(&["generate", "--chunk", "0", "--prompts", "x"]);
    assert!(r.stderr.contains("1 or more"), "{}", r.stderr);
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moss")).args(["check", "--model", &tiny()]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take()); // the reader is gone before moss writes
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert_ne!(o.status.code(), Some(101), "a panic exit: {err}");
}

#[test]
fn version_completions_and_man_page() {
    let r = moss(&["--version"]);
    assert_eq!(r.code, Some(0));
    let v = text(&r);
    assert!(v.contains(env!("CARGO_PKG_VERSION")) && v.contains("git "), "{v}");
    assert!(v.contains("CUDA kernels for sm_") || v.contains("built without CUDA kernels"), "{v}");
    for shell in ["bash", "zsh", "fish"] {
        let r = moss(&["completions", shell]);
        assert_eq!(r.code, Some(0), "{shell}: {}", r.stderr);
        let t = text(&r);
        assert!(t.contains("generate") && t.contains("prompt") && t.contains("guidance"), "{shell}: {t}");
    }
    let r = moss(&["man"]);
    assert_eq!(r.code, Some(0));
    assert!(text(&r).contains(".TH moss"), "not a man page");
}

#[test]
fn info_from_and_seeds() {
    let d = scratch("from");
    let m = tiny();
    let a = d.join("a.png");
    let b = d.join("b.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a red fox",
        "--negative",
        "blurry, dark",
        "--seed",
        "7",
        "--steps",
        "2",
        "--guidance",
        "2.5",
        "--size",
        "64x64",
        "--out",
        a.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.is_empty(), "a given seed is not repeated: {}", r.stderr);

    // moss info: the A1111 text, and JSON.
    let r = moss(&["info", a.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let t = text(&r);
    assert!(t.starts_with("a red fox\nNegative prompt: blurry, dark\nSteps: 2, Sampler: Euler"), "{t}");
    assert!(t.contains("CFG scale: 2.5") && t.contains("Seed: 7") && t.contains("Size: 64x64"), "{t}");
    let r = moss(&["info", "--json", a.to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!((j["seed"].as_u64(), j["steps"].as_u64(), j["negative"].as_str()), (Some(7), Some(2), Some("blurry, dark")));
    assert_eq!(j["device"], "cpu");

    // --from: the same bytes; a flag beside it overrides.
    let r = moss(&["generate", "--from", a.to_str().unwrap(), "--model", &m, "--out", b.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "--from did not render the same bytes");
    let c = d.join("c.png");
    let r = moss(&["generate", "--from", a.to_str().unwrap(), "--model", &m, "--seed", "8", "--out", c.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_slice(&moss(&["info", "--json", c.to_str().unwrap()]).stdout).unwrap();
    assert_eq!((j["seed"].as_u64(), j["guidance"].as_f64()), (Some(8), Some(2.5)));
    // A picture without moss settings is refused by name.
    let r = moss(&["info", common::golden().join("expected/tiny-a.png").to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("moss settings"), "{}", r.stderr);

    // --seed random draws one, says it, records it; a default seed is said too.
    let e = d.join("e.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "x",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--seed",
        "random",
        "--out",
        e.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let said: u64 =
        r.stderr.trim().strip_prefix("moss: seed ").and_then(|s| s.strip_suffix(" (random)")).unwrap_or_else(|| panic!("{}", r.stderr)).parse().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&moss(&["info", "--json", e.to_str().unwrap()]).stdout).unwrap();
    assert_eq!(j["seed"].as_u64(), Some(said));
    let r = moss(&["generate", "--device", "cpu", "--model", &m, "--prompt", "x", "--steps", "1", "--size", "64x64", "-y", "--out", e.to_str().unwrap()]);
    assert_eq!(r.stderr.trim(), "moss: seed 42 (default)");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn embeds_bring_their_texts() {
    let d = scratch("embeds");
    let m = tiny();
    let emb = d.join("e.safetensors");
    let r = moss(&["encode", "--device", "cpu", "--model", &m, "--prompt", "an owl", "--negative", "fog", "--out", emb.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out = d.join("o.png");
    let base = [
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--steps",
        "1",
        "--size",
        "64x64",
        "--seed",
        "1",
        "--embeds",
        emb.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let r = moss(&[&base[..], &["--prompt", "something else"]].concat());
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("--embeds brings its own prompt"), "{}", r.stderr);
    assert!(!out.exists());
    let r = moss(&base);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_slice(&moss(&["info", "--json", out.to_str().unwrap()]).stdout).unwrap();
    assert_eq!((j["prompt"].as_str(), j["negative"].as_str()), (Some("an owl"), Some("fog")));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn count_seeds_and_name_templates() {
    let d = scratch("count");
    let m = tiny();
    let tpl = d.join("fox-{seed}.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a fox",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--count",
        "3",
        "--seed",
        "40",
        "-o",
        tpl.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for s in [40, 41, 42] {
        assert!(d.join(format!("fox-{s}.png")).is_file(), "fox-{s}.png missing: {}", text(&r));
    }
    // The same picture as a single run with that seed.
    let one = d.join("one.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a fox",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--seed",
        "41",
        "-o",
        one.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&one).unwrap() == std::fs::read(d.join("fox-41.png")).unwrap(), "--count picture differs from the single run");
    // --seeds with a plain -o: NAME-{seed}.EXT.
    let plain = d.join("cat.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a cat",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--seeds",
        "5,9",
        "-o",
        plain.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(d.join("cat-5.png").is_file() && d.join("cat-9.png").is_file() && !plain.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_empty_list_or_nothing_left_says_so() {
    let d = scratch("empty");
    let m = tiny();
    let list = d.join("l.txt");
    std::fs::write(&list, "\n\n").unwrap();
    let r = moss(&["generate", "--device", "cpu", "--model", &m, "--prompts", list.to_str().unwrap(), "--out-dir", d.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stderr.trim(), "moss: nothing rendered: the list has no items");
    std::fs::write(&list, "a cat\n").unwrap();
    let args = [
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompts",
        list.to_str().unwrap(),
        "--out-dir",
        d.to_str().unwrap(),
        "--steps",
        "1",
        "--size",
        "64x64",
        "--skip-existing",
    ];
    assert_eq!(moss(&args).code, Some(0));
    let r = moss(&args);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stderr.trim(), "moss: nothing rendered: 1 skipped (already there)");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn uncond_skip_past_the_last_block_warns() {
    let d = scratch("skip");
    let b = common::golden().join("tiny-b").display().to_string(); // 2 blocks
    let out = d.join("s.png");
    let base =
        ["generate", "--device", "cpu", "--model", &b, "--prompt", "x", "--steps", "1", "--size", "96x64", "--seed", "1", "-y", "--out", out.to_str().unwrap()];
    let r = moss(&[&base[..], &["--uncond-skip", "1,5,9"]].concat());
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stderr.trim(), "moss: warning: --uncond-skip 5,9: the transformer has 2 blocks (0..1); an index past the last skips nothing");
    // The default (22) is past tiny-b's blocks too, but the user did not ask for it: no warning.
    let r = moss(&base);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    // -q keeps it quiet; an index inside the model says nothing.
    assert!(moss(&[&base[..], &["--uncond-skip", "5", "-q"]].concat()).stderr.is_empty());
    assert!(moss(&[&base[..], &["--uncond-skip", "1"]].concat()).stderr.is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_picture_records_the_prompt_as_encoded() {
    let d = scratch("cut");
    let m = tiny();
    let a = d.join("a.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        " \n a red fox in the snow at dawn \t\n",
        "--negative",
        "blurry and dark",
        "--max-tokens",
        "12",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--seed",
        "3",
        "--out",
        a.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // The counts the warnings name are the ones recorded.
    let count = |what: &str| -> usize {
        let head = format!("moss: warning: {what} has ");
        let l = r.stderr.lines().find_map(|l| l.strip_prefix(&head)).unwrap_or_else(|| panic!("{}", r.stderr));
        l.split(' ').next().unwrap().parse().unwrap()
    };
    let (np, nn) = (count("prompt"), count("negative prompt"));
    let j: serde_json::Value = serde_json::from_slice(&moss(&["info", "--json", a.to_str().unwrap()]).stdout).unwrap();
    assert_eq!(j["prompt"], "a red fox in the snow at dawn", "the trimmed prompt the template encoded");
    assert_eq!(
        (j["max_tokens"].as_u64(), j["prompt_tokens_before_cut"].as_u64(), j["negative_tokens_before_cut"].as_u64()),
        (Some(12), Some(np as u64), Some(nn as u64))
    );
    let t = text(&moss(&["info", a.to_str().unwrap()]));
    assert!(t.starts_with("a red fox in the snow at dawn\nNegative prompt: blurry and dark\n"), "{t}");
    assert!(t.contains("Max tokens: 12") && t.contains(&format!("Cut: prompt 12 of {np} tokens; negative 12 of {nn} tokens,")), "{t}");
    // --from cuts the same way: the same bytes.
    let b = d.join("b.png");
    let r = moss(&["generate", "--from", a.to_str().unwrap(), "--model", &m, "-q", "--out", b.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "--from of a cut prompt differs");
    // An uncut prompt records no cut, and the default limit is not spelled out.
    let c = d.join("c.png");
    assert_eq!(
        moss(&[
            "generate",
            "--device",
            "cpu",
            "--model",
            &m,
            "--prompt",
            "a fox",
            "--steps",
            "1",
            "--size",
            "64x64",
            "--seed",
            "3",
            "--out",
            c.to_str().unwrap()
        ])
        .code,
        Some(0)
    );
    let t = text(&moss(&["info", c.to_str().unwrap()]));
    assert!(!t.contains("Cut:") && !t.contains("Max tokens"), "{t}");

    // Through moss encode: the embeds file carries the limit and the cut.
    let emb = d.join("e.safetensors");
    let r = moss(&[
        "encode",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompt",
        "a red fox in the snow at dawn",
        "--max-tokens",
        "12",
        "-q",
        "--out",
        emb.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let e = d.join("e.png");
    let r = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--embeds",
        emb.to_str().unwrap(),
        "--steps",
        "1",
        "--size",
        "64x64",
        "--seed",
        "3",
        "--out",
        e.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_slice(&moss(&["info", "--json", e.to_str().unwrap()]).stdout).unwrap();
    assert_eq!((j["max_tokens"].as_u64(), j["prompt_tokens_before_cut"].as_u64()), (Some(12), Some(np as u64)));
    std::fs::remove_dir_all(&d).unwrap();
}
