//! The host's share of a full-size LoRA (rank 64 on the six linears of all 42 DiT blocks, kohya
//! naming, stored as bf16 and as f16; written to a temp folder), the former way and the present
//! way, on this machine's CPU (no GPU needed; the device's share is `moss check`'s and `moss
//! generate --json`'s):
//!
//! - reading: formerly the whole file read, every factor converted to an f32 vector and copied
//!   once more while mapping keys, and the FNV hash of the file before returning; now the file
//!   mapped and its keys mapped, the hash on a thread of its own;
//! - the merge's preparation, tensor after tensor: formerly each factor's rows converted into a
//!   fresh f32 byte vector (`to_bytes`) and then copied into the pinned staging chunk; now the
//!   stored bytes written once into the upload ring (bf16 as they are, widened on the device; f16
//!   converted to f32 as it is written).
//!
//! `cargo test --release --test lora_prep -- --ignored --nocapture` prints the times (the best
//! of three runs of each). The test
//! checks that both ways give the device the same f32 values (the ring's bf16 widened on the host
//! here as the device widens them) and the same file hash.

use moss::backend::cuda::lora::{parts_of, upload_len, widens, write_upload};
use moss::backend::cuda::ops::{to_bytes, DType};
use moss::checkpoint::{Dtype, TensorInfo, TensorStore};
use moss::lora::keys::{Delta, Mat, Module};
use moss::lora::merge::operands;
use moss::lora::{LoraSpec, Plan};
use std::collections::BTreeMap;
use std::time::Instant;

const LAYERS: usize = 42;
const DIM: usize = 3072;
const FFN: usize = 8192;
const RANK: usize = 64;
/// The upload ring's size (src/backend/cuda/ops/ring.rs).
const RING: usize = 32 << 20;

/// The DiT's block linears: name, rows, columns.
fn linears() -> Vec<(String, usize, usize)> {
    let shapes = [("q", DIM, DIM), ("k", DIM, DIM), ("v", DIM, DIM), ("o", DIM, DIM), ("ffn_up_gate", 2 * FFN, DIM), ("ffn_down", DIM, FFN)];
    (0..LAYERS).flat_map(|l| shapes.map(|(p, o, i)| (format!("layers.{l}.proj.{p}"), o, i))).collect()
}

/// A transformer with those weights (shapes only: the LoRA is checked against names and shapes).
fn model() -> TensorStore {
    let info = |o, i| TensorInfo { dtype: Dtype::BF16, shape: vec![o, i], file: 0, start: 0, end: 0 };
    let tensors = linears().into_iter().map(|(n, o, i)| (format!("{n}.weight"), info(o, i))).collect();
    TensorStore { dir: "/nonexistent".into(), files: vec![], tensors }
}

/// `n` values of standard deviation `std` as `dtype` (bf16 or f16; a fixed generator: the file is
/// the same each run).
fn noise(dtype: Dtype, n: usize, seed: u64, std: f32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(2 * n);
    for _ in 0..n {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let u = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.46 * std;
        match dtype {
            Dtype::BF16 => out.extend_from_slice(&half::bf16::from_f32(u).to_le_bytes()),
            _ => out.extend_from_slice(&half::f16::from_f32(u).to_le_bytes()),
        }
    }
    out
}

fn write_lora(path: &std::path::Path, dtype: Dtype) {
    use safetensors::{tensor::TensorView, Dtype as D};
    let d = if dtype == Dtype::BF16 { D::BF16 } else { D::F16 };
    let mut t: Vec<(String, Vec<usize>, D, Vec<u8>)> = vec![];
    for (k, (n, o, i)) in linears().into_iter().enumerate() {
        let stem = format!("lora_unet_{}", n.replace('.', "_"));
        let k = k as u64;
        t.push((format!("{stem}.lora_down.weight"), vec![RANK, i], d, noise(dtype, RANK * i, 2 * k, 1.0 / (i as f32).sqrt())));
        t.push((format!("{stem}.lora_up.weight"), vec![o, RANK], d, noise(dtype, o * RANK, 2 * k + 1, 1e-3)));
        t.push((format!("{stem}.alpha"), vec![], D::F32, (RANK as f32).to_le_bytes().to_vec()));
    }
    let views: Vec<(String, TensorView)> = t.iter().map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The former reading: the whole file, every tensor to f32, each copied again while mapping keys
/// (`keys::map` cloned its factors), and the hash. Returns the f32 factors by key and the hash.
fn former_read(path: &std::path::Path) -> (BTreeMap<String, Mat>, String) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out = BTreeMap::new();
    for (name, v) in st.tensors() {
        let dtype = match v.dtype() {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F16 => Dtype::F16,
            _ => Dtype::F32,
        };
        let data = moss::checkpoint::tensors::decode_f32(dtype, v.data()).unwrap();
        out.insert(name, Mat::new(v.shape().to_vec(), data.clone()));
    }
    (out, moss::lora::short_hash(&bytes))
}

