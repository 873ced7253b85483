//! `moss generate`'s sampling-loop flags (issue 42) on the golden checkpoint tiny-a, CPU:
//! `--sampler`, `--schedule` and `--guidance-window` give the latents the library's samplers give
//! over the same DiT passes (an independent loop in this file: the host sampler, the passes
//! called one by one, the CFG combined on the host); `--cache` serves the steps cache-dit's rules
//! say and counts them in `--json` and the metadata; `--preview` writes the decoded x0
//! prediction; the picture records all of it and `--from` renders it again; bad values are one
//! line and write nothing.

mod common;

use moss::backend::cpu::Cpu;
use moss::model::dit::{Dit, MainLinears};
use moss::noise::TorchGenerator;
use moss::options::Precision;
use moss::sampler::{self, Kind, ModelCall};
use moss::sampling::in_window;
use moss::sigmas::Schedule;
use moss::tensor::Tensor;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROMPT: &str = "a lighthouse at dusk";
const NEGATIVE: &str = "fog";
const SEED: u64 = 7;
const SIZE: (usize, usize) = (64, 48);
/// tiny-a has 23 blocks; the unconditional pass skips block 22 by default.
const BLOCKS: usize = 23;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-sampling-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model() -> String {
    common::golden().join("tiny-a").display().to_string()
}

