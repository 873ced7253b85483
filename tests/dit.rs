//! The DiT and the sampling loop on the CPU backend against the golden torch reference
//! (golden/dit_ref.py, fp32): every `dit` forward of both checkpoints, the traced intermediates
//! of the first one, and the 4-step CFG/Euler loop from the seed's noise.

mod common;

use common::{assert_close, checkpoint, Expected, CHECKPOINTS};
use moss::backend::cpu::Cpu;
use moss::model::dit::{rope, Dit, MainLinears::Dense};
use moss::pipeline::{self, Request, Silent};
use moss::tensor::Tensor;

const BOUND: f64 = 1e-5;

fn load(name: &str) -> (moss::checkpoint::Checkpoint, Dit<Cpu>, Expected) {
    let ck = checkpoint(name);
    let comp = ck.open_component("transformer").unwrap();
    let dit = Dit::load(&Cpu, &comp, &ck.dit, Dense).unwrap();
    (ck, dit, Expected::load(name))
}

fn skips(v: &serde_json::Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|s| s.as_u64().unwrap() as usize).collect()
}

#[test]
fn forwards_match_the_torch_reference() {
    for name in CHECKPOINTS {
        let (_, dit, e) = load(name);
        let runs = e.json["dit"].as_array().unwrap();
        assert!(runs.len() >= 4, "{name}: only {} dit entries", runs.len());
        let mut worst = 0f64;
        for r in runs {
            let key = r["key"].as_str().unwrap();
            let x = e.tensor(r["x"].as_str().unwrap());
            let ctx = e.tensor(r["ctx"].as_str().unwrap());
            let t = r["t"].as_f64().unwrap() as f32;
            let skip = skips(&r["skip"]);
            let text = dit.refine_text(&Cpu, &ctx).unwrap();
            let got = dit.forward(&Cpu, &x, t, &text, &skip).unwrap();
            let want = e.tensor(key);
            assert_eq!(got.shape, want.shape, "{name} {key}");
            let what = format!("{name} {key} (t={t}, skip={skip:?}, ctx={}, L={})", r["ctx"], text.len);
            assert_close(&what, &got.data, &want.data, BOUND);
            worst = worst.max(moss::tensor::rel_l2(&got.data, &want.data));
        }
        println!("{name}: worst DiT forward rel L2 {worst:.3e} over {} forwards", runs.len());
    }
}

/// The skip really changes the output where block 22 (tiny-a) or block 1 (tiny-b) exists, so the
/// forwards above tell skipping from not skipping.
#[test]
fn skipping_a_block_changes_the_velocity() {
    for name in CHECKPOINTS {
        let (ck, dit, e) = load(name);
        let block = if ck.dit.num_layers > 22 { 22 } else { ck.dit.num_layers - 1 };
        let text = dit.refine_text(&Cpu, &e.tensor("dit.ctx")).unwrap();
        let x = e.tensor("dit.x");
        let full = dit.forward(&Cpu, &x, 500.0, &text, &[]).unwrap();
        let skipped = dit.forward(&Cpu, &x, 500.0, &text, &[block]).unwrap();
        let past_end = dit.forward(&Cpu, &x, 500.0, &text, &[ck.dit.num_layers]).unwrap();
        let d = moss::tensor::rel_l2(&skipped.data, &full.data);
        println!("{name}: skipping block {block} moves the velocity by rel L2 {d:.3e}");
        assert!(d > 1e-3, "{name}: skipping block {block} changed nothing ({d:.3e})");
        assert_eq!(past_end.data, full.data, "{name}: a skip index past the last block must skip nothing");
    }
}

