//! W4A8 text encoders (comfy-kitchen's `asym_w4a8_int8`, what Comfy-Org ships for MOSS-Image):
//! golden/make_w4a8.py's files, written by comfy-kitchen 0.2.40 itself, read by moss to the numbers
//! comfy-kitchen reads out of them (the int8 grid bit for bit, the weights bit for bit against the
//! grid turned back exactly, and within f32 rounding of comfy-kitchen's own f32 dequantize); a render
//! with the W4A8 text encoder; malformed files refused in one line.

mod common;

use common::golden;
use moss::checkpoint::{comfy_quant, kept, single_file, Dtype, TensorStore};
use moss::tensor::rel_l2;
use std::path::{Path, PathBuf};
use std::process::Command;

/// make_quant.py's checksum: Σ bits(v[i]) · (2i + 1) mod 2^64.
fn checksum(v: &[f32]) -> String {
    let s = v.iter().enumerate().fold(0u64, |acc, (i, x)| acc.wrapping_add((x.to_bits() as u64).wrapping_mul(2 * i as u64 + 1)));
    format!("{s:016x}")
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(golden().join("expected/w4a8.json")).unwrap()).unwrap()
}

fn open(file: &str) -> TensorStore {
    let mut s = TensorStore::open_file(&golden().join("quant").join(file)).unwrap();
    comfy_quant::resolve(&mut s).unwrap();
    s
}

/// Every quantized tensor of both files: the grid and the values as comfy-kitchen's, every
/// variant seen; the side tensors gone from the list, the weights of logical shape.
#[test]
fn w4a8_files_dequantize_as_comfy_kitchen_does() {
    let want = expected();
    let own = TensorStore::open_file(&golden().join("expected/w4a8.safetensors")).unwrap();
    let mut variants = std::collections::BTreeSet::new();
    let mut compared = 0;
    for file in ["tiny-a-te-w4a8.safetensors", "w4a8-asym.safetensors"] {
        let store = open(file);
        assert!(
            store.tensors.keys().all(|k| !k.contains(".weight_s_") && !k.ends_with("_codebook") && !k.ends_with("_correction")),
            "{file}: side tensors left"
        );
        let layers = want["files"][file].as_object().unwrap();
        assert_eq!(store.tensors.values().filter(|t| matches!(t.dtype, Dtype::W4a8 { .. })).count(), layers.len(), "{file}");
        for (name, w) in layers {
            let info = store.get(name).unwrap_or_else(|| panic!("{file}: no `{name}`"));
            let shape: Vec<usize> = w["values"]["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            assert_eq!(info.shape, shape, "{file}: `{name}`");
            let grid: Vec<f32> = comfy_quant::w4a8_grid_of(&store, info).unwrap().iter().map(|&q| q as f32).collect();
            assert_eq!(checksum(&grid), w["grid"].as_str().unwrap(), "{file}: `{name}`'s int8 grid ({})", w["variant"]);
            let v = store.values(info).unwrap();
            assert_eq!(checksum(&v), w["values"]["checksum"].as_str().unwrap(), "{file}: `{name}` ({}) differs from the reference", w["variant"]);
            if let Some(o) = own.get(&format!("{file}:{name}")) {
                let e = rel_l2(&v, &own.values(o).unwrap());
                assert!(e < 1e-6, "{file}: `{name}` is {e:.2e} from comfy-kitchen's f32 dequantize");
                compared += 1;
            }
            variants.insert(w["variant"].as_str().unwrap().to_string());
        }
    }
    assert!(compared >= 6, "{compared}");
    assert_eq!(variants.len(), 5, "{variants:?}");
}

/// What the CUDA backend keeps: every symmetric layer as a W4A8 part of its stored bytes, packed by
/// the loader's own copies (`Layout::of`, `Layout::pieces`) into bytes that decode
/// (`Layout::dequantize`, the kernels' twin) to the store's values bit for bit; the asymmetric ones
/// refused in one line naming the tensor (the CPU runs them).
#[test]
fn the_gpu_keeps_symmetric_w4a8_and_refuses_the_correction() {
    let loc = moss::checkpoint::locate(golden().join("tiny-a").to_str().unwrap()).unwrap();
    let files = moss::checkpoint::ComponentFiles { transformer: None, text_encoder: Some(golden().join("quant/tiny-a-te-w4a8.safetensors")) };
    let c = moss::checkpoint::Checkpoint::open_with(loc, files).unwrap().open_component("text_encoder").unwrap();
    let mut kept = 0;
    // the text model's tensors (the file holds the vision tower's beside them)
    let model = c.store.tensors.iter().filter_map(|(k, t)| Some((k, k.strip_prefix(&c.prefix)?, t)));
    for (full, name, t) in model.filter(|(_, _, t)| matches!(t.dtype, Dtype::W4a8 { .. })) {
        assert_eq!(kept::gpu_refusal(full, t), None);
        let layout = kept::Layout::of(&c, &[name]).unwrap().unwrap_or_else(|| panic!("`{full}` not kept"));
        assert!(matches!(layout.parts[0].format, kept::Format::W4a8 { group: 16, convrot: 64, .. }), "{full}: {layout:?}");
        let mut b = vec![0u8; layout.bytes];
        for (src, at) in layout.pieces(&c, &[t]).unwrap() {
            b[at..at + src.len()].copy_from_slice(src);
        }
        let bits_of = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits_of(layout.dequantize(&b).unwrap()), bits_of(c.store.values(t).unwrap()), "{full}");
        kept += 1;
    }
    assert!(kept > 40, "{kept}");
    let asym = open("w4a8-asym.safetensors");
    let (name, t) = asym.tensors.iter().find(|(_, t)| matches!(t.dtype, Dtype::W4a8 { .. })).unwrap();
    let e = kept::gpu_refusal(name, t).expect("refused");
    assert!(e.contains(name) && e.contains("asymmetric w4a8") && e.contains("--device cpu"), "{e}");
}

