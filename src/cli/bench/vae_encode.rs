//! `moss bench-vae-encode` (hidden): the VAE encoder alone on a picture (spec 7.4), as `generate
//! --init-image` runs it (whole or in row strips, as the plan says), timed after a warm-up
//! (CUDA-synchronised on the GPU; the CPU reference for smoke runs), JSON out; optionally writes
//! the latents (raw little-endian f32 `[1, 128, H/16, W/16]`) for the comparison with diffusers
//! (bench/img2img.py).

use anyhow::Result;
use moss::backend::cpu::Cpu;
use moss::backend::ops::VaeEncodeOps;
use moss::backend::Device;
use moss::checkpoint::Checkpoint;
use moss::model::vae::VaeEncoder;
use moss::pipeline;
use moss::tensor::Tensor;
use std::path::PathBuf;
use std::time::Instant;

pub struct BenchVaeEncode {
    pub model: String,
    pub image: PathBuf,
    /// Timed repetitions (after one warm-up).
    pub reps: usize,
    pub out_f32: Option<PathBuf>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

pub fn run(a: &BenchVaeEncode, device: Device) -> Result<String> {
    let ck = pipeline::open_checkpoint(&a.model)?;
    let x = pipeline::read_init_picture(&a.image, "--image")?;
    let (j, used) = match device {
        Device::Cuda(n) => {
            let cuda = pipeline::cuda(n, moss::options::Precision::Fp32)?;
            let j = time(&cuda, &ck, &x, a, || cuda.sync())?;
            (j, cuda.gpu().mem_info().map(|m| m.1 - m.0).unwrap_or(0))
        }
        Device::Cpu => (time(&Cpu, &ck, &x, a, || Ok(()))?, 0),
    };
    let mut j = j;
    j["gpu_used_bytes_after"] = used.into();
    Ok(j.to_string())
}

fn time<B: VaeEncodeOps>(b: &B, ck: &Checkpoint, x: &Tensor, a: &BenchVaeEncode, sync: impl Fn() -> Result<()>) -> Result<serde_json::Value> {
    let (h, w) = (x.shape[2], x.shape[3]);
    let t0 = Instant::now();
    let comp = ck.open_component("vae")?;
    b.plan_vae_encode(&comp, &ck.vae, h, w)?;
    let enc = VaeEncoder::load(b, &comp, &ck.vae)?;
    sync()?;
    let load_s = t0.elapsed().as_secs_f64();
    let split = enc.split_for(b, h, w)?;
    let mut z = enc.encode(b, x)?; // warm-up (kernel loading, cuBLASLt plans, the memory pool)
    let mut ms = vec![];
    for _ in 0..a.reps.max(1) {
        let t = Instant::now();
        z = enc.encode(b, x)?;
        sync()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    if let Some(p) = &a.out_f32 {
        std::fs::write(p, z.data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }
    Ok(serde_json::json!({
        "device": b.name(),
        "picture": [h, w],
        "latents": z.shape,
        "split": format!("{split:?}"),
        "load_s": load_s,
        "encode_ms": ms,
        "encode_ms_median": median(&ms),
    }))
}
