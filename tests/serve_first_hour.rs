//! `moss serve` as clients of other servers expect it (issue 40), on tiny-a on the CPU: the
//! model's id is its folder's name and `--served-model-name` aliases (`dall-e-3`) are accepted;
//! `output_format` jpeg and webp (with `output_compression`) are the bytes `moss generate -o
//! x.jpg --quality N` writes; SIGTERM while an `n = 2` request runs delivers both pictures.

mod common;

use common::server::{b64, model, scratch, Server};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A request with the harness's defaults (loopback Host, JSON): its status and body.
async fn call(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Bytes) {
    let r = common::server::call(port, method, path, &[], body).await;
    (r.status, r.body)
}

async fn generate(port: u16, body: Value) -> (u16, Value) {
    let (status, bytes) = call(port, "POST", "/v1/images/generations", body.to_string().as_bytes()).await;
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes))))
}

/// `moss generate` of one picture at 64x64 to `out` (its extension picks the format).
fn cli(out: &Path, prompt: &str, seed: u64, steps: u32, extra: &[&str]) -> Vec<u8> {
    let m = model();
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args([
            "generate",
            "--model",
            &m,
            "--device",
            "cpu",
            "--size",
            "64x64",
            "-p",
            prompt,
            "-s",
            &seed.to_string(),
            "--steps",
            &steps.to_string(),
            "-q",
            "-y",
            "-o",
        ])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_model_id_aliases_and_output_formats() {
    let s = Server::start(&["--served-model-name", "dall-e-3", "--served-model-name", "gpt-image-1"], &[]);
    let p = s.port;
    let (status, models) = call(p, "GET", "/v1/models", b"").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_slice(&models).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tiny-a", "dall-e-3", "gpt-image-1"]);
    let d = scratch("formats");
    for name in ["tiny-a", "dall-e-3", "gpt-image-1"] {
        let (status, r) = generate(p, json!({"model": name, "prompt": "a cat", "seed": 3, "size": "64x64", "num_inference_steps": 2})).await;
        assert_eq!(status, 200, "{name}: {r}");
        assert!(b64(&r["data"][0]) == cli(&d.join("a.png"), "a cat", 3, 2, &[]), "{name}: not generate's PNG");
        assert_eq!(r["output_format"], "png");
    }
    let (status, r) = generate(p, json!({"model": "dall-e-2", "prompt": "a cat", "size": "64x64"})).await;
    assert_eq!((status, r["error"]["param"].as_str()), (404, Some("model")), "{r}");
    // jpeg with output_compression N is -o x.jpg --quality N; without, OpenAI's 100.
    let (status, r) =
        generate(p, json!({"prompt": "a fox", "seed": 4, "size": "64x64", "num_inference_steps": 2, "output_format": "jpeg", "output_compression": 70})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output_format"], "jpeg");
    let got = b64(&r["data"][0]);
    assert!(got.starts_with(&[0xFF, 0xD8, 0xFF]), "not a JPEG");
    assert!(got == cli(&d.join("a.jpg"), "a fox", 4, 2, &["--quality", "70"]), "the served JPEG differs from moss generate --quality 70");
    let (_, r) = generate(p, json!({"prompt": "a fox", "seed": 4, "size": "64x64", "num_inference_steps": 2, "output_format": "jpeg"})).await;
    assert!(b64(&r["data"][0]) == cli(&d.join("b.jpg"), "a fox", 4, 2, &["--quality", "100"]));
    let (status, r) = generate(p, json!({"prompt": "a fox", "seed": 4, "size": "64x64", "num_inference_steps": 2, "output_format": "webp"})).await;
    assert_eq!(status, 200, "{r}");
    assert!(b64(&r["data"][0]) == cli(&d.join("a.webp"), "a fox", 4, 2, &[]), "the served WebP differs from moss generate's");
    // A blank prompt: the CLI's rule.
    let (status, r) = generate(p, json!({"prompt": " \n "})).await;
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("prompt")), "{r}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// SIGTERM while the first of a request's two pictures renders: the request is finished, its
/// client gets both pictures (moss generate's bytes), then the server exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_delivers_the_running_requests_pictures() {
    let mut s = Server::start(&[], &[]);
    let p = s.port;
    let body = json!({"prompt": "drain", "size": "64x64", "num_inference_steps": 30, "seed": 20, "n": 2});
    let running = tokio::spawn(generate(p, body));
    // The first picture's first step is done: SIGTERM now.
    let t0 = Instant::now();
    loop {
        let (_, m) = call(p, "GET", "/metrics", b"").await;
        let m = String::from_utf8_lossy(&m).into_owned();
        let steps: f64 = m.lines().find(|l| l.starts_with("moss_steps_total ")).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0);
        if steps >= 1.0 {
            assert!(steps < 30.0, "the first picture ended before the signal: {steps} steps");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no step:\n{}", s.log());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(Command::new("kill").args(["-TERM", &s.child.id().to_string()]).status().unwrap().success());
    let (status, r) = running.await.unwrap();
    assert_eq!(status, 200, "{r}\n{}", s.log());
    let d = scratch("drain");
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{r}");
    for (i, item) in data.iter().enumerate() {
        assert!(b64(item) == cli(&d.join(format!("{i}.png")), "drain", 20 + i as u64, 30, &[]), "picture {i} differs from moss generate's");
    }
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "still running after SIGTERM:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.code(), Some(0), "{}", s.log());
    assert!(s.log().contains("finishing the running request 1 (all its pictures"), "{}", s.log());
    std::fs::remove_dir_all(&d).unwrap();
}
