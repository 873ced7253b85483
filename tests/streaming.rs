//! Streaming is a property of how weights are fetched: a transformer whose blocks are fetched
//! from the checkpoint mapping as each forward reaches them (some or none resident) gives the
//! same PNG bytes as the all-resident one, on both golden checkpoints (CPU backend).

mod common;

use common::{checkpoint, CHECKPOINTS};
use moss::backend::cpu::Cpu;
use moss::backend::Backend;
use moss::model::dit::{Dit, MainLinears::Dense};
use moss::options::Precision;
use moss::pipeline::{self, Request, Silent};

fn request(seed: u64) -> Request {
    Request {
        spec: moss::spec::PictureSpec {
            prompt: "a lighthouse on a cliff at dusk".into(),
            negative: String::new(),
            seed,
            steps: 3,
            guidance: 3.0,
            width: 64,
            height: 48,
            uncond_skip: vec![],
            skip_window: (0.0, 1.0),
            max_tokens: 4096,
            precision: moss::options::Precision::Fp32,
            ..Default::default()
        },
        out: std::env::temp_dir().join("moss-streaming-test-unused.png"),
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

fn png(ck: &moss::checkpoint::Checkpoint, dit: &Dit<Cpu>, req: &Request) -> Vec<u8> {
    let texts = pipeline::prompt_texts(req);
    let (enc, _) = pipeline::encode_prompts(&Cpu, ck, &texts, req.spec.max_tokens, req.spec.precision, &mut Silent).unwrap();
    let uncond = enc.get(1).unwrap_or(&enc[0]);
    let z = pipeline::denoise_with(&Cpu, dit, ck, req, &enc[0].hidden, &uncond.hidden, &mut Silent).unwrap();
    let vae = pipeline::load_vae(&Cpu, ck, z.shape[2], z.shape[3]).unwrap();
    pipeline::picture_bytes(&Cpu, &vae, ck, req, &z, &mut Silent).unwrap()
}

#[test]
fn streamed_blocks_give_the_resident_picture_bytes() {
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let n = ck.dit.num_layers;
        assert!(n >= 2, "{name}: {n} blocks, the test needs a resident and a streamed one");
        let req = request(11);
        let resident = Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit, Dense).unwrap();
        assert_eq!(resident.resident_blocks(), n);
        let want = png(&ck, &resident, &req);
        for k in [0, 1, n - 1] {
            let streamed = Dit::load_streamed(&Cpu, ck.open_component("transformer").unwrap(), &ck.dit, k, Dense).unwrap();
            assert_eq!(streamed.resident_blocks(), k, "{name}: {k} resident");
            let got = png(&ck, &streamed, &req);
            assert!(got == want, "{name}: {k} of {n} blocks resident, the PNG differs from the resident run's");
        }
        // The comparison can fail: another seed gives other bytes through the same path.
        assert!(png(&ck, &resident, &request(12)) != want, "{name}: the picture does not depend on the seed");
    }
}

