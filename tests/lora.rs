//! `--lora`: the merged weights against golden/make_lora.py's reference merges (peft
//! `merge_and_unload` for the PEFT adapter, the plain formula for kohya, fused-qkv and LoKr), the
//! 4-step picture with all four merged against the reference pipeline, the metadata entries, the
//! other formats (`.diff`, LoHa) against the formula, the backend's per-tensor merge against the
//! former whole-model host merge byte for byte, and every refusal.

mod common;

use common::{golden, Expected};
use moss::backend::cpu::Cpu;
use moss::backend::Backend;
use moss::lora::keys::{Delta, Factor, Mat};
use moss::lora::LoraSpec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn lora_dir() -> PathBuf {
    golden().join("lora")
}

fn file_of(tag: &str) -> PathBuf {
    match tag {
        "peft" => lora_dir().join("peft/adapter_model.safetensors"),
        t => lora_dir().join(format!("{t}.safetensors")),
    }
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-lora-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The transformer's tensor `name` as the CPU backend loads it with `specs` merged, as f32.
fn merged(specs: &[LoraSpec], name: &str) -> Vec<f32> {
    let mut ck = common::checkpoint("tiny-a");
    ck.attach_loras(specs).unwrap_or_else(|e| panic!("{e:#}"));
    Cpu.load(&ck.open_component("transformer").unwrap(), name).unwrap().data
}

/// `got` (bf16-stored) equals the fp32 reference within bf16 rounding: half an ulp, at most 2^-8 relative.
fn assert_bf16_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(want) {
        let err = (g - w).abs();
        let bound = w.abs() * 2f32.powi(-8) + 1e-7;
        assert!(err <= bound, "{what}: {g} vs reference {w} (more than bf16 rounding)");
        worst = worst.max(err / w.abs().max(1e-6));
    }
    println!("{what}: {} values within bf16 rounding (worst relative {worst:.2e})", got.len());
}

fn rows_8_and_last_8(t: &[f32], rows: usize) -> Vec<f32> {
    let cols = t.len() / rows;
    [&t[..8 * cols], &t[(rows - 8) * cols..]].concat()
}

#[test]
fn merges_equal_the_reference() {
    let e = Expected::load("lora");
    let base = common::checkpoint("tiny-a");
    let plain = base.open_component("transformer").unwrap();
    let mut seen = 0;
    for c in e.json["checks"].as_array().unwrap() {
        let (tag, tensor, key) = (c["lora"].as_str().unwrap(), c["tensor"].as_str().unwrap(), c["key"].as_str().unwrap());
        let scale = e.json["scales"][tag].as_f64().unwrap() as f32;
        let got = merged(&[LoraSpec { path: file_of(tag), scale }], tensor);
        let rows = plain.info(tensor).unwrap().shape[0];
        let got = rows_8_and_last_8(&got, rows);
        let was = rows_8_and_last_8(&plain.f32(tensor).unwrap().1, rows);
        assert_ne!(got, was, "{key}: the LoRA changed nothing");
        assert_bf16_close(key, &got, &e.tensor(key).data);
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} checks in golden/expected/lora.json");
}

