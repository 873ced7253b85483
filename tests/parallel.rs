//! `--devices` through the real CLI with CPU ranks (threads of one process over the host
//! transport: the same rank logic the GPUs run over NCCL), against one rank:
//! - CFG-parallel (2 ranks, golden tiny-a: block 22 skipped in the negative's pass): the picture
//!   file and the latents byte for byte, with the Euler loop, a host-side sampler and a guidance
//!   window (steps where both ranks run the prompt's pass); batch mode and `moss serve` too.
//! - Ulysses (tiny-b, 2 heads): 4 ranks = 2 CFG groups x 2 sequence ranks, and 2 ranks at
//!   guidance 1 (one group of 2). The stated bound: **0**, the same bytes. The CPU backend computes
//!   every row and every head on its own, so fewer rows a product or heads an attention change
//!   nothing; on GPUs a product with fewer rows may round otherwise (docs/DEVELOPERS.md). The
//!   measured distance is printed.
//! - Bad values: one line, a non-zero exit, nothing written.

mod common;

use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn moss(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-parallel-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model(name: &str) -> String {
    common::golden().join(name).display().to_string()
}

/// `generate` on `model` with `where_` (`--device cpu` or `--devices ...`) and `extra`: the PNG's
/// bytes, the latents file's bytes and the `--json` report.
fn render(dir: &Path, tag: &str, model: &str, where_: &[&str], extra: &[&str]) -> (Vec<u8>, Vec<u8>, Value) {
    let (png, lat) = (dir.join(format!("{tag}.png")), dir.join(format!("{tag}.safetensors")));
    let mut args = vec!["generate", "--model", model, "-p", "a red fox in the snow", "--negative", "blurry", "--size", "64x96", "--json", "-y"];
    args.extend_from_slice(where_);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-o", png.to_str().unwrap(), "--save-latents", lat.to_str().unwrap()]);
    let (code, out, err) = moss(&args);
    assert_eq!(code, 0, "{tag}: {err}");
    (std::fs::read(&png).unwrap(), std::fs::read(&lat).unwrap(), serde_json::from_str(out.trim()).unwrap())
}

/// The latents' f32 values of a `--save-latents` file.
fn latents(bytes: &[u8]) -> Vec<f32> {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    st.tensor("latents").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn cfg_parallel_on_two_ranks_writes_one_ranks_bytes() {
    let dir = scratch("cfg");
    let m = model("tiny-a");
    for (tag, extra) in [
        ("euler", &["--steps", "4"][..]),
        ("dpm", &["--steps", "4", "--sampler", "dpm++2m", "--seed", "7"][..]),
        ("window", &["--steps", "4", "--guidance-window", "0:0.5", "--skip-window", "0.25:1"][..]),
    ] {
        let (png1, lat1, _) = render(&dir, &format!("{tag}-1"), &m, &["--device", "cpu"], extra);
        let (png2, lat2, rep) = render(&dir, &format!("{tag}-2"), &m, &["--devices", "cpu,cpu"], extra);
        assert_eq!(rep["parallel"]["cfg_groups"], 2, "{tag}: {rep}");
        assert_eq!(rep["parallel"]["seq_ranks"], 1, "{tag}: {rep}");
        assert!(lat1 == lat2, "{tag}: the latents differ from one rank's");
        assert!(png1 == png2, "{tag}: the picture file differs from one rank's");
    }
    // The comparison sees a difference: another seed's latents are not these.
    let (_, other, _) = render(&dir, "seed", &m, &["--devices", "cpu,cpu"], &["--steps", "4", "--seed", "43"]);
    let (_, lat, _) = render(&dir, "euler-again", &m, &["--device", "cpu"], &["--steps", "4"]);
    assert!(other != lat, "the control (another seed) must differ");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ulysses_on_four_and_two_ranks_is_within_the_bound_of_one_rank() {
    let dir = scratch("ulysses");
    let m = model("tiny-b");
    for (tag, devices, guidance, layout) in [("2x2", "cpu,cpu,cpu,cpu", "3", (2, 2)), ("1x2", "cpu,cpu", "1", (1, 2))] {
        let extra = ["--steps", "3", "--guidance", guidance];
        let (png1, lat1, _) = render(&dir, &format!("{tag}-1"), &m, &["--device", "cpu"], &extra);
        let (png4, lat4, rep) = render(&dir, &format!("{tag}-n"), &m, &["--devices", devices], &extra);
        assert_eq!((rep["parallel"]["cfg_groups"].as_u64(), rep["parallel"]["seq_ranks"].as_u64()), (Some(layout.0), Some(layout.1)), "{rep}");
        let (a, b) = (latents(&lat4), latents(&lat1));
        let rel = moss::tensor::rel_l2(&a, &b);
        let max = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        eprintln!("Ulysses {tag} ({devices}) vs one rank: latents rel L2 {rel:e}, max |d| {max:e}");
        // The stated bound: 0 on the CPU (see the file's doc).
        assert!(rel == 0.0 && max == 0.0, "{tag}: rel L2 {rel:e}, max {max:e} above the bound 0");
        assert!(png1 == png4, "{tag}: the picture file differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn batch_over_two_ranks_writes_the_single_ranks_files() {
    let dir = scratch("batch");
    let list = dir.join("list.jsonl");
    std::fs::write(&list, "{\"prompt\": \"a red fox\", \"seed\": 1}\n{\"prompt\": \"a blue boat\", \"seed\": 2, \"guidance\": 1}\n").unwrap();
    let m = model("tiny-a");
    let mut files = vec![];
    for (tag, where_) in [("one", ["--device", "cpu"]), ("two", ["--devices", "cpu,cpu"])] {
        let out = dir.join(tag);
        let args = ["generate", "--model", &m, "--size", "64x64", "--steps", "3", "--prompts", list.to_str().unwrap(), "--quiet"];
        let (code, _, err) = moss(&[&args[..], &where_, &["--out-dir", out.to_str().unwrap(), "--name", "{index}.png"]].concat());
        assert_eq!(code, 0, "{tag}: {err}");
        files.push((0..2).map(|i| std::fs::read(out.join(format!("{i}.png"))).unwrap()).collect::<Vec<_>>());
    }
    assert!(files[0] == files[1], "batch mode over two ranks wrote other bytes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One HTTP/1.1 exchange with the server: the status and the JSON body.
fn post(port: u16, body: &str) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text[9..12].parse().unwrap();
    let at = text.find("\r\n\r\n").unwrap() + 4;
    (status, serde_json::from_str(&text[at..]).unwrap_or(Value::Null))
}

#[test]
fn serve_over_two_ranks_answers_with_generates_bytes() {
    use base64::Engine as _;
    let m = model("tiny-a");
    let mut child = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["serve", "--model", &m, "--devices", "cpu,cpu", "--port", "0"])
        .env_remove("MOSS_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let (mut log, t0) = (String::new(), Instant::now());
    let mut port = 0;
    while !log.contains("ready in") {
        assert!(t0.elapsed() < Duration::from_secs(120), "{log}");
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut err, &mut line).unwrap() == 0 {
            panic!("the server exited:\n{log}");
        }
        if let Some(at) = line.find("listening on http://127.0.0.1:") {
            port = line[at + 30..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap();
            assert!(line.contains("on cpu,cpu"), "{line}");
        }
        log.push_str(&line);
    }
    let body = r#"{"prompt": "a red fox", "negative_prompt": "blurry", "seed": 5, "size": "64x64", "num_inference_steps": 3, "response_format": "b64_json"}"#;
    let (status, v) = post(port, body);
    assert_eq!(status, 200, "{v}");
    let served = base64::engine::general_purpose::STANDARD.decode(v["data"][0]["b64_json"].as_str().unwrap()).unwrap();
    let cached = r#"{"prompt": "a red fox", "size": "64x64", "num_inference_steps": 3, "cache": "fbcache"}"#;
    let (status, v) = post(port, cached);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("one device"), "{v}");
    let _ = child.kill();
    let _ = child.wait();
    let dir = scratch("serve");
    let png = dir.join("ref.png");
    let (code, _, e) = moss(&[
        "generate",
        "--model",
        &m,
        "--device",
        "cpu",
        "-p",
        "a red fox",
        "--negative",
        "blurry",
        "--seed",
        "5",
        "--size",
        "64x64",
        "--steps",
        "3",
        "-q",
        "-o",
        png.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{e}");
    assert!(served == std::fs::read(&png).unwrap(), "the served picture differs from generate's");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `generate` with `extra` over the defaults on `model`: one line naming `needle`, a non-zero
/// exit, nothing written.
fn refuses(tag: &str, model: &str, extra: &[&str], needle: &str) {
    let dir = scratch(tag);
    let out = dir.join("pic.png");
    let mut args = vec!["generate", "--model", model, "-p", "a cat", "--steps", "1", "--size", "64x64", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = moss(&args);
    assert_ne!(code, 0, "{tag}: exit 0; {stderr}");
    let mut lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if code == 2 {
        // clap's usage error: the problem on its first line, then usage and help.
        lines.truncate(1);
    }
    assert_eq!(lines.len(), 1, "{tag}: want one line, got {stderr:?}");
    assert!(lines[0].contains(needle), "{tag}: {:?} does not mention {needle:?}", lines[0]);
    assert!(stdout.is_empty(), "{tag}: {stdout}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{tag}: something was written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_device_lists_are_refused_in_one_line_before_any_work() {
    let (a, b) = (model("tiny-a"), model("tiny-b"));
    refuses("unknown", &a, &["--devices", "cpu,tpu"], "unknown device `tpu`");
    refuses("mixed", &a, &["--devices", "cpu,cuda:0"], "mixed");
    refuses("twice", &a, &["--devices", "cuda:1,cuda:1"], "cuda:1 is given twice");
    refuses("both", &a, &["--devices", "cpu,cpu", "--device", "cpu"], "--device");
    refuses("heads", &a, &["--devices", "cpu,cpu,cpu,cpu"], "1 head(s) do not divide by 2");
    refuses("heads3", &b, &["--devices", "cpu,cpu,cpu"], "2 head(s) do not divide by 3");
    refuses("cache", &a, &["--devices", "cpu,cpu", "--cache", "fbcache"], "one device");
    refuses("empty", &a, &["--devices", ""], "device");
}