/// A guided step with streamed blocks runs the two passes block by block together (each streamed
/// block fetched once for both): each velocity is, byte for byte, the one its pass gives alone,
/// with and without the negative's skipped blocks, through the whole loop too.
#[test]
fn passes_through_the_blocks_together_give_each_pass_alone() {
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let n = ck.dit.num_layers;
        let resident = Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit, Dense).unwrap();
        let streamed = Dit::load_streamed(&Cpu, ck.open_component("transformer").unwrap(), &ck.dit, 1, Dense).unwrap();
        let req = request(5);
        let (enc, _) = pipeline::encode_prompts(&Cpu, &ck, &["a red fox in snow", "blurry"], req.spec.max_tokens, req.spec.precision, &mut Silent).unwrap();
        let (tc, tu) = (resident.refine_text(&Cpu, &enc[0].hidden).unwrap(), resident.refine_text(&Cpu, &enc[1].hidden).unwrap());
        let c = ck.dit.latent_channels;
        let x = moss::tensor::Tensor::new(vec![1, c, 3, 4], moss::noise::torch_randn(7, c * 12)).unwrap();
        let xt = Cpu.upload(&x).unwrap();
        for skip in [vec![], vec![0], vec![n - 1], (1..n).collect::<Vec<_>>()] {
            let alone_c = resident.velocity(&Cpu, &xt, 700.0, &tc, &[]).unwrap();
            let alone_u = resident.velocity(&Cpu, &xt, 700.0, &tu, &skip).unwrap();
            for dit in [&resident, &streamed] {
                let v = dit.velocities(&Cpu, &xt, 700.0, &[(&tc, &[]), (&tu, &skip)]).unwrap();
                assert!(v.len() == 2 && v[0].data == alone_c.data, "{name} skip {skip:?}: the prompt's velocity differs");
                assert!(v[1].data == alone_u.data, "{name} skip {skip:?}: the negative's velocity differs");
            }
            // Not vacuous: the two passes differ, and skipping blocks changes the negative's.
            assert!(alone_c.data != alone_u.data, "{name}: the passes give the same velocity");
            if !skip.is_empty() {
                let full = resident.velocity(&Cpu, &xt, 700.0, &tu, &[]).unwrap();
                assert!(full.data != alone_u.data, "{name} skip {skip:?}: skipping changes nothing");
            }
        }
        // The loop with the skip window on: streamed (passes together) = resident (one by one).
        let mut req = request(5);
        req.spec.uncond_skip = vec![0, n - 1];
        req.spec.skip_window = (0.0, 0.5);
        let want = png(&ck, &resident, &req);
        assert!(png(&ck, &streamed, &req) == want, "{name}: the streamed guided loop with skips differs");
    }
}

#[test]
fn streamed_encoder_layers_give_the_resident_hidden_states() {
    use moss::model::encoder::Encoder;
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let n = ck.encoder.num_layers();
        let ids: Vec<u32> = (1..40).map(|i| (i * 37) % 200).collect();
        let resident = Encoder::load(&Cpu, &ck.open_component("text_encoder").unwrap(), &ck.encoder).unwrap();
        assert_eq!(resident.resident_layers(), n);
        let want = pipeline::hidden_states(&Cpu, &resident, &ids, Precision::Bf16).unwrap();
        // A shorter second prompt (a negative): through the layers together with the first, each
        // gets its states alone.
        let neg: Vec<u32> = (1..9).map(|i| (i * 11) % 200).collect();
        let want_neg = pipeline::hidden_states(&Cpu, &resident, &neg, Precision::Bf16).unwrap();
        assert!(want_neg.data != want.data[..want_neg.data.len()], "{name}: the two prompts' states agree");
        let both = [ids.clone(), neg.clone()];
        for k in [0, 1, n - 1, n] {
            let streamed = Encoder::load_streamed(&Cpu, ck.open_component("text_encoder").unwrap(), &ck.encoder, k).unwrap();
            assert_eq!(streamed.resident_layers(), k, "{name}: {k} resident");
            let got = pipeline::hidden_states(&Cpu, &streamed, &ids, Precision::Bf16).unwrap();
            assert!(got.data == want.data, "{name}: {k} of {n} layers resident, the hidden states differ");
            let got = pipeline::hidden_states_all(&Cpu, &streamed, &both, Precision::Bf16).unwrap();
            assert!(got[0].data == want.data, "{name}: {k} resident, the prompt's states through the layers with the negative differ");
            assert!(got[1].data == want_neg.data, "{name}: {k} resident, the negative's states through the layers with the prompt differ");
        }
        let other: Vec<u32> = ids.iter().map(|i| i + 1).collect();
        assert!(pipeline::hidden_states(&Cpu, &resident, &other, Precision::Bf16).unwrap().data != want.data, "{name}: the states do not depend on the ids");
    }
}