#[test]
fn scale_zero_and_untouched_tensors_stay_as_stored() {
    let base = common::checkpoint("tiny-a").open_component("transformer").unwrap();
    let spec = LoraSpec { path: file_of("kohya"), scale: 0.0 };
    assert_eq!(merged(std::slice::from_ref(&spec), "layers.3.proj.q.weight"), base.f32("layers.3.proj.q.weight").unwrap().1);
    let spec1 = LoraSpec { scale: 1.0, ..spec };
    assert_eq!(merged(&[spec1], "layers.5.proj.q.weight"), base.f32("layers.5.proj.q.weight").unwrap().1);
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Write a safetensors file of f32 tensors.
fn write_st(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors.iter().map(|(n, s, d)| (n.to_string(), f32_bytes(d), s.clone())).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        bytes.iter().map(|(n, b, s)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn pattern(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * k).collect()
}

#[test]
fn diff_and_loha_follow_the_formula() {
    let dir = scratch("formula");
    let base = common::checkpoint("tiny-a").open_component("transformer").unwrap();
    let w = base.f32("layers.1.proj.o.weight").unwrap().1;
    let d = 128;
    // full difference, plus a bias difference on a biased layer
    let diff = pattern(d * d, 0.1);
    let db = pattern(d, 0.2);
    let p = dir.join("diff.safetensors");
    write_st(&p, &[("layers.1.proj.o.diff", vec![d, d], diff.clone()), ("text_embedder.proj.diff_b", vec![d], db.clone())]);
    let spec = LoraSpec { path: p, scale: 0.5 };
    let want: Vec<f32> = w.iter().zip(&diff).map(|(w, x)| w + 0.5 * x).collect();
    assert_bf16_close("diff", &merged(std::slice::from_ref(&spec), "layers.1.proj.o.weight"), &want);
    let b = base.f32("text_embedder.proj.bias").unwrap().1;
    let want_b: Vec<f32> = b.iter().zip(&db).map(|(w, x)| w + 0.5 * x).collect();
    assert_bf16_close("diff_b", &merged(&[spec], "text_embedder.proj.bias"), &want_b);

    // LoHa: (w1a w1b) * (w2a w2b) * alpha / r
    let r = 2;
    let (w1a, w1b, w2a, w2b) = (pattern(d * r, 1.0), pattern(r * d, 0.7), pattern(d * r, 0.9), pattern(r * d, 0.6));
    let p = dir.join("loha.safetensors");
    write_st(
        &p,
        &[
            ("lycoris_layers_2_proj_v.hada_w1_a", vec![d, r], w1a.clone()),
            ("lycoris_layers_2_proj_v.hada_w1_b", vec![r, d], w1b.clone()),
            ("lycoris_layers_2_proj_v.hada_w2_a", vec![d, r], w2a.clone()),
            ("lycoris_layers_2_proj_v.hada_w2_b", vec![r, d], w2b.clone()),
            ("lycoris_layers_2_proj_v.alpha", vec![], vec![1.0]),
        ],
    );
    let w = base.f32("layers.2.proj.v.weight").unwrap().1;
    let mut want = w.clone();
    for i in 0..d {
        for j in 0..d {
            let p1: f64 = (0..r).map(|k| w1a[i * r + k] as f64 * w1b[k * d + j] as f64).sum();
            let p2: f64 = (0..r).map(|k| w2a[i * r + k] as f64 * w2b[k * d + j] as f64).sum();
            want[i * d + j] = (w[i * d + j] as f64 + p1 * p2 * 0.5) as f32;
        }
    }
    assert_bf16_close("loha", &merged(&[LoraSpec { path: p, scale: 1.0 }], "layers.2.proj.v.weight"), &want);
}

fn dims(m: &Mat) -> (usize, usize) {
    match m.shape.as_slice() {
        [r, c] | [r, c, 1, 1] => (*r, *c),
        [r] => (*r, 1),
        s => panic!("shape {s:?}"),
    }
}

/// `a · b` as the former host merge computed it: rows of `a` times `b`, k in order, fp32.
fn product(a: &Mat, b: &Mat) -> (usize, Vec<f32>) {
    let ((n, r), (_, m)) = (dims(a), dims(b));
    let (a, b) = (a.values(), b.values());
    let mut out = vec![0f32; n * m];
    for i in 0..n {
        for k in 0..r {
            let s = a[i * r + k];
            if s != 0.0 {
                for j in 0..m {
                    out[i * m + j] += s * b[k * m + j];
                }
            }
        }
    }
    (n, out)
}

/// A module's whole delta, times alpha/rank, as the former host merge formed it.
fn former_delta(d: &Delta) -> Vec<f32> {
    let (mut v, fs) = match d {
        Delta::LowRank { up, down, alpha } => (product(up, down).1, alpha.map_or(1.0, |a| a / dims(down).0 as f32)),
        Delta::LoHa { w1a, w1b, w2a, w2b, alpha } => {
            let (p, q) = (product(w1a, w1b).1, product(w2a, w2b).1);
            (p.iter().zip(&q).map(|(x, y)| x * y).collect(), alpha.map_or(1.0, |a| a / dims(w1b).0 as f32))
        }
        Delta::LoKr { w1, w2, alpha } => {
            let f = |f: &Factor| match f {
                Factor::Full(m) => (dims(m), m.values().into_owned(), None),
                Factor::Product(a, b) => ((dims(a).0, dims(b).1), product(a, b).1, Some(dims(b).0)),
            };
            let (((ar, ac), a, ra), ((br, bc), b, rb)) = (f(w1), f(w2));
            let cols = ac * bc;
            let mut out = vec![0f32; ar * br * cols];
            for i in 0..ar * br {
                for j in 0..cols {
                    out[i * cols + j] = a[(i / br) * ac + j / bc] * b[(i % br) * bc + j % bc];
                }
            }
            (
                out,
                match (alpha, rb.or(ra)) {
                    (Some(al), Some(r)) => al / r as f32,
                    _ => 1.0,
                },
            )
        }
        Delta::Full(m) => (m.values().into_owned(), 1.0),
    };
    if fs != 1.0 {
        v.iter_mut().for_each(|x| *x *= fs);
    }
    v
}

/// The merge as moss did it before it became the backends' per-tensor op (up to commit 4acc57f):
/// a map of fp32 sums for every updated tensor of the model, then `W + sum` rounded to bf16.
fn former_host_merge(ck: &moss::checkpoint::Checkpoint) -> BTreeMap<String, Vec<f32>> {
    let base = ck.open_component("transformer").unwrap();
    let mut sums: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for l in ck.loras.adapters() {
        for m in &l.modules {
            let d = former_delta(&m.delta);
            let mut off = 0;
            for (name, shape) in &m.targets {
                let n: usize = shape.iter().product();
                let acc = sums.entry(name.clone()).or_insert_with(|| vec![0f32; n]);
                acc.iter_mut().zip(&d[off..off + n]).for_each(|(a, &x)| *a += l.spec.scale * x);
                off += n;
            }
        }
    }
    sums.into_iter()
        .map(|(name, d)| {
            let w = base.f32(&name).unwrap().1;
            (name, w.iter().zip(&d).map(|(w, d)| half::bf16::from_f32(w + d).to_f32()).collect())
        })
        .collect()
}

/// Every golden adapter, one twice (two updates of the same tensors add up), a LoHa and full
/// differences: each updated tensor as `Cpu.load` merges it equals the former whole-model merge
/// bit for bit.
#[test]
fn backend_merge_equals_the_former_host_merge() {
    let dir = scratch("former");
    let d = 128;
    let loha = dir.join("loha.safetensors");
    write_st(
        &loha,
        &[
            ("lycoris_layers_2_proj_v.hada_w1_a", vec![d, 3], pattern(d * 3, 1.0)),
            ("lycoris_layers_2_proj_v.hada_w1_b", vec![3, d], pattern(3 * d, 0.7)),
            ("lycoris_layers_2_proj_v.hada_w2_a", vec![d, 3], pattern(d * 3, 0.9)),
            ("lycoris_layers_2_proj_v.hada_w2_b", vec![3, d], pattern(3 * d, 0.6)),
            ("lycoris_layers_2_proj_v.alpha", vec![], vec![1.5]),
        ],
    );
    let diff = dir.join("diff.safetensors");
    write_st(&diff, &[("layers.3.proj.q.diff", vec![d, d], pattern(d * d, 0.01)), ("text_embedder.proj.diff_b", vec![d], pattern(d, 0.2))]);
    let spec = |p: PathBuf, scale: f32| LoraSpec { path: p, scale };
    let specs = [
        spec(file_of("peft"), 0.8),
        spec(file_of("kohya"), 0.7),
        spec(file_of("qkv"), 1.1),
        spec(file_of("lokr"), 1.2),
        spec(file_of("kohya"), -0.3),
        spec(loha, 0.9),
        spec(diff, 0.5),
    ];
    let mut ck = common::checkpoint("tiny-a");
    ck.attach_loras(&specs).unwrap_or_else(|e| panic!("{e:#}"));
    let want = former_host_merge(&ck);
    let comp = ck.open_component("transformer").unwrap();
    let stacked = want.keys().filter(|n| comp.lora_terms(n).len() > 1).count();
    assert!(want.len() >= 12 && stacked >= 3, "{} tensors updated, {stacked} by several adapters", want.len());
    for (name, w) in &want {
        let got = Cpu.load(&comp, name).unwrap().data;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert!(bits(&got) == bits(w), "{name}: the backend's merge differs from the former host merge");
    }
    println!("{} tensors bit-identical ({stacked} with several updates)", want.len());
}

/// Streamed blocks (fetched at each forward) get the same merged weights as resident ones: the
/// transformer's output with the golden LoRAs is the same with no block resident, and differs
/// without the LoRAs.
#[test]
fn streamed_blocks_merge_like_resident_ones() {
    use moss::model::dit::{Dit, MainLinears::Dense};
    use moss::tensor::Tensor;
    let specs: Vec<LoraSpec> = ["peft", "kohya", "qkv", "lokr"].iter().map(|t| LoraSpec { path: file_of(t), scale: 0.9 }).collect();
    let plain = common::checkpoint("tiny-a");
    let mut ck = common::checkpoint("tiny-a");
    ck.attach_loras(&specs).unwrap();
    let ctx = Tensor::new(vec![5, ck.dit.text_dim], pattern(5 * ck.dit.text_dim, 2.0)).unwrap();
    let x = Tensor::new(vec![1, ck.dit.latent_channels, 4, 2], pattern(8 * ck.dit.latent_channels, 3.0)).unwrap();
    let out = |dit: &Dit<Cpu>| {
        let text = dit.refine_text(&Cpu, &ctx).unwrap();
        dit.forward(&Cpu, &x, 0.7, &text, &[]).unwrap().data
    };
    let resident = out(&Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit, Dense).unwrap());
    let streamed = Dit::load_streamed(&Cpu, ck.open_component("transformer").unwrap(), &ck.dit, 0, Dense).unwrap();
    assert_eq!(streamed.resident_blocks(), 0);
    assert!(out(&streamed) == resident, "the streamed blocks' merge differs from the resident one");
    let without = out(&Dit::load(&Cpu, &plain.open_component("transformer").unwrap(), &plain.dit, Dense).unwrap());
    assert!(without != resident, "the LoRAs change nothing");
    assert!(ck.loras.clock.total().tensors > 2 * 9, "streamed blocks merge at each fetch");
}

#[test]
fn lora_spec_parses_path_and_scale() {
    assert_eq!(LoraSpec::parse("a.safetensors").unwrap(), LoraSpec { path: "a.safetensors".into(), scale: 1.0 });
    assert_eq!(LoraSpec::parse("a.safetensors:0.5").unwrap(), LoraSpec { path: "a.safetensors".into(), scale: 0.5 });
    assert_eq!(LoraSpec::parse("C:/x/a.safetensors").unwrap().path, PathBuf::from("C:/x/a.safetensors"));
    assert_eq!(LoraSpec::parse("a:-1").unwrap().scale, -1.0);
    assert!(LoraSpec::parse("a.safetensors:inf").is_err());
    assert!(LoraSpec::parse(":0.5").is_err());
    assert!(LoraSpec::parse("").is_err());
}

fn moss(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap()
}

fn loop_args(e: &Expected, model: &str, out: &Path) -> Vec<String> {
    let g = Expected::load("tiny-a");
    let lp = &e.json["loop"];
    let text = g.json["prompts"].as_array().unwrap().iter().find(|p| p["name"] == lp["prompt"]).unwrap()["text"].as_str().unwrap().to_string();
    let s = |k: &str| lp[k].to_string();
    vec![
        "generate".into(),
        "--device".into(),
        "cpu".into(),
        "--model".into(),
        model.into(),
        "--prompt".into(),
        text,
        "--seed".into(),
        s("seed"),
        "--steps".into(),
        s("steps"),
        "--size".into(),
        format!("{}x{}", s("width"), s("height")),
        "--out".into(),
        out.display().to_string(),
    ]
}

#[test]
fn picture_with_four_loras_matches_the_reference() {
    let e = Expected::load("lora");
    let dir = scratch("picture");
    let model = golden().join("tiny-a");
    let (png, lat) = (dir.join("lora.png"), dir.join("lora.f32"));
    let mut args = loop_args(&e, model.to_str().unwrap(), &png);
    args.extend(["--save-latents".into(), lat.display().to_string()]);
    for l in e.json["loop"]["loras"].as_array().unwrap() {
        args.extend(["--lora".into(), lora_dir().join(l.as_str().unwrap()).display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = moss(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (z, _) = moss::pipeline::read_latents(&lat, 128, None).unwrap();
    let got = z.data;
    // the golden fp32 bound of tests/generate.rs (our encoder's last bits against torch's)
    common::assert_close("latents with 4 LoRAs vs reference", &got, &e.tensor("loop.latents").data, 1e-4);
    let plain = Expected::load("tiny-a").tensor("loop.latents").data;
    let moved = got.iter().zip(&plain).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(moved > 0.1, "the LoRAs barely change the latents ({moved})");
    // The picture's settings name each LoRA (file, scale, short hash), also in the A1111 text.
    let (_, _, _, meta) = moss::png::decode(&std::fs::read(&png).unwrap()).unwrap();
    let p = moss::metadata::Params::from_png(&meta).unwrap();
    let loras: Vec<&str> = p.loras.iter().map(String::as_str).collect();
    assert_eq!(loras.len(), 4, "{:?}", meta.entries);
    assert!(meta.get("parameters").unwrap().contains("Lora hashes: "), "{:?}", meta.get("parameters"));
    assert!(loras[0].starts_with("adapter_model.safetensors:0.8:") && loras[0].len() > 30, "{}", loras[0]);
    assert!(loras[3].starts_with("lokr.safetensors:1.2:"), "{}", loras[3]);
}

/// `--json` reports the merge's time, host and device apart, for one picture and for each
/// picture of a batch (the chunk's load on its first picture): on the CPU all of it is host time;
/// without a LoRA all of it is zero.
#[test]
fn json_reports_the_merge_time() {
    let dir = scratch("json");
    let model = golden().join("tiny-a");
    let m = model.to_str().unwrap();
    let lora = format!("{}:0.7", file_of("kohya").display());
    let merge = |j: &serde_json::Value| -> [f64; 3] {
        ["lora_merge_s", "lora_merge_host_s", "lora_merge_device_s"].map(|k| j["timings"][k].as_f64().unwrap_or_else(|| panic!("{j} lacks timings.{k}")))
    };
    let lines = |out: std::process::Output| -> Vec<serde_json::Value> {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let one = ["generate", "--device", "cpu", "--model", m, "--prompt", "a cat", "--steps", "1", "--size", "64x64", "--json", "-y"];
    let png = dir.join("a.png");
    let png = png.to_str().unwrap();
    let j = &lines(moss(&[&one[..], &["--out", png, "--lora", &lora]].concat()))[0];
    let [all, host, device] = merge(j);
    assert!(host > 0.0 && device == 0.0 && all == host, "{j}");
    assert!(j["timings"]["lora_read_s"].as_f64().unwrap() > 0.0, "{j}");
    let j = &lines(moss(&[&one[..], &["--out", png]].concat()))[0];
    assert_eq!(merge(j), [0.0; 3], "{j}");

    // A batch of three in one chunk: the load's merges on the first line, none on the others.
    let list = dir.join("list.txt");
    std::fs::write(&list, "a cat\na dog\na fox\n").unwrap();
    let batch = ["generate", "--device", "cpu", "--model", m, "--steps", "1", "--size", "64x64", "--json", "--chunk", "3"];
    let out = dir.join("out");
    let args = [&batch[..], &["--prompts", list.to_str().unwrap(), "--out-dir", out.to_str().unwrap(), "--lora", &lora]].concat();
    let js = lines(moss(&args));
    assert_eq!(js.len(), 3);
    let [all, host, device] = merge(&js[0]);
    assert!(host > 0.0 && device == 0.0 && all == host, "{}", js[0]);
    for j in &js[1..] {
        assert_eq!(merge(j), [0.0; 3], "{j}: a resident transformer merges once a chunk");
    }
}

/// `moss generate --lora FILE` fails before any work with one line containing `want`, writing nothing.
fn refused(tag: &str, lora: &Path, want: &str) {
    let dir = scratch(tag);
    let png = dir.join("x.png");
    let model = golden().join("tiny-a");
    let out = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "a cat",
        "--steps",
        "1",
        "--size",
        "64x64",
        "--out",
        png.to_str().unwrap(),
        "--lora",
        lora.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{tag}: accepted");
    assert!(err.starts_with("moss: error: ") && err.trim_end().lines().count() == 1, "{tag}: {err:?}");
    assert!(err.contains(want), "{tag}: {err:?} lacks {want:?}");
    assert!(!err.contains("panicked"), "{tag}: {err}");
    assert!(!png.exists(), "{tag}: wrote a picture");
    println!("{tag}: {}", err.trim_end());
}

#[test]
fn refusals() {
    let dir = scratch("refusals");
    let d = 128;
    refused("missing", &dir.join("nope.safetensors"), "cannot read LoRA");
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"not a safetensors file at all").unwrap();
    refused("unreadable", &junk, "not a readable safetensors file");

    let p = dir.join("unmapped.safetensors");
    write_st(&p, &[("layers.99.proj.q.lora_A.weight", vec![2, d], pattern(2 * d, 1.0)), ("layers.99.proj.q.lora_B.weight", vec![d, 2], pattern(2 * d, 1.0))]);
    refused("unmapped", &p, "map onto no transformer tensor: `layers.99.proj.q`; the model has e.g.");

    let p = dir.join("shape.safetensors");
    write_st(
        &p,
        &[
            ("layers.0.proj.q.lora_down.weight", vec![2, d], pattern(2 * d, 1.0)),
            ("layers.0.proj.q.lora_up.weight", vec![d + 16, 2], pattern(2 * (d + 16), 1.0)),
        ],
    );
    refused("shape", &p, "shape does not fit");

    let p = dir.join("sdxl.safetensors");
    write_st(
        &p,
        &[
            ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight", vec![2, 8], pattern(16, 1.0)),
            ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight", vec![8, 2], pattern(16, 1.0)),
        ],
    );
    refused("sdxl", &p, "another model family");
    let p = dir.join("flux.safetensors");
    write_st(&p, &[("diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight", vec![2, 8], pattern(16, 1.0))]);
    refused("flux", &p, "another model family");

    let p = dir.join("te.safetensors");
    write_st(
        &p,
        &[
            ("layers.0.proj.q.lora_down.weight", vec![2, d], pattern(2 * d, 1.0)),
            ("layers.0.proj.q.lora_up.weight", vec![d, 2], pattern(2 * d, 1.0)),
            ("lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", vec![2, 8], pattern(16, 1.0)),
        ],
    );
    refused("text encoder", &p, "touches the text encoder (key `lora_te_text_model_encoder_layers_0_mlp_fc1");

    let p = dir.join("unknown.safetensors");
    write_st(&p, &[("layers.0.proj.q.something", vec![2], vec![1.0, 2.0])]);
    refused("unknown", &p, "no known LoRA format: `layers.0.proj.q.something`");

    let out = moss(&["generate", "--device", "cpu", "--prompt", "x", "--lora", "a.safetensors:nan"]);
    assert!(!out.status.success());
}
