//! How `--precision fp8` gets its weights (CPU backend): a checkpoint stored as float8 with the
//! codes and scales the load would make gives the same picture; streamed blocks (quantized at
//! each fetch, or fetched as codes, or dequantized on the host) give the resident picture, also
//! under `--max-vram`; LoRAs merge before the quantization (into a float8 checkpoint: dequantized,
//! merged, requantized); a float8 checkpoint that moss cannot read is refused with one line.

mod common;

use common::folders::{self, as_stored, bf16_bytes, f32_bytes, is_main_matrix, open, rewrite, tiny_b_fp8, tiny_b_lora, with_transformer, Stored};
use common::golden;
use moss::backend::cpu::Cpu;
use moss::backend::{Backend, Device};
use moss::checkpoint::{Checkpoint, Dtype};
use moss::lora::LoraSpec;
use moss::model::dit::mats::{self, BlockMats, Matrix};
use moss::model::dit::{Dit, MainLinears};
use moss::options::Precision;
use moss::pipeline::{self, Request, Silent};
use moss::plan::MemoryOptions;
use moss::tensor::Tensor;
use std::path::{Path, PathBuf};

fn scratch(tag: &str) -> PathBuf {
    folders::scratch("fp8-loading", tag)
}

fn request(precision: Precision, out: PathBuf) -> Request {
    Request {
        spec: moss::spec::PictureSpec {
            prompt: "a lighthouse on a cliff at dusk".into(),
            negative: String::new(),
            seed: 11,
            steps: 3,
            guidance: 3.0,
            width: 64,
            height: 48,
            uncond_skip: vec![],
            skip_window: (0.0, 1.0),
            max_tokens: 4096,
            precision,
            ..Default::default()
        },
        out,
        save_latents: None,
        embeds: None,
        prompt_file: None,
        from: None,
        device: Device::Cpu,
        quality: None,
        cut: Default::default(),
        replace: true,
        preview: None,
        preview_every: 1,
        forwards: None,
        init: None,
        c2pa: None,
    }
}

/// The final latents `req` gives with the transformer `dit` of `ck`.
fn latents(ck: &Checkpoint, dit: &Dit<Cpu>, req: &Request) -> Tensor {
    let texts = pipeline::prompt_texts(req);
    let (enc, _) = pipeline::encode_prompts(&Cpu, ck, &texts, req.spec.max_tokens, req.spec.precision, &mut Silent).unwrap();
    let uncond = enc.get(1).unwrap_or(&enc[0]);
    pipeline::denoise_with(&Cpu, dit, ck, req, &enc[0].hidden, &uncond.hidden, &mut Silent).unwrap()
}

/// The picture `req` gives with the transformer `dit` of `ck` (its bytes record the checkpoint).
fn png(ck: &Checkpoint, dit: &Dit<Cpu>, req: &Request) -> Vec<u8> {
    let z = latents(ck, dit, req);
    let vae = pipeline::load_vae(&Cpu, ck, z.shape[2], z.shape[3]).unwrap();
    pipeline::picture_bytes(&Cpu, &vae, ck, req, &z, &mut Silent).unwrap()
}

fn load(ck: &Checkpoint, linears: MainLinears) -> Dit<Cpu> {
    Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit, linears).unwrap()
}

