//! Hostile and damaged checkpoints, and non-finite values: a copy of golden/tiny-a is damaged in
//! many ways (config values zero, negative, huge, of the wrong type or missing; safetensors headers;
//! shapes, dtypes, non-finite weights) and `moss generate` must, for each, either render normally
//! or stop with one `moss: error:` line and exit 1: no panic, no signal, memory bounded (4 GiB of
//! address space), a few seconds at most, nothing written, the existing output untouched.

mod common;

use common::golden;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_model(to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    assert!(Command::new("cp").arg("-r").arg(golden().join("tiny-a")).arg(to).status().unwrap().success());
}

/// `moss ARGS` under a 4 GiB address-space limit and a 60 s wall limit.
fn moss_bounded(args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let o = Command::new("prlimit")
        .arg("--as=4294967296")
        .arg("--")
        .arg("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_moss"))
        .args(args)
        .output()
        .expect("prlimit and timeout (util-linux, coreutils)");
    (o, t.elapsed())
}

/// Render with the (damaged) model at `m` into `out`, which holds "keep" before (`--force`: a run
/// allowed to replace it that fails must still leave it).
fn render(m: &Path, out: &Path) -> (Output, Duration) {
    std::fs::write(out, b"keep").unwrap();
    moss_bounded(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "a cat",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--force",
        "--out",
        out.to_str().unwrap(),
    ])
}

/// The outcome is a clean render or one named error; returns the error line (None if rendered).
fn judge(case: &str, o: &Output, took: Duration, out: &Path) -> Option<String> {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(took < Duration::from_secs(30), "{case}: took {took:?}");
    match o.status.code() {
        Some(0) => {
            assert!(std::fs::read(out).unwrap().starts_with(b"\x89PNG"), "{case}: exit 0 without a picture");
            None
        }
        Some(1) => {
            let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("moss: warning:")).collect();
            assert_eq!(lines.len(), 1, "{case}: not one error line:\n{err}");
            assert!(lines[0].starts_with("moss: error: "), "{case}: {err}");
            assert_eq!(std::fs::read(out).unwrap(), b"keep", "{case}: the existing output was replaced");
            Some(lines[0].to_string())
        }
        c => panic!("{case}: exit {c:?} (a panic, a signal or the memory bound?):\n{err}"),
    }
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// (config file, JSON path inside it) of every number the loaders read.
const KEYS: [(&str, &[&str]); 22] = [
    ("transformer/config.json", &["dim"]),
    ("transformer/config.json", &["ffn_dim"]),
    ("transformer/config.json", &["num_heads"]),
    ("transformer/config.json", &["num_layers"]),
    ("transformer/config.json", &["text_dim"]),
    ("transformer/config.json", &["latent_channels"]),
    ("transformer/config.json", &["rope_base"]),
    ("transformer/config.json", &["freq_dim"]),
    ("vae/config.json", &["norm_num_groups"]),
    ("vae/config.json", &["layers_per_block"]),
    ("vae/config.json", &["latent_channels"]),
    ("vae/config.json", &["batch_norm_eps"]),
    ("vae/config.json", &["decoder_block_out_channels"]),
    ("vae/config.json", &["patch_size"]),
    ("scheduler/scheduler_config.json", &["num_train_timesteps"]),
    ("scheduler/scheduler_config.json", &["shift"]),
    ("text_encoder/config.json", &["text_config", "num_hidden_layers"]),
    ("text_encoder/config.json", &["text_config", "hidden_size"]),
    ("text_encoder/config.json", &["text_config", "vocab_size"]),
    ("text_encoder/config.json", &["text_config", "head_dim"]),
    ("text_encoder/config.json", &["text_config", "num_attention_heads"]),
    ("text_encoder/config.json", &["text_config", "rms_norm_eps"]),
];

