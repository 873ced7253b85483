//! The samplers and sigma schedules of issue 42 against their upstream implementations
//! (golden/make_samplers.py: diffusers 0.42.1's schedulers, ComfyUI's rectified-flow ancestral
//! Euler and its `simple` / `sgm_uniform` schedules), on synthetic latents and a synthetic
//! velocity `v = a·x + f32(b·sin 3σ)·F`, so no transformer is involved.

mod common;

use common::Expected;
use moss::backend::cpu::Cpu;
use moss::noise::TorchGenerator;
use moss::sampler::{self, device, Kind, ModelCall};
use moss::schedule::ScheduleConfig;
use moss::sigmas::Schedule;
use moss::tensor::Tensor;

/// The formulas in torch's order, rounded alike: most runs equal torch's bit for bit, the rest
/// are within 4e-7 of the latents' size after 20 steps (printed with --nocapture); another
/// sampler or noise stream lands ≥ 1e-2 away.
const BOUND: f64 = 2e-6;

struct Golden {
    e: Expected,
}

impl Golden {
    fn load() -> Golden {
        Golden { e: Expected::load("samplers") }
    }
    fn f(&self, k: &str) -> f64 {
        self.e.json[k].as_f64().unwrap()
    }
    fn field(&self) -> Vec<f32> {
        self.e.tensor("field").data
    }
}

/// `a·x + f32(b·sin(3σ))·F` in f32, as make_samplers.py's `Velocity`.
fn velocity(a: f32, b: f64, field: &[f32], x: &[f32], sigma: f32) -> Vec<f32> {
    let c = (b * (3.0 * sigma as f64).sin()) as f32;
    x.iter().zip(field).map(|(&x, &f)| a * x + c * f).collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs()).fold(0.0, f64::max)
}

/// Run `kind` over `sigmas` from the seed's latent; the model calls' sigmas and the output.
fn run(g: &Golden, kind: Kind, sigmas: &[f32], continue_generator: bool) -> (Vec<f32>, Vec<f32>) {
    let (a, b, field) = (g.f("a") as f32, g.f("b"), g.field());
    let seed = g.e.json["seed"].as_u64().unwrap();
    let mut gen = TorchGenerator::new(seed);
    let x = gen.randn(field.len());
    if !continue_generator {
        gen = TorchGenerator::new(seed);
    }
    let mut seen = vec![];
    let mut model = |x: &[f32], c: ModelCall| {
        seen.push(c.sigma);
        Ok(velocity(a, b, &field, x, c.sigma))
    };
    let (out, calls) = sampler::run(kind, sigmas, x, &mut gen, &mut model, |_, _, _| Ok(())).unwrap();
    assert_eq!(calls, seen.len());
    (out, seen)
}

#[test]
fn the_initial_latent_is_torch_randn_of_the_seed() {
    let g = Golden::load();
    let want = g.e.tensor("x_init").data;
    let got = TorchGenerator::new(g.e.json["seed"].as_u64().unwrap()).randn(want.len());
    assert_eq!(got, want);
}

