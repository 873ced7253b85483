//! `moss serve` as a child on 127.0.0.1 (an ephemeral port) and a real HTTP client (hyper's),
//! on the golden checkpoint tiny-a on the CPU: the harness of tests/serve*.rs.

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/tiny-a").display().to_string()
}

pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `moss serve` child; killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// A server that listens (its weights may still be loading).
    pub fn spawn(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let m = model();
        let mut args = vec!["serve", "--model", &m, "--device", "cpu", "--port", "0"];
        args.extend_from_slice(extra);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_moss"));
        cmd.args(&args).env_remove("MOSS_API_KEY").stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (l, err) = (log.clone(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut l = l.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut s = Server { child, port: 0, log };
        s.wait_for("listening on");
        let log = s.log();
        let at = log.find("listening on http://127.0.0.1:").unwrap() + "listening on http://127.0.0.1:".len();
        s.port = log[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap();
        s
    }

    /// A server that has loaded its weights.
    pub fn start(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut s = Server::spawn(extra, env);
        s.wait_for("ready in");
        s
    }

    /// Wait until the log holds `what` (the server must not exit first).
    pub fn wait_for(&mut self, what: &str) {
        let t0 = Instant::now();
        while !self.log().contains(what) {
            assert!(t0.elapsed() < Duration::from_secs(120), "the server did not log `{what}`:\n{}", self.log());
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("the server exited ({st}):\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }

    /// A value from /metrics.
    pub async fn metric(&self, name: &str) -> f64 {
        let r = call(self.port, "GET", "/metrics", &[], b"").await;
        let text = String::from_utf8(r.body.to_vec()).unwrap();
        let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("{name} not in:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// Wait until `name` reaches `at_least`.
    pub async fn wait_metric(&self, name: &str, at_least: f64) -> f64 {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name).await;
            if v >= at_least {
                return v;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "{name} stayed at {v} (< {at_least}):\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    /// The OpenAI envelope, checked for its four fields.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = &v["error"];
        for k in ["message", "type", "param", "code"] {
            assert!(e.get(k).is_some(), "envelope without `{k}`: {v}");
        }
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        e.clone()
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A connection: its sender, and the task that owns the socket (aborting it hangs up).
pub async fn connect(port: u16) -> (Sender, tokio::task::JoinHandle<()>) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::builder().method(method).uri(path).header("host", "127.0.0.1").header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::copy_from_slice(body))).unwrap()
}

pub async fn call(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let (mut s, _conn) = connect(port).await;
    let res = s.send_request(request(method, path, headers, body)).await.unwrap();
    let (parts, body) = res.into_parts();
    Reply { status: parts.status.as_u16(), headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
}

pub async fn generate(port: u16, body: Value) -> Reply {
    call(port, "POST", "/v1/images/generations", &[], body.to_string().as_bytes()).await
}

/// `moss generate` (batch mode for several: the same bytes as single runs) of `(prompt, seed)`
/// pairs at 64x64; the files' bytes in order.
pub fn reference(tag: &str, items: &[(String, u64)], steps: u32, negative: &str) -> Vec<Vec<u8>> {
    let dir = scratch(tag);
    let list: String = items.iter().map(|(p, s)| json!({"prompt": p, "seed": s}).to_string() + "\n").collect();
    std::fs::write(dir.join("list.jsonl"), list).unwrap();
    let m = model();
    let out = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["generate", "--model", &m, "--device", "cpu", "--size", "64x64", "--steps", &steps.to_string(), "--negative", negative])
        .args(["--prompts", dir.join("list.jsonl").to_str().unwrap(), "--out-dir", dir.to_str().unwrap(), "--name", "{index}.png", "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (0..items.len()).map(|i| std::fs::read(dir.join(format!("{i}.png"))).unwrap()).collect()
}

pub fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(v["b64_json"].as_str().unwrap()).unwrap()
}
