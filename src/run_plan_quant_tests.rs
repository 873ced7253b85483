//! The planner with quantized single-file components: on the GPU a quantized matrix counts its
//! stored bytes (ggml blocks; int8 codes and a scale a row), its products a dequantized scratch of
//! the largest one, and a matrix with a LoRA update its bf16 bytes (it is dequantized, merged and
//! kept in bf16); the CPU counts every value in f32.

use super::*;
use crate::checkpoint::{locate, Checkpoint, ComponentFiles, Dtype};

const GB: u64 = 1 << 30;

fn golden(p: &str) -> String {
    format!("{}/golden/{p}", env!("CARGO_MANIFEST_DIR"))
}

fn open(folder: &str, transformer: &str) -> Checkpoint {
    let files = ComponentFiles { transformer: Some(golden(transformer).into()), text_encoder: None };
    Checkpoint::open_with(locate(&golden(folder)).unwrap(), files).unwrap()
}

fn gpu() -> Budget {
    Budget { memory: Some((80 * GB, 80 * GB)), overhead: 0, bf16_loaded: 2, act: DType::BF16, linears: MainLinears::Dense }
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
        let cpu = networks(&ck, &Budget::cpu(), 16, (64, 64)).unwrap();
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
