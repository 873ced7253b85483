//! img2img and inpainting with every sampler and the schedules against diffusers' pipelines
//! (golden/make_img2img_samplers.py: the scheduler set to the whole schedule and started at
//! `get_timesteps`' index with `set_begin_index`, the start `scale_noise`, the inpaint blend
//! after every step), on make_samplers.py's synthetic latents and velocity: moss's recipe (the
//! sampler over the schedule's tail from [`img2img::start_index`], [`img2img::noised`],
//! [`Inpaint::after_step_host`], what `pipeline::denoise_loop` runs) gives the same latents.

mod common;

use common::Expected;
use moss::img2img::{self, Inpaint};
use moss::noise::TorchGenerator;
use moss::sampler::{self, Kind, ModelCall};
use moss::tensor::Tensor;

/// tests/samplers.rs's bound: the formulas in torch's order, a few ulp of the latents' size.
const BOUND: f64 = 2e-6;

/// `a·x + f32(b·sin(3σ))·F` in f32 (make_samplers.py's `Velocity`).
fn velocity(a: f32, b: f64, field: &[f32], x: &[f32], sigma: f32) -> Vec<f32> {
    let c = (b * (3.0 * sigma as f64).sin()) as f32;
    x.iter().zip(field).map(|(&x, &f)| a * x + c * f).collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs()).fold(0.0, f64::max)
}

struct Run {
    start: Vec<f32>,
    out: Vec<f32>,
    t_start: usize,
    call_sigmas: Vec<f32>,
}

/// moss's recipe for one golden run: `kind` over the tail of `sigmas` from the noised latents,
/// the blend after every step when `masked`.
fn run(e: &Expected, kind: Kind, sigmas: &[f32], strength: f64, masked: bool) -> Run {
    let (a, b) = (e.json["a"].as_f64().unwrap() as f32, e.json["b"].as_f64().unwrap());
    let field = e.tensor("field").data;
    let z0 = e.tensor("z0");
    let mut gen = TorchGenerator::new(e.json["seed"].as_u64().unwrap());
    let noise = Tensor::new(z0.shape.clone(), gen.randn(z0.numel())).unwrap();
    let t_start = img2img::start_index(sigmas.len() - 1, strength).unwrap();
    let tail = &sigmas[t_start..];
    let start = img2img::noised(&z0, &noise, tail[0]).unwrap().data;
    let blend = masked.then(|| Inpaint::new(z0.clone(), noise.clone(), e.tensor("mask")).unwrap());
    let mut call_sigmas = vec![];
    let mut model = |x: &[f32], c: ModelCall| {
        call_sigmas.push(c.sigma);
        Ok(velocity(a, b, &field, x, c.sigma))
    };
    let after = |i: usize, x: Vec<f32>| match &blend {
        Some(p) => p.after_step_host(x, tail, i),
        None => Ok(x),
    };
    let (out, _) = sampler::run_with(kind, tail, start.clone(), &mut gen, &mut model, after, |_, _, _| Ok(())).unwrap();
    Run { start, out, t_start, call_sigmas }
}

#[test]
fn every_sampler_starts_and_blends_as_diffusers_pipelines() {
    let e = Expected::load("img2img_samplers");
    assert_eq!(e.tensor("noise").data, TorchGenerator::new(e.json["seed"].as_u64().unwrap()).randn(e.tensor("z0").numel()));
    let mut seen = std::collections::BTreeSet::new();
    for r in e.json["runs"].as_array().unwrap() {
        let key = r["key"].as_str().unwrap();
        let kind: Kind = r["sampler"].as_str().unwrap().parse().unwrap();
        let sigmas = e.tensor(r["sigmas"].as_str().unwrap()).data;
        let masked = r["masked"].as_bool().unwrap();
        let got = run(&e, kind, &sigmas, r["strength"].as_f64().unwrap(), masked);
        assert_eq!(got.t_start as u64, r["t_start"].as_u64().unwrap(), "{key}: get_timesteps");
        let want_calls: Vec<f32> = r["call_sigmas"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(got.call_sigmas, want_calls, "{key}: the sigmas of the model calls");
        assert_eq!(got.start, e.tensor(&format!("{key}.start")).data, "{key}: the start is scale_noise's, bit for bit");
        let want = e.tensor(&format!("{key}.out")).data;
        let scale = want.iter().fold(1.0f64, |m, &v| m.max(v.abs() as f64));
        let err = max_abs(&got.out, &want) / scale;
        println!("{key}: max |Δ| / max |x| = {err:.2e}");
        if kind == Kind::Euler {
            assert_eq!(got.out, want, "{key}: euler is diffusers' arithmetic exactly");
        }
        assert!(err < BOUND, "{key}: {err:.2e} is not under {BOUND:.0e}");
        seen.insert((kind.name(), masked));
    }
    // Every sampler img2img, every one but heun inpainting.
    assert_eq!(seen.len(), 2 * Kind::ALL.len() - 1, "{seen:?}");
}

/// The controls: a start one index off, or no blend, misses the bound by far.
#[test]
fn another_start_or_no_blend_misses_the_bound() {
    let e = Expected::load("img2img_samplers");
    let sigmas = e.tensor("sigmas.moss.8").data;
    for kind in [Kind::DpmPp2m, Kind::UniPc, Kind::Lcm] {
        let want = e.tensor(&format!("img2img.{kind}.out")).data;
        // strength 0.6 of 8 steps starts at 3; 0.7 starts at 2.
        let off = run(&e, kind, &sigmas, 0.7, false);
        assert!(max_abs(&off.out, &want) > 1e3 * BOUND, "{kind}: another start lands near the reference");
        let want = e.tensor(&format!("inpaint.{kind}.out")).data;
        let plain = run(&e, kind, &sigmas, 0.8, false);
        assert!(max_abs(&plain.out, &want) > 1e3 * BOUND, "{kind}: without the blend lands near the reference");
    }
}
