//! `--precision fp8` on the CPU twin against golden/make_fp8.py (torch: the main blocks' linears
//! row-wise float8 e4m3, activations per token): the e4m3 cast table, every main-block matrix,
//! the golden forwards and pictures, and the float8-stored transformer golden/tiny-b-fp8 (its
//! codes and scales used as stored, or dequantized). Each comparison has a control the bound
//! tells apart.
//!
//! Conditioning (golden/make_fp8.py, `cond` in fp8.json): fp8 makes a forward discontinuous (a
//! value one fp32 rounding from an e4m3 rounding boundary takes the other code), and on these tiny
//! random checkpoints a relative 1e-6 on the inputs moves an fp8 forward by 1e-3 to 5e-2, about
//! as far as fp8 is from fp32. So the matrices are compared exactly on torch's own inputs, and
//! whole forwards and pictures by the size of their fp8 error.

mod common;

use common::folders::{self, open, tiny_b_fp8};
use common::{assert_close, checkpoint, golden, Expected};
use moss::backend::cpu::Cpu;
use moss::checkpoint::{Checkpoint, TensorStore};
use moss::model::dit::mats::{self, BlockMats, Matrix};
use moss::model::dit::{Dit, MainLinears};
use moss::tensor::{rel_l2, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A well-conditioned comparison (the dequantized checkpoint against torch's fp32 forward of it).
const TIGHT: f64 = 1e-5;
/// A reference output is well conditioned when its `cond` is under this.
const CONDITIONED: f64 = 2e-6;
/// The fp8 error of a forward or a picture, as a multiple of torch's: a wrong fp8 (weights only,
/// without the activations' quantization) is 0.7x, the dense model's 1e-5x.
const SIZE: std::ops::Range<f64> = 0.8..1.25;

fn reference() -> (serde_json::Value, TensorStore) {
    let dir = golden().join("expected");
    let json = serde_json::from_str(&std::fs::read_to_string(dir.join("fp8.json")).unwrap()).unwrap();
    (json, TensorStore::open_file(&dir.join("fp8.safetensors")).unwrap())
}

fn tensor(store: &TensorStore, key: &str) -> Tensor {
    let (shape, data) = store.to_f32(key).unwrap_or_else(|e| panic!("{e:#}"));
    Tensor::new(shape, data).unwrap()
}

fn scratch(tag: &str) -> PathBuf {
    folders::scratch("fp8", tag)
}

/// The golden forwards `dit.out.N` of `name` (their x, ctx, t and skip) on checkpoint `ck`.
fn forwards(ck: &Checkpoint, name: &str, linears: MainLinears) -> Vec<Tensor> {
    let e = Expected::load(name);
    let dit = Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit, linears).unwrap();
    e.json["dit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let text = dit.refine_text(&Cpu, &e.tensor(r["ctx"].as_str().unwrap())).unwrap();
            let skip: Vec<usize> = r["skip"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap() as usize).collect();
            dit.forward(&Cpu, &e.tensor(r["x"].as_str().unwrap()), r["t"].as_f64().unwrap() as f32, &text, &skip).unwrap()
        })
        .collect()
}

/// torch's `x.clamp(-448, 448).to(torch.float8_e4m3fn)` for 3213 f32 values (every e4m3 value,
/// the midpoints between neighbours and one ulp either side, subnormals, ties at zero,
/// saturation, infinities, NaN, random values) is `fp8::e4m3_from_f32`, code for code.
#[test]
fn e4m3_codes_are_torchs() {
    let (_, store) = reference();
    let (_, x) = store.to_f32("table.inputs").unwrap();
    let codes = store.bytes(store.get("table.codes").unwrap());
    assert_eq!(x.len(), codes.len());
    let wrong: Vec<String> = x
        .iter()
        .zip(codes)
        .filter(|(v, c)| moss::fp8::e4m3_from_f32(**v) != **c)
        .map(|(v, c)| format!("{v:e}: torch {c:#04x}, moss {:#04x}", moss::fp8::e4m3_from_f32(*v)))
        .collect();
    assert!(wrong.is_empty(), "{} of {} codes differ: {}", wrong.len(), x.len(), wrong[..wrong.len().min(10)].join("; "));
    // The table holds what a wrong rounding gets wrong: exact ties (away from zero differs),
    // subnormals, values past 448.
    let pos: Vec<f32> = (0u8..0x7f).map(moss::fp8::e4m3_to_f32).collect();
    let ties = x.iter().filter(|v| pos.windows(2).any(|w| v.abs() == (w[0] + w[1]) / 2.0)).count();
    let sub = x.iter().filter(|v| v.abs() < 2f32.powi(-6) && **v != 0.0).count();
    let sat = x.iter().filter(|v| v.abs() > 448.0).count();
    assert!(ties > 200 && sub > 100 && sat > 10, "ties {ties}, subnormals {sub}, past 448 {sat}");
}