fn moss(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap()
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-w4a8-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `moss generate` on the CPU at 64x64, one step, with the text encoder file `te`, to `pic`.
fn generate_with(model: &Path, te: &Path, pic: &Path, extra: &[&str]) -> std::process::Output {
    let (m, t, p) = (model.to_str().unwrap(), te.to_str().unwrap(), pic.to_str().unwrap());
    moss(
        &[
            &["generate", "--device", "cpu", "--model", m, "--text-encoder", t, "--prompt", "a red fox", "--steps", "1", "--size", "64x64", "--out", p][..],
            extra,
        ]
        .concat(),
    )
}

/// `--text-encoder` a W4A8 file: a render near the bf16 encoder's (not equal: the 4- and 6-bit
/// weights ran), `moss check` naming the format; a copy with a side tensor cut refused in one line,
/// nothing written.
#[test]
fn renders_with_a_w4a8_text_encoder() {
    let dir = scratch("render");
    let model = golden().join("tiny-a");
    let te = golden().join("quant/tiny-a-te-w4a8.safetensors");
    let run = |extra: &[&str], tag: &str| common::render_fox(&model, &dir, tag, extra).1;
    let folder = run(&[], "folder");
    let w4a8 = run(&["--text-encoder", te.to_str().unwrap()], "w4a8");
    let e = rel_l2(&w4a8, &folder);
    println!("W4A8 text encoder: latents {e:.3e} from the bf16 encoder's");
    // 4- and 6-bit weights (each matrix ~5-10 % from the folder's) through the tiny random
    // encoder and 2 steps: far from the folder's, not equal
    assert!(e > 0.0 && e < 1.0, "{e:.3e}");
    // the same weights (comfy-kitchen's values, tested above) stored as f32: the same latents
    let store = single_file::open(&te, "text_encoder").unwrap();
    let values: Vec<(String, Vec<usize>, Vec<u8>)> = store
        .tensors
        .iter()
        .filter(|(n, _)| !n.ends_with(".comfy_quant"))
        .map(|(n, i)| (n.clone(), i.shape.clone(), common::folders::f32_bytes(&store.values(i).unwrap())))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        values.iter().map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())).collect();
    let f32_file = dir.join("te-f32.safetensors");
    std::fs::write(&f32_file, safetensors::serialize(views, None).unwrap()).unwrap();
    let dense = run(&["--text-encoder", f32_file.to_str().unwrap()], "dense");
    assert!(dense == w4a8, "the W4A8 file and its dequantized weights as f32 give other latents");
    let o = moss(&["check", "--model", model.to_str().unwrap(), "--text-encoder", te.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let row = out.lines().find(|l| l.starts_with("text_encoder")).unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("asym_w4a8_int8") && row.ends_with("ok"), "{row}");
    // a file whose group scales were cut short: one line, exit 1, nothing written
    let bad = cut_side_tensor(&te, &dir.join("bad.safetensors"));
    let out = dir.join("x.png");
    let r = generate_with(&model, &bad, &out, &[]);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert_eq!((r.status.code(), err.lines().count()), (Some(1), 1), "{err}");
    assert!(err.contains("weight_s_rel") && !out.exists(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `src` with the first `.weight_s_rel` it holds given one column fewer.
fn cut_side_tensor(src: &Path, to: &Path) -> PathBuf {
    let store = TensorStore::open_file(src).unwrap();
    let victim = store.tensors.iter().find(|(k, t)| k.ends_with(".weight_s_rel") && t.dtype == Dtype::F8E4M3).unwrap().0.clone();
    let v = &store.tensors[&victim];
    let (rows, cols) = (v.shape[0], v.shape[1]);
    let cut: Vec<u8> = (0..rows).flat_map(|r| store.bytes(v)[r * cols..r * cols + cols - 1].to_vec()).collect();
    let mut views = vec![];
    for (n, i) in &store.tensors {
        let (shape, bytes) = if *n == victim { (vec![rows, cols - 1], &cut[..]) } else { (i.shape.clone(), store.bytes(i)) };
        views.push((n.clone(), safetensors::tensor::TensorView::new(common::folders::st_dtype(i.dtype), shape, bytes).unwrap()));
    }
    std::fs::write(to, safetensors::serialize(views, None).unwrap()).unwrap();
    let _ = single_file::open(to, "text_encoder").err().expect("refused");
    to.to_path_buf()
}

/// `moss quantize --component text-encoder --to w4a8 | w6a8`: the file reads back (moss's reader,
/// comfy-kitchen's layout) near the folder's weights, every quantizable matrix W4A8, and renders.
#[test]
fn moss_quantize_writes_w4a8() {
    let dir = scratch("own");
    let model = golden().join("tiny-a");
    let folder = TensorStore::open(&model.join("text_encoder")).unwrap();
    for (to, bits, bound) in [("w4a8", 4u8, 0.12), ("w6a8", 6, 0.03)] {
        let out = dir.join(format!("te.{to}.safetensors"));
        let o = moss(&["quantize", "--model", model.to_str().unwrap(), "--component", "text-encoder", "--to", to, "-o", out.to_str().unwrap(), "--quiet"]);
        assert!(o.status.success(), "{to}: {}", String::from_utf8_lossy(&o.stderr));
        let store = single_file::open(&out, "text_encoder").unwrap();
        let mut quantized = 0;
        for (name, info) in &folder.tensors {
            let got = store.get(name).unwrap_or_else(|| panic!("{to}: no `{name}`"));
            let want = folder.values(info).unwrap();
            let e = rel_l2(&store.values(got).unwrap(), &want);
            if got.dtype == (Dtype::W4a8 { bits }) {
                quantized += 1;
                assert!(e > 0.0 && e < bound, "{to}: `{name}` is {e:.3e} from the folder's");
            } else {
                assert!(e < 4e-3, "{to}: `{name}` ({}) is {e:.3e} from the folder's", got.dtype.name());
            }
        }
        let expected = folder.tensors.iter().filter(|(n, i)| moss::checkpoint::w4a8_quantize::quantizable(n, &i.shape, bits)).count();
        assert!(quantized == expected && quantized > 40, "{to}: {quantized} of {expected}");
        let pic = dir.join(format!("{to}.png"));
        let o = generate_with(&model, &out, &pic, &["--quiet"]);
        assert!(o.status.success() && pic.exists(), "{to}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A W4A8 file with a NaN group scale: `moss check` fails naming the scale tensor; generate refuses
/// in one line, nothing written.
#[test]
fn a_nan_group_scale_is_caught() {
    let dir = scratch("nan");
    let src = golden().join("quant/tiny-a-te-w4a8.safetensors");
    let store = TensorStore::open_file(&src).unwrap();
    let (name, t) = store.tensors.iter().find(|(k, t)| k.ends_with(".weight_s_rel") && t.dtype == Dtype::F8E4M3).unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[t.start + 3] = 0x7f; // e4m3's NaN
    let bad = dir.join("nan.safetensors");
    std::fs::write(&bad, &bytes).unwrap();
    let model = golden().join("tiny-a");
    let o = moss(&["check", "--model", model.to_str().unwrap(), "--text-encoder", bad.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success() && out.lines().any(|l| l.starts_with("text_encoder") && l.contains(name.as_str()) && l.contains("NaN")), "{out}");
    let pic = dir.join("x.png");
    let r = generate_with(&model, &bad, &pic, &[]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.code() == Some(1) && err.lines().count() == 1 && err.contains(name.as_str()) && !pic.exists(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Group scales stored as raw U8 bytes (older tools' files, which ComfyUI views back as e4m3) read
/// as the e4m3 ones: the same values.
#[test]
fn group_scales_stored_as_u8_read_as_e4m3() {
    let dir = scratch("u8");
    let src = golden().join("quant/tiny-a-te-w4a8.safetensors");
    let store = TensorStore::open_file(&src).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView)> = store
        .tensors
        .iter()
        .map(|(n, i)| {
            let d = if i.dtype == Dtype::F8E4M3 { safetensors::Dtype::U8 } else { common::folders::st_dtype(i.dtype) };
            (n.clone(), safetensors::tensor::TensorView::new(d, i.shape.clone(), store.bytes(i)).unwrap())
        })
        .collect();
    let u8_file = dir.join("u8.safetensors");
    std::fs::write(&u8_file, safetensors::serialize(views, None).unwrap()).unwrap();
    let (a, b) = (single_file::open(&src, "text_encoder").unwrap(), single_file::open(&u8_file, "text_encoder").unwrap());
    let mut n = 0;
    for (name, t) in a.tensors.iter().filter(|(_, t)| matches!(t.dtype, Dtype::W4a8 { .. })) {
        let u = b.get(name).unwrap();
        assert_eq!(kept::Format::of(u), kept::Format::of(t), "{name}");
        assert!(a.values(t).unwrap() == b.values(u).unwrap(), "{name}");
        n += 1;
    }
    assert!(n > 40, "{n}");
    let _ = std::fs::remove_dir_all(&dir);
}
