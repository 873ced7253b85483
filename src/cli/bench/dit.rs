//! `moss bench-dit` (hidden): the DiT stage alone, for timing and for comparing backends.
//!
//! Loads only `transformer/` on the chosen backend (after the stage's memory plan), reads the
//! text conditions from an embeds file (`moss encode`, or a script's random hidden states),
//! then: `forwards` timed forwards of the conditional pass at the first step's timestep on the
//! seed's torch-identical noise (synchronised wall time each, median reported), optionally its
//! velocity written out, and unless `forward_only` the full guided loop (the pipeline's own
//! `denoise_with`), timed and its latents written. One JSON line on stdout.

use anyhow::{bail, Result};
use moss::backend::cpu::Cpu;
use moss::backend::ops::{DitOps, VaeOps};
use moss::backend::Device;
use moss::checkpoint::Checkpoint;
use moss::model::dit::Dit;
use moss::options::Precision;
use moss::pipeline::{self, Request, Silent};
use moss::tensor::Tensor;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct BenchDit {
    pub model: String,
    pub embeds: PathBuf,
    pub width: u32,
    pub height: u32,
    pub steps: u32,
    pub seed: u64,
    pub guidance: f32,
    pub uncond_skip: Vec<usize>,
    pub skip_window: (f64, f64),
    pub precision: Precision,
    pub forwards: usize,
    pub forward_only: bool,
    pub save_latents: Option<PathBuf>,
    pub save_velocity: Option<PathBuf>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

pub fn run(a: &BenchDit, device: Device) -> Result<serde_json::Value> {
    let ck = moss::pipeline::open_checkpoint(&a.model)?; // with --transformer / --text-encoder
    let mut e = moss::embeds::read(&a.embeds)?;
    // As `generate --embeds` feeds them: F32 hidden states rounded to bf16 at --precision bf16.
    for x in [&mut e.cond, &mut e.uncond] {
        x.hidden = moss::pipeline::stage_boundary(x.hidden.clone(), a.precision);
    }
    if e.cond.hidden.shape[1] != ck.dit.text_dim {
        bail!("{}: hidden states are {} wide, the transformer takes {}", a.embeds.display(), e.cond.hidden.shape[1], ck.dit.text_dim);
    }
    moss::options::parse_size(&format!("{}x{}", a.width, a.height)).map_err(anyhow::Error::msg)?;
    match device {
        Device::Cpu => run_on(&Cpu, &ck, a, &e.cond.hidden, &e.uncond.hidden, &|| Ok(()), "cpu"),
        Device::Cuda(n) => {
            let b = pipeline::cuda(n, a.precision)?;
            let name = format!("cuda:{n} ({})", b.gpu().name);
            run_on(&b, &ck, a, &e.cond.hidden, &e.uncond.hidden, &|| b.sync(), &name)
        }
    }
}

fn run_on<B: DitOps + VaeOps>(
    b: &B,
    ck: &Checkpoint,
    a: &BenchDit,
    cond: &Tensor,
    uncond: &Tensor,
    sync: &dyn Fn() -> Result<()>,
    device: &str,
) -> Result<serde_json::Value> {
    let (h, w) = ((a.height / 16) as usize, (a.width / 16) as usize);
    let c = ck.dit.latent_channels;
    let t0 = Instant::now();
    let comp = ck.open_component("transformer")?;
    b.plan_dit(&comp, &ck.dit, h * w, cond.shape[0].max(uncond.shape[0]))?;
    let dit = Dit::load(b, &comp, &ck.dit, moss::model::dit::MainLinears::of(a.precision))?;
    sync()?;
    let load_s = t0.elapsed().as_secs_f64();

    let sigmas = moss::schedule::sigmas(a.steps as usize, &ck.scheduler);
    let t = sigmas[0] * 1000.0;
    let noise = Tensor::new(vec![1, c, h, w], moss::noise::torch_randn(a.seed, c * h * w))?;
    let x = b.upload(&noise)?;
    let tc = dit.refine_text(b, cond)?;
    let mut fwd_ms = vec![];
    let mut vel = None;
    for i in 0..=a.forwards {
        sync()?;
        let s = Instant::now();
        let v = dit.velocity(b, &x, t, &tc, &[])?;
        sync()?;
        if i > 0 {
            fwd_ms.push(s.elapsed().as_secs_f64() * 1e3); // the first one warms up
        }
        vel = Some(v);
    }
    // One more forward with every op bracketed by CUDA events (no synchronisation between ops):
    // op -> GPU ms, host ms, calls; CUDA only (the CPU records nothing).
    moss::backend::cuda::profile::start(moss::backend::cuda::profile::Mode::Events);
    sync()?;
    let s = Instant::now();
    let profiled = dit.velocity(b, &x, t, &tc, &[]).and_then(|v| sync().map(|_| v));
    let prof_ms = s.elapsed().as_secs_f64() * 1e3;
    let ops = moss::backend::cuda::profile::take();
    moss::backend::cuda::profile::stop();
    drop(profiled?);
    let ops = ops?.ops;
    let gpu_sum: f64 = ops.iter().map(|o| o.gpu_ms).sum();
    let profile: serde_json::Map<String, serde_json::Value> =
        ops.iter().map(|o| (o.op.clone(), serde_json::json!({"ms": o.gpu_ms, "host_ms": o.host_ms, "calls": o.calls}))).collect();
    if let (Some(p), Some(v)) = (&a.save_velocity, &vel) {
        pipeline::write_latents_raw(p, &b.download(v)?)?;
    }
    drop(vel);
    drop(tc);

    let mut out = serde_json::json!({
        "device": device,
        // The CPU computes in fp32, but for the fp8 and int8 linears.
        "precision": if device == "cpu" && !matches!(a.precision, Precision::Fp8 | Precision::Int8) { "fp32".to_string() } else { a.precision.to_string() },
        "size": format!("{}x{}", a.width, a.height),
        "tokens_cond": h * w + cond.shape[0],
        "tokens_uncond": h * w + uncond.shape[0],
        "t": t,
        "load_s": load_s,
        "forward_ms_median": median(&fwd_ms),
        "forward_ms": fwd_ms,
        "profile_forward_ms": prof_ms,
        "profile_gpu_sum_ms": gpu_sum,
        "profile_ms": profile,
    });
    if !a.forward_only {
        let spec = moss::spec::PictureSpec {
            prompt: String::new(),
            negative: String::new(),
            seed: a.seed,
            steps: a.steps,
            guidance: a.guidance,
            width: a.width,
            height: a.height,
            uncond_skip: a.uncond_skip.clone(),
            skip_window: a.skip_window,
            max_tokens: 0,
            precision: a.precision,
            ..Default::default()
        };
        let req = Request::new(spec, PathBuf::from("unused.png"), Device::Cpu);
        sync()?;
        let s = Instant::now();
        let z = pipeline::denoise_with(b, &dit, ck, &req, cond, uncond, &mut Silent)?;
        sync()?;
        let loop_s = s.elapsed().as_secs_f64();
        if let Some(p) = &a.save_latents {
            pipeline::write_latents_raw(p, &z)?;
        }
        out["steps"] = a.steps.into();
        out["guidance"] = (a.guidance as f64).into();
        out["loop_s"] = loop_s.into();
        out["loop_s_per_step"] = (loop_s / a.steps as f64).into();
    }
    Ok(out)
}
