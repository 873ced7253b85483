//! The planner with quantized single-file components: on the GPU a quantized matrix counts its
//! stored bytes (ggml blocks; int8 codes and a scale a row), its products a dequantized scratch of
//! the largest one, and a matrix with a LoRA update its bf16 bytes (it is dequantized, merged and
//! kept in bf16); the CPU counts every value in f32.

use super::*;
use crate::checkpoint::config::{DitConfig, EncoderConfig, VaeConfig};
use crate::checkpoint::{locate, Checkpoint, ComponentFiles, Dtype};
use crate::model::dit::MainLinears;
use crate::plan::Activations;

/// No activations: these tests are about the weights' bytes and the dequantized scratch.
struct NoActivations;
impl Activations for NoActivations {
    fn dit(&self, _: &DitConfig, _: usize, _: usize) -> u64 {
        0
    }
    fn encoder(&self, _: &EncoderConfig, _: usize, _: usize) -> u64 {
        0
    }
    fn vae_decode(&self, _: &VaeConfig, _: usize, _: usize) -> (u64, u64) {
        (0, 0)
    }
    fn vae_encode(&self, _: &VaeConfig, _: usize, _: usize) -> (u64, u64) {
        (0, 0)
    }
}

const GB: u64 = 1 << 30;

fn golden(p: &str) -> String {
    format!("{}/../../golden/{p}", env!("CARGO_MANIFEST_DIR"))
}

fn open(folder: &str, transformer: &str) -> Checkpoint {
    let files = ComponentFiles { transformer: Some(golden(transformer).into()), text_encoder: None };
    Checkpoint::open_with(locate(&golden(folder)).unwrap(), files).unwrap()
}

fn gpu() -> Budget {
    Budget { memory: Some((80 * GB, 80 * GB)), overhead: 0, bf16_loaded: 2, act: 2, linears: MainLinears::Dense, activations: &NoActivations }
}

/// The transformer's bytes read off the file itself: every quantized tensor's stored bytes (int8:
/// a byte a code and an f32 a row, their scale tensors not again, the JSON descriptions not at
/// all), every bf16 tensor as bf16 and the other floats as f32; and the largest quantized matrix in bf16 (the scratch).
fn from_the_file(c: &Component) -> (u64, u64) {
    let (mut bytes, mut scratch) = (0u64, 0u64);
    for (k, t) in &c.store.tensors {
        let companion = k.ends_with(".comfy_quant")
            || (k.ends_with(".weight_scale") && c.store.get(&k.replace(".weight_scale", ".weight")).is_some_and(|w| w.dtype == Dtype::I8));
        bytes += match t.dtype {
            _ if companion => 0,
            Dtype::Ggml(_) => (t.end - t.start) as u64,
            Dtype::I8 => (t.numel() + 4 * t.shape[0]) as u64,
            Dtype::BF16 => 2 * t.numel() as u64,
            // f16 and f32 tensors load as f32
            _ => 4 * t.numel() as u64,
        };
        if t.dtype.is_block_or_int8() {
            scratch = scratch.max(2 * t.numel() as u64);
        }
    }
    (bytes, scratch)
}

/// GGUF and int8 transformers plan on the GPU with their stored bytes (within the 16-byte alignment
/// of each matrix's parts) and the scratch of their largest matrix; the CPU plans them in f32.
#[test]
fn quantized_transformers_count_their_stored_bytes() {
    for (folder, file) in [("tiny-b", "quant/tiny-b-mixed.gguf"), ("tiny-b", "quant/tiny-b-int8.safetensors"), ("tiny-a", "quant/tiny-a-Q4_0.gguf")] {
        let ck = open(folder, file);
        let dit = ck.open_component_for_plan("transformer").unwrap();
        let (want, scratch) = from_the_file(&dit);
        let tensors = dit.store.tensors.len() as u64;
        let g = networks(&ck, &gpu(), 16, (64, 64)).unwrap();
        let got = g[1].weights;
        assert!(got >= want && got <= want + 3 * 16 * tensors, "{file}: planned {got} bytes, the file holds {want}");
        let plain = networks(&Checkpoint::open(locate(&golden(folder)).unwrap()).unwrap(), &gpu(), 16, (64, 64)).unwrap();
        assert!(got < plain[1].weights, "{file}: {got} bytes kept quantized, {} in bf16", plain[1].weights);
        assert_eq!(g[1].activations, plain[1].activations + scratch, "{file}: the activations and one dequantized matrix");
        let cpu = networks(&ck, &Budget::cpu(&NoActivations), 16, (64, 64)).unwrap();
        let all: u64 = dit.store.tensors.values().map(|t| 4 * t.numel() as u64).sum();
        assert!(cpu[1].weights <= all && cpu[1].weights > got, "{file}: the CPU loads f32 values: {} of {all}", cpu[1].weights);
    }
}

