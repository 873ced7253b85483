//! Checkpoint folders made for a test: golden components copied, a transformer rewritten
//! tensor by tensor (stored dtypes, extra or missing tensors).

use super::golden;
use moss::checkpoint::{Checkpoint, Dtype, TensorInfo, TensorStore};
use std::path::{Path, PathBuf};

/// An empty folder of this process under the temp dir.
pub fn scratch(prefix: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-{prefix}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).unwrap();
        }
    }
}

/// A pipeline folder `dir/<tag>`: golden `base`'s components, `transformer` from `transformer`.
pub fn with_transformer(base: &str, transformer: &Path, dir: &Path, tag: &str) -> PathBuf {
    let root = dir.join(tag);
    for e in std::fs::read_dir(golden().join(base)).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap();
        if name == "transformer" {
            continue;
        }
        if p.is_dir() {
            copy_dir(&p, &root.join(name));
        } else {
            std::fs::copy(&p, root.join(name)).unwrap();
        }
    }
    copy_dir(transformer, &root.join("transformer"));
    root
}

/// tiny-b with the float8-stored transformer of golden/tiny-b-fp8, as `dir/tiny-b-fp8`.
pub fn tiny_b_fp8(dir: &Path) -> PathBuf {
    with_transformer("tiny-b", &golden().join("tiny-b-fp8/transformer"), dir, "tiny-b-fp8")
}

pub fn open(root: &Path) -> Checkpoint {
    Checkpoint::open(moss::checkpoint::locate(root.to_str().unwrap()).unwrap()).unwrap()
}

/// One stored tensor: name, dtype, shape, little-endian bytes.
pub type Stored = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

pub fn st_dtype(d: Dtype) -> safetensors::Dtype {
    match d {
        Dtype::BF16 => safetensors::Dtype::BF16,
        Dtype::F16 => safetensors::Dtype::F16,
        Dtype::F32 => safetensors::Dtype::F32,
        Dtype::F64 => safetensors::Dtype::F64,
        Dtype::I64 => safetensors::Dtype::I64,
        Dtype::F8E4M3 => safetensors::Dtype::F8_E4M3,
        Dtype::F8E5M2 => safetensors::Dtype::F8_E5M2,
        Dtype::I8 => safetensors::Dtype::I8,
        // the byte tensors of comfy_quant files (their JSON)
        Dtype::Other => safetensors::Dtype::U8,
        Dtype::Ggml(_) | Dtype::W4a8 { .. } => panic!("a dtype safetensors does not store in a golden transformer"),
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect()
}

/// The tensor as stored, unchanged.
pub fn as_stored(name: &str, info: &TensorInfo, bytes: &[u8]) -> Vec<Stored> {
    vec![(name.to_string(), st_dtype(info.dtype), info.shape.clone(), bytes.to_vec())]
}

/// `layers.N.proj.*.weight`: a main block's matrix.
pub fn is_main_matrix(name: &str) -> bool {
    name.starts_with("layers.") && name.contains(".proj.") && name.ends_with(".weight")
}

/// `dir/transformer/`: the transformer folder `src` (config and tensors, sharded or not) in one
/// file, every tensor passed through `f` (which gives what to store in its place).
pub fn rewrite(src: &Path, dir: &Path, f: impl Fn(&str, &TensorInfo, &[u8]) -> Vec<Stored>) -> PathBuf {
    let out = dir.join("transformer");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(src.join("config.json"), out.join("config.json")).unwrap();
    let store = TensorStore::open(src).unwrap();
    let mut all: Vec<Stored> = vec![];
    for (name, info) in &store.tensors {
        all.extend(f(name, info, store.bytes(info)));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        all.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &out.join("diffusion_pytorch_model.safetensors")).unwrap();
    out
}

/// A LoRA for tiny-b: a fused q|k|v update on block 0 (whose q, k, v are stored with a per-row, a
/// per-row [out, 1] and a per-tensor scale) and a kohya one on block 1's ffn_down.
pub fn tiny_b_lora(dir: &Path) -> PathBuf {
    let p = dir.join("b.safetensors");
    let pat = |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * k).collect() };
    let (d, f, r) = (256, 128, 4);
    let t: Vec<Stored> = vec![
        ("transformer.layers.0.proj.qkv.lora_A.weight".into(), safetensors::Dtype::F32, vec![r, d], f32_bytes(&pat(r * d, 0.6))),
        ("transformer.layers.0.proj.qkv.lora_B.weight".into(), safetensors::Dtype::F32, vec![3 * d, r], f32_bytes(&pat(3 * d * r, 0.2))),
        ("transformer.layers.0.proj.qkv.alpha".into(), safetensors::Dtype::F32, vec![], f32_bytes(&[2.0])),
        ("lora_unet_layers_1_proj_ffn_down.lora_down.weight".into(), safetensors::Dtype::F32, vec![r, f], f32_bytes(&pat(r * f, 0.6))),
        ("lora_unet_layers_1_proj_ffn_down.lora_up.weight".into(), safetensors::Dtype::F32, vec![d, r], f32_bytes(&pat(d * r, 0.2))),
        ("lora_unet_layers_1_proj_ffn_down.alpha".into(), safetensors::Dtype::F32, vec![], f32_bytes(&[4.0])),
    ];
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        t.iter().map(|(n, dt, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &p).unwrap();
    p
}
