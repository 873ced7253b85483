//! `moss serve` with LoRAs: per-request adapters from `--lora-dir` equal `moss generate --lora`
//! byte for byte, and the names a request may use.

mod common;

use common::server::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A `--lora-dir` of the golden adapters: `kohya`, `lokr`, `qkv` (files) and `peft` (a PEFT
/// folder), plus an entry whose name a request could not use.
fn lora_dir(tag: &str) -> PathBuf {
    let d = scratch(tag);
    let g = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/lora");
    for f in ["kohya.safetensors", "lokr.safetensors", "qkv.safetensors"] {
        std::fs::copy(g.join(f), d.join(f)).unwrap();
    }
    std::fs::create_dir(d.join("peft")).unwrap();
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(g.join("peft").join(f), d.join("peft").join(f)).unwrap();
    }
    std::fs::copy(g.join("kohya.safetensors"), d.join("not a name.safetensors")).unwrap();
    d
}

/// `moss generate --lora` of `(file, scale)` pairs: the PNG's bytes.
fn generate_with_loras(tag: &str, prompt: &str, seed: u64, loras: &[(PathBuf, f32)]) -> Vec<u8> {
    let out = scratch(tag).join("g.png");
    let m = model();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moss"));
    cmd.args(["generate", "--model", &m, "--device", "cpu", "--size", "64x64", "--steps", "2", "--seed", &seed.to_string(), "--prompt", prompt]);
    for (p, s) in loras {
        cmd.args(["--lora", &format!("{}:{s}", p.display())]);
    }
    let g = cmd.args(["--out", out.to_str().unwrap(), "--quiet"]).output().unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    std::fs::read(&out).unwrap()
}

/// Per-request LoRAs under a memory cap that streams half the transformer's blocks: each
/// request's picture is `moss generate --lora`'s with the same files and scales, through changes
/// of set and back (a set kept is not merged again); `/v1/loras` lists names, never paths; bad
/// names, paths, too many, twice, and a server without `--lora-dir` get 400 with the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_request_loras_equal_generate_lora_byte_for_byte() {
    let dir = lora_dir("lora-dir");
    let d = dir.to_str().unwrap();
    let s = Server::start(&["--lora-dir", d, "--max-vram", "0.77", "--max-size", "64x64"], &[]);
    let log = s.log();
    assert!(log.contains("4 LoRA(s) offered from") && log.contains("left out") && log.contains("not a name.safetensors"), "{log}");
    assert!(log.contains("transformer kept, 11/23 blocks resident, 12 streamed"), "the cap no longer streams the transformer:\n{log}");
    let list = call(s.port, "GET", "/v1/loras", &[], b"").await;
    assert_eq!(list.status, 200);
    let ids: Vec<String> = list.json()["data"].as_array().unwrap().iter().map(|l| l["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, ["kohya", "lokr", "peft", "qkv"]);
    assert!(!String::from_utf8_lossy(&list.body).contains(d), "a path in /v1/loras");
    let f = |n: &str| if n == "peft" { dir.join("peft/adapter_model.safetensors") } else { dir.join(format!("{n}.safetensors")) };
    let a = [("peft", 0.9), ("kohya", 0.7)];
    let b = [("lokr", 1.5), ("qkv", 0.5), ("peft", -0.8)];
    let sets: [&[(&str, f32)]; 5] = [&a, &[], &b, &a, &a];
    let mut served = vec![];
    for (i, set) in sets.iter().enumerate() {
        let lora: Vec<Value> = set.iter().map(|(n, sc)| json!({"name": n, "scale": sc})).collect();
        let r = generate(s.port, json!({"prompt": "a fox", "seed": 5, "size": "64x64", "num_inference_steps": 2, "lora": lora})).await;
        assert_eq!(r.status, 200, "request {i}: {}", String::from_utf8_lossy(&r.body));
        let d = &r.json()["data"][0];
        let switched = d["timings"]["lora_switch_s"].as_f64().unwrap() > 0.0;
        assert_eq!(switched, i != 4, "request {i}: {d}");
        served.push(b64(d));
    }
    for (i, set) in sets.iter().enumerate().take(3) {
        let files: Vec<(PathBuf, f32)> = set.iter().map(|(n, sc)| (f(n), *sc)).collect();
        assert!(served[i] == generate_with_loras(&format!("lora-ref-{i}"), "a fox", 5, &files), "request {i}: differs from moss generate --lora's");
    }
    assert!(served[3] == served[0] && served[4] == served[0], "the set again gives another picture");
    assert!(served[0] != served[1] && served[2] != served[1], "the LoRAs changed nothing");
    assert_eq!(s.metric("moss_lora_switch_seconds_count").await, 4.0);
    let bad: [(Value, &str); 7] = [
        (json!([{"name": "../kohya"}]), "invalid_value"),
        (json!([{"name": f("kohya").to_str().unwrap()}]), "invalid_value"),
        (json!([{"name": "kohya.safetensors"}]), "lora_not_found"),
        (json!([{"name": "nope", "scale": 1}]), "lora_not_found"),
        (json!([{"name": "kohya"}, {"name": "lokr"}, {"name": "qkv"}, {"name": "peft"}, {"name": "kohya"}]), "invalid_value"),
        (json!([{"name": "kohya"}, {"name": "kohya", "scale": 0.5}]), "invalid_value"),
        (json!([{"name": "kohya", "path": "/tmp/x.safetensors"}]), "unknown_parameter"),
    ];
    for (lora, code) in bad {
        let r = generate(s.port, json!({"prompt": "x", "size": "64x64", "lora": lora})).await;
        assert_eq!(r.status, 400, "{lora}");
        let e = r.error();
        assert_eq!((e["param"].as_str(), e["code"].as_str()), (Some("lora"), Some(code)), "{lora}: {e}");
    }
    let plain = Server::start(&[], &[]);
    let r = generate(plain.port, json!({"prompt": "x", "size": "64x64", "lora": [{"name": "kohya"}]})).await;
    assert_eq!((r.status, r.error()["code"].as_str()), (400, Some("unsupported_value")));
    let both = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["serve", "--model", &model(), "--lora-dir", d, "--lora", f("kohya").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(!both.status.success() && err.contains("--lora-dir") && err.contains("cannot be used with"), "{err}");
}
