//! `moss serve` through a real server on 127.0.0.1 (an ephemeral port) and a real HTTP client
//! (hyper's), on the golden checkpoint tiny-a on the CPU: served PNGs equal `moss generate`'s
//! bytes (n = 3 with consecutive seeds; 16 concurrent clients each get their own picture), every
//! bad input gets its status and the OpenAI envelope, 401, 413, 429 with Retry-After, a client
//! that goes away frees the engine within a step, and SIGTERM drains.

mod common;

use common::server::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n3_consecutive_seeds_equal_generate_byte_for_byte() {
    let s = Server::start(&[], &[]);
    assert_eq!(call(s.port, "GET", "/health", &[], b"").await.status, 200);
    let models = call(s.port, "GET", "/v1/models", &[], b"").await.json();
    assert_eq!(models["data"][0]["id"], "tiny-a", "the folder's name, not its path");
    let r = generate(
        s.port,
        json!({"prompt": "a red fox", "negative_prompt": "blurry", "n": 3, "seed": 100, "size": "64x64",
               "num_inference_steps": 3, "model": model(), "response_format": "b64_json", "quality": "hd", "user": "t"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let want = reference("n3", &[("a red fox".into(), 100), ("a red fox".into(), 101), ("a red fox".into(), 102)], 3, "blurry");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["seed"], 100 + i as u64);
        assert!(d["timings"]["total_s"].as_f64().unwrap() > 0.0, "{d}");
        assert!(b64(d) == want[i], "picture {i} (seed {}) differs from moss generate's", 100 + i);
    }
    assert_ne!(want[0], want[1], "consecutive seeds give different pictures");
    assert_eq!(s.wait_metric("moss_pictures_total", 3.0).await, 3.0);
    assert!(s.log().contains("POST /v1/images/generations 200") && s.log().contains("seed=100"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_bad_input_gets_its_status_and_envelope() {
    let s = Server::start(&["--max-body", "2048", "--max-tokens", "64", "--max-steps", "8", "--max-size", "256x256"], &[]);
    let p = s.port;
    let cases: Vec<(&[u8], u16, &str, Value)> = vec![
        (b"{not json", 400, "invalid_json", Value::Null),
        (b"[]", 400, "invalid_json", Value::Null),
        (br#"{"size":"64x64"}"#, 400, "missing_required_parameter", json!("prompt")),
        (br#"{"prompt":"   "}"#, 400, "invalid_value", json!("prompt")),
        (br#"{"prompt":"x","colour":"red","sede":1}"#, 400, "unknown_parameter", json!("colour")),
        (br#"{"prompt":"x","n":0}"#, 400, "invalid_value", json!("n")),
        (br#"{"prompt":"x","n":9}"#, 400, "invalid_value", json!("n")),
        (br#"{"prompt":"x","n":"2"}"#, 400, "invalid_type", json!("n")),
        (br#"{"prompt":"x","size":"65x64"}"#, 400, "invalid_value", json!("size")),
        (br#"{"prompt":"x","size":"512x512"}"#, 400, "invalid_value", json!("size")),
        (br#"{"prompt":"x","response_format":"url"}"#, 400, "unsupported_value", json!("response_format")),
        (br#"{"prompt":"x","output_format":"gif"}"#, 400, "invalid_value", json!("output_format")),
        (br#"{"prompt":"x","seed":-3}"#, 400, "invalid_type", json!("seed")),
        (br#"{"prompt":"x","num_inference_steps":9}"#, 400, "invalid_value", json!("num_inference_steps")),
        (br#"{"prompt":"x","num_inference_steps":0}"#, 400, "invalid_value", json!("num_inference_steps")),
        (br#"{"prompt":"x","guidance_scale":"high"}"#, 400, "invalid_type", json!("guidance_scale")),
        (br#"{"prompt":"x","stream":1}"#, 400, "invalid_type", json!("stream")),
        (br#"{"prompt":"x","model":"dall-e-3"}"#, 404, "model_not_found", json!("model")),
    ];
    for (body, status, code, param) in cases {
        let r = call(p, "POST", "/v1/images/generations", &[], body).await;
        let what = String::from_utf8_lossy(body);
        assert_eq!(r.status, status, "{what}: {}", String::from_utf8_lossy(&r.body));
        let e = r.error();
        assert_eq!(e["code"], code, "{what}: {e}");
        assert_eq!(e["param"], param, "{what}: {e}");
        assert_eq!(e["type"], "invalid_request_error", "{e}");
    }
    // Both unknown fields are named.
    let e = call(p, "POST", "/v1/images/generations", &[], br#"{"prompt":"x","colour":1,"sede":1}"#).await.error();
    assert!(e["message"].as_str().unwrap().contains("`colour`, `sede`"), "{e}");
    // Prompt tokens above --max-tokens; the negative too (it is encoded unless guidance is 1).
    let long = json!({"prompt": "word ".repeat(100), "size": "64x64"});
    let e = generate(p, long).await.error();
    assert_eq!((e["param"].as_str(), e["code"].as_str()), (Some("prompt"), Some("invalid_value")), "{e}");
    let e = generate(p, json!({"prompt": "x", "size": "64x64", "negative_prompt": "word ".repeat(100)})).await.error();
    assert_eq!(e["param"], "negative_prompt", "{e}");
    // 413 past --max-body (the envelope too), 404 for an unknown route, 405 for a wrong method.
    let big = json!({"prompt": "x".repeat(4000)}).to_string();
    let r = call(p, "POST", "/v1/images/generations", &[], big.as_bytes()).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.error()["code"], "request_too_large");
    let r = call(p, "GET", "/v1/images/variations", &[], b"").await;
    assert_eq!((r.status, r.error()["code"].as_str()), (404, Some("not_found")));
    let r = call(p, "GET", "/v1/images/generations", &[], b"").await;
    assert_eq!(r.status, 405);
    r.error();
    // Nothing ran; the server still serves.
    assert_eq!(s.metric("moss_pictures_total").await, 0.0);
    assert_eq!(generate(p, json!({"prompt": "ok", "size": "64x64", "num_inference_steps": 1})).await.status, 200);
    assert!(s.metric("moss_requests_total{status=\"400\"}").await >= 20.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_key_401_and_insecure_bind_refused() {
    let s = Server::start(&[], &[("MOSS_API_KEY", "sk-test-123")]);
    let p = s.port;
    let body = json!({"prompt": "x", "size": "64x64", "num_inference_steps": 1}).to_string();
    for h in [vec![], vec![("authorization", "Bearer sk-test-124")], vec![("authorization", "sk-test-123")]] {
        let r = call(p, "POST", "/v1/images/generations", &h, body.as_bytes()).await;
        assert_eq!(r.status, 401, "{h:?}");
        let e = r.error();
        assert_eq!((e["type"].as_str(), e["code"].as_str()), (Some("authentication_error"), Some("invalid_api_key")));
    }
    assert_eq!(call(p, "GET", "/v1/models", &[], b"").await.status, 401);
    assert_eq!(call(p, "GET", "/health", &[], b"").await.status, 200, "the readiness probe needs no key");
    let ok = call(p, "POST", "/v1/images/generations", &[("authorization", "Bearer sk-test-123")], body.as_bytes()).await;
    assert_eq!(ok.status, 200);
    // A non-loopback address without a key: refused before anything loads.
    let err = refused(&["--host", "0.0.0.0"]);
    assert!(err.contains("without an API key") && err.contains("--allow-insecure-bind"), "{err}");
}

/// `moss serve` on the CPU with `extra`, which must refuse to start (exit 1): its stderr.
fn refused(extra: &[&str]) -> String {
    let m = model();
    let out = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["serve", "--model", &m, "--device", "cpu", "--port", "0"])
        .args(extra)
        .env_remove("MOSS_API_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
    err
}

/// Read server-sent events from `res` until one named `until`; the events seen.
async fn read_events(body: &mut hyper::body::Incoming, until: &str, buf: &mut String) -> Vec<Value> {
    let mut seen = vec![];
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) {
                let v: Value = serde_json::from_str(data).unwrap();
                let done = v["type"] == until;
                seen.push(v);
                if done {
                    return seen;
                }
            }
        }
        let frame = body.frame().await.expect("the stream ended").unwrap();
        if let Ok(d) = frame.into_data() {
            buf.push_str(std::str::from_utf8(&d).unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_queue_full_429_and_disconnect_frees_the_engine() {
    let s = Server::start(&["--max-queue", "1", "--max-steps", "1000"], &[]);
    let p = s.port;
    // A streamed, long request: queued, then steps.
    let (mut a, a_conn) = connect(p).await;
    let long = json!({"prompt": "slow", "size": "64x64", "num_inference_steps": 1000, "stream": true, "seed": 5}).to_string();
    let res = a.send_request(request("POST", "/v1/images/generations", &[], long.as_bytes())).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut body = res.into_body();
    let mut buf = String::new();
    let ev = read_events(&mut body, "image_generation.step", &mut buf).await;
    assert_eq!(ev[0]["type"], "image_generation.queued");
    assert_eq!(ev[0]["position"], 0);
    let last = ev.last().unwrap();
    // 1000 steps snap to the distinct timesteps of the training grid: fewer, but many.
    assert!(last["step"] == 1 && last["steps"].as_u64().unwrap() > 500, "{last}");
    // One waits in the queue; the next is refused with 429 and a Retry-After.
    let (mut b, b_conn) = connect(p).await;
    let queued = tokio::spawn(async move {
        let body = json!({"prompt": "waits", "size": "64x64", "num_inference_steps": 2}).to_string();
        b.send_request(request("POST", "/v1/images/generations", &[], body.as_bytes())).await
    });
    s.wait_metric("moss_queue_depth", 1.0).await;
    let r = generate(p, json!({"prompt": "full", "size": "64x64", "num_inference_steps": 2})).await;
    assert_eq!(r.status, 429);
    let ra: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(ra >= 1, "Retry-After {ra}");
    assert_eq!((r.error()["type"].as_str(), r.error()["code"].as_str()), (Some("rate_limit_error"), Some("queue_full")));
    // The queued client goes away: it leaves the queue.
    queued.abort();
    b_conn.abort();
    let _ = queued.await;
    let t0 = Instant::now();
    while s.metric("moss_queue_depth").await != 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the queued request stayed:\n{}", s.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The running client goes away: the engine stops within a step.
    read_events(&mut body, "image_generation.step", &mut buf).await;
    let steps_seen = s.metric("moss_steps_total").await;
    drop(body);
    drop(a);
    a_conn.abort();
    s.wait_metric("moss_pictures_cancelled_total", 1.0).await;
    let steps_run = s.metric("moss_steps_total").await;
    assert!(steps_run <= steps_seen + 2.0, "{steps_run} steps ran, the client left after {steps_seen}");
    assert_eq!(s.metric("moss_running").await, 0.0);
    assert!(s.log().contains("stopped between steps: the client went away"), "{}", s.log());
    // Both requests the clients left have their log line, with 499 and the seed.
    assert!(s.log().contains("removed from the queue"), "{}", s.log());
    assert_eq!(s.log().matches("POST /v1/images/generations 499").count(), 2, "{}", s.log());
    assert!(s.log().contains("seed=5"), "{}", s.log());
    // The next request is served normally.
    let r = generate(p, json!({"prompt": "after", "size": "64x64", "num_inference_steps": 1})).await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_finishes_the_running_picture_and_answers_the_queue_503() {
    let s = Server::start(&[], &[]);
    let p = s.port;
    let body = json!({"prompt": "drain", "size": "64x64", "num_inference_steps": 20, "seed": 9});
    let running = tokio::spawn(generate(p, body.clone()));
    s.wait_metric("moss_steps_total", 1.0).await;
    let queued = tokio::spawn(generate(p, json!({"prompt": "queued", "size": "64x64", "num_inference_steps": 2})));
    s.wait_metric("moss_queue_depth", 1.0).await;
    s.signal("-TERM");
    let q = queued.await.unwrap();
    assert_eq!(q.status, 503);
    assert_eq!(q.error()["type"], "server_error");
    let r = running.await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let want = reference("drain", &[("drain".into(), 9)], 20, "");
    assert!(b64(&r.json()["data"][0]) == want[0], "the drained picture differs from moss generate's");
    let mut s = s;
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "still running after SIGTERM:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{}", s.log());
    let log = s.log();
    assert!(log.contains("SIGTERM: stopped accepting; 1 queued requests answered 503; finishing the running request"), "{log}");
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", p)).await.is_err(), "still accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_clients_each_get_their_own_picture() {
    let s = Server::start(&["--max-queue", "16"], &[]);
    let p = s.port;
    let items: Vec<(String, u64)> = (0..16).map(|i| (format!("client {i}"), 1000 + 7 * i)).collect();
    let tasks: Vec<_> = items
        .iter()
        .map(|(prompt, seed)| {
            tokio::spawn(generate(p, json!({"prompt": prompt, "seed": seed, "size": "64x64", "num_inference_steps": 2, "negative_prompt": "x"})))
        })
        .collect();
    let want = reference("sixteen", &items, 2, "x");
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "client {i}: {}", String::from_utf8_lossy(&r.body));
        let d = &r.json()["data"][0];
        assert_eq!(d["seed"], items[i].1);
        assert!(b64(d) == want[i], "client {i} got another picture");
    }
    assert_eq!(s.metric("moss_pictures_total").await, 16.0);
}

/// Read from a raw socket until the server closes it (or `limit` passes); what arrived.
fn read_until_closed(s: &mut std::net::TcpStream, limit: Duration) -> Option<String> {
    use std::io::Read;
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = vec![];
    s.read_to_end(&mut got).ok().map(|_| String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_time_out() {
    use std::io::Write;
    let s = Server::start(&["--client-timeout", "1"], &[]);
    // Headers that never end (a client this slow needs a raw socket).
    let t0 = Instant::now();
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.write_all(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n").unwrap();
    assert!(read_until_closed(&mut c, Duration::from_secs(20)).is_some(), "a stalled header was kept open");
    assert!(t0.elapsed() < Duration::from_secs(10), "closed only after {:?}", t0.elapsed());
    // A body that never arrives whole: answered with an error in the envelope, then closed.
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.write_all(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"").unwrap();
    let got = read_until_closed(&mut c, Duration::from_secs(20)).expect("a stalled body was kept open");
    let status = got.split(' ').nth(1).unwrap_or("");
    assert!(status.starts_with('4'), "{got}");
    assert!(got.contains("\"error\""), "{got}");
    // The server still serves.
    assert_eq!(call(s.port, "GET", "/health", &[], b"").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_signal_stops_the_running_picture_between_steps() {
    let mut s = Server::start(&["--max-steps", "1000"], &[]);
    let p = s.port;
    let running = tokio::spawn(generate(p, json!({"prompt": "long", "size": "64x64", "num_inference_steps": 1000})));
    s.wait_metric("moss_steps_total", 1.0).await;
    s.signal("-INT");
    let t0 = Instant::now();
    while !s.log().contains("SIGINT: stopped accepting") {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", s.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.signal("-TERM");
    let r = running.await.unwrap();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.error()["type"], "server_error");
    let status = s.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", s.log());
    let log = s.log();
    assert!(log.contains("second signal: stopping the running picture") && log.contains("stopped between steps: shutdown"), "{log}");
}

/// `moss serve --lora` merges at start-up: the served picture equals `moss generate --lora`'s bytes
/// (the LoRA recorded in both), and differs from the picture without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lora_given_at_start_up_serves_generates_picture() {
    let lora = format!("{}:0.7", Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/lora/kohya.safetensors").display());
    let s = Server::start(&["--lora", &lora], &[]);
    let r = generate(s.port, json!({"prompt": "a fox", "seed": 5, "size": "64x64", "num_inference_steps": 2})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let served = b64(&r.json()["data"][0]);
    let dir = scratch("lora");
    let out = dir.join("g.png");
    let m = model();
    let g = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["generate", "--model", &m, "--device", "cpu", "--size", "64x64", "--steps", "2", "--seed", "5", "--prompt", "a fox"])
        .args(["--lora", &lora, "--out", out.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    assert!(served == std::fs::read(&out).unwrap(), "the served picture differs from moss generate --lora's");
    let plain = reference("lora-plain", &[("a fox".into(), 5)], 2, "");
    assert!(served != plain[0], "the LoRA changed nothing");
    // The start-up log says what reading and merging the LoRA took.
    let log = s.log();
    assert!(log.contains("1 LoRA(s) read in ") && log.contains(", merged in ") && log.contains("(host "), "{log}");
}

/// `moss serve --max-vram`: a cap below the smallest that works is refused in one line before
/// the server binds; under a cap the plan is logged at start-up and shown by `/health`, and the
/// served picture is `moss generate`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_vram_is_planned_logged_and_shown_by_health() {
    let err = refused(&["--max-vram", "0.01"]);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("smallest cap that works") && err.contains("--max-vram"), "{err}");
    let s = Server::start(&["--max-vram", "2", "--max-size", "256x256"], &[]);
    assert!(s.log().contains("memory plan under 2.00 GiB"), "{}", s.log());
    let h = call(s.port, "GET", "/health", &[], b"").await.json();
    let nets = h["memory_plan"]["networks"].as_array().unwrap_or_else(|| panic!("{h}"));
    assert_eq!(nets.len(), 3, "{h}");
    assert_eq!(h["memory_plan"]["cap_bytes"], 2u64 << 30, "{h}");
    let r = generate(s.port, json!({"prompt": "a red fox", "seed": 100, "size": "64x64", "num_inference_steps": 3, "negative_prompt": "blurry"})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let want = reference("maxvram", &[("a red fox".into(), 100)], 3, "blurry");
    assert!(b64(&r.json()["data"][0]) == want[0], "the capped server's picture differs from moss generate's");
}

/// `GET /livez` (liveness) is 200 whenever the process answers, with no key: right after the
/// server listens (its weights may still be loading: `/health` is then 503 `loading`), and while
/// a long picture runs (`/health` 200), answered at once, not after the picture.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn livez_answers_while_loading_and_while_a_picture_runs() {
    let mut s = Server::spawn(&["--max-steps", "1000"], &[("MOSS_API_KEY", "sk-live")]);
    let live = call(s.port, "GET", "/livez", &[], b"").await;
    assert_eq!((live.status, live.json()["status"].as_str()), (200, Some("alive")));
    let h = call(s.port, "GET", "/health", &[], b"").await;
    assert!(h.status == 200 || (h.status == 503 && h.json()["status"] == "loading"), "{}", String::from_utf8_lossy(&h.body));
    s.wait_for("ready in");
    let key = [("authorization", "Bearer sk-live")];
    let body = json!({"prompt": "long", "size": "64x64", "num_inference_steps": 1000}).to_string();
    let p = s.port;
    let running = tokio::spawn(async move { call(p, "POST", "/v1/images/generations", &key, body.as_bytes()).await });
    s.wait_metric("moss_steps_total", 1.0).await;
    for _ in 0..3 {
        let t0 = Instant::now();
        let live = call(s.port, "GET", "/livez", &[], b"").await;
        assert_eq!(live.status, 200);
        assert!(t0.elapsed() < Duration::from_secs(2), "/livez took {:?} during a picture", t0.elapsed());
        assert_eq!(call(s.port, "GET", "/health", &[], b"").await.status, 200, "ready while busy");
    }
    assert_eq!(s.metric("moss_running").await, 1.0, "the picture was still running");
    running.abort();
}