/// A LoRA update on a quantized matrix: the GPU dequantizes that matrix, merges in f32 and keeps it
/// in bf16 (ComfyUI-GGUF patches the dequantized weight; moss merges once, at load), so the plan
/// counts 2 bytes an element for it and the stored bytes for the others.
#[test]
fn quantized_matrices_with_a_lora_count_bf16() {
    let mut ck = open("tiny-a", "quant/tiny-a-Q4_0.gguf");
    let plain = ck.open_component_for_plan("transformer").unwrap();
    ck.attach_loras(&[crate::lora::LoraSpec { path: golden("lora/kohya.safetensors").into(), scale: 1.0 }]).unwrap();
    let dit = ck.open_component_for_plan("transformer").unwrap();
    let mut merged = 0;
    for i in 0..ck.dit.num_layers {
        for g in mats::block_matrix_names(i) {
            let refs: Vec<&str> = g.iter().map(String::as_str).collect();
            let numel: usize = g.iter().map(|n| dit.info(n).unwrap().numel()).sum();
            let kept = Layout::of(&plain, &refs).unwrap().expect("Q4_0 matrices are kept");
            let lora = g.iter().any(|n| !dit.lora_terms(n).is_empty());
            let bytes = stack_bytes(&dit, &g, 2, true).unwrap();
            if lora {
                merged += 1;
                assert!(Layout::of(&dit, &refs).unwrap().is_none(), "{g:?}: a merged matrix is not kept quantized");
                assert_eq!(bytes, 2 * numel as u64, "{g:?}: merged, bf16");
            } else {
                assert_eq!(bytes, kept.bytes as u64, "{g:?}: kept as stored");
            }
        }
    }
    assert!(merged > 0, "the adapter updates some block matrices");
}

/// The full-size DiT (42 blocks, dim 3072, FFN 8192) per format: the main blocks' matrices at the
/// format's bytes (Q8_0 8.5 bits a weight, Q6_K 6.5625, Q5_K 5.5, Q4_K 4.5, int8 8 and a scale a
/// row), the scratch the largest of them (ffn_up_gate, 16384 x 3072) in bf16.
#[test]
fn full_size_block_bytes_per_format() {
    use crate::checkpoint::ggml::GgmlType;
    use crate::checkpoint::kept::Format;
    let (d, f) = (3072usize, 8192usize);
    let block = [(3 * d, d), (d, d), (2 * f, d), (d, f)];
    let per_block = |fm: Format| -> usize { block.iter().map(|&(rows, k)| Layout::new(k, &[(rows, fm)]).bytes).sum() };
    let weights: usize = block.iter().map(|&(r, k)| r * k).sum();
    for (fm, bits) in
        [(Format::Ggml(GgmlType::Q8_0), 8.5), (Format::Ggml(GgmlType::Q6_K), 6.5625), (Format::Ggml(GgmlType::Q5_K), 5.5), (Format::Ggml(GgmlType::Q4_K), 4.5)]
    {
        assert_eq!(per_block(fm) as f64, weights as f64 * bits / 8.0, "{}", fm.name());
    }
    let rows: usize = block.iter().map(|b| b.0).sum();
    assert_eq!(per_block(Format::Int8 { convrot: Some(256) }), weights + 4 * rows);
    // 42 blocks at Q4_K: 2.49 GiB against 8.87 in bf16; with the other 0.33 B parameters (quantized
    // too) about 3 GB, the "a Q4_K DiT is ~3 GB"
    let q4 = 42.0 * per_block(Format::Ggml(GgmlType::Q4_K)) as f64 / GB as f64;
    assert!((2.45..2.55).contains(&q4), "{q4:.2} GiB");
}

