//! `moss serve` with the sampling loop's request fields (issue 42), tiny-a on the CPU through a
//! real server and hyper's client: `sampler`, `schedule`, `cache`, `guidance_window` give the
//! bytes `moss generate` writes with the same flags; `partial_images` with `stream: true` sends
//! OpenAI's `image_generation.partial_image` events (the decoded x0 prediction `generate
//! --preview` writes for that step) between the step events; bad values are 400 with the
//! envelope.

mod common;

use common::server::*;
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// POST a generation; the status, headers and the response body (streamed bodies are read to the end).
async fn post(port: u16, body: &Value) -> (u16, hyper::HeaderMap, Bytes) {
    let r = generate(port, body.clone()).await;
    (r.status, r.headers, r.body)
}

/// The `data:` lines of a server-sent event stream, parsed.
fn events(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).unwrap();
    text.split("\n\n").filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data: "))).map(|d| serde_json::from_str(d).unwrap()).collect()
}

fn moss_generate(out: &Path, seed: u64, flags: &[&str]) {
    let (m, seed) = (model(), seed.to_string());
    let mut args = vec!["generate", "--model", &m[..], "--device", "cpu", "--prompt", "a red fox", "--negative", "blurry", "--size", "64x48"];
    args.extend(["--steps", "4", "--seed", &seed, "-q", "-o", out.to_str().unwrap()]);
    args.extend(flags);
    let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

const FLAGS: [&str; 16] = [
    "--sampler",
    "dpm++2m",
    "--schedule",
    "karras",
    "--cache",
    "dbcache",
    "--cache-fn",
    "1",
    "--cache-threshold",
    "1",
    "--cache-warmup",
    "1",
    "--guidance-window",
    "0:0.5",
    "--cache-max-cached",
    "1",
];

fn body(extra: Value) -> Value {
    let mut b = json!({
        "prompt": "a red fox", "negative_prompt": "blurry", "size": "64x48", "num_inference_steps": 4, "seed": 9,
        "sampler": "dpm++2m", "schedule": "karras", "guidance_window": "0:0.5",
        "cache": {"method": "dbcache", "Fn_compute_blocks": 1, "residual_diff_threshold": 1, "max_warmup_steps": 1, "max_cached_steps": 1},
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loop_fields_and_partial_images() {
    let s = Server::start(&[], &[]);
    let dir = scratch("loop");
    // The loop's fields give generate's picture with the same flags.
    let (status, _, bytes) = post(s.port, &body(json!({}))).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let want = dir.join("want.png");
    moss_generate(&want, 9, &FLAGS);
    assert!(b64(&v["data"][0]) == std::fs::read(&want).unwrap(), "the served picture differs from moss generate's");
    // dpm++2m, 4 calls; window 0:0.5: 2 negative passes. Each pass serves its call 1 (past the
    // warm-up, max_cached_steps 1): the prompt's 3 full passes of 23 blocks and F1, the
    // negative's 1 of 22 (block 22 skipped) and F1; the served ones leave out 22 and 21.
    assert_eq!(
        v["data"][0]["forwards"],
        json!({"calls": 4, "computed": 4, "cached": 2, "skipped": 2, "blocks_computed": 3 * 23 + 1 + 22 + 1, "blocks_skipped": 22 + 21})
    );

    // Streamed with partial images: 3 a picture, after steps 1, 2, 3 of 4, each picture's before
    // its completion; the step events stay.
    let (status, headers, bytes) = post(s.port, &body(json!({"stream": true, "partial_images": 3, "n": 2}))).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(headers["content-type"], "text/event-stream");
    let ev = events(&bytes);
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "image_generation.step").count(), 8, "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"done"), "{kinds:?}");
    for index in 0..2 {
        let mine: Vec<&Value> = ev.iter().filter(|e| e["index"] == index).collect();
        let parts: Vec<&&Value> = mine.iter().filter(|e| e["type"] == "image_generation.partial_image").collect();
        assert_eq!(parts.len(), 3, "picture {index}: {kinds:?}");
        let done_at = mine.iter().position(|e| e["type"] == "image_generation.completed").unwrap();
        assert!(mine[..done_at].iter().filter(|e| e["type"] == "image_generation.partial_image").count() == 3, "partial images come first");
        for (k, e) in parts.iter().enumerate() {
            assert_eq!((e["partial_image_index"].as_u64(), e["step"].as_u64(), e["steps"].as_u64()), (Some(k as u64), Some(k as u64 + 1), Some(4)), "{e}");
            assert_eq!(
                (e["size"].as_str(), e["output_format"].as_str(), e["background"].as_str(), e["quality"].as_str()),
                (Some("64x48"), Some("png"), Some("opaque"), Some("auto"))
            );
            assert!(e["created_at"].as_u64().unwrap() > 1_700_000_000, "{e}");
            let (_, w, h, meta) = moss::picture::decode(&b64(e)).unwrap();
            assert_eq!((w, h, meta.get("moss:preview")), (64, 48, Some(&*format!("step {} of 4", k + 1))));
        }
        let done = mine[done_at];
        assert_eq!((done["size"].as_str(), done["output_format"].as_str(), done["seed"].as_u64()), (Some("64x48"), Some("png"), Some(9 + index)));
    }
    let first = ev.iter().find(|e| e["type"] == "image_generation.completed" && e["index"] == 0).unwrap();
    assert!(b64(first) == std::fs::read(&want).unwrap(), "the streamed picture differs");
    // The partial image after step 3 is what `generate --preview` writes after step 3.
    let (prev, pic) = (dir.join("prev.png"), dir.join("pic.png"));
    moss_generate(&pic, 9, &[&FLAGS[..], &["--preview", prev.to_str().unwrap(), "--preview-every", "3"]].concat());
    let part = ev.iter().find(|e| e["index"] == 0 && e["partial_image_index"] == 2).unwrap();
    let (served, ..) = moss::picture::decode(&b64(part)).unwrap();
    let (preview, ..) = moss::picture::decode(&std::fs::read(&prev).unwrap()).unwrap();
    assert!(served == preview, "partial image 2 is not generate's preview after step 3");
    assert!(s.log.lock().unwrap().contains("POST /v1/images/generations 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_loop_fields_are_400_with_the_envelope() {
    let s = Server::start(&[], &[]);
    for (extra, param, needle) in [
        (json!({"sampler": "dpmpp_2m"}), "sampler", "euler_ancestral"),
        (json!({"schedule": "normal"}), "schedule", "sgm_uniform"),
        (json!({"cache": "teacache"}), "cache", "taylorseer"),
        (json!({"cache": {"method": "dbcache", "Fn_compute_blocks": 20, "Bn_compute_blocks": 4}}), "cache", "23 blocks"),
        (json!({"guidance_window": [0.5, 0.25]}), "guidance_window", "A:B"),
        (json!({"partial_images": 2}), "partial_images", "stream"),
        (json!({"partial_images": 4, "stream": true}), "partial_images", "0..=3"),
    ] {
        let (status, _, bytes) = post(s.port, &body(extra.clone())).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(status, 400, "{extra}: {v}");
        let e = &v["error"];
        assert_eq!((e["param"].as_str(), e["type"].as_str()), (Some(param), Some("invalid_request_error")), "{extra}: {v}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{extra}: {v}");
    }
}