#[test]
fn every_sampler_matches_its_reference() {
    let g = Golden::load();
    let mut worst = 0.0f64;
    for r in g.e.json["runs"].as_array().unwrap() {
        let name = r["sampler"].as_str().unwrap();
        let kind: Kind = name.parse().unwrap();
        let sigmas = g.e.tensor(r["sigmas"].as_str().unwrap()).data;
        let want = g.e.tensor(r["key"].as_str().unwrap()).data;
        let (got, seen) = run(&g, kind, &sigmas, true);
        let want_calls: Vec<f32> = r["call_sigmas"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(seen, want_calls, "{}: the sigmas of the model calls", r["key"]);
        assert_eq!(seen.len(), kind.calls(sigmas.len() - 1), "{}: Kind::calls", r["key"]);
        let scale = want.iter().fold(1.0f64, |m, &v| m.max(v.abs() as f64));
        let e = max_abs(&got, &want) / scale;
        println!("{}: max |Δ| / max |x| = {e:.2e}, {} calls", r["key"], seen.len());
        if kind == Kind::Euler {
            assert_eq!(got, want, "{}: euler is diffusers' arithmetic exactly", r["key"]);
        }
        assert!(e < BOUND, "{}: {e:.2e} is not under {BOUND:.0e}", r["key"]);
        worst = worst.max(e);
    }
    println!("worst {worst:.2e}");
}

/// The controls: the bound tells samplers and noise streams apart.
#[test]
fn another_sampler_or_noise_stream_misses_the_bound() {
    let g = Golden::load();
    let sigmas = g.e.tensor("sigmas.moss.8").data;
    let euler = g.e.tensor("out.euler.moss.8").data;
    for kind in [Kind::Heun, Kind::DpmPp2m, Kind::UniPc] {
        let (got, _) = run(&g, kind, &sigmas, true);
        let e = max_abs(&got, &euler) / 8.0;
        assert!(e > 100.0 * BOUND, "{kind} lands {e:.2e} from euler's reference");
    }
    for kind in [Kind::DpmPp2mSde, Kind::Lcm, Kind::EulerAncestral] {
        let want = g.e.tensor(&format!("out.{kind}.moss.8")).data;
        let (got, _) = run(&g, kind, &sigmas, false);
        let e = max_abs(&got, &want) / 8.0;
        assert!(e > 100.0 * BOUND, "{kind} with a fresh generator lands {e:.2e} from its reference");
    }
}

#[test]
fn every_schedule_matches_its_reference() {
    let g = Golden::load();
    let cfg = ScheduleConfig::default();
    assert_eq!(g.f("shift"), cfg.shift);
    for s in g.e.json["schedules"].as_array().unwrap() {
        let kind: Schedule = s["name"].as_str().unwrap().parse().unwrap();
        let steps = s["steps"].as_u64().unwrap() as usize;
        let want = g.e.tensor(s["key"].as_str().unwrap()).data;
        let got = kind.sigmas(steps, &cfg).unwrap();
        assert_eq!(got.len(), want.len(), "{}", s["key"]);
        let ulps = got.iter().zip(&want).map(|(a, b)| (a.to_bits() as i64 - b.to_bits() as i64).abs()).max().unwrap();
        println!("{}: {ulps} ulp", s["key"]);
        assert!(ulps <= 2, "{}: {got:?} vs {want:?}", s["key"]);
    }
}

/// On the CPU backend the host loop with `euler` gives the fused device loop's latents bit for
/// bit, guided and not: the combine on the device and the host update round alike.
#[test]
fn the_host_loop_with_euler_is_the_fused_loop() {
    let g = Golden::load();
    let field = g.field();
    let shape = vec![1, 128, 4, 6];
    let sigmas = moss::schedule::sigmas(6, &ScheduleConfig::default());
    for guidance in [1.0f32, 3.0] {
        let velocities = |s: moss::sampling::Step, x: &Tensor| {
            let v_c = velocity(-0.75, 0.5, &field, &x.data, s.t / 1000.0);
            let v_u = velocity(0.25, -0.3, &field, &x.data, s.t / 1000.0);
            Ok((Tensor::new(x.shape.clone(), v_c)?, s.guided.then(|| Tensor::new(x.shape.clone(), v_u).unwrap())))
        };
        let x = Tensor::new(shape.clone(), moss::noise::torch_randn(42, 128 * 24)).unwrap();
        let mut gen = TorchGenerator::new(0);
        let (fused, n1) = device::sample(&Cpu, x.clone(), &sigmas, Kind::Euler, &mut gen, guidance, (0.0, 1.0), (0.0, 1.0), velocities, |_, _| Ok(())).unwrap();
        let (host, n2) =
            device::sample_on_host(&Cpu, x.clone(), &sigmas, Kind::Euler, &mut gen, guidance, (0.0, 1.0), (0.0, 1.0), velocities, |_, _| Ok(())).unwrap();
        assert_eq!(fused.data, host.data, "guidance {guidance}");
        assert_eq!(n1, n2);
        assert_eq!(n1.calls, 6);
        assert_eq!(n1.passes, if guidance == 1.0 { 6 } else { 12 });
        let direct = moss::sampling::sample(&Cpu, x, &sigmas, guidance, (0.0, 1.0), velocities, |_, _, _| Ok(())).unwrap();
        assert_eq!(fused.data, direct.data, "euler is today's loop");
    }
}

/// `device::sample` (what the pipeline calls) on the tiny-a DiT: for every sampler it equals
/// `sampler::run` with a model that runs the same passes and combines them on the host, so the
/// adapter hands each call its step, timestep, skip window and guidance as the plain loop does.
#[test]
fn the_device_loop_asks_the_dit_what_the_host_loop_asks() {
    use moss::model::dit::{Dit, MainLinears::Dense};
    let ck = common::checkpoint("tiny-a");
    let comp = ck.open_component("transformer").unwrap();
    let dit = Dit::load(&Cpu, &comp, &ck.dit, Dense).unwrap();
    let ctx = Expected::load("tiny-a");
    let tc = dit.refine_text(&Cpu, &ctx.tensor("dit.ctx")).unwrap();
    let tu = dit.refine_text(&Cpu, &ctx.tensor("dit.ctx.neg")).unwrap();
    let shape = vec![1, 128, 4, 4];
    let n = 128 * 16;
    let sigmas = moss::schedule::sigmas(4, &ck.scheduler);
    let (g, window, skip) = (3.0f32, (0.0, 0.5), [22usize]);
    for (kind, _) in Kind::ALL {
        let mut gen = TorchGenerator::new(42);
        let x = Tensor::new(shape.clone(), gen.randn(n)).unwrap();
        let mut steps_seen = vec![];
        let velocities = |s: moss::sampling::Step, x: &Tensor| {
            steps_seen.push((s.step, s.call, s.skip_active));
            let sk: &[usize] = if s.skip_active { &skip } else { &[] };
            Ok((dit.velocity(&Cpu, x, s.t, &tc, &[])?, Some(dit.velocity(&Cpu, x, s.t, &tu, sk)?)))
        };
        let (got, count) = device::sample(&Cpu, x.clone(), &sigmas, kind, &mut gen, g, window, (0.0, 1.0), velocities, |_, _| Ok(())).unwrap();
        assert_eq!(count.calls, kind.calls(4), "{kind}");
        assert_eq!(count.passes, 2 * count.calls);
        let want_steps: Vec<usize> = steps_seen.iter().map(|s| s.0).collect();
        assert!(steps_seen.iter().all(|&(s, _, active)| active == ((s as f64 / 4.0) < 0.5)), "{kind}: {steps_seen:?}");
        assert_eq!(steps_seen.iter().map(|s| s.1).collect::<Vec<_>>(), (0..count.calls).collect::<Vec<_>>());

        let mut gen = TorchGenerator::new(42);
        let x0 = gen.randn(n);
        let mut host_steps = vec![];
        let mut model = |x: &[f32], c: ModelCall| {
            host_steps.push(c.step);
            let xt = Tensor::new(shape.clone(), x.to_vec())?;
            let sk: &[usize] = if (c.step as f64 / c.steps as f64) < 0.5 { &skip } else { &[] };
            let v_c = dit.velocity(&Cpu, &xt, c.t(), &tc, &[])?;
            let v_u = dit.velocity(&Cpu, &xt, c.t(), &tu, sk)?;
            Ok(v_u.data.iter().zip(&v_c.data).map(|(&u, &c)| u + g * (c - u)).collect())
        };
        let (want, calls) = sampler::run(kind, &sigmas, x0, &mut gen, &mut model, |_, _, _| Ok(())).unwrap();
        assert_eq!(calls, count.calls);
        assert_eq!(host_steps, want_steps, "{kind}: the steps of the calls");
        assert_eq!(got.data, want, "{kind}");
        assert!(want.iter().all(|v| v.is_finite()));
    }
}