/// The README's memory table: the planner at full size (1024x1024, bf16 activations as
/// `plan::tests` takes them, a 0.54 GiB context) with each format's byte counts: the DiT's
/// matrices (its 42 blocks and its other 0.33 B parameters) at the format's bytes, the text encoder
/// in bf16 (GGUF text encoders are not read), int8 or W4A8 (the comfy_quant rows: its layers
/// quantized, its embedding table bf16), plus the dequantized scratch of the largest matrix. Computed, not measured.
/// Every format keeps at least as many DiT blocks resident as bf16 at every cap.
#[test]
fn readme_memory_table_per_format() {
    use crate::checkpoint::ggml::GgmlType;
    use crate::checkpoint::kept::Format;
    use crate::plan::{plan_for_process, NetworkPlan};
    let (d, f) = (3072usize, 8192usize);
    let block = [(3 * d, d), (d, d), (2 * f, d), (d, f)];
    let params: usize = block.iter().map(|&(r, k)| r * k).sum();
    let bytes = |fm: Option<Format>, rows: usize, k: usize| -> u64 {
        match fm {
            None => (2 * rows * k) as u64,
            Some(fm) => Layout::new(k, &[(rows, fm)]).bytes as u64,
        }
    };
    let int8 = Some(Format::Int8 { convrot: None });
    // the text encoder's bits a weight: bf16, int8 (+ a row scale), W4A8 (4-bit codes + an e4m3
    // group scale every 16 weights; the row scales and codebook under 0.1 %)
    let nets = |fm: Option<Format>, te_bits: f64, int8_compute: bool| -> Vec<Network> {
        let mut all = full_size_bf16();
        let per_block: u64 = block.iter().map(|&(r, k)| bytes(fm, r, k)).sum();
        let other = bytes(fm, 326_000_000 / d, d);
        let scratch = if fm.is_some() { (2 * 2 * f * d) as u64 } else { 0 };
        let dit = &mut all[1];
        (dit.weights, dit.block_bytes, dit.all_blocks, dit.slot_bytes) = (42 * per_block + other, per_block, 42 * per_block, per_block);
        if int8_compute {
            // `--precision int8` (mats::Kind): the main matrices resident as int8 codes and row
            // scales; from the bf16 folder a streamed block moves its bf16 bytes and quantizes
            // them beside (Kind::Quantized), from an int8 file it moves its codes and scales as
            // stored (Kind::Int8Codes)
            let resident: u64 = block.iter().map(|&(r, k)| bytes(int8, r, k)).sum();
            let (slot, derived) = if fm.is_none() { (per_block, resident) } else { (resident, 0) };
            (dit.weights, dit.block_bytes, dit.all_blocks) = (42 * resident + other, resident, 42 * resident);
            (dit.slot_bytes, dit.derived_bytes) = (slot, derived);
        }
        dit.activations += scratch;
        if te_bits < 16.0 {
            let enc = &mut all[0];
            let layer = (enc.block_bytes as f64 * te_bits / 16.0) as u64;
            let rest = enc.weights - enc.all_blocks;
            (enc.weights, enc.block_bytes, enc.all_blocks, enc.slot_bytes) = (rest + 32 * layer, layer, 32 * layer, layer);
            enc.activations += (2 * 24_576 * 4096) as u64;
        }
        assert!(int8_compute || all[1].block_bytes == per_block, "{params} parameters a block");
        all
    };
    let (bf16_te, int8_te, w4a8_te) = (16.0, 8.0, 4.5);
    let rows: [(&str, Option<Format>, f64, bool); 10] = [
        ("bf16", None, bf16_te, false),
        ("Q8_0", Some(Format::Ggml(GgmlType::Q8_0)), bf16_te, false),
        ("INT8 (+ int8 text encoder)", Some(Format::Int8 { convrot: Some(256) }), int8_te, false),
        ("bf16 folder, --precision int8 (or fp8)", None, bf16_te, true),
        ("INT8 (+ int8 text encoder), --precision int8", Some(Format::Int8 { convrot: Some(256) }), int8_te, true),
        ("Q6_K", Some(Format::Ggml(GgmlType::Q6_K)), bf16_te, false),
        ("Q5_K", Some(Format::Ggml(GgmlType::Q5_K)), bf16_te, false),
        ("Q4_K", Some(Format::Ggml(GgmlType::Q4_K)), bf16_te, false),
        ("Q8_0 (+ W4A8 text encoder)", Some(Format::Ggml(GgmlType::Q8_0)), w4a8_te, false),
        ("Q4_K (+ W4A8 text encoder)", Some(Format::Ggml(GgmlType::Q4_K)), w4a8_te, false),
    ];
    let what = |n: &NetworkPlan| match n.placement {
        Placement::Resident => "resident".to_string(),
        Placement::Streamed { resident, blocks } => format!("{resident}/{blocks}"),
        Placement::Strips => "strips".to_string(),
    };
    let resident = |n: &NetworkPlan| match n.placement {
        Placement::Streamed { resident, .. } => resident,
        _ => 42,
    };
    let overhead = 553 << 20;
    let mut bf16_dit = vec![];
    println!("| transformer (text encoder) | DiT resident GiB | 6 / 8 / 12 / 16 / 24 GB: text encoder layers, transformer blocks resident |");
    for (i, (name, fm, te, compute)) in rows.iter().enumerate() {
        let n = nets(*fm, *te, *compute);
        let mut cells = vec![];
        for (j, cap) in [6u64, 8, 12, 16, 24].iter().enumerate() {
            let p = plan_for_process(cap * GB, overhead, &n).unwrap();
            let dit = resident(&p.networks[1]);
            if i == 0 {
                bf16_dit.push(dit);
            } else {
                assert!(dit >= bf16_dit[j], "{name} at {cap} GB: {dit} blocks resident, bf16 {}", bf16_dit[j]);
            }
            cells.push(format!("{} / {}", what(&p.networks[0]), what(&p.networks[1])));
        }
        println!("| {name} | {:.2} | {} |", n[1].weights as f64 / GB as f64, cells.join(" · "));
    }
}