/// The fp8 error of `got` (its rel L2 to the golden fp32 output `fp32`) as a multiple of torch's
/// (`vs_fp32` of the reference entry `r`).
fn error_size(got: &[f32], fp32: &Tensor, r: &serde_json::Value) -> f64 {
    rel_l2(got, &fp32.data) / r["vs_fp32"].as_f64().unwrap()
}

/// Every main-block matrix of tiny-b at fp8 (quantized at load), of golden/tiny-b-fp8 at fp8 (its
/// codes and scales as stored, in every naming) and dequantized, as the model builds them
/// ([`mats::sources`], [`BlockMats::load`]), on torch's own input to it in the golden forward:
/// torch's output to fp32 rounding. The control: tiny-b's row-wise matrices on the stored
/// checkpoint's inputs miss its outputs (per-tensor scales give other codes).
#[test]
fn fp8_matrices_match_torchs() {
    let (json, store) = reference();
    let dir = scratch("mats");
    let stored = open(&tiny_b_fp8(&dir));
    let plain = checkpoint("tiny-b");
    let cases = [("tiny-b", &plain, MainLinears::Fp8), ("tiny-b-fp8", &stored, MainLinears::Fp8), ("tiny-b-fp8-dequant", &stored, MainLinears::Dense)];
    let mut compared = 0;
    for (tag, ck, linears) in cases {
        let c = ck.open_component("transformer").unwrap();
        let blocks: Vec<BlockMats<Cpu>> =
            (0..ck.dit.num_layers).map(|i| BlockMats::load(&Cpu, &c, i, &mats::sources(&Cpu, &c, i, linears).unwrap()).unwrap()).collect();
        let pc = plain.open_component("transformer").unwrap();
        for m in json["checkpoints"][tag]["mats"].as_array().unwrap() {
            let i = m["block"].as_u64().unwrap() as usize;
            let pick = |b: &BlockMats<Cpu>| -> Matrix<Cpu> {
                match m["matrix"].as_str().unwrap() {
                    "qkv" => b.qkv.clone(),
                    "o" => b.o.clone(),
                    "ffn_up_gate" => b.ffn_up_gate.clone(),
                    _ => b.ffn_down.clone(),
                }
            };
            let (x, want) = (tensor(&store, m["x"].as_str().unwrap()), tensor(&store, m["y"].as_str().unwrap()));
            let got = pick(&blocks[i]).forward(&Cpu, &x).unwrap();
            assert_close(&format!("{tag} block {i} {}", m["matrix"]), &got.data, &want.data, 1e-6);
            compared += 1;
            if tag == "tiny-b-fp8" {
                let rowwise = BlockMats::load(&Cpu, &pc, i, &mats::sources(&Cpu, &pc, i, MainLinears::Fp8).unwrap()).unwrap();
                let miss = rel_l2(&pick(&rowwise).forward(&Cpu, &x).unwrap().data, &want.data);
                // Matrices stored with other scales than the row-wise ones (per tensor, bf16).
                let parts = match m["matrix"].as_str().unwrap() {
                    "qkv" => vec!["q", "k", "v"],
                    one => vec![one],
                };
                let kinds = &json["checkpoints"][tag]["storage"][i];
                if parts.iter().any(|p| kinds[*p] != "row" && kinds[*p] != "row_col") {
                    assert!(miss > 1e-3, "{tag} block {i} {}: the row-wise codes give the stored output ({miss:.1e})", m["matrix"]);
                }
            }
        }
    }
    assert_eq!(compared, 3 * 2 * 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A main matrix's input quantized by its producer (`Act::Fp8`, the DiT's path at fp8: the CPU
/// quantizes the producer's output with `quantize_rows`) gives the bytes of `linear_fp8` on the
/// dense input, for every main-block matrix of tiny-b on torch's inputs to it, also with the rows
/// under two leading dims; the dense input passes through as it was; a dense matrix refuses
/// a quantized input (one error, no panic).
#[test]
fn a_quantized_activation_gives_linear_fp8s_bytes() {
    use moss::backend::Backend;
    use moss::model::dit::mats::Act;
    let (json, store) = reference();
    let ck = checkpoint("tiny-b");
    let c = ck.open_component("transformer").unwrap();
    let bits = |t: &Tensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let mut compared = 0;
    for m in json["checkpoints"]["tiny-b"]["mats"].as_array().unwrap() {
        let i = m["block"].as_u64().unwrap() as usize;
        let b = BlockMats::load(&Cpu, &c, i, &mats::sources(&Cpu, &c, i, MainLinears::Fp8).unwrap()).unwrap();
        let w = match m["matrix"].as_str().unwrap() {
            "qkv" => b.qkv,
            "o" => b.o,
            "ffn_up_gate" => b.ffn_up_gate,
            _ => b.ffn_down,
        };
        let x = tensor(&store, m["x"].as_str().unwrap());
        let want = bits(&w.forward(&Cpu, &x).unwrap());
        let (q, scale) = Cpu.quantize_rows(&x).unwrap();
        assert_eq!(bits(&w.forward_act(&Cpu, &Act::Fp8 { q: q.clone(), scale: scale.clone() }).unwrap()), want, "block {i} {}", m["matrix"]);
        assert_eq!(bits(&w.forward_act(&Cpu, &Act::Dense(x.clone())).unwrap()), want);
        let (rows, k) = (x.shape[0], x.shape[1]);
        let q3 = Tensor::new(vec![rows, 1, k], q.data.clone()).unwrap();
        let Matrix::Fp8 { q: wq, scale: ws } = &w else { panic!("a dense matrix at fp8") };
        assert_eq!(bits(&Cpu.linear_fp8_quantized(&q3, &scale, wq, ws).unwrap()), want, "[{rows}, 1, {k}]");
        let dense = Matrix::<Cpu>::Dense(Tensor::new(vec![4, k], vec![0.0; 4 * k]).unwrap());
        assert!(dense.forward_act(&Cpu, &Act::Fp8 { q, scale }).is_err());
        compared += 1;
    }
    assert_eq!(compared, 2 * 4);
}

/// Every golden forward at fp8 (tiny-a, tiny-b, golden/tiny-b-fp8 as stored) has an fp8 error of
/// torch's size ([`SIZE`]; none is well conditioned enough for a closer comparison: fp8.json
/// `cond`); the dense model's, the control, is out of it (1e-5x; 0.7x for tiny-b-fp8 dequantized,
/// which is torch's forward of it within [`TIGHT`]).
#[test]
fn fp8_forwards_have_torchs_error() {
    let (json, store) = reference();
    let dir = scratch("forwards");
    let stored = open(&tiny_b_fp8(&dir));
    for (tag, name, ck) in [("tiny-a", "tiny-a", checkpoint("tiny-a")), ("tiny-b", "tiny-b", checkpoint("tiny-b")), ("tiny-b-fp8", "tiny-b", stored)] {
        let e = Expected::load(name);
        let (fp8, dense) = (forwards(&ck, name, MainLinears::Fp8), forwards(&ck, name, MainLinears::Dense));
        for (j, r) in json["checkpoints"][tag]["dit"].as_array().unwrap().iter().enumerate() {
            let fp32 = e.tensor(r["of"].as_str().unwrap());
            let (ours, control) = (error_size(&fp8[j].data, &fp32, r), error_size(&dense[j].data, &fp32, r));
            println!("{tag} forward {j}: fp8 error {ours:.2}x torch's (cond {:.1e}), the dense model's {control:.1e}x", r["cond"].as_f64().unwrap());
            assert!(SIZE.contains(&ours), "{tag} forward {j}: the fp8 error is {ours:.2}x torch's");
            assert!(!SIZE.contains(&control), "{tag} forward {j}: the dense model's error is fp8's size ({control:.2}x)");
            if tag != "tiny-b-fp8" {
                assert!(control < 1e-3, "{tag} forward {j}: the dense model has an fp8-sized error ({control:.1e}x)");
            } else {
                let r = &json["checkpoints"]["tiny-b-fp8-dequant"]["dit"][j];
                assert!(r["cond"].as_f64().unwrap() < CONDITIONED, "the dequantized forward {j} is not well conditioned");
                assert_close(&format!("tiny-b-fp8 dequantized, forward {j}"), &dense[j].data, &tensor(&store, r["key"].as_str().unwrap()).data, TIGHT);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn moss(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "moss {args:?}: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The golden loop's latents of checkpoint folder `model` (prompt and settings of `name`'s) at
/// `precision`, through `moss generate --save-latents`; the picture records the precision.
fn latents(name: &str, model: &Path, precision: &str, dir: &Path) -> Vec<f32> {
    let e = Expected::load(name);
    let lp = &e.json["loop"];
    let size = format!("{}x{}", lp["width"], lp["height"]);
    let tag = format!("{name}-{precision}-{}", model.file_name().unwrap().to_string_lossy());
    let (pic, lat) = (dir.join(format!("{tag}.png")), dir.join(format!("{tag}.latents")));
    moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        &e.loop_prompt(),
        "--seed",
        &lp["seed"].to_string(),
        "--steps",
        &lp["steps"].to_string(),
        "--size",
        &size,
        "--precision",
        precision,
        "--out",
        pic.to_str().unwrap(),
        "--save-latents",
        lat.to_str().unwrap(),
    ]);
    let info: serde_json::Value = serde_json::from_str(&moss(&["info", "--json", pic.to_str().unwrap()])).unwrap();
    assert_eq!(info["precision"], precision, "the picture records its precision");
    moss::pipeline::read_latents(&lat, 128, None).unwrap().0.data
}

/// `moss generate --precision fp8` on the CPU: the golden loop (4 steps, CFG 3) of tiny-a, tiny-b
/// and golden/tiny-b-fp8 has an fp8 error (against the golden fp32 loop) of torch's size
/// ([`SIZE`]); the bf16 picture's, the control, is out of it (1e-4x; 0.4x for tiny-b-fp8, which
/// bf16 dequantizes).
#[test]
fn fp8_pictures_have_torchs_error() {
    let (json, _) = reference();
    let dir = scratch("pictures");
    let stored = tiny_b_fp8(&dir);
    for (tag, name, model) in [("tiny-a", "tiny-a", golden().join("tiny-a")), ("tiny-b", "tiny-b", golden().join("tiny-b")), ("tiny-b-fp8", "tiny-b", stored)] {
        let r = &json["checkpoints"][tag]["loop"];
        let fp32 = Expected::load(name).tensor("loop.latents");
        let (ours, control) = (error_size(&latents(name, &model, "fp8", &dir), &fp32, r), error_size(&latents(name, &model, "bf16", &dir), &fp32, r));
        println!("{tag} loop: fp8 error {ours:.2}x torch's (cond {:.1e}), the bf16 picture's {control:.1e}x", r["cond"].as_f64().unwrap());
        assert!(SIZE.contains(&ours), "{tag}: the fp8 loop's error is {ours:.2}x torch's");
        assert!(!SIZE.contains(&control), "{tag}: the bf16 loop has an fp8-sized error ({control:.2}x)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
