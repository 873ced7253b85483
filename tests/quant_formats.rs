//! The files people download: GGUF DiTs and ComfyUI comfy_quant safetensors, read by moss and
//! dequantized to the numbers the formats' own projects give (golden/make_quant.py: the `gguf`
//! package's `quants.dequantize`, convert-to-quant's `TensorWiseINT8Layout.dequantize` and
//! `build_hadamard`), bit for bit; a golden render from each file on the CPU against dit_ref run
//! with those dequantized weights; and what moss cannot read refused in one line.

mod common;

use common::golden;
use moss::checkpoint::{gguf, single_file, Dtype, TensorStore};
use moss::tensor::rel_l2;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The checksum make_quant.py records: Σ bits(v[i]) · (2i + 1) mod 2^64.
fn checksum(v: &[f32]) -> String {
    let s = v.iter().enumerate().fold(0u64, |acc, (i, x)| acc.wrapping_add((x.to_bits() as u64).wrapping_mul(2 * i as u64 + 1)));
    format!("{s:016x}")
}

fn quant_json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(golden().join("expected/quant.json")).unwrap()).unwrap()
}

fn expected_values() -> TensorStore {
    TensorStore::open_file(&golden().join("expected/quant.safetensors")).unwrap()
}

/// Every tensor moss maps out of `store` against the project's dequantization of `file`: the same
/// names, shapes and values bit for bit.
fn same_as_reference(file: &str, store: &TensorStore) {
    let want = &quant_json()["files"][file];
    let want = want.as_object().unwrap_or_else(|| panic!("no {file} in quant.json"));
    let names: Vec<&String> = store.tensors.keys().filter(|k| !k.ends_with(".comfy_quant") && !k.ends_with(".weight_scale")).collect();
    assert_eq!(names.len(), want.len(), "{file}: moss maps {} tensors, the reference {}", names.len(), want.len());
    for (name, w) in want {
        let info = store.get(name).unwrap_or_else(|| panic!("{file}: moss has no `{name}`"));
        let shape: Vec<usize> = w["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(info.shape, shape, "{file}: `{name}`");
        let v = store.values(info).unwrap();
        let first: Vec<f32> = w["first"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(&v[..first.len()], &first[..], "{file}: `{name}` first values");
        assert_eq!(checksum(&v), w["checksum"].as_str().unwrap(), "{file}: `{name}` ({}) differs from the reference", info.dtype.name());
    }
}

#[test]
fn every_ggml_block_type_dequantizes_as_gguf_does() {
    let store = gguf::open(&golden().join("quant/blocks.gguf")).unwrap();
    assert_eq!(store.format, "GGUF (general.architecture moss_blocks)");
    let want = expected_values();
    let mut seen = vec![];
    for (name, info) in &store.tensors {
        let v = store.values(info).unwrap();
        let (_, w) = want.to_f32(name).unwrap();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&v), bits(&w), "`{name}` ({})", info.dtype.name());
        seen.push(info.dtype.name());
    }
    seen.sort();
    assert_eq!(seen, ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "bf16", "f16", "f32"]);
}

#[test]
fn gguf_dits_map_to_moss_names_and_dequantize_as_gguf_does() {
    for file in ["tiny-b-mixed.gguf", "tiny-a-Q4_0.gguf"] {
        let store = single_file::open(&golden().join("quant").join(file), "transformer").unwrap();
        same_as_reference(file, &store);
    }
}

#[test]
fn comfy_quant_files_dequantize_as_convert_to_quant_does() {
    let int8 = single_file::open(&golden().join("quant/tiny-b-int8.safetensors"), "transformer").unwrap();
    assert_eq!(int8.format, "comfy_quant safetensors (int8_tensorwise)");
    same_as_reference("tiny-b-int8.safetensors", &int8);
    let rot = single_file::open(&golden().join("quant/tiny-a-int8-convrot.safetensors"), "transformer").unwrap();
    assert_eq!(rot.format, "comfy_quant safetensors (int8_tensorwise + ConvRot, int8_tensorwise)");
    let q = rot.get("layers.0.proj.q.weight").unwrap();
    assert_eq!((q.dtype, q.row_scales.as_ref().unwrap().convrot), (Dtype::I8, Some(64)));
    same_as_reference("tiny-a-int8-convrot.safetensors", &rot);
}

/// The control of the ConvRot check: the codes times their scales without the rotation turned back
/// are far from what convert-to-quant's weights are.
#[test]
fn convrot_without_the_rotation_is_not_the_weight() {
    let mut rot = single_file::open(&golden().join("quant/tiny-a-int8-convrot.safetensors"), "transformer").unwrap();
    let info = rot.tensors.get_mut("layers.0.proj.q.weight").unwrap();
    info.row_scales.as_mut().unwrap().convrot = None;
    let unturned = rot.values(rot.get("layers.0.proj.q.weight").unwrap()).unwrap();
    let w = &quant_json()["files"]["tiny-a-int8-convrot.safetensors"]["layers.0.proj.q.weight"];
    assert_ne!(checksum(&unturned), w["checksum"].as_str().unwrap());
}