/// The full-size networks in bf16 at 1024x1024 as `plan::tests` counts them (Qwen3.5-9B in
/// 32 layers with its 248320 x 4096 table, the DiT's 42 blocks and 0.33 B other parameters, the
/// VAE decoder in fp32; activations rough: 0.5 GiB, 1 GiB, 3 GiB whole or an eighth in strips).
fn full_size_bf16() -> Vec<Network> {
    use crate::plan::PREFETCH;
    let block_params = 4 * 3072 * 3072 + 3 * 3072 * 8192;
    let embed = 248_320 * 4096;
    let enc_layer = (9_000_000_000 - embed - 50_000_000) / 32;
    let px = 1024 * 1024;
    let net = |name, weights, blocks, block: u64, host_only, activations, strips| Network {
        name,
        weights,
        blocks,
        block_bytes: block,
        all_blocks: blocks * block,
        slot_bytes: block,
        derived_bytes: 0,
        ahead: if blocks > 0 { PREFETCH } else { 0 },
        host_only,
        activations,
        strip_activations: strips,
    };
    vec![
        net("text_encoder", (embed + 32 * enc_layer + 50_000_000) * 2, 32, enc_layer * 2, embed * 2, 512 << 20, None),
        net("transformer", (42 * block_params + 326_000_000) * 2, 42, block_params * 2, 0, px * 1024, None),
        net("vae", 84_000_000 * 4, 0, 0, 0, px * 3 * 1024, Some(px * 3 * 1024 / 8)),
    ]
}