/// tiny-a's transformer with every main-block matrix stored as the codes and per-row scales
/// ([out] `weight_scale`) of `fp8::quantize_row` of its bf16 weights.
fn tiny_a_as_float8(dir: &Path) -> PathBuf {
    let t = rewrite(&golden().join("tiny-a/transformer"), &dir.join("stored"), |name, info, bytes| {
        if !is_main_matrix(name) {
            return as_stored(name, info, bytes);
        }
        let w = moss::checkpoint::tensors::decode_f32(info.dtype, bytes).unwrap();
        let (rows, cols) = (info.shape[0], info.shape[1]);
        let (mut q, mut scales) = (vec![0f32; w.len()], vec![]);
        for (wr, qr) in w.chunks(cols).zip(q.chunks_mut(cols)) {
            scales.push(moss::fp8::quantize_row(wr, qr));
        }
        let codes: Vec<u8> = q.iter().map(|&v| moss::fp8::e4m3_from_f32(v)).collect();
        let stem = name.strip_suffix(".weight").unwrap();
        vec![
            (name.to_string(), safetensors::Dtype::F8_E4M3, info.shape.clone(), codes),
            (format!("{stem}.weight_scale"), safetensors::Dtype::F32, vec![rows], f32_bytes(&scales)),
        ]
    });
    with_transformer("tiny-a", &t, dir, "tiny-a-fp8")
}

