//! `--precision int8` on the CPU twin (what CI runs): the int8 product against the sums written out
//! in the test from the same codes; ConvRot's `(x·H)·W_rotᵀ` against `x·Wᵀ` with the weight
//! convert-to-quant's dequantization gives (tests/quant_formats.rs checks moss reads it bit for
//! bit); which matrices are taken as stored and which are quantized at load; and whole renders
//! from the bf16 folder, the int8 comfy_quant file and the ConvRot one.

mod common;

use common::folders::{self, tiny_b_lora};
use common::golden;
use moss::backend::cpu::Cpu;
use moss::backend::Backend;
use moss::checkpoint::{self, comfy_quant, Checkpoint, ComponentFiles};
use moss::lora::LoraSpec;
use moss::model::dit::mats::{self, BlockMats, Kind, Matrix};
use moss::model::dit::MainLinears;
use moss::tensor::{rel_l2, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Deterministic values in (-1, 1) (an LCG), with a spread of row magnitudes.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `[rows, k]` with row `r` scaled by `1.3^r` and row 1 all zeros.
fn matrix(rows: usize, k: usize, seed: u64) -> Tensor {
    let mut v = values(rows * k, seed);
    for (r, row) in v.chunks_mut(k).enumerate() {
        row.iter_mut().for_each(|x| *x *= 1.3f32.powi(r as i32) * if r == 1 { 0.0 } else { 1.0 });
    }
    Tensor::new(vec![rows, k], v).unwrap()
}

/// The codes of a quantization as `i64`, each checked to be an integer in ±127.
fn codes(t: &Tensor) -> Vec<i64> {
    t.data
        .iter()
        .map(|&v| {
            assert!(v.fract() == 0.0 && v.abs() <= 127.0, "code {v}");
            v as i64
        })
        .collect()
}

/// `x · H / √g` in groups of `g`, with `H` written out (the direct O(g²) sum in f64).
fn turned(x: &Tensor, g: usize) -> Tensor {
    let h = comfy_quant::hadamard_signs(g);
    let norm = 1.0 / (g as f64).sqrt();
    let mut out = x.data.clone();
    for (o, group) in out.chunks_mut(g).zip(x.data.chunks(g)) {
        for (j, v) in o.iter_mut().enumerate() {
            *v = ((0..g).map(|k| group[k] as f64 * h[k * g + j] as f64).sum::<f64>() * norm) as f32;
        }
    }
    Tensor::new(x.shape.clone(), out).unwrap()
}

/// The quantization of each row checked from its definition: the scale is `amax / 127`, every
/// value within half a step of its code's, and the largest magnitude at ±127 (a zero row: codes 0).
fn check_rows(x: &Tensor, q: &Tensor, s: &Tensor) {
    let k = x.last_dim();
    let q = codes(q);
    for (r, (row, qr)) in x.data.chunks(k).zip(q.chunks(k)).enumerate() {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = s.data[r];
        assert_eq!(scale, amax.max(1e-12) / 127.0, "row {r}'s scale");
        for (&v, &c) in row.iter().zip(qr) {
            assert!((v as f64 - c as f64 * scale as f64).abs() <= 0.5 * scale as f64 * (1.0 + 1e-6), "row {r}: {v} as code {c} of {scale}");
        }
        if amax > 0.0 {
            assert_eq!(qr.iter().map(|c| c.abs()).max(), Some(127), "row {r}");
        } else {
            assert!(qr.iter().all(|&c| c == 0));
        }
    }
}

/// `Σ_k qx·qw` in i64, times both scales in f64, next to the CPU backend's output.
fn assert_integer_sums(y: &Tensor, (xq, xs): &(Tensor, Tensor), (wq, ws): &(Tensor, Tensor)) {
    let (n, k) = (wq.shape[0], wq.shape[1]);
    let (a, w) = (codes(xq), codes(wq));
    for r in 0..xq.rows() {
        for j in 0..n {
            let acc: i64 = (0..k).map(|i| a[r * k + i] * w[j * k + i]).sum();
            let want = acc as f64 * xs.data[r] as f64 * ws.data[j] as f64;
            let got = y.data[r * n + j] as f64;
            assert!((got - want).abs() <= 1e-7 * want.abs(), "y[{r}, {j}] = {got}, the integer sum gives {want}");
        }
    }
}

#[test]
fn the_int8_product_is_the_exact_integer_sum() {
    let (x, w) = (matrix(6, 64, 1), matrix(32, 64, 2));
    let wq = Cpu.quantize_rows_int8(&w, None).unwrap();
    let xq = Cpu.quantize_rows_int8(&x, None).unwrap();
    check_rows(&w, &wq.0, &wq.1);
    check_rows(&x, &xq.0, &xq.1);
    let y = Cpu.linear_int8(&x, &wq.0, &wq.1, None).unwrap();
    assert_integer_sums(&y, &xq, &wq);
    // the product is near the dense one (int8's error, about 1%), and a product that forgot the
    // scales is not
    let dense = Cpu.linear(&x, &w, None).unwrap();
    let e = rel_l2(&y.data, &dense.data);
    assert!(e > 1e-5 && e < 2e-2, "int8 against dense: {e:.3e}");
    let unscaled = Cpu.linear_int8_quantized(&xq.0, &Tensor::new(vec![6], vec![1.0; 6]).unwrap(), &wq.0, &wq.1).unwrap();
    assert!(rel_l2(&unscaled.data, &dense.data) > 0.5);

    // with ConvRot: the rows are turned by H (written out here), then quantized
    let yr = Cpu.linear_int8(&x, &wq.0, &wq.1, Some(16)).unwrap();
    let xt = turned(&x, 16);
    let xtq = Cpu.quantize_rows_int8(&x, Some(16)).unwrap();
    check_rows(&xt, &xtq.0, &xtq.1);
    assert_integer_sums(&yr, &xtq, &wq);
}

/// `x · Wᵀ = (x · H) · W_rotᵀ`: with ConvRot's codes `W_rot` (block 0's o of the golden ConvRot
/// file, groups of 64) and `W` as convert-to-quant dequantizes them, exactly up to f32 rounding;
/// with the activation quantized too (the int8 path), within int8's error; and a product that
/// does not turn the activation is far off (the control).
#[test]
fn the_convrot_product_is_the_same_map() {
    let store = checkpoint::single_file::open(&golden().join("quant/tiny-a-int8-convrot.safetensors"), "transformer").unwrap();
    let info = store.get("layers.0.proj.o.weight").unwrap();
    assert_eq!(info.row_scales.as_ref().unwrap().convrot, Some(64));
    let (n, k) = (info.shape[0], info.shape[1]);
    let w = Tensor::new(vec![n, k], store.values(info).unwrap()).unwrap();
    let q = Cpu.upload_int8(&[n, k], store.bytes(info)).unwrap();
    let s = Tensor::new(vec![n], comfy_quant::int8_row_scales(&store, info).unwrap()).unwrap();
    let x = matrix(5, k, 3);
    let want = Cpu.linear(&x, &w, None).unwrap();
    // (x·H)·(q·s)ᵀ in f64, no activation quantization
    let xt = turned(&x, 64);
    let exact: Vec<f32> = (0..5)
        .flat_map(|r| {
            let (xt, q, s) = (&xt, &q, &s);
            (0..n).map(move |j| ((0..k).map(|i| xt.data[r * k + i] as f64 * q.data[j * k + i] as f64).sum::<f64>() * s.data[j] as f64) as f32)
        })
        .collect();
    let e = rel_l2(&exact, &want.data);
    assert!(e < 1e-6, "(x·H)·W_rotᵀ is {e:.3e} from x·Wᵀ");
    let y = Cpu.linear_int8(&x, &q, &s, Some(64)).unwrap();
    let e = rel_l2(&y.data, &want.data);
    assert!(e < 2e-2, "the int8 ConvRot product is {e:.3e} from x·Wᵀ");
    let unturned = Cpu.linear_int8(&x, &q, &s, None).unwrap();
    let c = rel_l2(&unturned.data, &want.data);
    assert!(c > 0.5, "without the turn: {c:.3e}");
}

fn with_file(base: &str, file: &str) -> Checkpoint {
    let loc = checkpoint::locate(golden().join(base).to_str().unwrap()).unwrap();
    Checkpoint::open_with(loc, ComponentFiles { transformer: Some(golden().join("quant").join(file)), text_encoder: None }).unwrap()
}

fn kinds(ck: &Checkpoint, i: usize, linears: MainLinears) -> Vec<Kind> {
    let c = ck.open_component("transformer").unwrap();
    mats::block_matrix_names(i).iter().map(|g| mats::kind(&c, g, linears).unwrap()).collect()
}

/// At int8 a comfy_quant int8 file's codes and scales are the matrices as stored (q|k|v stacked);
/// a bf16 folder, a GGUF file and a stored matrix with a LoRA update are quantized at load.
#[test]
fn stored_int8_codes_are_taken_as_they_are() {
    let ck = with_file("tiny-b", "tiny-b-int8.safetensors");
    assert_eq!(kinds(&ck, 0, MainLinears::Int8), vec![Kind::Int8Codes { convrot: None }; 4]);
    assert_eq!(kinds(&ck, 0, MainLinears::Dense), vec![Kind::Dense; 4]);
    let c = ck.open_component("transformer").unwrap();
    let m = BlockMats::load(&Cpu, &c, 0, &mats::sources(&Cpu, &c, 0, MainLinears::Int8).unwrap()).unwrap();
    let Matrix::Int8 { q, scale, convrot: None } = &m.qkv else { panic!("q|k|v is not an int8 matrix") };
    let mut stored = vec![];
    let mut scales = vec![];
    for n in ["q", "k", "v"] {
        let info = c.info(&format!("layers.0.proj.{n}.weight")).unwrap();
        stored.extend(c.store.bytes(info).iter().map(|&b| b as i8 as f32));
        scales.extend(c.store.to_f32(&format!("layers.0.proj.{n}.weight_scale")).unwrap().1);
    }
    assert_eq!((q.shape.clone(), &q.data), (vec![3 * 256, 256], &stored));
    assert_eq!(scale.data, scales);

    let rot = with_file("tiny-a", "tiny-a-int8-convrot.safetensors");
    let g = Some(64);
    // ffn_down's 96 columns are not whole groups of 64: convert-to-quant left it without ConvRot
    assert_eq!(
        kinds(&rot, 3, MainLinears::Int8),
        [Kind::Int8Codes { convrot: g }, Kind::Int8Codes { convrot: g }, Kind::Int8Codes { convrot: g }, Kind::Int8Codes { convrot: None }]
    );
    assert_eq!(kinds(&with_file("tiny-b", "tiny-b-mixed.gguf"), 0, MainLinears::Int8), vec![Kind::Quantized; 4]);
    assert_eq!(kinds(&common::checkpoint("tiny-b"), 1, MainLinears::Int8), vec![Kind::Quantized; 4]);

    let dir = folders::scratch("int8", "lora");
    let mut merged = with_file("tiny-b", "tiny-b-int8.safetensors");
    merged.attach_loras(&[LoraSpec { path: tiny_b_lora(&dir), scale: 1.0 }]).unwrap();
    let k = kinds(&merged, 0, MainLinears::Int8);
    assert_eq!((k[0], k[3]), (Kind::Quantized, Kind::Int8Codes { convrot: None }), "block 0's q|k|v has a LoRA update, its ffn_down none");
    let _ = std::fs::remove_dir_all(&dir);
}

fn moss(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap()
}

/// `moss generate --device cpu` of tiny `model` (with `--transformer file` when given) at
/// `precision`: the picture's bytes and its latents.
fn render(model: &str, file: Option<&str>, precision: &str, dir: &Path) -> (Vec<u8>, Vec<f32>) {
    let tag = format!("{model}-{}-{precision}", file.unwrap_or("folder"));
    let (pic, lat): (PathBuf, PathBuf) = (dir.join(format!("{tag}.png")), dir.join(format!("{tag}.latents")));
    let m = golden().join(model);
    let f = file.map(|f| golden().join("quant").join(f));
    let mut args = vec!["generate", "--device", "cpu", "--model", m.to_str().unwrap()];
    if let Some(f) = &f {
        args.extend(["--transformer", f.to_str().unwrap()]);
    }
    args.extend(["--prompt", "a lighthouse on a cliff at dusk", "--seed", "11", "--steps", "3", "--size", "64x48", "--precision", precision]);
    args.extend(["--out", pic.to_str().unwrap(), "--save-latents", lat.to_str().unwrap(), "--quiet"]);
    let o = moss(&args);
    assert!(o.status.success(), "{tag}: {}", String::from_utf8_lossy(&o.stderr));
    (std::fs::read(&pic).unwrap(), moss::pipeline::read_latents(&lat, 128, None).unwrap().0.data)
}

/// Whole renders at int8 (3 steps, 64x48): from the bf16 folder, from the int8 file and from the
/// ConvRot file, each against the same weights computed dense (`--precision bf16`, which the CPU
/// computes in fp32). The int8 error is bounded by fp8's on the same weights: both quantize the
/// same matrices and activations per row, int8 in 255 uniform steps of the row's range, e4m3
/// with 3 mantissa bits (about 1/16 relative); on these Gaussian-like rows int8's step is several
/// times finer. Zero error would mean nothing was quantized.
#[test]
fn int8_renders_are_near_the_dense_ones() {
    let dir = folders::scratch("int8", "renders");
    for (model, file) in [("tiny-b", None), ("tiny-b", Some("tiny-b-int8.safetensors")), ("tiny-a", Some("tiny-a-int8-convrot.safetensors"))] {
        let (png, int8) = render(model, file, "int8", &dir);
        let (_, dense) = render(model, file, "bf16", &dir);
        let (_, fp8) = render(model, file, "fp8", &dir);
        let (e, e8) = (rel_l2(&int8, &dense), rel_l2(&fp8, &dense));
        println!("{model} {file:?}: int8 {e:.3e}, fp8 {e8:.3e} from the dense latents");
        assert!(e > 1e-6 && e < e8, "{model} {file:?}: int8 is {e:.3e} from dense, fp8 {e8:.3e}");
        let recorded = br#""precision":"int8""#;
        assert!(png.windows(recorded.len()).any(|w| w == recorded), "the picture records its precision");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_precision_is_refused_in_one_line() {
    let dir = folders::scratch("int8", "refuse");
    let out = dir.join("x.png");
    let m = golden().join("tiny-b");
    let o = moss(&["generate", "--device", "cpu", "--model", m.to_str().unwrap(), "--prompt", "x", "--precision", "int4", "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("unknown precision `int4` (use bf16, fp32, fp8 or int8)"), "{err}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