/// The fastest of [`REPS`] runs of `f` (the machine may be shared), and `f`'s last value.
fn best<T>(mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..REPS {
        let t = Instant::now();
        last = Some(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, last.expect("REPS > 0"))
}

const REPS: usize = 3;

#[test]
#[ignore = "a measurement at full size (writes a 283 MiB file); run with --ignored --nocapture"]
fn host_share_of_a_full_size_lora() {
    for dtype in [Dtype::BF16, Dtype::F16] {
        measure(dtype);
    }
}

fn measure(dtype: Dtype) {
    let dir = std::env::temp_dir().join(format!("moss-lora-prep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("r64.safetensors");
    write_lora(&file, dtype);
    let size = std::fs::metadata(&file).unwrap().len();
    let store = model();
    let _ = std::fs::read(&file).unwrap(); // in the page cache, as for a LoRA used before

    let (former_read_s, (former, former_hash)) = best(|| former_read(&file));
    let spec = LoraSpec { path: file.clone(), scale: 1.0 };
    let (mut read_s, mut plan) = (f64::INFINITY, None);
    for _ in 0..REPS {
        let t = Instant::now();
        let p = Plan::new(moss::lora::load_all(std::slice::from_ref(&spec), &store).unwrap());
        read_s = read_s.min(t.elapsed().as_secs_f64());
        p.adapters()[0].hash.get(); // its thread joined outside the time, before the next run
        plan = Some(p);
    }
    let plan = plan.unwrap();
    assert_eq!(plan.adapters()[0].hash.get(), former_hash, "the file's hash");
    let (hash_s, _) = best(|| moss::lora::short_hash(&std::fs::read(&file).unwrap()));

    // The same modules with the former f32 factors, to run the former preparation on.
    let former_modules: Vec<Module> = plan.adapters()[0]
        .modules
        .iter()
        .map(|m| {
            let stem = m.key.as_str();
            let f = |part: &str| former[&format!("{stem}.lora_{part}.weight")].clone();
            let Delta::LowRank { alpha, .. } = &m.delta else { panic!("{stem}: low rank") };
            Module { key: m.key.clone(), targets: m.targets.clone(), delta: Delta::LowRank { up: f("up"), down: f("down"), alpha: *alpha } }
        })
        .collect();

    let names: Vec<String> = plan.tensors().map(String::from).collect();
    let rows = |n: &str| store.get(n).unwrap().shape[0];
    // Former: each factor to a fresh f32 byte vector, then into the (pinned) staging chunk.
    let mut staging = vec![0u8; 64 << 20];
    let (former_prep_s, former_bytes) = best(|| {
        let mut bytes = 0;
        for m in &former_modules {
            let term = moss::lora::Term { module: m, row0: 0, scale: 1.0 };
            let (ops, _) = operands(&term, rows(&m.targets[0].0)).unwrap();
            for p in parts_of(&ops) {
                let b = to_bytes(&p.data.f32(), DType::F32);
                staging[..b.len()].copy_from_slice(&b);
                bytes += b.len();
            }
        }
        bytes
    });
    // Present: the stored bytes written once into the ring, tensor after tensor, wrapping.
    let mut ring = vec![0u8; RING];
    let (prep_s, ring_bytes) = best(|| {
        let (mut head, mut bytes) = (0, 0);
        for n in &names {
            for term in plan.terms(n) {
                let (ops, _) = operands(&term, rows(n)).unwrap();
                let parts = parts_of(&ops);
                let need: usize = parts.iter().map(|p| upload_len(p).next_multiple_of(256)).sum();
                if head + need > RING {
                    head = 0;
                }
                for p in parts {
                    let len = upload_len(p);
                    write_upload(p, &mut ring[head..head + len]);
                    head += len.next_multiple_of(256);
                    bytes += len;
                }
            }
        }
        bytes
    });

    // Both give the device the same f32 values: check a block's six weights.
    for m in former_modules.iter().filter(|m| m.key.contains("layers_7_")) {
        let name = &m.targets[0].0;
        let (old, _) = operands(&moss::lora::Term { module: m, row0: 0, scale: 1.0 }, rows(name)).unwrap();
        let terms = plan.terms(name);
        let (new, _) = operands(&terms[0], rows(name)).unwrap();
        for (a, b) in parts_of(&old).into_iter().zip(parts_of(&new)) {
            let mut up = vec![0u8; upload_len(b)];
            write_upload(b, &mut up);
            let got: Vec<u8> = if widens(b) {
                up.chunks_exact(2).flat_map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes()).collect()
            } else {
                up
            };
            assert_eq!(got, to_bytes(&a.data.f32(), DType::F32), "{name}: the factor's f32 values");
        }
    }

    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    println!("full-size rank-{RANK} {} LoRA: {} MiB, {} tensors, {} cores (best of {REPS})", dtype.name(), size >> 20, names.len(), std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("  read + check: former {former_read_s:.3} s (the hash's {hash_s:.3} s included) | now {read_s:.3} s (the hash on a thread of its own)");
    println!("  merge prep:   former {former_prep_s:.3} s ({:.0} MiB of f32, then staged) | now {prep_s:.3} s ({:.0} MiB into the ring)", mib(former_bytes), mib(ring_bytes));
    std::fs::remove_dir_all(&dir).unwrap();
}
