//! Batch lists with the sampling loop's fields (issue 42), tiny-a on the CPU: `sampler`,
//! `schedule`, `cache` (a name or cache-dit's object) and `guidance_window` (`"A:B"` or `[A, B]`)
//! per line over the flags' defaults give the pictures single `moss generate` runs with the same
//! flags give, byte for byte; `--json` counts each picture's forwards; a bad field fails its line
//! alone, naming what is accepted.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-sampling-batch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn moss(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

const COMMON: [&str; 8] = ["--device", "cpu", "--size", "64x48", "--steps", "4", "--negative", "fog"];

#[test]
fn list_fields_equal_single_runs_and_bad_fields_fail_their_line() {
    let dir = scratch("list");
    let model = common::golden().join("tiny-a").display().to_string();
    let lines = [
        r#"a lighthouse at dusk"#,
        r#"{"prompt": "a red fox", "sampler": "euler", "schedule": "karras"}"#,
        r#"{"prompt": "a red fox", "cache": {"method": "dbcache", "Fn_compute_blocks": 1, "residual_diff_threshold": 1, "max_warmup_steps": 1, "max_continuous_cached_steps": 1}, "guidance_window": "0:0.5"}"#,
        r#"{"prompt": "a boat", "cache": "fbcache", "guidance_window": [0.5, 1], "sampler": "unipc"}"#,
        r#"{"prompt": "x", "sampler": "dpmpp_2m"}"#,
        r#"{"prompt": "x", "schedule": "normal"}"#,
        r#"{"prompt": "x", "cache": {"method": "dbcache", "Fn": 1}}"#,
        r#"{"prompt": "x", "cache": {"method": "taylorseer", "taylorseer_order": 5}}"#,
        r#"{"prompt": "x", "guidance_window": "0:2"}"#,
        r#"{"prompt": "x", "cache": {"method": "dbcache", "Fn_compute_blocks": 20, "Bn_compute_blocks": 4}}"#,
    ];
    let list = dir.join("list.jsonl");
    std::fs::write(&list, lines.join("\n")).unwrap();
    let out_dir = dir.join("out");
    let mut args = vec!["generate", "--model", &model[..], "--prompts", p(&list), "--out-dir", p(&out_dir), "--name", "{index}.png"];
    args.extend(COMMON);
    args.extend(["--seed", "5", "--sampler", "heun", "--json"]);
    let (code, stdout, stderr) = moss(&args);
    assert_eq!(code, 1, "some lines fail: {stderr}");
    // The bad lines, each naming what is accepted (the last one fails at its render).
    for (line, needle) in [(5, "euler_ancestral"), (6, "sgm_uniform"), (7, "Fn_compute_blocks"), (8, "1 or 2"), (9, "A:B"), (10, "23 blocks")] {
        let l = stderr.lines().find(|l| l.contains(&format!("list.jsonl:{line}:"))).unwrap_or_else(|| panic!("no error for line {line}: {stderr}"));
        assert!(l.contains(needle), "line {line}: {l}");
    }
    let done: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(done.len(), 4, "{stdout}");
    for (i, d) in done.iter().enumerate() {
        assert_eq!(d["index"], i, "{d}");
        assert!(d["forwards"]["calls"].as_u64().unwrap() > 0, "{d}");
    }
    // heun, 4 steps: 7 calls; calls 0 and 1 are steps 0 and the first of 1 (window 0:0.5 is steps
    // 0 and 1: calls 0..=3 guided). Per pass, calls 0 (warm-up), 2, 4, 6 run in full.
    let f = &done[2]["forwards"];
    assert_eq!((f["calls"].as_u64(), f["skipped"].as_u64()), (Some(7), Some(3)), "{f}");
    assert_eq!((f["computed"].as_u64(), f["cached"].as_u64()), (Some(4 + 2), Some(3 + 2)), "{f}");

    // The same pictures from single runs with the flags the lines stand for.
    let singles: [(&str, &str, &[&str]); 4] = [
        ("a lighthouse at dusk", "5", &["--sampler", "heun"]),
        ("a red fox", "6", &["--sampler", "euler", "--schedule", "karras"]),
        (
            "a red fox",
            "7",
            &[
                "--sampler",
                "heun",
                "--cache",
                "dbcache",
                "--cache-fn",
                "1",
                "--cache-threshold",
                "1",
                "--cache-warmup",
                "1",
                "--cache-max-continuous",
                "1",
                "--guidance-window",
                "0:0.5",
            ],
        ),
        ("a boat", "8", &["--sampler", "unipc", "--cache", "fbcache", "--guidance-window", "0.5:1"]),
    ];
    for (i, (prompt, seed, flags)) in singles.iter().enumerate() {
        let one = dir.join(format!("single{i}.png"));
        let mut args = vec!["generate", "--model", &model[..], "--prompt", prompt, "--seed", seed, "-q", "-o", p(&one)];
        args.extend(COMMON);
        args.extend(*flags);
        let (code, _, err) = moss(&args);
        assert_eq!(code, 0, "{err}");
        let batch = std::fs::read(out_dir.join(format!("{i}.png"))).unwrap();
        assert!(batch == std::fs::read(&one).unwrap(), "item {i} differs from `moss generate {}`", flags.join(" "));
    }
    let (_, info, _) = moss(&["info", "--json", p(&out_dir.join("3.png"))]);
    let j: Value = serde_json::from_str(&info).unwrap();
    assert_eq!((j["sampler"].as_str(), j["cache"]["method"].as_str()), (Some("unipc"), Some("fbcache")), "{j}");
    assert_eq!(j["guidance_window"], serde_json::json!([0.5, 1.0]));
}

/// `--preview` shows one picture's loop, and the flags' own cache values are checked before any
/// line is read.
#[test]
fn batch_refusals() {
    let dir = scratch("refuse");
    let model = common::golden().join("tiny-a").display().to_string();
    let list = dir.join("list.txt");
    std::fs::write(&list, "a cat\n").unwrap();
    let out_dir = dir.join("out");
    for (extra, needle) in [
        (&["--preview", "p.png"][..], "--preview"),
        (&["--cache", "dbcache", "--cache-threshold", "3"][..], "0..=1"),
        (&["--cache", "off", "--cache-warmup", "3"][..], "--cache-warmup"),
        (&["--guidance-window", "0.5:1.5"][..], "guidance window"),
    ] {
        let mut args = vec!["generate", "--model", &model[..], "--prompts", p(&list), "--out-dir", p(&out_dir)];
        args.extend(COMMON);
        args.extend(extra);
        let (code, _, err) = moss(&args);
        assert_eq!(code, 1, "{extra:?}: {err}");
        assert!(err.lines().count() == 1 && err.contains(needle), "{extra:?}: {err}");
        assert!(!out_dir.exists(), "{extra:?}: wrote something");
    }
}
