//! `POST /v1/images/edits` through a real `moss serve` (tiny-a, CPU, an ephemeral port) and a
//! multipart/form-data client: the pictures equal `moss generate --init-image --mask` byte for
//! byte (n = 2, consecutive seeds); bad pictures, a mask of another size, a JSON body and a body
//! past `--max-upload` get their status and the OpenAI envelope. (tests/openai_client.py sends
//! the same request through the official client.)

mod common;

use base64::Engine as _;
use common::server::Server;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn golden(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden").join(p)
}

const BOUNDARY: &str = "moss-test-boundary-7MA4YWxkTrZu0gW";

/// A multipart/form-data body: text fields, then files (name, bytes).
fn form(fields: &[(&str, &str)], files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = vec![];
    for (k, v) in fields {
        b.extend(format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n").as_bytes());
    }
    for (k, bytes) in files {
        b.extend(format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"; filename=\"{k}.png\"\r\nContent-Type: image/png\r\n\r\n").as_bytes());
        b.extend_from_slice(bytes);
        b.extend(b"\r\n");
    }
    b.extend(format!("--{BOUNDARY}--\r\n").as_bytes());
    b
}

struct Reply {
    status: u16,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    /// The envelope's `param` and `code`.
    fn error(&self) -> (String, String) {
        let e = &self.json()["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()) && e.get("type").is_some(), "{e}");
        (e["param"].as_str().unwrap_or("").to_string(), e["code"].as_str().unwrap_or("").to_string())
    }
}

async fn post(port: u16, content_type: &str, body: Vec<u8>) -> Reply {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/v1/images/edits")
        .header("host", "127.0.0.1")
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let res = s.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    Reply { status, body: res.into_body().collect().await.unwrap().to_bytes() }
}

async fn edit(port: u16, fields: &[(&str, &str)], files: &[(&str, &[u8])]) -> Reply {
    post(port, &format!("multipart/form-data; boundary={BOUNDARY}"), form(fields, files)).await
}

fn cli(args: &[&str], out: &Path) -> Vec<u8> {
    let m = golden("tiny-a");
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["generate", "--model", m.to_str().unwrap(), "--device", "cpu", "--quiet", "-o", out.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read(out).unwrap()
}

fn png(img: image::DynamicImage) -> Vec<u8> {
    let mut out = std::io::Cursor::new(vec![]);
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_equal_generate_and_bad_pictures_are_refused() {
    let s = Server::start(&["--max-upload", "200000"], &[]);
    let (init, mask) = (golden("expected/enc-64x64.png"), golden("expected/mask-64x64.png"));
    let (ib, mb) = (std::fs::read(&init).unwrap(), std::fs::read(&mask).unwrap());
    let fields = [
        ("prompt", "a lighthouse"),
        ("n", "2"),
        ("seed", "9"),
        ("num_inference_steps", "3"),
        ("strength", "0.7"),
        ("negative_prompt", "fog"),
        ("response_format", "b64_json"),
        ("size", "64x64"),
    ];
    let r = edit(s.port, &fields, &[("image", &ib), ("mask", &mb)]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let dir = std::env::temp_dir().join(format!("moss-serve-edits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, d) in data.iter().enumerate() {
        let seed = (9 + i).to_string();
        let want = cli(
            &[
                "--prompt",
                "a lighthouse",
                "--negative",
                "fog",
                "--seed",
                &seed,
                "--steps",
                "3",
                "--strength",
                "0.7",
                "--size",
                "64x64",
                "--init-image",
                init.to_str().unwrap(),
                "--mask",
                mask.to_str().unwrap(),
            ],
            &dir.join(format!("{i}.png")),
        );
        let got = base64::engine::general_purpose::STANDARD.decode(d["b64_json"].as_str().unwrap()).unwrap();
        assert!(got == want, "picture {i} (seed {seed}) differs from moss generate --init-image --mask");
    }
    assert!(s.log.lock().unwrap().contains("POST /v1/images/edits 200"), "{}", s.log.lock().unwrap());

    // Without `size`: the picture's own; `image[]` is OpenAI's spelling of a one-picture list.
    let r = edit(s.port, &[("prompt", "x"), ("num_inference_steps", "1"), ("seed", "1")], &[("image[]", &ib)]).await;
    assert_eq!((r.status, r.json()["size"].as_str()), (200, Some("64x64")));

    let small = png(image::DynamicImage::new_luma8(32, 32));
    // A PNG whose header claims 100000x100000 (no pixels behind it).
    let mut bomb = png(image::DynamicImage::new_rgb8(1, 1));
    bomb[16..24].copy_from_slice(&[0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0]);
    let crc = crc32fast::hash(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    let p = [("prompt", "x")];
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<(&'a str, &'a [u8])>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (p.to_vec(), vec![], 400, "image"),
        (p.to_vec(), vec![("image", b"hello, not a picture")], 400, "image"),
        (p.to_vec(), vec![("image", &bomb)], 400, "image"),
        (p.to_vec(), vec![("image", &ib), ("mask", &bomb)], 400, "mask"),
        (p.to_vec(), vec![("image", &ib), ("mask", &small)], 400, "mask"),
        (p.to_vec(), vec![("image", &ib), ("image", &ib)], 400, "image"),
        (vec![("prompt", "x"), ("strength", "2")], vec![("image", &ib)], 400, "strength"),
        (vec![("prompt", "x"), ("size", "100x100")], vec![("image", &ib)], 400, "size"),
        (vec![], vec![("image", &ib)], 400, "prompt"),
        (vec![("prompt", "x"), ("sampler", "heun")], vec![("image", &ib), ("mask", &mb)], 400, "sampler"),
    ];
    for (f, files, status, param) in cases {
        let r = edit(s.port, &f, &files).await;
        assert_eq!(r.status, status, "{f:?}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.error().0, param, "{f:?}");
    }
    // The bomb is refused from its header, its claimed size named.
    for files in [vec![("image", &bomb[..])], vec![("image", &ib[..]), ("mask", &bomb[..])]] {
        let r = edit(s.port, &p, &files).await;
        let m = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(r.status == 400 && m.contains("100000x100000"), "{m}");
    }
    // A body past --max-upload: 413 in the envelope.
    let big = vec![7u8; 300_000];
    let r = edit(s.port, &p, &[("image", &big)]).await;
    assert_eq!((r.status, r.error().1.as_str()), (413, "request_too_large"));
    // JSON is not a form: 415.
    let r = post(s.port, "application/json", br#"{"prompt":"x"}"#.to_vec()).await;
    assert_eq!((r.status, r.error().1.as_str()), (415, "unsupported_media_type"));
    let _ = std::fs::remove_dir_all(&dir);
}