fn moss(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap()
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-quant-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The golden loop (fp32, 4 steps) with `--transformer file`, its latents.
fn loop_latents(ckpt: &str, transformer: &Path, dir: &Path) -> Vec<f32> {
    let e = common::Expected::load(ckpt);
    let lp = &e.json["loop"];
    let size = format!("{}x{}", lp["width"], lp["height"]);
    let (seed, steps) = (lp["seed"].to_string(), lp["steps"].to_string());
    let (pic, lat) = (dir.join("pic.png"), dir.join("pic.latents"));
    let model = golden().join(ckpt);
    let o = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        model.to_str().unwrap(),
        "--transformer",
        transformer.to_str().unwrap(),
        "--prompt",
        &e.loop_prompt(),
        "--seed",
        &seed,
        "--steps",
        &steps,
        "--size",
        &size,
        "--precision",
        "fp32",
        "--out",
        pic.to_str().unwrap(),
        "--save-latents",
        lat.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "moss generate --transformer {}: {}", transformer.display(), String::from_utf8_lossy(&o.stderr));
    moss::pipeline::read_latents(&lat, 128, None).unwrap().0.data
}

/// A whole render from each file: the latents of dit_ref run with the reference's dequantized weights
/// (the bound of tests/fp32.rs), and farther than that from the bf16 folder's own fp32 loop (the
/// file's weights are what ran).
#[test]
fn renders_from_single_files_match_the_reference() {
    let want = expected_values();
    let folder = TensorStore::open_file(&golden().join("expected/fp32.safetensors")).unwrap();
    for (file, m) in quant_json()["models"].as_object().unwrap() {
        let ckpt = m["checkpoint"].as_str().unwrap();
        let dir = scratch(ckpt);
        let got = loop_latents(ckpt, &golden().join("quant").join(file), &dir);
        let (_, reference) = want.to_f32(m["latents"].as_str().unwrap()).unwrap();
        let (_, bf16) = folder.to_f32(&format!("{ckpt}.loop.latents")).unwrap();
        let (e, control) = (rel_l2(&got, &reference), rel_l2(&got, &bf16));
        println!("{file}: {e:.3e} from the reference loop, {control:.3e} from the bf16 folder's");
        assert!(e < 1e-5, "{file}: the render is {e:.3e} from the reference");
        assert!(control > 5e-5, "{file}: the render is as close to the bf16 folder's ({control:.3e}): the file's weights did not run");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn what_moss_cannot_read_is_refused_in_one_line() {
    let dir = scratch("refuse");
    // a GGUF holding a type moss does not read: the blocks file with one type id rewritten (Q2_K)
    let mut bytes = std::fs::read(golden().join("quant/blocks.gguf")).unwrap();
    let name = b"blocks.Q4_0";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * dims;
    assert_eq!(u32::from_le_bytes(bytes[ty..ty + 4].try_into().unwrap()), 2, "Q4_0's id");
    bytes[ty..ty + 4].copy_from_slice(&10u32.to_le_bytes());
    let bad = dir.join("q2k.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let err = format!("{:#}", gguf::open(&bad).err().expect("refused"));
    assert!(err.contains("`blocks.Q4_0`") && err.contains("Q2_K"), "{err}");
    // a truncated file
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert!(gguf::open(&cut).is_err());
    // through the binary: one line, exit 1, nothing written
    let out = dir.join("x.png");
    let model = golden().join("tiny-b");
    let refused = |flag: &str, file: &Path| -> String {
        let (m, f, o) = (model.to_str().unwrap(), file.to_str().unwrap(), out.to_str().unwrap());
        let r = moss(&["generate", "--device", "cpu", "--model", m, flag, f, "--prompt", "x", "--steps", "1", "--size", "64x64", "--out", o]);
        let err = String::from_utf8_lossy(&r.stderr).into_owned();
        assert_eq!((r.status.code(), err.lines().count()), (Some(1), 1), "{err}");
        assert!(!out.exists());
        err
    };
    let err = refused("--transformer", &bad);
    assert!(err.contains("blocks.Q4_0") && err.contains("Q2_K"), "{err}");
    // a GGUF text encoder (llama.cpp's names) is refused, naming the file's kind
    let err = refused("--text-encoder", &golden().join("quant/blocks.gguf"));
    assert!(err.contains("GGUF text encoder"), "{err}");
    // the wrong model's file: a shape the config does not imply, named
    let err = refused("--transformer", &golden().join("quant/tiny-a-Q4_0.gguf"));
    assert!(err.contains("shape"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `moss quantize`'s own files load back through `--transformer`'s reader near the folder's values
/// (ComfyUI's fused q|k|v split again); a checkpoint file as the output is refused, left as it was.
#[test]
fn moss_quantize_files_load_back() {
    let dir = scratch("own");
    let model = golden().join("tiny-b");
    let folder = common::checkpoint("tiny-b").open_component("transformer").unwrap();
    for (to, bound) in [("q8_0", 1e-2), ("q4_k", 0.1), ("q6_k", 0.03), ("int8", 1e-2), ("int8-convrot", 1e-2)] {
        let out = dir.join(format!("t.{to}"));
        let o = moss(&["quantize", "--model", model.to_str().unwrap(), "--to", to, "-o", out.to_str().unwrap(), "--quiet"]);
        assert!(o.status.success(), "{to}: {}", String::from_utf8_lossy(&o.stderr));
        let store = single_file::open(&out, "transformer").unwrap();
        for (name, info) in &folder.store.tensors {
            let got = store.values(store.get(name).unwrap_or_else(|| panic!("{to}: no `{name}`"))).unwrap();
            let want = folder.store.values(info).unwrap();
            let e = rel_l2(&got, &want);
            assert!(e < bound, "{to}: `{name}` is {e:.3e} from the folder's");
        }
    }
    let weights = model.join("transformer/diffusion_pytorch_model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let o = moss(&["quantize", "--model", model.to_str().unwrap(), "--to", "q8_0", "-o", weights.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&weights).unwrap() == before, "the checkpoint's file was changed");
    let o = moss(&["quantize", "--model", model.to_str().unwrap(), "--to", "q3_k", "-o", dir.join("y").to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("q3_k"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--text-encoder FILE`: the folder's shards as one bf16 file give the folder's picture byte for
/// byte; `moss quantize --component text-encoder --to int8`'s file gives latents near it, not equal
/// (the int8 weights ran), together with a GGUF transformer.
#[test]
fn text_encoder_single_files() {
    let dir = scratch("te");
    let model = golden().join("tiny-a");
    let store = TensorStore::open(&model.join("text_encoder")).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView)> = store
        .tensors
        .iter()
        .map(|(n, i)| (n.clone(), safetensors::tensor::TensorView::new(common::folders::st_dtype(i.dtype), i.shape.clone(), store.bytes(i)).unwrap()))
        .collect();
    let one = dir.join("te-bf16.safetensors");
    std::fs::write(&one, safetensors::serialize(views, None).unwrap()).unwrap();
    let int8 = dir.join("te-int8.safetensors");
    let o = moss(&["quantize", "--model", model.to_str().unwrap(), "--component", "text-encoder", "--to", "int8", "-o", int8.to_str().unwrap(), "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = |extra: &[&str], tag: &str| common::render_fox(&model, &dir, tag, extra);
    let (folder_pic, folder_lat) = run(&[], "folder");
    let (one_pic, _) = run(&["--text-encoder", one.to_str().unwrap()], "one");
    assert!(one_pic == folder_pic, "the folder's text encoder as one file gives another picture");
    let gguf = golden().join("quant/tiny-a-Q4_0.gguf");
    let (_, q_lat) = run(&["--text-encoder", int8.to_str().unwrap(), "--transformer", gguf.to_str().unwrap()], "int8");
    let (_, g_lat) = run(&["--transformer", gguf.to_str().unwrap()], "gguf");
    let e = rel_l2(&q_lat, &g_lat);
    println!("int8 text encoder: latents {e:.3e} from the bf16 encoder's (Q4_0 transformer both); Q4_0 vs folder {:.3e}", rel_l2(&g_lat, &folder_lat));
    // each int8 matrix is within 0.7 % of the folder's (rel L2); the tiny random encoder and 2
    // steps carry that to ~9e-2 in the latents (the Q4_0 transformer alone moves them 3.8e-1)
    assert!(e > 0.0 && e < 0.3, "int8 text encoder: {e:.3e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `moss check` names each single-file component's format and scans it.
#[test]
fn check_reports_single_file_formats() {
    let model = golden().join("tiny-b");
    let gguf = golden().join("quant/tiny-b-mixed.gguf");
    let o = moss(&["check", "--model", model.to_str().unwrap(), "--transformer", gguf.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let row = out.lines().find(|l| l.starts_with("transformer")).unwrap();
    assert!(row.contains("GGUF (general.architecture moss_image)") && row.contains("Q4_K") && row.ends_with("ok"), "{row}");
    // what the GPU keeps as stored: every quantized matrix of the file, in its stored bytes
    let file = single_file::open(&gguf, "transformer").unwrap();
    let quantized = file.tensors.values().filter(|t| t.dtype.is_block_or_int8()).count();
    assert!(quantized > 0 && row.contains(&format!("on the GPU {quantized} matrices kept as stored")), "{quantized}: {row}");
}
