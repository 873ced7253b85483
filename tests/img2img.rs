//! img2img and inpainting arithmetic (src/img2img.rs) against diffusers 0.42.1 as
//! golden/make_img2img.py ran it (`golden/expected/img2img.*`): the start index of
//! `get_timesteps`, `scale_noise`, the Euler steps of `FlowMatchEulerDiscreteScheduler` through
//! the sampling loop, the mask at the latent grid and the latent blend of
//! `Flux2KleinInpaintPipeline`, on synthetic latents and velocities. All bit for bit.

mod common;

use common::{golden, Expected};
use moss::backend::cpu::Cpu;
use moss::img2img::{latent_mask, noised, start_index, Inpaint};
use moss::sampling::{sample_with, Step};
use moss::tensor::Tensor;

fn same_bits(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    let off = got.data.iter().zip(&want.data).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    let worst = got.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert_eq!(off, 0, "{what}: {off} of {} values differ (largest {worst:e})", got.numel());
}

/// The mask picture (golden/expected/mask-96x64.png, grey) at the latent grid.
fn mask(exp: &Expected) -> Tensor {
    let [h, w] = [0, 1].map(|i| exp.json["latent_grid"][i].as_u64().unwrap() as usize);
    let bytes = std::fs::read(golden().join("expected").join(exp.json["mask_png"].as_str().unwrap())).unwrap();
    let img = moss::picture_in::decode_image(&bytes).unwrap().to_luma8();
    let (width, height) = img.dimensions();
    latent_mask(img.as_raw(), width as usize, height as usize, h, w).unwrap()
}

#[test]
fn mask_matches_the_inpaint_pipeline() {
    let exp = Expected::load("img2img");
    let m = mask(&exp);
    same_bits("mask at the latent grid", &m, &exp.tensor("mask.latent"));
    assert!(m.data.contains(&0.5) && m.data.contains(&0.0) && m.data.contains(&1.0), "the golden mask has partial cells");
}

#[test]
fn img2img_and_inpaint_match_diffusers() {
    let exp = Expected::load("img2img");
    let (z0, noise) = (exp.tensor("z0"), exp.tensor("noise"));
    let inpaint = Inpaint::new(z0.clone(), noise.clone(), mask(&exp)).unwrap();
    for case in exp.json["cases"].as_array().unwrap() {
        let key = case["key"].as_str().unwrap();
        let (steps, strength) = (case["steps"].as_u64().unwrap() as usize, case["strength"].as_f64().unwrap());
        let what = format!("{steps} steps at strength {strength}");
        let t_start = start_index(steps, strength).unwrap();
        assert_eq!(t_start as u64, case["t_start"].as_u64().unwrap(), "{what}: t_start");
        let sigmas = moss::schedule::sigmas(steps, &Default::default());
        let run = &sigmas[t_start..];
        let want: Vec<f32> = case["sigmas"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(run, &want[..], "{what}: the sigmas run");
        let start = noised(&z0, &noise, run[0]).unwrap();
        same_bits(&format!("{what}: start latents"), &start, &exp.tensor(&format!("{key}.start")));
        if t_start == 0 {
            assert!(start.data == noise.data, "{what}: strength 1 must start from the noise itself");
        }
        // The loop with the golden velocities (v.<t_start + j> at step j), guidance 1, unblended
        // and blended; every step's latents compared.
        for blend in [false, true] {
            let tag = if blend { "inpaint" } else { "img2img" };
            let velocity = |s: Step, _: &Tensor| Ok((exp.tensor(&format!("v.{}", t_start + s.step)), None));
            let after = |i: usize, x: Tensor| if blend { inpaint.after_step(&Cpu, x, run, i) } else { Ok(x) };
            let check = |i: usize, _: usize, x: &Tensor| {
                same_bits(&format!("{what}: {tag} after step {i}"), x, &exp.tensor(&format!("{key}.{tag}.{}", i - 1)));
                Ok(())
            };
            let out = sample_with(&Cpu, start.clone(), run, 1.0, (0.0, 1.0), velocity, after, check).unwrap();
            if blend {
                // The kept cells end on the encoded picture itself.
                let hw = inpaint.mask.numel();
                for (i, (&o, &z)) in out.data.iter().zip(&z0.data).enumerate() {
                    if inpaint.mask.data[i % hw] == 0.0 {
                        assert_eq!(o, z, "{what}: a kept cell is not z0 at the end");
                    }
                }
            }
        }
    }
}

#[test]
fn strength_is_checked() {
    for s in [0.0, -0.5, 1.5, f64::NAN] {
        assert!(start_index(10, s).is_err(), "strength {s} must be refused");
    }
    assert_eq!(start_index(50, 1.0).unwrap(), 0);
    assert_eq!(start_index(50, 0.6).unwrap(), 20);
    // The f32 rounding of 0.6 moves the start: strengths must reach this as f64.
    assert_eq!(start_index(50, 0.6f32 as f64).unwrap(), 19);
    // The smallest strengths still run one step.
    assert_eq!(start_index(10, 1e-9).unwrap(), 9);
}