/// The intermediates golden traced for `dit.out.0`: time embedding, both modulations, the refiner
/// output and the RoPE table.
#[test]
fn traced_intermediates_match() {
    for name in CHECKPOINTS {
        let (ck, dit, e) = load(name);
        let tr = &e.json["dit_trace"];
        let of = tr["of"].as_str().unwrap();
        let run = e.json["dit"].as_array().unwrap().iter().find(|r| r["key"] == of).unwrap();
        let t = run["t"].as_f64().unwrap() as f32;
        let key = |k: &str| tr["keys"][k].as_str().unwrap().to_string();
        let d = ck.dit.dim;

        let m = dit.modulation(&Cpu, t).unwrap();
        assert_close(&format!("{name} time embedding"), &m.time.data, &e.tensor(&key("time")).data, BOUND);
        let six: Vec<f32> = [&m.shift_attn, &m.scale_attn, &m.gate_attn, &m.shift_ffn, &m.scale_ffn, &m.gate_ffn].iter().flat_map(|v| v.data.clone()).collect();
        let want = e.tensor(&key("mod"));
        assert_eq!(want.shape, [6, d]);
        assert_close(&format!("{name} block modulation"), &six, &want.data, BOUND);
        let two: Vec<f32> = [&m.head_shift, &m.head_scale].iter().flat_map(|v| v.data.clone()).collect();
        assert_close(&format!("{name} head modulation"), &two, &e.tensor(&key("head_mod")).data, BOUND);

        let text = dit.refine_text(&Cpu, &e.tensor(run["ctx"].as_str().unwrap())).unwrap();
        assert_close(&format!("{name} text refiner"), &text.tokens.data, &e.tensor(&key("refiner")).data, BOUND);

        let x = e.tensor("dit.x");
        let (h, w) = (x.shape[2], x.shape[3]);
        let (cos, sin) = rope::table(&rope::joint_positions(h, w, text.len), ck.dit.rope_base, ck.dit.head_dim() / 2);
        for (what, got, want) in [("cos", &cos, e.tensor(&key("rope_cos"))), ("sin", &sin, e.tensor(&key("rope_sin")))] {
            let half = got.shape[1];
            assert_eq!(want.shape, [h * w + text.len, 2 * half], "{name} rope {what}");
            // golden holds cat(θ, θ): both halves must equal our table.
            let mut max = 0f32;
            for n in 0..want.shape[0] {
                for m in 0..2 * half {
                    max = max.max((got.data[n * half + m % half] - want.data[n * 2 * half + m]).abs());
                }
            }
            println!("{name} rope {what}: max abs error {max:.3e}");
            assert!(max <= 2e-7, "{name} rope {what}: max abs error {max:.3e}");
        }
    }
}

/// The loop's inputs: the bf16-rounded encoder outputs of the loop's prompt and negative, as
/// golden kept them (`enc.N` of the prompts named / worded like them).
fn loop_contexts(e: &Expected) -> (Tensor, Tensor) {
    let lp = &e.json["loop"];
    let prompts = e.json["prompts"].as_array().unwrap();
    let find = |f: &dyn Fn(&serde_json::Value) -> bool| {
        let p = prompts.iter().find(|p| f(p)).expect("loop prompt in golden prompts");
        e.tensor(p["key"].as_str().unwrap()).round_bf16()
    };
    let cond = find(&|p| p["name"] == lp["prompt"]);
    let uncond = find(&|p| p["text"] == lp["negative"]);
    // Those are the `dit.ctx` / `dit.ctx.neg` golden fed its forwards.
    assert_eq!(cond.data, e.tensor("dit.ctx").data);
    assert_eq!(uncond.data, e.tensor("dit.ctx.neg").data);
    (cond, uncond)
}

fn loop_request(e: &Expected) -> Request {
    let lp = &e.json["loop"];
    let prompts = e.json["prompts"].as_array().unwrap();
    let text = prompts.iter().find(|p| p["name"] == lp["prompt"]).unwrap()["text"].as_str().unwrap();
    Request {
        spec: moss::spec::PictureSpec {
            prompt: text.into(),
            negative: lp["negative"].as_str().unwrap().into(),
            seed: lp["seed"].as_u64().unwrap(),
            steps: lp["steps"].as_u64().unwrap() as u32,
            guidance: lp["guidance"].as_f64().unwrap() as f32,
            width: lp["width"].as_u64().unwrap() as u32,
            height: lp["height"].as_u64().unwrap() as u32,
            uncond_skip: skips(&lp["uncond_skip"]),
            skip_window: (0.0, 1.0),
            max_tokens: 4096,
            precision: moss::options::Precision::Fp32,
            ..Default::default()
        },
        out: std::env::temp_dir().join("moss-dit-test-unused.png"),
        save_latents: None,
        embeds: None,
        prompt_file: None,
        from: None,
        device: moss::backend::Device::Cpu,
        quality: None,
        cut: Default::default(),
        replace: true,
        preview: None,
        preview_every: 1,
        forwards: None,
        init: None,
        c2pa: None,
    }
}