fn moss(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `moss encode` of the prompt and negative at fp32 (the hidden states the reference loop uses).
fn embeds(dir: &Path) -> PathBuf {
    let e = dir.join("embeds.safetensors");
    let (code, _, err) =
        moss(&["encode", "--model", &model(), "--device", "cpu", "--prompt", PROMPT, "--negative", NEGATIVE, "--precision", "fp32", "-o", p(&e), "-q"]);
    assert_eq!(code, 0, "{err}");
    e
}

/// `moss generate` from `embeds` at fp32 with `extra`; its `--json` line and saved latents.
fn generate(dir: &Path, tag: &str, embeds: &Path, steps: usize, extra: &[&str]) -> (Value, Tensor, PathBuf) {
    let (png, lat) = (dir.join(format!("{tag}.png")), dir.join(format!("{tag}.latents")));
    let (steps, m) = (steps.to_string(), model());
    let mut args = vec!["generate", "--model", &m[..], "--device", "cpu", "--embeds", p(embeds), "--precision", "fp32"];
    args.extend(["--size", "64x48", "--steps", &steps, "--seed", "7", "--json", "-o", p(&png), "--save-latents", p(&lat)]);
    args.extend_from_slice(extra);
    let (code, out, err) = moss(&args);
    assert_eq!(code, 0, "{tag}: {err}");
    let (z, _) = moss::pipeline::read_latents(&lat, 128, None).unwrap();
    (serde_json::from_str(out.trim()).unwrap(), z, png)
}

/// The reference: the transformer of tiny-a with the embeds' texts, each pass called alone.
struct Reference {
    dit: Dit<Cpu>,
    tc: moss::model::dit::TextCond<Cpu>,
    tu: moss::model::dit::TextCond<Cpu>,
    ck: moss::checkpoint::Checkpoint,
}

impl Reference {
    fn new(embeds: &Path) -> Reference {
        let ck = common::checkpoint("tiny-a");
        let comp = ck.open_component("transformer").unwrap();
        let dit = Dit::load(&Cpu, &comp, &ck.dit, MainLinears::of(Precision::Fp32)).unwrap();
        let e = moss::embeds::read(embeds).unwrap();
        let tc = dit.refine_text(&Cpu, &e.cond.hidden).unwrap();
        let tu = dit.refine_text(&Cpu, &e.uncond.hidden).unwrap();
        Reference { dit, tc, tu, ck }
    }

    /// `v` at `x` for a call: `v_c` alone outside `window`, else `v_u + g·(v_c − v_u)` with the
    /// negative pass skipping block 22 (the default skip window covers every step).
    fn velocity(&self, x: &[f32], c: ModelCall, g: f32, window: (f64, f64)) -> Vec<f32> {
        let xt = Tensor::new(vec![1, 128, SIZE.1 / 16, SIZE.0 / 16], x.to_vec()).unwrap();
        let v_c = self.dit.velocity(&Cpu, &xt, c.t(), &self.tc, &[]).unwrap();
        if !in_window(c.step, c.steps, window) {
            return v_c.data;
        }
        let v_u = self.dit.velocity(&Cpu, &xt, c.t(), &self.tu, &[22]).unwrap();
        v_u.data.iter().zip(&v_c.data).map(|(&u, &c)| u + g * (c - u)).collect()
    }

    /// The final latent of `kind` over `schedule` at guidance 3, and the latent after each step.
    fn run(&self, kind: Kind, schedule: Schedule, steps: usize, window: (f64, f64)) -> (Vec<f32>, Vec<Vec<f32>>, Vec<f32>) {
        let sigmas = schedule.sigmas(steps, &self.ck.scheduler).unwrap();
        let mut gen = TorchGenerator::new(SEED);
        let x0 = gen.randn(128 * (SIZE.0 / 16) * (SIZE.1 / 16));
        let mut after = vec![x0.clone()];
        let mut model = |x: &[f32], c: ModelCall| Ok(self.velocity(x, c, 3.0, window));
        let (x, _) = sampler::run(kind, &sigmas, x0, &mut gen, &mut model, |_, _, x| {
            after.push(x.to_vec());
            Ok(())
        })
        .unwrap();
        (x, after, sigmas)
    }
}

/// Every sampler (on a schedule each, with a guidance window or not) through the CLI gives the
/// latents of the host loop over the same passes, bit for bit, and `--json` counts its calls
/// and the negative passes the window left out.
#[test]
fn sampler_schedule_and_window_flags_give_the_librarys_loop() {
    let dir = scratch("loop");
    let e = embeds(&dir);
    let r = Reference::new(&e);
    let cases = [
        (Kind::Euler, Schedule::Model, (0.0, 1.0)),
        (Kind::Euler, Schedule::Simple, (0.0, 0.5)),
        (Kind::Heun, Schedule::Karras, (0.0, 1.0)),
        (Kind::DpmPp2m, Schedule::Exponential, (0.25, 0.75)),
        (Kind::DpmPp2mSde, Schedule::Beta, (0.0, 1.0)),
        (Kind::UniPc, Schedule::SgmUniform, (0.0, 1.0)),
        (Kind::Lcm, Schedule::Model, (0.5, 1.0)),
        (Kind::EulerAncestral, Schedule::Karras, (0.0, 0.5)),
    ];
    let steps = 4;
    let mut finals = vec![];
    for (kind, schedule, window) in cases {
        let tag = format!("{kind}-{schedule}");
        let w = format!("{}:{}", window.0, window.1);
        let (j, z, _) = generate(&dir, &tag, &e, steps, &["--sampler", kind.name(), "--schedule", schedule.name(), "--guidance-window", &w]);
        let (want, _, _) = r.run(kind, schedule, steps, window);
        assert!(z.data == want, "{tag}: the CLI's latents are not the host loop's");
        let f = &j["forwards"];
        let calls = kind.calls(steps);
        let guided_steps = (0..steps).filter(|&i| in_window(i, steps, window)).count();
        // Heun's two calls of a step are decided by the step: count the guided calls.
        let guided_calls = if kind == Kind::Heun { 2 * guided_steps - usize::from(in_window(steps - 1, steps, window)) } else { guided_steps };
        assert_eq!(f["calls"], calls, "{tag}: {f}");
        assert_eq!(
            (f["computed"].as_u64(), f["cached"].as_u64(), f["skipped"].as_u64()),
            (Some((calls + guided_calls) as u64), Some(0), Some((calls - guided_calls) as u64)),
            "{tag}: {f}"
        );
        assert_eq!(f["blocks_computed"], calls * BLOCKS + guided_calls * (BLOCKS - 1), "{tag}: {f}");
        finals.push(z.data);
    }
    for (i, a) in finals.iter().enumerate() {
        for b in &finals[i + 1..] {
            assert!(a != b, "two loops gave the same latents");
        }
    }
}

/// The defaults are today's loop (the explicit names give the same file) and say so; a cache
/// with threshold 1 serves every other call of each pass past the warm-up (cache-dit's
/// `max_continuous_cached_steps` 1), the first F and last B blocks running.
#[test]
fn the_default_loop_and_a_fixed_cache_pattern_are_counted() {
    let dir = scratch("count");
    let e = embeds(&dir);
    let (j, z, png) = generate(&dir, "plain", &e, 6, &[]);
    let f = &j["forwards"];
    assert_eq!(*f, serde_json::json!({"calls": 6, "computed": 12, "cached": 0, "skipped": 0, "blocks_computed": 6 * (2 * BLOCKS - 1), "blocks_skipped": 0}));
    let explicit = ["--sampler", "euler", "--schedule", "model", "--cache", "off", "--guidance-window", "0:1"];
    let (_, _, png2) = generate(&dir, "explicit", &e, 6, &explicit);
    assert!(std::fs::read(&png).unwrap() == std::fs::read(&png2).unwrap(), "the explicit defaults change the picture");
    let (_, info, _) = moss(&["info", p(&png)]);
    assert!(info.contains("Sampler: Euler, Schedule type: Automatic,") && !info.contains("Cache") && !info.contains("Forwards"), "{info}");

    let cache = ["--cache", "dbcache", "--cache-fn", "2", "--cache-bn", "1", "--cache-threshold", "1", "--cache-warmup", "1", "--cache-max-continuous", "1"];
    let (j, zc, png) = generate(&dir, "cached", &e, 6, &cache);
    // Per pass: calls 0 (warm-up), 2, 4 run in full; 1, 3, 5 are served. The cond pass runs its
    // 23 blocks in full and F2 + B1 when served; the negative's block 22 is skipped, so it has no
    // last block to run: 22 in full, 2 when served; each served pass leaves out 20.
    let f = &j["forwards"];
    assert_eq!(
        *f,
        serde_json::json!({"calls": 6, "computed": 6, "cached": 6, "skipped": 0, "blocks_computed": 3 * 23 + 3 * 3 + 3 * 22 + 3 * 2, "blocks_skipped": 6 * 20})
    );
    assert!(zc.data != z.data && zc.data.iter().all(|v| v.is_finite()));
    let (_, info, _) = moss(&["info", p(&png)]);
    assert!(info.contains("Cache: dbcache F2B1 threshold 1 warmup 1 max continuous 1, Forwards: \"6 of 12 computed (6 cached, 0 left out)\""), "{info}");
}

/// A picture records its loop (A1111 text and JSON); `--from` renders the same picture, and a
/// flag given beside it replaces that setting only.
#[test]
fn from_reproduces_the_loop() {
    let dir = scratch("from");
    let a = dir.join("a.png");
    let m = model();
    let flags = [
        "generate",
        "--model",
        &m,
        "--device",
        "cpu",
        "--prompt",
        PROMPT,
        "--size",
        "64x48",
        "--steps",
        "5",
        "--seed",
        "3",
        "--sampler",
        "dpm++2m",
        "--schedule",
        "exponential",
        "--cache",
        "fbcache",
        "--cache-threshold",
        "1",
        "--cache-warmup",
        "1",
        "--cache-max-cached",
        "2",
        "--guidance-window",
        "0:0.75",
        "-q",
        "-o",
        p(&a),
    ];
    let (code, _, err) = moss(&flags);
    assert_eq!(code, 0, "{err}");
    let (_, text, _) = moss(&["info", p(&a)]);
    assert!(text.contains("Sampler: DPM++ 2M, Schedule type: Exponential,") && text.contains("Guidance window: \"0:0.75\""), "{text}");
    let (_, j, _) = moss(&["info", "--json", p(&a)]);
    let j: Value = serde_json::from_str(&j).unwrap();
    assert_eq!((j["sampler"].as_str(), j["schedule"].as_str(), j["cache"]["method"].as_str()), (Some("dpm++2m"), Some("exponential"), Some("fbcache")));
    assert_eq!(
        (j["cache"]["max_warmup_steps"].as_u64(), j["cache"]["max_cached_steps"].as_i64(), j["cache"]["Fn_compute_blocks"].as_u64()),
        (Some(1), Some(2), Some(1))
    );
    assert_eq!(j["guidance_window"], serde_json::json!([0.0, 0.75]));
    assert!(j["forwards"]["cached"].as_u64().unwrap() > 0, "{j}");

    let b = dir.join("b.png");
    let (code, _, err) = moss(&["generate", "--from", p(&a), "--model", &m, "-q", "-o", p(&b)]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "--from gave another picture");
    let c = dir.join("c.png");
    let (code, _, err) = moss(&["generate", "--from", p(&a), "--model", &m, "--sampler", "heun", "--cache", "off", "-q", "-o", p(&c)]);
    assert_eq!(code, 0, "{err}");
    let (_, j, _) = moss(&["info", "--json", p(&c)]);
    let j: Value = serde_json::from_str(&j).unwrap();
    assert_eq!((j["sampler"].as_str(), j["schedule"].as_str(), &j["cache"]), (Some("heun"), Some("exponential"), &Value::from("off")));
    assert_eq!(j["guidance_window"], serde_json::json!([0.0, 0.75]));
}

/// `--preview` replaces its file with the decoded x0 prediction (`x − σ·v` at the start of the
/// step) after every N-th step but the last; the picture is the one a run without it writes.
#[test]
fn the_preview_is_the_decoded_x0_prediction() {
    let dir = scratch("preview");
    let e = embeds(&dir);
    let prev = dir.join("prev.png");
    let (_, _, png) = generate(&dir, "with", &e, 5, &["--preview", p(&prev), "--preview-every", "2"]);
    let (_, _, plain) = generate(&dir, "without", &e, 5, &[]);
    assert!(std::fs::read(&png).unwrap() == std::fs::read(&plain).unwrap(), "the preview changed the picture");
    let (rgb, w, h, meta) = moss::picture::decode(&std::fs::read(&prev).unwrap()).unwrap();
    assert_eq!((w, h), (64, 48));
    assert_eq!(meta.get("moss:preview"), Some("step 4 of 5"), "the last preview is after step 4 (5 is the picture)");
    // The reference: x after 3 steps, v there, x0 = x − σ_3·v, decoded by the VAE.
    let r = Reference::new(&e);
    let (_, after, sigmas) = r.run(Kind::Euler, Schedule::Model, 5, (0.0, 1.0));
    let call = ModelCall { step: 3, steps: 5, sigma: sigmas[3], call: 3 };
    let v = r.velocity(&after[3], call, 3.0, (0.0, 1.0));
    let x0: Vec<f32> = after[3].iter().zip(&v).map(|(&x, &v)| x - sigmas[3] * v).collect();
    let vae = moss::pipeline::load_vae(&Cpu, &r.ck, SIZE.1 / 16, SIZE.0 / 16).unwrap();
    let want = vae.decode_rgb8(&Cpu, &Tensor::new(vec![1, 128, SIZE.1 / 16, SIZE.0 / 16], x0).unwrap()).unwrap();
    assert!(rgb == want, "the preview is not the decoded x0 prediction of step 4");
    let left: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.contains("partial")).collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// Every bad value: a non-zero exit naming what is accepted, one line (or clap's usage error),
/// nothing written.
#[test]
fn bad_values_are_refused_before_anything_is_written() {
    let cases: [(&[&str], i32, &str); 20] = [
        (&["--sampler", "dpmpp_2m"], 2, "euler_ancestral"),
        (&["--schedule", "normal"], 2, "sgm_uniform"),
        (&["--cache", "teacache"], 2, "off, dbcache, fbcache, taylorseer"),
        (&["--cache-fn", "2"], 2, "--cache"),
        (&["--cache", "off", "--cache-fn", "2"], 1, "--cache-fn"),
        (&["--cache", "dbcache", "--cache-threshold", "1.5"], 1, "0..=1"),
        (&["--cache", "dbcache", "--cache-threshold", "nan"], 1, "0..=1"),
        (&["--cache", "dbcache", "--cache-fn", "0"], 1, "F >= 1"),
        (&["--cache", "dbcache", "--cache-fn", "20", "--cache-bn", "4"], 1, "23 blocks"),
        (&["--cache", "fbcache", "--cache-fn", "2"], 1, "F1B0"),
        (&["--cache", "dbcache", "--cache-taylor-order", "1"], 1, "taylorseer"),
        (&["--cache", "taylorseer", "--cache-taylor-order", "3"], 1, "1 or 2"),
        (&["--cache", "dbcache", "--cache-max-cached", "-2"], 2, "-1"),
        (&["--guidance-window", "0:1.5"], 1, "guidance window"),
        (&["--guidance-window", "0.6:0.2"], 2, "START <= STOP"),
        (&["--preview", "-"], 1, "--preview"),
        (&["--preview-every", "2"], 2, "--preview"),
        (&["--preview", "PREV", "--count", "2"], 1, "--preview"),
        (&["--preview", "PREV.txt"], 1, "txt"),
        (&["--preview", "OUT"], 1, "--preview"),
    ];
    let m = model();
    for (i, (extra, want, needle)) in cases.iter().enumerate() {
        let dir = scratch(&format!("bad{i}"));
        let out = dir.join("pic.png");
        let prev = dir.join("prev.png");
        let prev_txt = dir.join("prev.txt");
        let extra: Vec<&str> = extra
            .iter()
            .map(|a| match *a {
                "PREV" => p(&prev),
                "PREV.txt" => p(&prev_txt),
                "OUT" => p(&out),
                a => a,
            })
            .collect();
        let mut args = vec!["generate", "--model", &m[..], "--device", "cpu", "--prompt", "a cat", "--steps", "2", "--size", "64x64", "-o", p(&out)];
        args.extend(&extra);
        let (code, stdout, stderr) = moss(&args);
        assert_eq!(code, *want, "{extra:?}: {stderr}");
        // A usage error is clap's whole message (the problem, the usage line); ours is one line.
        assert!(stderr.contains(needle), "{extra:?}: {stderr:?} does not say {needle:?}");
        if code == 1 {
            assert_eq!(stderr.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{extra:?}: {stderr}");
        }
        assert!(stdout.is_empty(), "{extra:?}: {stdout}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{extra:?}: something was written");
    }
}
