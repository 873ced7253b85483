//! `moss bench-vae-encode` (hidden): the VAE encoder alone on a picture (spec 7.4), as `generate
//! --init-image` runs it (whole or in row strips as the plan says), CUDA-synchronised timings,
//! JSON out; optionally writes the latents (raw little-endian f32 `[1, 128, H/16, W/16]`) for
//! the comparison with diffusers (bench/encode.sh).

use anyhow::{bail, Result};
use moss::backend::cuda::ops::Cuda;
use moss::backend::ops::VaeEncodeOps;
use moss::backend::{Backend, Device};
use moss::model::vae::VaeEncoder;
use moss::pipeline;
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
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}

pub fn run(a: &BenchVaeEncode, device: Device) -> Result<String> {
    let Device::Cuda(n) = device else { bail!("bench-vae-encode runs on cuda") };
    let cuda = Cuda::new(n, moss::options::Precision::Fp32)?;
    let ck = pipeline::open_checkpoint(&a.model)?;
    let x = pipeline::read_init_picture(&a.image, "--image")?;
    let (h, w) = (x.shape[2], x.shape[3]);
    let t0 = Instant::now();
    let comp = ck.open_component("vae")?;
    cuda.plan_vae_encode(&comp, &ck.vae, h, w)?;
    let enc = VaeEncoder::load(&cuda, &comp, &ck.vae)?;
    cuda.sync()?;
    let load_s = t0.elapsed().as_secs_f64();
    let split = enc.split_for(&cuda, h, w)?;
    let mut z = enc.encode(&cuda, &x)?; // warm-up (kernel loading, cuBLASLt plans, the memory pool)
    let mut ms = vec![];
    for _ in 0..a.reps.max(1) {
        let t = Instant::now();
        z = enc.encode(&cuda, &x)?;
        cuda.sync()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    if let Some(p) = &a.out_f32 {
        std::fs::write(p, z.data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }
    let used = cuda.gpu().mem_info().map(|m| m.1 - m.0).unwrap_or(0);
    Ok(serde_json::json!({
        "device": cuda.name(),
        "picture": [h, w],
        "latents": z.shape,
        "split": format!("{split:?}"),
        "load_s": load_s,
        "encode_ms": ms,
        "encode_ms_median": median(&ms),
        "gpu_used_bytes_after": used,
    })
    .to_string())
}
