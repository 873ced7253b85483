//! `moss bench-vae` (hidden): the VAE decoder alone on raw latents, CUDA-synchronised timings,
//! JSON out; optionally writes the raw float picture (`[3, H, W]` f32, not clamped) and the RGB8
//! bytes (HWC) for an error table against a float64 decode (bench/vae.sh).

use anyhow::{bail, Result};
use moss::backend::cuda::ops::Cuda;
use moss::backend::{Backend, Device};
use moss::model::vae::VaeDecoder;
use moss::pipeline;
use moss::tensor::Tensor;
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
    /// Strip mode ([`strips`]): strips of this many rows, `keep_gib` GiB of kept pictures on the
    /// device (0: all in host memory); or the planner's split for `plan_free_gib` GiB free.
    pub strip_rows: Option<usize>,
    pub keep_gib: Option<f64>,
    pub plan_free_gib: Option<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}

pub fn run(a: &BenchVae, device: Device) -> Result<String> {
    let Device::Cuda(n) = device else { bail!("bench-vae runs on cuda") };
    let cuda = Cuda::new(n, moss::options::Precision::Fp32)?;
    let ck = pipeline::open_checkpoint(&a.model)?;
    let c = ck.dit.latent_channels;
    let bytes = moss::bounded::read_bounded(&a.latents, pipeline::max_latents_bytes(c), "latents")?;
    let (h, w) = pipeline::latent_grid(bytes.len() as u64, c, None)?;
    let data: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let z = Tensor::new(vec![1, c, h, w], data)?;
    let t0 = Instant::now();
    let comp = ck.open_component("vae")?;
    let vae = VaeDecoder::load(&cuda, &comp, &ck.vae)?;
    cuda.sync()?;
    let load_s = t0.elapsed().as_secs_f64();
    if a.strip_rows.is_some() || a.plan_free_gib.is_some() {
        return strips(a, &cuda, &vae, &ck.vae, &z);
    }
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
    moss::backend::cuda::profile::start(moss::backend::cuda::profile::Mode::Synced);
    let t = Instant::now();
    drop(vae.forward(&cuda, &gz)?);
    cuda.sync()?;
    let prof_total = t.elapsed().as_secs_f64() * 1e3;
    let mut ops = moss::backend::cuda::profile::take()?.ops;
    moss::backend::cuda::profile::stop();
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

/// Strip mode: the pipeline's whole decode (`decode_rgb8`, one warm-up, then `reps`) against
/// the split decode (`reps`, the first one included: it pins the host memory of host-kept
/// pictures), the RGB8 bytes compared, each side's peak of the device pool, what the split kept
/// where and the bytes it moved between host and device.
fn strips(a: &BenchVae, cuda: &Cuda, vae: &VaeDecoder<Cuda>, cfg: &moss::checkpoint::config::VaeConfig, z: &Tensor) -> Result<String> {
    use moss::model::vae::Split;
    let (h, w) = (z.shape[2], z.shape[3]);
    const GIB: f64 = (1u64 << 30) as f64;
    let split = match (a.plan_free_gib, a.strip_rows) {
        (Some(g), _) => match moss::backend::cuda::vae::strip_plan_for(cfg, h, w, (g * GIB) as usize)? {
            Some(p) => Split::strips_keeping(p.rows, p.keep_bytes),
            None => Split::Whole,
        },
        (None, Some(rows)) => Split::strips_keeping(rows, (a.keep_gib.unwrap_or(0.0) * GIB) as usize),
        (None, None) => bail!("strip mode needs --strip-rows or --plan-free-gib"),
    };
    let reps = a.reps.max(1);
    let time = |split: Split| -> Result<(Vec<f64>, Vec<u8>, Option<moss::model::vae::SplitReport>, u64)> {
        cuda.pool_high_water(true)?;
        let mut ms = vec![];
        let mut last = (vec![], None);
        for _ in 0..reps {
            let t = Instant::now();
            last = vae.decode_rgb8_report(cuda, z, split)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok((ms, last.0, last.1, cuda.pool_high_water(false)?))
    };
    drop(vae.decode_rgb8_with(cuda, z, Split::Whole)?); // warm-up
    let (whole_ms, whole_rgb, _, whole_high) = time(Split::Whole)?;
    let (split_ms, split_rgb, report, split_high) = time(split)?;
    if let Some(p) = &a.out_rgb {
        std::fs::write(p, &split_rgb)?;
    }
    let tail = |v: &[f64]| if v.len() > 1 { median(&v[1..]) } else { v[0] };
    let r = report.unwrap_or_default();
    Ok(serde_json::json!({
        "device": cuda.name(),
        "picture": [h * 16, w * 16],
        "split": format!("{split:?}"),
        "whole_ms": whole_ms,
        "whole_ms_median": median(&whole_ms),
        "split_ms": split_ms,
        "split_ms_median_after_first": tail(&split_ms),
        "split_over_whole": tail(&split_ms) / median(&whole_ms),
        "identical_rgb8": whole_rgb == split_rgb,
        "pool_peak_bytes_whole": whole_high,
        "pool_peak_bytes_split": split_high,
        "kept_peak_bytes": r.kept_peak_bytes,
        "device_pictures": r.device_pictures,
        "host_pictures": r.host_pictures,
        "host_bytes_moved": r.host_bytes_moved,
        "planner": {
            "whole_bytes": moss::backend::cuda::vae::vae_activation_bytes(cfg, h, w),
            "mid_bytes": moss::backend::cuda::vae::vae_mid_bytes(cfg, h, w),
            "keep_all_bytes": moss::backend::cuda::vae::vae_keep_bytes(cfg, h, w),
            "strip_bytes": match split { Split::Strips(s) => moss::backend::cuda::vae::vae_strip_bytes(cfg, h, w, s.rows), Split::Whole => 0 },
        },
    })
    .to_string())
}
