//! `moss serve` against web pages, through a real server (golden tiny-a on the CPU, an ephemeral
//! port) and a real HTTP client (hyper's): a JSON route refuses other content types (415), a
//! browser `Origin` is refused (403) unless `--allow-origin` allows it (then CORS, preflight
//! included), a loopback server without a key answers loopback host names only (403 for a
//! rebound name), and `/v1/models` and `/health` never show the checkpoint's path. Every refusal
//! has the OpenAI envelope and queues nothing.

mod common;

use common::server::{model, Server};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::process::Command;

struct Reply {
    status: u16,
    headers: hyper::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The OpenAI envelope's `code`, its four fields checked.
    fn code(&self) -> String {
        let v: Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()));
        for k in ["message", "type", "param", "code"] {
            assert!(v["error"].get(k).is_some(), "envelope without `{k}`: {v}");
        }
        v["error"]["code"].as_str().unwrap().to_string()
    }
}

/// One request with exactly `headers` (no default Host or Content-Type).
async fn call(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut b = hyper::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let res = s.send_request(b.body(Full::new(Bytes::copy_from_slice(body))).unwrap()).await.unwrap();
    let (parts, body) = res.into_parts();
    Reply { status: parts.status.as_u16(), headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
}

/// The status line of `GET path` sent as HTTP/1.0 with no header at all.
fn http10_status(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.lines().next().unwrap_or_default().to_string()
}

const BODY: &[u8] = br#"{"prompt": "a fox", "size": "64x64", "num_inference_steps": 1, "seed": 5}"#;
const GEN: &str = "/v1/images/generations";

/// Pictures the server rendered (its metric).
async fn pictures(port: u16) -> f64 {
    let r = call(port, "GET", "/metrics", &[("host", "127.0.0.1")], b"").await;
    let line = r.text().lines().find(|l| l.starts_with("moss_pictures_total ")).unwrap().to_string();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pages_cannot_drive_a_local_server() {
    let s = Server::start(&[], &[]);
    let p = s.port;
    let host = format!("127.0.0.1:{p}");
    let json = [("host", host.as_str()), ("content-type", "application/json")];
    // Not JSON: 415, whatever the body.
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"] {
        let r = call(p, "POST", GEN, &[("host", &host), ("content-type", ct)], BODY).await;
        assert_eq!((r.status, r.code().as_str()), (415, "unsupported_media_type"), "{ct}: {}", r.text());
    }
    let r = call(p, "POST", GEN, &[("host", &host)], BODY).await;
    assert_eq!((r.status, r.code().as_str()), (415, "unsupported_media_type"), "no content type: {}", r.text());
    // A browser's Origin, on every route: 403.
    for (method, path) in [("POST", GEN), ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"), ("OPTIONS", GEN)] {
        let r = call(p, method, path, &[json[0], json[1], ("origin", "https://evil.example")], BODY).await;
        assert_eq!((r.status, r.code().as_str()), (403, "origin_not_allowed"), "{method} {path}: {}", r.text());
        assert!(r.headers.get("access-control-allow-origin").is_none());
    }
    let r = call(p, "POST", GEN, &[json[0], json[1], ("origin", "null")], BODY).await;
    assert_eq!(r.status, 403, "Origin: null");
    // A name that is not loopback (DNS rebinding): 403; loopback names are answered.
    for h in ["evil.example", &format!("evil.example:{p}"), "localhost.evil.example", "10.1.2.3"] {
        let r = call(p, "GET", "/v1/models", &[("host", h)], b"").await;
        assert_eq!((r.status, r.code().as_str()), (403, "host_not_allowed"), "Host {h}: {}", r.text());
        let r = call(p, "POST", GEN, &[("host", h), ("content-type", "application/json")], BODY).await;
        assert_eq!(r.status, 403, "Host {h}");
    }
    let r = call(p, "GET", "/health", &[], b"").await;
    assert_eq!((r.status, r.code().as_str()), (403, "host_not_allowed"), "no Host: {}", r.text());
    // HTTP/1.0 without a Host (a load balancer's health check, HAProxy's `option httpchk`): answered.
    let line = http10_status(p, "/health");
    assert!(line.starts_with("HTTP/1.") && line.contains(" 200 "), "HTTP/1.0 without Host: {line}");
    assert_eq!(pictures(p).await, 0.0, "a refused request was rendered");
    for h in [host.clone(), format!("localhost:{p}"), "LOCALHOST".into(), format!("[::1]:{p}"), "127.0.0.2".into()] {
        let r = call(p, "GET", "/health", &[("host", &h)], b"").await;
        assert_eq!(r.status, 200, "Host {h}: {}", r.text());
    }
    // The model is named by its folder, never by its path.
    for path in ["/v1/models", "/health"] {
        let r = call(p, "GET", path, &[json[0]], b"").await;
        assert!(!r.text().contains(&model()) && !r.text().contains(env!("CARGO_MANIFEST_DIR")), "{path} shows the path: {}", r.text());
    }
    let r = call(p, "GET", "/v1/models", &[json[0]], b"").await;
    assert!(r.text().contains("\"id\":\"tiny-a\""), "{}", r.text());
    // A request naming the model by its --model spelling is still served; JSON from no page renders.
    let body = format!(r#"{{"prompt": "a fox", "size": "64x64", "num_inference_steps": 1, "model": {:?}}}"#, model());
    let r = call(p, "POST", GEN, &json, body.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call(p, "POST", GEN, &[json[0], ("content-type", "application/json; charset=utf-8")], BODY).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(pictures(p).await, 2.0);
    assert!(s.log().contains("no API key: loopback host names only"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_get_cors_and_a_key_lifts_the_host_check() {
    let s = Server::start(&["--allow-origin", "http://localhost:3000", "--allow-origin", "https://App.Example/", "--api-key", "k1"], &[]);
    let p = s.port;
    let auth = ("authorization", "Bearer k1");
    // With a key, any Host name is answered (the key guards); without the key, 401.
    let r = call(p, "GET", "/v1/models", &[("host", "moss.example:8000"), auth], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call(p, "GET", "/v1/models", &[("host", "moss.example:8000")], b"").await;
    assert_eq!(r.status, 401);
    // A preflight from an allowed origin, then its request.
    let pre = [
        ("host", "127.0.0.1"),
        ("origin", "https://app.example"),
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "authorization, content-type"),
    ];
    let r = call(p, "OPTIONS", GEN, &pre, b"").await;
    assert!(r.status < 300, "preflight: {} {}", r.status, r.text());
    assert_eq!(r.headers["access-control-allow-origin"], "https://app.example");
    let allowed = r.headers["access-control-allow-headers"].to_str().unwrap().to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"), "{allowed}");
    let r = call(p, "POST", GEN, &[("host", "127.0.0.1"), ("origin", "http://localhost:3000"), ("content-type", "application/json"), auth], BODY).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["access-control-allow-origin"], "http://localhost:3000");
    // Any other origin is still refused, before the key is looked at.
    for o in ["http://localhost:3001", "https://evil.example"] {
        let r = call(p, "POST", GEN, &[("host", "127.0.0.1"), ("origin", o), ("content-type", "application/json"), auth], BODY).await;
        assert_eq!((r.status, r.code().as_str()), (403, "origin_not_allowed"), "{o}");
    }
}

#[test]
fn a_malformed_allow_origin_is_refused_at_start() {
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["serve", "--model", &model(), "--device", "cpu", "--port", "0", "--allow-origin", "localhost:3000/app"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("moss: error: --allow-origin \"localhost:3000/app\" is not an origin"), "{err}");
}