/// Stored as the codes and scales the load makes, a float8 checkpoint gives the fp8 latents of
/// the bf16 one bit for bit (q, k and v stacked with their own scales), resident and streamed;
/// at bf16 it gives other latents (dequantized weights: the control).
#[test]
fn stored_rowwise_codes_give_the_quantized_picture() {
    let dir = scratch("rowwise");
    let (plain, stored) = (common::checkpoint("tiny-a"), open(&tiny_a_as_float8(&dir)));
    let req = request(Precision::Fp8, dir.join("unused.png"));
    let want = latents(&plain, &load(&plain, MainLinears::Fp8), &req).data;
    assert!(latents(&stored, &load(&stored, MainLinears::Fp8), &req).data == want, "the stored codes give other latents");
    let streamed = Dit::load_streamed(&Cpu, stored.open_component("transformer").unwrap(), &stored.dit, 1, MainLinears::Fp8).unwrap();
    assert!(latents(&stored, &streamed, &req).data == want, "the streamed stored codes give other latents");
    let bf16 = request(Precision::Bf16, dir.join("unused.png"));
    assert!(latents(&stored, &load(&stored, MainLinears::Dense), &bf16).data != want, "dequantized, the latents are the fp8 ones");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Streamed blocks give the resident picture byte for byte at fp8: quantized after each fetch
/// (tiny-a), fetched as stored codes (golden/tiny-b-fp8), and dequantized on the host at bf16
/// (tiny-b-fp8); at int8: quantized after each fetch (tiny-a), stored int8 codes uploaded from the
/// host (golden/quant's int8 and ConvRot files); and another seed gives another picture through
/// the same path.
#[test]
fn streamed_fp8_blocks_give_the_resident_picture() {
    let dir = scratch("streamed");
    let stored = open(&tiny_b_fp8(&dir));
    let file = |base: &str, f: &str| {
        let loc = moss::checkpoint::locate(golden().join(base).to_str().unwrap()).unwrap();
        let files = moss::checkpoint::ComponentFiles { transformer: Some(golden().join("quant").join(f)), text_encoder: None };
        Checkpoint::open_with(loc, files).unwrap()
    };
    for (tag, ck, linears) in [
        ("tiny-a", common::checkpoint("tiny-a"), MainLinears::Fp8),
        ("tiny-b-fp8", open(&dir.join("tiny-b-fp8")), MainLinears::Fp8),
        ("tiny-b-fp8 at bf16", stored, MainLinears::Dense),
        ("tiny-a at int8", common::checkpoint("tiny-a"), MainLinears::Int8),
        ("tiny-b-int8 at int8", file("tiny-b", "tiny-b-int8.safetensors"), MainLinears::Int8),
        ("tiny-a-int8-convrot at int8", file("tiny-a", "tiny-a-int8-convrot.safetensors"), MainLinears::Int8),
    ] {
        let precision = match linears {
            MainLinears::Fp8 => Precision::Fp8,
            MainLinears::Int8 => Precision::Int8,
            MainLinears::Dense => Precision::Bf16,
        };
        let req = request(precision, dir.join("unused.png"));
        let resident = load(&ck, linears);
        let want = png(&ck, &resident, &req);
        let n = ck.dit.num_layers;
        for k in [0, 1, n - 1] {
            let streamed = Dit::load_streamed(&Cpu, ck.open_component("transformer").unwrap(), &ck.dit, k, linears).unwrap();
            assert_eq!(streamed.resident_blocks(), k);
            assert!(png(&ck, &streamed, &req) == want, "{tag}: {k} of {n} blocks resident, the picture differs");
        }
        let mut other = req.clone();
        other.spec.seed = 12;
        assert!(png(&ck, &resident, &other) != want, "{tag}: the picture does not depend on the seed");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `generate --precision fp8 --max-vram` plans the transformer's main-block matrices at a byte an
/// element (plus a scale a row): its blocks and weights count less than at bf16 on the same
/// checkpoint; at the smallest cap that works (on these tiny checkpoints the text encoder is the
/// one that streams there; the transformer streaming at fp8 is the test above) the picture is the
/// unlimited run's byte for byte, and under it the run is refused before anything is written.
#[test]
fn fp8_plans_count_a_byte_an_element_and_keep_the_picture_under_a_cap() {
    use moss::plan::{run::networks, Budget};
    let dir = scratch("maxvram");
    let stored = tiny_b_fp8(&dir);
    for model in [golden().join("tiny-a"), stored] {
        let ck = open(&model);
        let mut req = request(Precision::Fp8, dir.join("x.png"));
        let budget =
            Budget { memory: None, overhead: 0, bf16_loaded: 4, act: 4, linears: MainLinears::Fp8, activations: &moss::backend::cuda::plan::ACTIVATIONS };
        let (tokens, _) = pipeline::tokenize_prompts(&ck, &pipeline::prompt_texts(&req), req.spec.max_tokens, &mut Silent).unwrap();
        let nets = networks(&ck, &budget, tokens.iter().map(Vec::len).max().unwrap(), (req.spec.width, req.spec.height)).unwrap();
        // As a GPU counts them: fp8 against bf16.
        let gpu = |linears| {
            let b = Budget { bf16_loaded: 2, act: 2, linears, ..budget };
            networks(&ck, &b, 1, (req.spec.width, req.spec.height)).unwrap()[1].clone()
        };
        let (fp8, bf16) = (gpu(MainLinears::Fp8), gpu(MainLinears::Dense));
        assert!(fp8.block_bytes < bf16.block_bytes && fp8.weights < bf16.weights, "{}: fp8 blocks are not counted smaller", model.display());
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut run = |cap: Option<f64>, out: &str| {
            req.out = dir.join(out);
            pipeline::generate_planned(&req, model.to_str().unwrap(), &[], Device::Cpu, &MemoryOptions { max_vram_gib: cap }, &mut Silent)
                .map(|rep| (rep, std::fs::read(dir.join(out)).unwrap()))
        };
        let (_, want) = run(None, "unlimited.png").unwrap();
        let cap = nets.iter().map(|n| n.minimum()).max().unwrap();
        let (rep, got) = run(Some(gib(cap) + 1e-9), "least.png").unwrap();
        assert!(rep.plan.unwrap()["networks"].as_array().unwrap().iter().any(|n| n["mode"] == "streamed"));
        assert!(got == want, "{}: the capped fp8 picture differs from the unlimited one", model.display());
        let err = run(Some(gib(cap) * 0.99), "refused.png").unwrap_err().to_string();
        assert!(err.contains("smallest cap that works"), "{err}");
        assert!(!dir.join("refused.png").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Block `i`'s matrices of `ck` as the model holds them under `linears`.
fn block(ck: &Checkpoint, i: usize, linears: MainLinears) -> BlockMats<Cpu> {
    let c = ck.open_component("transformer").unwrap();
    BlockMats::load(&Cpu, &c, i, &mats::sources(&Cpu, &c, i, linears).unwrap()).unwrap()
}

fn parts(m: &Matrix<Cpu>) -> Vec<Vec<f32>> {
    match m {
        Matrix::Dense(w) => vec![w.data.clone()],
        Matrix::Fp8 { q, scale } | Matrix::Int8 { q, scale, .. } => vec![q.data.clone(), scale.data.clone()],
    }
}

fn all(b: &BlockMats<Cpu>) -> Vec<Vec<Vec<f32>>> {
    [&b.qkv, &b.o, &b.ffn_up_gate, &b.ffn_down].into_iter().map(parts).collect()
}

/// With LoRAs, a bf16 checkpoint at fp8 (and at int8) holds the quantization of the merged (and
/// bf16-rounded) weights: what a checkpoint storing those merged weights gives, matrix for matrix.
#[test]
fn loras_merge_before_the_quantization() {
    let dir = scratch("lora");
    let specs: Vec<LoraSpec> = ["peft/adapter_model.safetensors", "kohya.safetensors", "qkv.safetensors", "lokr.safetensors"]
        .iter()
        .map(|f| LoraSpec { path: golden().join("lora").join(f), scale: 0.9 })
        .collect();
    let mut ck = common::checkpoint("tiny-a");
    ck.attach_loras(&specs).unwrap();
    let c = ck.open_component("transformer").unwrap();
    // Every tensor as `load` gives it (merged, rounded to its stored bf16), stored again.
    let t = rewrite(&golden().join("tiny-a/transformer"), &dir, |name, info, bytes| {
        if info.dtype != Dtype::BF16 {
            return as_stored(name, info, bytes);
        }
        let w = Cpu.load(&c, name).unwrap();
        vec![(name.to_string(), safetensors::Dtype::BF16, info.shape.clone(), bf16_bytes(&w.data))]
    });
    let merged = open(&with_transformer("tiny-a", &t, &dir, "merged"));
    let plain = common::checkpoint("tiny-a");
    for l in [MainLinears::Fp8, MainLinears::Int8] {
        let mut touched = 0;
        for i in 0..ck.dit.num_layers {
            let (got, want) = (all(&block(&ck, i, l)), all(&block(&merged, i, l)));
            assert!(got == want, "block {i}: the {l:?} matrices are not those of the merged weights");
            touched += (got != all(&block(&plain, i, l))) as usize;
        }
        assert!(touched >= 4, "the LoRAs change the {l:?} matrices of only {touched} blocks");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn dense(m: &Matrix<Cpu>) -> &Tensor {
    match m {
        Matrix::Dense(w) => w,
        Matrix::Fp8 { .. } | Matrix::Int8 { .. } => panic!("a quantized matrix where a dense one was loaded"),
    }
}

/// `a [n, r] · b [r, m] · k` in f64.
fn product(a: &[f32], b: &[f32], (n, r, m): (usize, usize, usize), k: f64) -> Vec<f32> {
    (0..n * m).map(|ij| (0..r).map(|t| a[ij / m * r + t] as f64 * b[t * m + ij % m] as f64).sum::<f64>() * k).map(|v| v as f32).collect()
}

/// A LoRA on a float8 checkpoint: its matrices are dequantized (`W = q · scale`) and the update
/// added in fp32 (the dense matrix moves by the LoRA's own `scale · alpha/r · B A`, computed here
/// in f64), then at fp8 requantized per row; matrices without updates keep their stored codes.
#[test]
fn a_float8_checkpoint_takes_a_lora() {
    let dir = scratch("stored-lora");
    let root = tiny_b_fp8(&dir);
    let lora = tiny_b_lora(&dir);
    let base = open(&root);
    let mut stored = open(&root);
    stored.attach_loras(&[LoraSpec { path: lora.clone(), scale: 1.0 }]).unwrap();
    let l = moss::checkpoint::TensorStore::open_file(&lora).unwrap();
    let f = |k: &str| l.to_f32(k).unwrap().1;
    let (d, ff, r) = (256, 128, 4);
    let qkv = "transformer.layers.0.proj.qkv";
    let down = "lora_unet_layers_1_proj_ffn_down";
    // (block, matrix) -> the update: block 0's q|k|v (alpha 2), block 1's ffn_down (alpha 4).
    let updates = [
        ((0, 0), product(&f(&format!("{qkv}.lora_B.weight")), &f(&format!("{qkv}.lora_A.weight")), (3 * d, r, d), 2.0 / 4.0)),
        ((1, 3), product(&f(&format!("{down}.lora_up.weight")), &f(&format!("{down}.lora_down.weight")), (d, r, ff), 4.0 / 4.0)),
    ];
    for i in 0..2 {
        let (with, without) = (block(&stored, i, MainLinears::Dense), block(&base, i, MainLinears::Dense));
        let (with8, without8) = (block(&stored, i, MainLinears::Fp8), block(&base, i, MainLinears::Fp8));
        let pick = |b: &BlockMats<Cpu>, m: usize| -> Matrix<Cpu> { [&b.qkv, &b.o, &b.ffn_up_gate, &b.ffn_down][m].clone() };
        for m in 0..4 {
            let (w, w0) = (pick(&with, m), pick(&without, m));
            let (got8, plain8) = (parts(&pick(&with8, m)), parts(&pick(&without8, m)));
            match updates.iter().find(|(k, _)| *k == (i, m)) {
                Some((_, delta)) => {
                    let moved: Vec<f32> = dense(&w).data.iter().zip(&dense(&w0).data).map(|(a, b)| a - b).collect();
                    common::assert_close(&format!("block {i} matrix {m}: the dense matrix's move"), &moved, delta, 1e-5);
                    let (q, scale) = Cpu.quantize_rows(dense(&w)).unwrap();
                    assert!(got8 == vec![q.data, scale.data], "block {i} matrix {m}: not the requantized merge");
                    assert!(got8 != plain8, "block {i} matrix {m}: the LoRA changes nothing at fp8");
                }
                None => {
                    assert!(dense(&w).data == dense(&w0).data, "block {i} matrix {m}: moved without an update");
                    assert!(got8 == plain8, "block {i} matrix {m}: a matrix without updates lost its stored codes");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `moss generate` on golden/tiny-b-fp8 rewritten by `f` fails with one line containing `want`,
/// writing nothing.
fn refused(tag: &str, want: &str, f: impl Fn(&str, &moss::checkpoint::TensorInfo, &[u8]) -> Vec<Stored>) {
    let dir = scratch(tag);
    let t = rewrite(&golden().join("tiny-b-fp8/transformer"), &dir.join("t"), f);
    let model = with_transformer("tiny-b", &t, &dir, "ckpt");
    let png = dir.join("x.png");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["generate", "--device", "cpu", "--precision", "fp8", "--prompt", "a cat", "--steps", "1", "--size", "64x64"])
        .args(["--model", model.to_str().unwrap(), "--out", png.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{tag}: accepted");
    assert!(err.starts_with("moss: error: ") && err.trim_end().lines().count() == 1, "{tag}: {err:?}");
    assert!(err.contains(want), "{tag}: {err:?} lacks {want:?}");
    assert!(!err.contains("panicked") && !png.exists(), "{tag}: {err}");
    println!("{tag}: {}", err.trim_end());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn float8_checkpoints_moss_cannot_read_are_refused() {
    let only = |target: &'static str, g: fn(&str, &moss::checkpoint::TensorInfo, &[u8]) -> Vec<Stored>| {
        move |name: &str, info: &moss::checkpoint::TensorInfo, bytes: &[u8]| if name == target { g(name, info, bytes) } else { as_stored(name, info, bytes) }
    };
    refused(
        "e5m2",
        "is stored as F8_E5M2 (float8 e5m2)",
        only("layers.0.proj.q.weight", |n, i, b| vec![(n.into(), safetensors::Dtype::F8_E5M2, i.shape.clone(), b.to_vec())]),
    );
    refused("no-scale", "without its scale: neither `layers.1.proj.o.weight_scale` nor", only("layers.1.proj.o.weight_scale", |_, _, _| vec![]));
    refused(
        "scale-shape",
        "must be one value ([] or [1]) or one a row ([256] or [256, 1])",
        only("layers.0.proj.q.weight_scale", |n, _, _| vec![(n.into(), safetensors::Dtype::F32, vec![2], f32_bytes(&[1.0, 1.0]))]),
    );
    refused(
        "two-scales",
        "has two scales",
        only("layers.0.proj.q.weight_scale", |n, i, b| {
            let mut v = as_stored(n, i, b);
            v.push(("layers.0.proj.q.scale_weight".into(), safetensors::Dtype::F32, vec![], f32_bytes(&[1.0])));
            v
        }),
    );
    refused(
        "not-a-main-matrix",
        "`text_embedder.proj.weight` in",
        only("text_embedder.proj.weight", |n, i, b| {
            let codes = moss::checkpoint::tensors::decode_f32(i.dtype, b).unwrap().iter().map(|&v| moss::fp8::e4m3_from_f32(v)).collect();
            vec![(n.into(), safetensors::Dtype::F8_E4M3, i.shape.clone(), codes)]
        }),
    );
    refused(
        "mixed-stack",
        "stored partly as float8, partly not",
        only("layers.0.proj.k.weight", |n, i, b| {
            let q = moss::checkpoint::tensors::decode_f32(i.dtype, b).unwrap();
            vec![(n.into(), safetensors::Dtype::BF16, i.shape.clone(), bf16_bytes(&q))]
        }),
    );
}

/// `moss encode --precision fp8` writes the bf16 embeds (an fp8 run's encoder is the bf16 one),
/// value for value, and `generate --embeds` at fp8 gives the latents of the direct fp8 run.
#[test]
fn encode_at_fp8_writes_the_bf16_embeds() {
    let dir = scratch("encode");
    let model = golden().join("tiny-b");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let m = model.to_str().unwrap();
    let emb = |p: &str| dir.join(format!("{p}.safetensors"));
    for p in ["fp8", "bf16"] {
        run(&["encode", "--device", "cpu", "--model", m, "--prompt", "a red fox", "--precision", p, "--out", emb(p).to_str().unwrap()]);
    }
    // (The files' metadata order varies from run to run: the tensors and their dtypes are compared.)
    let (a, b) = (moss::checkpoint::TensorStore::open_file(&emb("fp8")).unwrap(), moss::checkpoint::TensorStore::open_file(&emb("bf16")).unwrap());
    for k in ["cond", "uncond"] {
        assert_eq!(a.get(k).unwrap().dtype, Dtype::BF16, "{k}");
        assert!(a.to_f32(k).unwrap() == b.to_f32(k).unwrap(), "the fp8 embeds' {k} are not the bf16 ones");
    }
    let lat = |name: &str, extra: &[&str]| {
        let (pic, lat) = (dir.join(format!("{name}.png")), dir.join(format!("{name}.f32")));
        let mut args = vec!["generate", "--device", "cpu", "--model", m, "--precision", "fp8", "--steps", "2", "--size", "64x48"];
        args.extend(["--out", pic.to_str().unwrap(), "--save-latents", lat.to_str().unwrap()]);
        args.extend(extra);
        run(&args);
        moss::pipeline::read_latents(&lat, 128, None).unwrap().0.data
    };
    let via = lat("via", &["--embeds", emb("fp8").to_str().unwrap()]);
    assert!(via == lat("direct", &["--prompt", "a red fox"]), "generate --embeds at fp8 differs from the direct fp8 run");
    assert!(via != lat("other", &["--prompt", "a blue fox"]), "the latents do not depend on the prompt");
    let _ = std::fs::remove_dir_all(&dir);
}
