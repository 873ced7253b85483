//! The FLUX.2 VAE encoder (spec 7.4) on the CPU backend against diffusers'
//! `AutoencoderKLFlux2.encode` (mean) and the Flux2 pipelines' patchify + BatchNorm glue, as
//! golden/make_vae_encoder.py ran them (`golden/expected/vae_encoder.*`, pictures
//! `golden/expected/enc-*.png`), on tiny-a, tiny-b and golden/vae-wide (encoder widths that
//! change, so the 1x1 `conv_shortcut` runs); the split encode against the whole one; and the
//! stride-2 convolution against plain loops.

mod common;

use common::{assert_close, golden, Expected};
use moss::backend::cpu::Cpu;
use moss::backend::ops::{VaeEncodeOps, VaeOps};
use moss::checkpoint::config::VaeConfig;
use moss::checkpoint::{Component, TensorStore};
use moss::model::vae::{pixels_from_rgb8, Split, Strips, VaeEncoder};
use moss::tensor::Tensor;

/// Against diffusers' fp32 run: about torch's own fp32 error (rel L2 1.2-1.5e-6 from its float64
/// run, `fp32_vs_f64` in the json).
const ENCODER_BOUND: f64 = 3e-6;
/// Against torch's float64 run: our fp32 layers accumulate in f64.
const F64_BOUND: f64 = 5e-7;

/// The VAE folder `golden/<folder>` as a component, with its config.
fn vae_at(folder: &str) -> (Component, VaeConfig) {
    let dir = golden().join(folder);
    let cfg = VaeConfig::from_file(&dir.join("config.json")).unwrap();
    let comp = Component { name: "vae", store: TensorStore::open(&dir).unwrap(), prefix: String::new(), loras: Default::default() };
    (comp, cfg)
}

/// Each golden case: (name, encoder, the PNG's pixels as the encoder's input, the json entry).
fn cases() -> Vec<(String, VaeEncoder<Cpu>, Tensor, serde_json::Value)> {
    let exp = Expected::load("vae_encoder");
    exp.json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let (comp, cfg) = vae_at(c["vae"].as_str().unwrap());
            let enc = VaeEncoder::load(&Cpu, &comp, &cfg).unwrap();
            let bytes = std::fs::read(golden().join("expected").join(c["png"].as_str().unwrap())).unwrap();
            let (rgb, w, h, _) = moss::png::decode(&bytes).unwrap();
            assert_eq!((w as u64, h as u64), (c["width"].as_u64().unwrap(), c["height"].as_u64().unwrap()));
            let x = pixels_from_rgb8(&rgb, w as usize, h as usize).unwrap();
            (c["name"].as_str().unwrap().to_string(), enc, x, c.clone())
        })
        .collect()
}

#[test]
fn encode_matches_diffusers() {
    let exp = Expected::load("vae_encoder");
    for (name, enc, x, c) in cases() {
        let key = c["key"].as_str().unwrap();
        // The pixels: diffusers' VaeImageProcessor on the same PNG, bit for bit.
        let want = exp.tensor(&format!("{key}.pixels"));
        assert_eq!(x.shape, want.shape, "{name}: pixels shape");
        assert!(x.data == want.data, "{name}: pixels differ from VaeImageProcessor's (2 * (x / 255) - 1)");
        let moments = enc.moments_once(&Cpu, &x, Split::Whole).unwrap();
        let want = exp.tensor(&format!("{key}.moments"));
        assert_eq!(moments.shape, want.shape, "{name}: moments shape");
        assert_close(&format!("{name} moments (encoder + quant_conv)"), &moments.data, &want.data, ENCODER_BOUND);
        let z = enc.encode(&Cpu, &x).unwrap();
        let want = exp.tensor(&format!("{key}.latents"));
        assert_eq!(z.shape, want.shape, "{name}: latents shape");
        assert_close(&format!("{name} latents (mean, patchified, normalised)"), &z.data, &want.data, ENCODER_BOUND);
        // Against torch's float64 run: closer than torch's own fp32 (json `fp32_vs_f64`, ~1.3e-6).
        let want64 = exp.tensor(&format!("{key}.latents64"));
        assert_close(&format!("{name} latents vs float64 torch"), &z.data, &want64.data, F64_BOUND);
        // The glue alone, on diffusers' own mean: patchify and normalise are exact f32 arithmetic.
        let mean = exp.tensor(&format!("{key}.mean"));
        let mut m = exp.tensor(&format!("{key}.moments"));
        m.data[..mean.numel()].copy_from_slice(&mean.data);
        let glued = enc.latents_of(&m).unwrap();
        let worst = glued.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!("{name} glue on diffusers' mean: max |diff| {worst:e}");
        assert!(worst <= 1e-6 * want.data.iter().fold(0f32, |a, b| a.max(b.abs())), "{name}: patchify/normalise off by {worst}");
    }
}

/// The split encode gives the whole encode's moments bit for bit, for strips of many heights
/// (one row, fewer rows than a downsampler's halo, odd, the whole height); the control (strips
/// without their halo rows) must differ.
#[test]
fn split_encode_equals_whole() {
    for (name, enc, x, _) in cases() {
        let whole = enc.moments_once(&Cpu, &x, Split::Whole).unwrap();
        for rows in [1, 2, 3, 7, 16, 1000] {
            for keep in [0, usize::MAX] {
                let split = enc.moments_once(&Cpu, &x, Split::strips_keeping(rows, keep)).unwrap();
                assert!(split.data == whole.data, "{name}: strips of {rows} differ from the whole encode");
            }
        }
        let bad = enc.moments_once(&Cpu, &x, Split::Strips(Strips { rows: 5, keep_bytes: 0, no_halo: true })).unwrap();
        assert!(bad.data != whole.data, "{name}: strips without the halo must differ (the control)");
    }
}