/// The first Euler step, through the loop itself (`moss::sampling::sample`), with the noise of
/// `moss::noise`.
#[test]
fn loop_first_step_matches() {
    for name in CHECKPOINTS {
        let (ck, dit, e) = load(name);
        let (cond, uncond) = loop_contexts(&e);
        let req = loop_request(&e);
        let sig = moss::schedule::sigmas(req.spec.steps as usize, &ck.scheduler);
        let want_sig: Vec<f32> = e.json["loop"]["sigmas"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap() as f32).collect();
        assert_eq!(sig, want_sig, "{name}: loop sigmas");
        let (tc, tu) = (dit.refine_text(&Cpu, &cond).unwrap(), dit.refine_text(&Cpu, &uncond).unwrap());
        let (h, w) = ((req.spec.height / 16) as usize, (req.spec.width / 16) as usize);
        let c = ck.dit.latent_channels;
        let x0 = Tensor::new(vec![1, c, h, w], moss::noise::torch_randn(req.spec.seed, c * h * w)).unwrap();
        let mut step1 = None;
        let mut passes = vec![];
        let _ = moss::sampling::sample(
            &Cpu,
            x0,
            &sig,
            req.spec.guidance,
            req.spec.skip_window,
            |p, x| {
                passes.push((p.step, p.guided, p.skip_active));
                let v_c = dit.velocity(&Cpu, x, p.t, &tc, &[])?;
                let v_u = if p.guided { Some(dit.velocity(&Cpu, x, p.t, &tu, &req.spec.uncond_skip)?) } else { None };
                Ok((v_c, v_u))
            },
            |i, _, x| {
                step1 = Some(x.clone());
                // Stop after the first step: an error ends the loop.
                anyhow::ensure!(i > 1, "stop after step {i}");
                Ok(())
            },
        );
        assert_eq!(passes, [(0, true, true)], "{name}: steps asked for before step 1 ends");
        let got = step1.expect("step 1 ran");
        assert_close(&format!("{name} loop.latents.step1"), &got.data, &e.tensor("loop.latents.step1").data, BOUND);
    }
}

/// The whole loop through `pipeline::denoise` (the function `moss generate` runs).
#[test]
fn loop_final_latents_match() {
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let e = Expected::load(name);
        let (cond, uncond) = loop_contexts(&e);
        let req = loop_request(&e);
        let got = pipeline::denoise(&Cpu, &ck, &req, &cond, &uncond, &mut Silent).unwrap();
        let want = e.tensor("loop.latents");
        assert_eq!(got.shape, want.shape, "{name}");
        assert_close(&format!("{name} loop.latents ({} steps, cfg {})", req.spec.steps, req.spec.guidance), &got.data, &want.data, BOUND);
        // And the loop is deterministic.
        let again = pipeline::denoise(&Cpu, &ck, &req, &cond, &uncond, &mut Silent).unwrap();
        assert_eq!(again.data, got.data, "{name}: two runs differ");
    }
}

/// Guidance exactly 1 runs no negative pass: the result is the plain conditional Euler loop,
/// whatever the negative is.
#[test]
fn guidance_one_runs_no_negative_pass() {
    let name = "tiny-b";
    let (ck, dit, e) = load(name);
    let (cond, _) = loop_contexts(&e);
    let mut req = loop_request(&e);
    req.spec.guidance = 1.0;
    req.spec.steps = 2;
    let got = pipeline::denoise(&Cpu, &ck, &req, &cond, &Tensor::zeros(&[0, 0]), &mut Silent).unwrap();
    // By hand: x += dσ·v_c.
    let sig = moss::schedule::sigmas(2, &ck.scheduler);
    let tc = dit.refine_text(&Cpu, &cond).unwrap();
    let mut x = Tensor::new(got.shape.clone(), moss::noise::torch_randn(req.spec.seed, got.numel())).unwrap();
    for i in 0..2 {
        let v = dit.forward(&Cpu, &x, sig[i] * 1000.0, &tc, &[]).unwrap();
        let ds = sig[i + 1] - sig[i];
        x.data.iter_mut().zip(&v.data).for_each(|(a, &b)| *a += ds * b);
    }
    assert_eq!(got.data, x.data, "{name}: guidance 1 is not the conditional loop");
}