#[test]
fn damaged_config_values_never_panic() {
    let d = scratch("configs");
    let m = d.join("model");
    let out = d.join("out.png");
    let values: Vec<Option<Value>> = vec![
        Some(json!(0)),
        Some(json!(-1)),
        Some(json!(1.5)),
        Some(json!(2147483648u64)),
        Some(json!(9223372036854775808u64)),
        Some(json!(1e300)),
        Some(json!("x")),
        Some(Value::Null),
        Some(json!([1])),
        None,
    ];
    let mut cases = 0;
    for (file, path) in KEYS {
        for v in &values {
            copy_model(&m);
            edit_json(&m.join(file), |root| {
                let (last, parents) = path.split_last().unwrap();
                let mut o = root;
                for p in parents {
                    o = o.get_mut(*p).unwrap();
                }
                let o = o.as_object_mut().unwrap();
                match v {
                    Some(v) => {
                        o.insert(last.to_string(), v.clone());
                    }
                    None => {
                        o.remove(*last);
                    }
                }
            });
            let case = format!("{file} {} = {v:?}", path.join("."));
            let (o, took) = render(&m, &out);
            judge(&case, &o, took, &out);
            cases += 1;
        }
    }
    println!("{cases} damaged configs, no panic");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The cases the issue names, with the error each must give.
#[test]
fn named_hostile_configs_are_refused_with_their_key() {
    let d = scratch("named");
    let m = d.join("model");
    let out = d.join("out.png");
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("vae/config.json", "norm_num_groups", json!(0), "norm_num_groups"),
        ("scheduler/scheduler_config.json", "num_train_timesteps", json!(9223372036854775808u64), "num_train_timesteps"),
        ("transformer/config.json", "num_layers", json!(2147483648u64), "num_layers"),
        ("vae/config.json", "layers_per_block", json!(2147483648u64), "layers_per_block"),
        ("transformer/config.json", "rope_base", json!(0), "rope_base"),
        ("transformer/config.json", "eps", json!(-1e-6), "eps"),
        ("vae/config.json", "batch_norm_eps", json!(-1), "batch_norm_eps"),
        // Fewer blocks than stored: the extra blocks are not silently ignored.
        ("transformer/config.json", "num_layers", json!(5), "num_layers gives 5 blocks"),
        ("vae/config.json", "layers_per_block", json!(1), "layers_per_block 1"),
    ];
    for (file, key, v, needle) in cases {
        copy_model(&m);
        edit_json(&m.join(file), |o| {
            o.as_object_mut().unwrap().insert(key.into(), v.clone());
        });
        let (o, took) = render(&m, &out);
        let e = judge(&format!("{file} {key}={v}"), &o, took, &out).unwrap_or_else(|| panic!("{key}={v} rendered"));
        assert!(e.contains(needle), "{key}={v}: {e}");
    }
    // A missing size key falls back to the real model's value, and the error says so.
    copy_model(&m);
    edit_json(&m.join("transformer/config.json"), |o| {
        o.as_object_mut().unwrap().remove("dim");
    });
    let (o, took) = render(&m, &out);
    let e = judge("no dim", &o, took, &out).expect("a missing dim rendered");
    assert!(e.contains("leaves out dim (default 3072)"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// (offset of the data, header) of a safetensors file.
fn header(bytes: &[u8]) -> (usize, Value) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (8 + n, serde_json::from_slice(&bytes[8..8 + n]).unwrap())
}

fn with_header(bytes: &[u8], h: &Value) -> Vec<u8> {
    let (start, _) = header(bytes);
    let text = serde_json::to_vec(h).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[start..]);
    out
}

#[test]
fn damaged_safetensors_never_panic() {
    let d = scratch("tensors");
    let m = d.join("model");
    let out = d.join("out.png");
    let shard = "transformer/diffusion_pytorch_model-00001-of-00003.safetensors";
    let vae = "vae/diffusion_pytorch_model.safetensors";
    type Damage = Box<dyn Fn(&[u8]) -> Vec<u8>>;
    let first_tensor = |h: &Value| {
        let o = h.as_object().unwrap();
        o.keys().find(|k| *k != "__metadata__" && o[*k]["shape"].as_array().is_some_and(|s| !s.is_empty())).unwrap().clone()
    };
    let damages: Vec<(&str, Damage)> = vec![
        ("header length u64::MAX", Box::new(|b| [&u64::MAX.to_le_bytes()[..], &b[8..]].concat())),
        ("header length past the end", Box::new(|b| [&(b.len() as u64).to_le_bytes()[..], &b[8..]].concat())),
        ("header length 0", Box::new(|b| [&0u64.to_le_bytes()[..], &b[8..]].concat())),
        ("truncated to 4 bytes", Box::new(|b| b[..4].to_vec())),
        ("truncated to half", Box::new(|b| b[..b.len() / 2].to_vec())),
        ("empty file", Box::new(|_| vec![])),
        (
            "header not JSON",
            Box::new(|b| {
                let (start, _) = header(b);
                let mut o = b.to_vec();
                o[8] = b'!';
                o.truncate(start.max(9));
                o.extend_from_slice(&b[start..]);
                o
            }),
        ),
        (
            "dtype F16",
            Box::new(move |b| {
                let (_, mut h) = header(b);
                let k = first_tensor(&h);
                h[&k]["dtype"] = json!("F16");
                with_header(b, &h)
            }),
        ),
        (
            "dtype I8",
            Box::new(move |b| {
                let (_, mut h) = header(b);
                let k = first_tensor(&h);
                h[&k]["dtype"] = json!("I8");
                with_header(b, &h)
            }),
        ),
        (
            "shape doubled",
            Box::new(move |b| {
                let (_, mut h) = header(b);
                let k = first_tensor(&h);
                let s0 = h[&k]["shape"][0].as_u64().unwrap();
                h[&k]["shape"][0] = json!(s0 * 2);
                with_header(b, &h)
            }),
        ),
        (
            "shape huge",
            Box::new(move |b| {
                let (_, mut h) = header(b);
                let k = first_tensor(&h);
                h[&k]["shape"] = json!([1u64 << 40, 1u64 << 40]);
                with_header(b, &h)
            }),
        ),
        (
            "offsets past the end",
            Box::new(move |b| {
                let (_, mut h) = header(b);
                let k = first_tensor(&h);
                h[&k]["data_offsets"] = json!([0, 1u64 << 40]);
                with_header(b, &h)
            }),
        ),
    ];
    for file in [shard, vae] {
        for (what, damage) in &damages {
            copy_model(&m);
            let p = m.join(file);
            let bytes = std::fs::read(&p).unwrap();
            std::fs::write(&p, damage(&bytes)).unwrap();
            let (o, took) = render(&m, &out);
            let e = judge(&format!("{file}: {what}"), &o, took, &out);
            assert!(e.is_some(), "{file}: {what}: rendered a picture from a damaged file");
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Write `value` (as the tensor's dtype) into element 0 of tensor `name` of the safetensors `file`.
fn poke(file: &Path, name: &str, value: f32) {
    let mut bytes = std::fs::read(file).unwrap();
    let (start, h) = header(&bytes);
    let t = &h[name];
    let at = start + t["data_offsets"][0].as_u64().unwrap() as usize;
    match t["dtype"].as_str().unwrap() {
        "BF16" => bytes[at..at + 2].copy_from_slice(&half::bf16::from_f32(value).to_le_bytes()),
        "F32" => bytes[at..at + 4].copy_from_slice(&value.to_le_bytes()),
        d => panic!("dtype {d}"),
    }
    std::fs::write(file, bytes).unwrap();
}

/// Which shard of `component` holds `name`.
fn shard_of(m: &Path, component: &str, name: &str) -> PathBuf {
    let dir = m.join(component);
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let (_, h) = header(&std::fs::read(&p).unwrap());
            if h.get(name).is_some() {
                return p;
            }
        }
    }
    panic!("no {name} in {}", dir.display())
}

#[test]
fn non_finite_values_never_become_a_picture() {
    let d = scratch("nan");
    let m = d.join("model");
    let out = d.join("out.png");
    let cases = [
        ("transformer", "video_embedder.weight", f32::NAN, "the latents after denoising"),
        ("transformer", "layers.3.proj.q.weight", f32::INFINITY, "the latents after denoising"),
        ("text_encoder", "language_model.norm.weight", f32::NAN, "hidden states"),
        ("vae", "decoder.conv_in.weight", f32::NAN, "the decoded picture"),
        ("vae", "bn.running_var", -5.0, "running_var"),
    ];
    for (comp, name, v, needle) in cases {
        copy_model(&m);
        poke(&shard_of(&m, comp, name), name, v);
        let (o, took) = render(&m, &out);
        let e = judge(&format!("{name} = {v}"), &o, took, &out).unwrap_or_else(|| panic!("{name}={v}: rendered"));
        assert!(e.contains(needle), "{name}={v}: {e}");
        if v.is_nan() || v.is_infinite() {
            // `moss check` finds it too, and names the tensor.
            let (c, _) = moss_bounded(&["check", "--model", m.to_str().unwrap()]);
            let text = String::from_utf8_lossy(&c.stdout);
            assert_eq!(c.status.code(), Some(1), "{name}: check passed:\n{text}");
            assert!(text.contains(name) && text.contains("non-finite"), "{name}: {text}");
        }
    }
    // An embeds file with a NaN.
    copy_model(&m);
    let emb = d.join("e.safetensors");
    let mk = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["encode", "--device", "cpu", "--model", m.to_str().unwrap(), "--prompt", "a cat", "--out"])
        .arg(&emb)
        .output()
        .unwrap();
    assert!(mk.status.success(), "{}", String::from_utf8_lossy(&mk.stderr));
    poke(&emb, "cond", f32::NAN);
    std::fs::write(&out, b"keep").unwrap();
    let (o, took) = moss_bounded(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        m.to_str().unwrap(),
        "--embeds",
        emb.to_str().unwrap(),
        "--steps",
        "1",
        "--size",
        "64x64",
        "--force",
        "--out",
        out.to_str().unwrap(),
    ]);
    let e = judge("embeds NaN", &o, took, &out).expect("rendered from a NaN embeds file");
    assert!(e.contains("non-finite") && e.contains("cond"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