/// `conv2d_down2` against plain loops over the padded picture (diffusers' pad (0, 1, 0, 1) then a
/// stride-2 3x3 conv), and against the identity the CUDA backend uses (the "same" conv read at
/// the odd pixels), at even and odd sizes.
#[test]
fn conv2d_down2_is_the_strided_conv() {
    let mut seed = 12345u64;
    let mut rnd = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    };
    for (n, cin, h, w, cout) in [(1, 5, 8, 6, 7), (2, 3, 7, 9, 4), (1, 8, 2, 2, 3), (1, 4, 3, 10, 9)] {
        let x = Tensor::new(vec![n, cin, h, w], rnd(n * cin * h * w)).unwrap();
        let wt = Tensor::new(vec![cout, cin, 3, 3], rnd(cout * cin * 9)).unwrap();
        let b = Tensor::new(vec![cout], rnd(cout)).unwrap();
        let got = Cpu.conv2d_down2(&x, &wt, &b).unwrap();
        let (oh, ow) = (h / 2, w / 2);
        assert_eq!(got.shape, vec![n, cout, oh, ow]);
        let px = |ni: usize, i: usize, y: usize, xx: usize| if y < h && xx < w { x.data[((ni * cin + i) * h + y) * w + xx] as f64 } else { 0.0 };
        let same = Cpu.conv2d(&x, &wt, &b, false).unwrap();
        for ni in 0..n {
            for o in 0..cout {
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut s = b.data[o] as f64;
                        for i in 0..cin {
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    s += wt.data[((o * cin + i) * 3 + ky) * 3 + kx] as f64 * px(ni, i, 2 * y + ky, 2 * xo + kx);
                                }
                            }
                        }
                        let g = got.data[((ni * cout + o) * oh + y) * ow + xo];
                        assert!((g as f64 - s).abs() <= 1e-6 * (1.0 + s.abs()), "[{ni},{o},{y},{xo}] {g} vs {s}");
                        let odd = same.data[((ni * cout + o) * h + 2 * y + 1) * w + 2 * xo + 1];
                        assert_eq!(g, odd, "[{ni},{o},{y},{xo}]: not the same conv at the odd pixel");
                    }
                }
            }
        }
    }
    let x = Tensor::new(vec![1, 2, 1, 4], vec![0.0; 8]).unwrap();
    let wt = Tensor::new(vec![1, 2, 3, 3], vec![0.0; 18]).unwrap();
    assert!(Cpu.conv2d_down2(&x, &wt, &Tensor::new(vec![1], vec![0.0]).unwrap()).is_err(), "a 1-row picture has no stride-2 output");
}

/// Pictures of a size the encoder cannot take, and checkpoints whose encoder tensors are not
/// those of the config, are refused with one line.
#[test]
fn bad_input_is_refused() {
    let (comp, cfg) = vae_at("tiny-a/vae");
    let enc = VaeEncoder::load(&Cpu, &comp, &cfg).unwrap();
    for (h, w) in [(24, 32), (32, 40), (0, 16)] {
        let x = Tensor::new(vec![1, 3, h, w], vec![0.0; 3 * h * w]).unwrap();
        let e = enc.encode(&Cpu, &x).unwrap_err().to_string();
        assert!(e.contains("multiples of 16"), "{h}x{w}: {e}");
    }
    // The wide VAE's tensors under tiny-b's config (one resnet a block like it, but widths 32
    // everywhere): a shape differs; under tiny-a's (two resnets a block), a tensor is missing.
    let (wide, _) = vae_at("vae-wide");
    for (cfg, what) in [(vae_at("tiny-b/vae").1, "shape"), (cfg, "missing")] {
        let e = format!("{:#}", VaeEncoder::load(&Cpu, &wide, &cfg).err().expect("wrong tensors must not load"));
        assert!(e.contains("VAE encoder") && e.contains(what), "{e}");
    }
}

/// A run with a picture in counts the encode in its VAE stage: the larger of the decode's and
/// the encode's activations (whole and least split), here on tiny-a at 1024x1024 and on the
/// FLUX.2 widths' estimates beside it.
#[test]
fn run_plan_counts_the_encoder() {
    use moss::backend::cuda::vae::encode_plan::{encode_activation_bytes, encode_split_least_bytes};
    use moss::plan::run::{networks, with_vae_encode};
    let ck = common::checkpoint("tiny-a");
    let size = (1024u32, 1024u32);
    let nets = networks(&ck, &moss::backend::cpu_budget(), 16, size).unwrap();
    let mut with = nets.clone();
    with_vae_encode(&mut with, &ck, &moss::backend::cpu_budget(), size);
    let (before, after) = (nets.iter().find(|n| n.name == "vae").unwrap(), with.iter().find(|n| n.name == "vae").unwrap());
    let (enc, least) = (encode_activation_bytes(&ck.vae, 1024, 1024) as u64, encode_split_least_bytes(&ck.vae, 1024, 1024) as u64);
    assert_eq!(after.activations, before.activations.max(enc));
    assert_eq!(after.strip_activations, before.strip_activations.map(|s| s.max(least)));
    assert!(after.activations >= enc && after.strip_activations.unwrap() >= least);
    for (a, b) in nets.iter().zip(&with).filter(|(a, _)| a.name != "vae") {
        assert_eq!((a.activations, a.strip_activations), (b.activations, b.strip_activations), "{}", a.name);
    }
}
