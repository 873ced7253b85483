//! `moss bench-dit` (hidden) on the CPU: the DiT stage alone, from `moss encode`'s embeds, gives
//! the golden loop's latents (golden/expected/<ck>.safetensors `loop.latents`, the torch fp32
//! reference's 4-step CFG loop), and prints its timings as JSON.

mod common;

use std::process::Command;

fn moss() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moss"))
}

fn run(ck: &str, size: &str) {
    let dir = std::env::temp_dir().join(format!("moss-bench-dit-{ck}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exp = common::Expected::load(ck);
    let spec = &exp.json;
    let lp = &spec["loop"];
    let prompt = spec["prompts"].as_array().unwrap().iter().find(|p| p["name"] == lp["prompt"]).unwrap()["text"].as_str().unwrap().to_string();
    assert_eq!(lp["negative"], "");
    let embeds = dir.join("e.safetensors");
    let o = moss()
        .args(["encode", "--device", "cpu", "--model", common::golden().join(ck).to_str().unwrap(), "--prompt", &prompt, "-q", "-o"])
        .arg(&embeds)
        .output()
        .unwrap();
    assert!(o.status.success(), "encode: {}", String::from_utf8_lossy(&o.stderr));
    let lat = dir.join("z.f32");
    let o = moss()
        .args(["bench-dit", "--device", "cpu", "--model", common::golden().join(ck).to_str().unwrap(), "--size", size, "--forwards", "1"])
        .args(["--steps", &lp["steps"].to_string(), "--seed", &lp["seed"].to_string()])
        .arg("--embeds")
        .arg(&embeds)
        .arg("--save-latents")
        .arg(&lat)
        .output()
        .unwrap();
    assert!(o.status.success(), "bench-dit: {}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON line");
    assert!(j["loop_s"].as_f64().unwrap() > 0.0 && j["forward_ms_median"].as_f64().unwrap() > 0.0, "{j}");
    let got: Vec<f32> = std::fs::read(&lat).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    println!("{ck}: {j}");
    // The CPU backend's own DiT/loop bound (tests/dit.rs gates the same loop).
    common::assert_close(&format!("{ck}: bench-dit --device cpu latents vs golden loop.latents"), &got, &exp.tensor("loop.latents").data, 1e-4);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_dit_cpu_matches_golden_loop() {
    run("tiny-a", "64x64");
    run("tiny-b", "96x64");
}

/// `--transformer FILE` reaches bench-dit (bench/quant.sh's velocity column): the quantized file's
/// latents differ from the folder's, and stay near them.
#[test]
fn bench_dit_takes_the_transformer_file() {
    let dir = std::env::temp_dir().join(format!("moss-bench-dit-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = common::golden().join("tiny-b");
    let embeds = dir.join("e.safetensors");
    let o = moss().args(["encode", "--device", "cpu", "--model", ck.to_str().unwrap(), "--prompt", "a cat", "-q", "-o"]).arg(&embeds).output().unwrap();
    assert!(o.status.success(), "encode: {}", String::from_utf8_lossy(&o.stderr));
    let latents = |file: Option<&str>, out: &str| -> Vec<f32> {
        let lat = dir.join(out);
        let mut c = moss();
        c.args(["bench-dit", "--device", "cpu", "--model", ck.to_str().unwrap(), "--size", "96x64", "--forwards", "1", "--steps", "2"]);
        if let Some(f) = file {
            c.args(["--transformer", common::golden().join(f).to_str().unwrap()]);
        }
        let o = c.arg("--embeds").arg(&embeds).arg("--save-latents").arg(&lat).output().unwrap();
        assert!(o.status.success(), "bench-dit: {}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(&lat).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let folder = latents(None, "folder.f32");
    let file = latents(Some("quant/tiny-b-mixed.gguf"), "gguf.f32");
    assert_eq!(folder.len(), file.len());
    let diff = folder.iter().zip(&file).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
    let norm = folder.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    assert!(diff > 0.0, "the GGUF's latents equal the folder's: --transformer was not used");
    assert!(diff / norm < 0.2, "rel L2 {:.3e} from the folder", diff / norm);
    std::fs::remove_dir_all(&dir).ok();
}
