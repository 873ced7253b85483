//! Step caching (crate::cache) against cache-dit itself: golden/make_cache.py wraps cache-dit 1.5.3's
//! DBCache (FBCache = F1B0, TaylorSeer calibrator) around the torch reference DiT on tiny-a and
//! records, per config, which steps each pass (cond / uncond) served from the cache, the residual
//! differences it measured, and the final latents. The same loop here, with the CPU DiT consulting
//! one BlockCache per pass, must make the same decisions and land on the same latents.

mod common;

use common::{checkpoint, Expected};
use moss::backend::cpu::Cpu;
use moss::cache::{CacheConfig, Method};
use moss::model::dit::{Dit, MainLinears::Dense, PassCaches};
use moss::schedule::sigmas;
use moss::tensor::{rel_l2, Tensor};

/// The CPU DiT's fp32 forward is ~1e-6 from torch's; after 24 steps the cached loops are within
/// 6e-7 of cache-dit's (printed). Caching moves the latents 2.6e-2 or more from the plain loop
/// (`rel_l2_from_plain`).
const BOUND: f64 = 1e-5;

fn config(c: &serde_json::Value) -> CacheConfig {
    let f = &c["config"];
    let num = |k: &str| f[k].as_u64().map(|v| v as usize);
    let order = c["taylorseer_order"].as_u64().unwrap() as usize;
    let (fn_blocks, bn_blocks) = (num("Fn_compute_blocks").unwrap(), num("Bn_compute_blocks").unwrap());
    let method = match (order, fn_blocks, bn_blocks) {
        (1.., _, _) => Method::TaylorSeer,
        (0, 1, 0) => Method::FbCache,
        _ => Method::DbCache,
    };
    CacheConfig {
        method,
        fn_blocks,
        bn_blocks,
        threshold: f["residual_diff_threshold"].as_f64().unwrap(),
        warmup: num("max_warmup_steps").unwrap(),
        max_cached: num("max_cached_steps"),
        max_continuous: num("max_continuous_cached_steps"),
        taylor_order: order,
    }
}

/// The golden loop (spec 5.3, Euler) with one cache per pass (None: plain). Returns the latents
/// and the two caches.
fn run(e: &Expected, cfg: Option<CacheConfig>, guidance: f32) -> (Vec<f32>, Option<PassCaches<Cpu>>) {
    let ck = checkpoint(e.json["checkpoint"].as_str().unwrap());
    let comp = ck.open_component("transformer").unwrap();
    let dit = Dit::load(&Cpu, &comp, &ck.dit, Dense).unwrap();
    let ctx = Expected::load("tiny-a");
    let tc = dit.refine_text(&Cpu, &ctx.tensor("dit.ctx")).unwrap();
    let tu = dit.refine_text(&Cpu, &ctx.tensor("dit.ctx.neg")).unwrap();
    let shape: Vec<usize> = e.json["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let n: usize = shape.iter().product();
    let x = Tensor::new(shape, moss::noise::torch_randn(e.json["seed"].as_u64().unwrap(), n)).unwrap();
    let s = sigmas(e.json["steps"].as_u64().unwrap() as usize, &ck.scheduler);
    let mut caches = cfg.map(PassCaches::new);
    let none: &[usize] = &[];
    let out = moss::sampling::sample(
        &Cpu,
        x,
        &s,
        guidance,
        (0.0, 1.0),
        |step, x| match &mut caches {
            Some(c) => dit.velocities_cached(&Cpu, x, &step, (&tc, none), Some((&tu, none)), c),
            None => {
                let v_u = if step.guided { Some(dit.velocity(&Cpu, x, step.t, &tu, none)?) } else { None };
                Ok((dit.velocity(&Cpu, x, step.t, &tc, none)?, v_u))
            }
        },
        |_, _, _| Ok(()),
    )
    .unwrap();
    (out.data, caches)
}

fn steps(v: &serde_json::Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|s| s.as_u64().unwrap() as usize).collect()
}

#[test]
fn the_cached_loops_make_cache_dits_decisions_and_land_on_its_latents() {
    let e = Expected::load("cache");
    for c in e.json["configs"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let guidance = c["guidance"].as_f64().unwrap() as f32;
        let (lat, caches) = run(&e, Some(config(c)), guidance);
        let caches = caches.unwrap();
        let caches = [&caches.cond, &caches.uncond];
        assert_eq!(caches[0].branch.cached, steps(&c["cached"]), "{name}: the cond pass's cached steps");
        let want_u = steps(&c["cfg_cached"]);
        if guidance != 1.0 {
            assert_eq!(caches[1].branch.cached, want_u, "{name}: the uncond pass's cached steps");
        }
        for (k, key) in [(0, "diffs"), (1, "cfg_diffs")] {
            let want = c[key].as_object().unwrap();
            let got = &caches[k].branch.diffs;
            assert_eq!(got.len(), want.len(), "{name} {key}: steps measured");
            for (step, d) in got {
                let w = want[&step.to_string()].as_f64().unwrap();
                assert!((d - w).abs() < 1e-4 * w.abs().max(1.0), "{name} {key} step {step}: {d} vs cache-dit's {w}");
            }
        }
        let want = e.tensor(c["latents"].as_str().unwrap()).data;
        let err = rel_l2(&lat, &want);
        println!("{name}: cached {:?} / {:?}, latents rel L2 {err:.2e}", caches[0].branch.cached, caches[1].branch.cached);
        assert!(err < BOUND, "{name}: latents {err:.2e} from cache-dit's");
        let c0 = caches[0];
        assert_eq!(c0.served, c0.branch.cached.len());
        assert_eq!(c0.computed + c0.served, e.json["steps"].as_u64().unwrap() as usize);
        assert!(c0.blocks_skipped > 0);
    }
}

/// The control: the plain loop equals cache-dit's uncached one, and misses every cached result.
#[test]
fn the_plain_loop_is_far_from_every_cached_one() {
    let e = Expected::load("cache");
    for g in [3.0f32, 1.0] {
        let (plain, _) = run(&e, None, g);
        let want = e.tensor(&format!("plain.g{g}")).data;
        let err = rel_l2(&plain, &want);
        assert!(err < BOUND, "plain g{g}: {err:.2e}");
        for c in e.json["configs"].as_array().unwrap().iter().filter(|c| c["guidance"].as_f64().unwrap() as f32 == g) {
            let cached = e.tensor(c["latents"].as_str().unwrap()).data;
            let d = rel_l2(&plain, &cached);
            assert!(d > 10.0 * BOUND, "{}: the cached latents are only {d:.2e} from the plain ones", c["name"]);
        }
    }
}
