//! `moss bench-vae` (hidden): the VAE decoder alone on raw latents, CUDA-synchronised timings,
//! JSON out; optionally writes the raw float picture (`[3, H, W]` f32, not clamped) and the RGB8
//! bytes (HWC) for an error table against a float64 decode (bench/vae_gpu.sh).

use crate::backend::cuda::ops::Cuda;
use crate::backend::ops::VaeOps;
use crate::backend::{Backend, Device};
use crate::model::vae::VaeDecoder;
use crate::pipeline;
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::Instant;

pub struct BenchVae {
    pub model: String,
    pub latents: PathBuf,
    /// Timed repetitions (after one warm-up).
    pub reps: usize,
    pub out_f32: Option<PathBuf>,
    pub out_rgb: Option<PathBuf>,
    /// Only `decode_rgb8` (split as planned): no whole forward, no profile.
    pub decode_only: bool,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}

pub fn run(a: &BenchVae, device: Device) -> Result<String> {
    let Device::Cuda(n) = device else { bail!("bench-vae runs on cuda") };
    let cuda = Cuda::new(n, crate::options::Precision::Fp32)?;
    let ck = pipeline::open_checkpoint(&a.model)?;
    let c = ck.dit.latent_channels;
    let meta = std::fs::metadata(&a.latents)?;
    let (h, w) = pipeline::latent_grid(meta.len(), c, None)?;
    let bytes = std::fs::read(&a.latents)?;
    let data: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let z = Tensor::new(vec![1, c, h, w], data)?;
    let t0 = Instant::now();
    let comp = ck.open_component("vae")?;
    let vae = VaeDecoder::load(&cuda, &comp, &ck.vae)?;
    cuda.sync()?;
    let load_s = t0.elapsed().as_secs_f64();
    // The whole decode as the pipeline runs it: upload, forward, clamp + round on the GPU, bytes
    // back; `reps` times (ms each) and the last picture.
    let decodes = || -> Result<(Vec<f64>, Vec<u8>)> {
        let (mut full, mut rgb) = (vec![], vec![]);
        for _ in 0..a.reps.max(1) {
            let t = Instant::now();
            rgb = vae.decode_rgb8(&cuda, &z)?;
            full.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok((full, rgb))
    };
    if a.decode_only {
        let split = vae.split_for(&cuda, h, w)?;
        let (full, rgb) = decodes()?;
        if let Some(p) = &a.out_rgb {
            std::fs::write(p, &rgb)?;
        }
        let (free, total) = cuda.gpu().mem_info()?;
        return Ok(serde_json::json!({
            "device": cuda.name(),
            "picture": [h * 16, w * 16],
            "split": format!("{split:?}"),
            "decode_rgb8_ms": full,
            "decode_rgb8_ms_median": median(&full),
            "gpu_free_total_bytes_after": [free, total],
        })
        .to_string());
    }
    let gz = cuda.upload_f32(&z)?;
    // Warm-up (kernel loading, cuBLASLt plans, the memory pool).
    let img = vae.forward(&cuda, &gz)?;
    cuda.sync()?;
    drop(img);
    let mut fwd = vec![];
    for _ in 0..a.reps.max(1) {
        let t = Instant::now();
        let img = vae.forward(&cuda, &gz)?;
        cuda.sync()?;
        fwd.push(t.elapsed().as_secs_f64() * 1e3);
        drop(img);
    }
    let (full, rgb) = decodes()?;
    // One more forward with every op synchronised and timed (not part of the timings above).
    crate::backend::cuda::profile::start(crate::backend::cuda::profile::Mode::Synced);
    let t = Instant::now();
    drop(vae.forward(&cuda, &gz)?);
    cuda.sync()?;
    let prof_total = t.elapsed().as_secs_f64() * 1e3;
    let mut ops = crate::backend::cuda::profile::take()?.ops;
    crate::backend::cuda::profile::stop();
    ops.sort_by(|a, b| a.op.cmp(&b.op));
    let prof: Vec<serde_json::Value> = ops.into_iter().map(|o| serde_json::json!({"op": o.op, "ms": o.gpu_ms, "calls": o.calls})).collect();
    if let Some(p) = &a.out_f32 {
        let img = cuda.download(&vae.forward(&cuda, &gz)?)?;
        let b: Vec<u8> = img.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(p, b)?;
    }
    if let Some(p) = &a.out_rgb {
        std::fs::write(p, &rgb)?;
    }
    let peak = cuda.gpu().mem_info().map(|m| m.1 - m.0).unwrap_or(0);
    Ok(serde_json::json!({
        "device": cuda.name(),
        "latents": [1, c, h, w],
        "picture": [h * 16, w * 16],
        "conv": "F16",
        "split_of_decode_rgb8": format!("{:?}", vae.split_for(&cuda, h, w)?),
        "load_s": load_s,
        "forward_ms": fwd,
        "forward_ms_median": median(&fwd),
        "decode_rgb8_ms": full,
        "decode_rgb8_ms_median": median(&full),
        "gpu_used_bytes_after": peak,
        "profile_total_ms": prof_total,
        "profile": prof,
    })
    .to_string())
}