/// `generate --max-vram` on the CPU plans like on a GPU: at the smallest cap that works the
/// network that needs it streams, and the picture is the unlimited run's, byte for byte; a
/// cap below it is refused before anything loads, naming it.
#[test]
fn the_smallest_cap_streams_and_gives_the_unlimited_picture() {
    use moss::plan::MemoryOptions;
    use moss::plan::{run::networks, Budget};
    let dir = std::env::temp_dir().join(format!("moss-maxvram-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let mut req = request(11);
        let budget = Budget { memory: None, overhead: 0, bf16_loaded: 4, act: 4, linears: Dense, activations: &moss::backend::cuda::plan::ACTIVATIONS };
        let (tokens, _) = pipeline::tokenize_prompts(&ck, &pipeline::prompt_texts(&req), req.spec.max_tokens, &mut Silent).unwrap();
        let longest = tokens.iter().map(Vec::len).max().unwrap();
        let nets = networks(&ck, &budget, longest, (req.spec.width, req.spec.height)).unwrap();
        let least = nets.iter().map(|n| n.minimum()).max().unwrap();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let model = common::golden().join(name).display().to_string();
        let tightest = nets.iter().position(|n| n.minimum() == least).unwrap();
        let mut run = |cap: Option<f64>, out: &str| {
            req.out = dir.join(out);
            let r = pipeline::generate_planned(&req, &model, &[], moss::backend::Device::Cpu, &MemoryOptions { max_vram_gib: cap }, &mut Silent);
            r.map(|rep| (rep, std::fs::read(dir.join(out)).unwrap()))
        };
        let (_, want) = run(None, "unlimited.png").unwrap();
        let (rep, got) = run(Some(gib(least) + 1e-9), "least.png").unwrap();
        let plan = rep.plan.unwrap();
        assert_eq!(plan["networks"][tightest]["mode"], "streamed", "{name}: at the smallest cap {plan}");
        assert!(got == want, "{name}: the streamed picture differs from the unlimited run's");
        let err = run(Some(gib(least) * 0.99), "refused.png").unwrap_err().to_string();
        assert!(err.contains("smallest cap that works"), "{err}");
        assert!(!dir.join("refused.png").exists(), "{name}: a refused run wrote its picture");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `generate --prompts --max-vram`: the list is planned like a single picture (its longest
/// prompt, its largest size); at the smallest cap that works the pictures are the unlimited
/// run's, byte for byte, and below it the run is refused before anything is written.
#[test]
fn batch_mode_streams_under_the_cap_with_the_same_pictures() {
    use moss::plan::{run::networks, Budget};
    let dir = std::env::temp_dir().join(format!("moss-maxvram-batch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let req = request(11);
    let list = dir.join("list.txt");
    std::fs::write(&list, format!("{}\n", req.spec.prompt)).unwrap();
    for name in CHECKPOINTS {
        let ck = checkpoint(name);
        let budget = Budget { memory: None, overhead: 0, bf16_loaded: 4, act: 4, linears: Dense, activations: &moss::backend::cuda::plan::ACTIVATIONS };
        let (tokens, _) = pipeline::tokenize_prompts(&ck, &pipeline::prompt_texts(&req), req.spec.max_tokens, &mut Silent).unwrap();
        let longest = tokens.iter().map(Vec::len).max().unwrap();
        let least = networks(&ck, &budget, longest, (req.spec.width, req.spec.height)).unwrap().iter().map(|n| n.minimum()).max().unwrap();
        let gib = |b: u64| format!("{}", b as f64 / (1u64 << 30) as f64 + 1e-9);
        let model = common::golden().join(name).display().to_string();
        let run = |cap: Option<String>, out: &str| {
            let out = dir.join(name).join(out);
            let (l, o) = (list.display().to_string(), out.display().to_string());
            let mut args = vec!["generate", "--device", "cpu", "--model", &model, "--prompts", &l, "--out-dir", &o];
            args.extend(["--seed", "11", "--steps", "3", "--size", "64x48", "--guidance", "3"]);
            let cap = cap.map(|c| vec!["--max-vram".to_string(), c]).unwrap_or_default();
            let r = std::process::Command::new(env!("CARGO_BIN_EXE_moss")).args(&args).args(&cap).output().unwrap();
            (r.status.code(), String::from_utf8_lossy(&r.stderr).into_owned(), out)
        };
        let (code, err, unlimited) = run(None, "unlimited");
        assert_eq!(code, Some(0), "{name}: {err}");
        let (code, err, capped) = run(Some(gib(least)), "capped");
        assert_eq!(code, Some(0), "{name}: at the smallest cap: {err}");
        let pngs = |d: &std::path::Path| {
            let mut v: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).collect();
            v.sort();
            v.iter().map(|p| std::fs::read(p).unwrap()).collect::<Vec<_>>()
        };
        let want = pngs(&unlimited);
        assert_eq!(want.len(), 1, "{name}: one picture");
        assert!(pngs(&capped) == want, "{name}: the capped batch picture differs from the unlimited one");
        let (code, err, refused) = run(Some(format!("{}", least as f64 / (1u64 << 30) as f64 * 0.99)), "refused");
        assert_ne!(code, Some(0), "{name}: below the smallest cap the batch ran");
        assert!(err.contains("smallest cap that works"), "{name}: {err}");
        assert!(!refused.exists() || pngs(&refused).is_empty(), "{name}: a refused batch wrote pictures");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `moss serve --max-vram` on the CPU: the server's engine planned under caps from the smallest
/// that works up to one where everything stays loaded renders the same picture bytes as the
/// unlimited engine, while the plans go through every way of holding a network (loaded per
/// request, kept with blocks streamed, kept whole).
#[test]
fn a_capped_server_renders_the_unlimited_servers_bytes() {
    use moss::plan::run::networks;
    use moss::plan::serve::Keep;
    use moss::plan::MemoryOptions;
    use moss::serve::engine::{self, Engine, Render};
    let ck = checkpoint("tiny-a");
    let mut req = request(11);
    req.out = std::path::PathBuf::new(); // the server's: PNG
    let (tokens, _) = pipeline::tokenize_prompts(&ck, &pipeline::prompt_texts(&req), req.spec.max_tokens, &mut Silent).unwrap();
    let longest = tokens.iter().map(Vec::len).max().unwrap();
    let size = (req.spec.width, req.spec.height);
    let render = |req: &Request, cap: Option<u64>| {
        let mem = MemoryOptions { max_vram_gib: cap.map(|b| (b as f64 + 0.5) / (1u64 << 30) as f64) };
        let ck = checkpoint("tiny-a");
        let plan = engine::plan(&Cpu, &ck, &mem, size, longest, Dense)?;
        let keeps: Vec<Keep> = plan.plan.networks.iter().map(|n| n.keep).collect();
        let streams = plan.plan.networks.iter().map(|n| n.stage.moved_per_pass > 0).collect::<Vec<_>>();
        let mut e = Engine::load(Cpu, ck, plan, size)?;
        // Two pictures: what the first leaves behind must not change the second.
        let a = e.render(req, &tokens, &mut Silent)?.bytes;
        let b = e.render(req, &tokens, &mut Silent)?.bytes;
        assert!(a == b, "at {cap:?} bytes the second picture differs from the first");
        anyhow::Ok((a, keeps, streams))
    };
    let (want, keeps, _) = render(&req, None).unwrap();
    assert!(keeps.iter().all(|k| matches!(k, Keep::Blocks(_))), "unlimited: {keeps:?}");
    let nets = networks(&ck, &moss::backend::cpu_budget(), longest, size).unwrap();
    let least = nets.iter().map(|n| n.minimum()).max().unwrap();
    let all: u64 = nets.iter().map(|n| n.weights).sum::<u64>() + nets.iter().map(|n| n.activations).max().unwrap() + moss::plan::RESERVE;
    let mut seen = (false, false, false);
    for j in 0..=12 {
        let cap = least + (all - least) * j / 12;
        let (got, keeps, streams) = render(&req, Some(cap)).unwrap_or_else(|e| panic!("cap {cap}: {e:#}"));
        assert!(got == want, "cap {cap} ({keeps:?}): the picture differs from the unlimited server's");
        for (k, s) in keeps.iter().zip(&streams) {
            seen.0 |= *k == Keep::PerRequest;
            seen.1 |= matches!(k, Keep::Blocks(_)) && *s;
            seen.2 |= matches!(k, Keep::Blocks(_)) && !*s;
        }
    }
    assert!(seen.0 && seen.1 && seen.2, "per request, kept streamed, kept whole seen: {seen:?}");
    // Below the smallest cap: refused before anything loads, naming it.
    let err = render(&req, Some(least - 1)).unwrap_err().to_string();
    assert!(err.contains("smallest cap that works"), "{err}");
    // The comparison can fail: another seed gives other bytes.
    req.spec.seed = 12;
    assert!(render(&req, None).unwrap().0 != want, "the picture does not depend on the seed");
}
