//! Shared helpers for the integration tests: the golden checkpoints and expected outputs that
//! `golden/make_golden.py` wrote (see golden/README.md).
#![allow(dead_code)]

use moss::checkpoint::{self, Checkpoint, TensorStore};
use moss::tensor::Tensor;
use std::path::PathBuf;

pub mod folders;
pub mod server;

pub const CHECKPOINTS: [&str; 2] = ["tiny-a", "tiny-b"];

pub fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

pub fn checkpoint(name: &str) -> Checkpoint {
    let loc = checkpoint::locate(golden().join(name).to_str().unwrap()).unwrap();
    Checkpoint::open(loc).unwrap()
}

/// `golden/expected/<name>.json` and `.safetensors`.
pub struct Expected {
    pub json: serde_json::Value,
    pub store: TensorStore,
}

impl Expected {
    pub fn load(name: &str) -> Expected {
        let dir = golden().join("expected");
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap_or_else(|e| panic!("golden/expected/{name}.json: {e}"));
        Expected { json: serde_json::from_str(&text).unwrap(), store: TensorStore::open_file(&dir.join(format!("{name}.safetensors"))).unwrap() }
    }

    pub fn tensor(&self, key: &str) -> Tensor {
        let (shape, data) = self.store.to_f32(key).unwrap_or_else(|e| panic!("{e:#}"));
        Tensor::new(shape, data).unwrap()
    }

    /// The text of the golden loop's prompt (`loop.prompt` names one of `prompts`).
    pub fn loop_prompt(&self) -> String {
        let name = &self.json["loop"]["prompt"];
        let p = self.json["prompts"].as_array().unwrap().iter().find(|p| &p["name"] == name).unwrap();
        p["text"].as_str().unwrap().to_string()
    }

    pub fn raw(&self, key: &str) -> &[u8] {
        self.store.bytes(self.store.get(key).unwrap_or_else(|| panic!("no `{key}` in golden data")))
    }
}

/// Assert a relative L2 error under `bound`, printing what was seen (visible with --nocapture
/// and in the failure message).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], bound: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length {} vs {}", got.len(), want.len());
    let e = moss::tensor::rel_l2(got, want);
    println!("{what}: rel L2 {e:.3e} (bound {bound:.0e})");
    assert!(e < bound, "{what}: rel L2 {e:.3e} is not under {bound:.0e}");
}

/// `moss generate` on the CPU of "a red fox", 2 steps at 64x64, with `extra` flags, into
/// `dir/{tag}.png` and its latents: (the PNG's bytes, the latents).
pub fn render_fox(model: &std::path::Path, dir: &std::path::Path, tag: &str, extra: &[&str]) -> (Vec<u8>, Vec<f32>) {
    let (pic, lat) = (dir.join(format!("{tag}.png")), dir.join(format!("{tag}.latents")));
    let args = [
        &["generate", "--device", "cpu", "--model", model.to_str().unwrap(), "--prompt", "a red fox", "--steps", "2", "--size", "64x64"][..],
        extra,
        &["--out", pic.to_str().unwrap(), "--save-latents", lat.to_str().unwrap(), "--quiet"],
    ]
    .concat();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_moss")).args(&args).output().unwrap();
    assert!(o.status.success(), "{tag}: {}", String::from_utf8_lossy(&o.stderr));
    (std::fs::read(&pic).unwrap(), moss::pipeline::read_latents(&lat, 128, None).unwrap().0.data)
}
