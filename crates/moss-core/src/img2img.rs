//! Pictures from pictures with flow matching (spec 7.4): img2img and inpainting as diffusers'
//! pipelines do them (0.42.1: `FlowMatchEulerDiscreteScheduler`, the img2img `get_timesteps`,
//! and `Flux2KleinInpaintPipeline`, the inpaint pipeline of the FLUX.2 VAE), on the latents of
//! [`crate::model::vae::VaeEncoder`]. golden/make_img2img.py pins every step to diffusers' code
//! (tests/img2img.rs).
//!
//! - img2img: the run follows the schedule from index [`start_index`] and starts from
//!   [`noised`]`(z0, noise, σ[t_start])` (the scheduler's `scale_noise`).
//! - Inpainting: the mask goes to the latent grid ([`latent_mask`]: binarised at 0.5, bilinear
//!   straight to `H/16 × W/16`, one value a latent cell for all 128 channels), and after every
//!   step the region to keep is put back at the next noise level ([`Inpaint::after_step`]):
//!   `(1 − m)·noised(z0, noise, σ_next) + m·x`, `z0` itself after the last step.
//!
//! Every formula is f32 elementwise in torch's order, so the latents equal diffusers' bit for
//! bit given the same inputs.

use crate::backend::Backend;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// diffusers' `get_timesteps`: the index into the schedule's sigmas an img2img run of `steps`
/// steps at `strength` starts from, `int(max(steps − min(steps·strength, steps), 0))`, in f64
/// as Python computes it (pass the strength as parsed to f64: an f32 0.6 would give 19 of 50
/// steps skipped, not 20). `strength` in (0, 1]; the run then has `steps − t_start ≥ 1` steps,
/// and strength 1 runs the whole schedule from pure noise (text to image).
pub fn start_index(steps: usize, strength: f64) -> Result<usize> {
    ensure!(strength > 0.0 && strength <= 1.0, "strength {strength} is outside (0, 1]");
    ensure!(steps > 0, "an img2img run needs at least one step");
    let n = steps as f64;
    let init = (n * strength).min(n);
    Ok((n - init).max(0.0) as usize)
}

/// The flow-matching forward process (`scale_noise`): `σ·noise + (1 − σ)·z0`, f32.
pub fn noised(z0: &Tensor, noise: &Tensor, sigma: f32) -> Result<Tensor> {
    ensure!(z0.shape == noise.shape, "noised: latents {:?} and noise {:?}", z0.shape, noise.shape);
    let keep = 1.0 - sigma;
    let data = z0.data.iter().zip(&noise.data).map(|(&z, &n)| sigma * n + keep * z).collect();
    Tensor::new(z0.shape.clone(), data)
}

/// A mask picture at the latent grid, as `Flux2KleinInpaintPipeline` makes it: the grey values
/// `gray` (row-major `width × height`, 255 = repaint) to `v/255` in f32, binarised (`< 0.5` → 0,
/// else 1, `VaeImageProcessor.binarize`), then `interpolate(size=(h, w), mode="bilinear")`
/// (align_corners false, no antialias) to the latent grid `h × w`: `[1, 1, h, w]`, 1 = repaint,
/// 0 = keep. At 16 pixels a cell each value is the mean of the cell's four central pixels
/// (0, ¼, ½, ¾ or 1).
pub fn latent_mask(gray: &[u8], width: usize, height: usize, h: usize, w: usize) -> Result<Tensor> {
    ensure!(gray.len() == width * height && width > 0 && height > 0, "mask: {} values for a {width}x{height} picture", gray.len());
    ensure!(h > 0 && w > 0 && h <= height && w <= width, "mask: a {width}x{height} picture to a {w}x{h} latent grid");
    let m: Vec<f32> = gray.iter().map(|&v| if (v as f32 / 255.0) < 0.5 { 0.0 } else { 1.0 }).collect();
    let (ys, xs) = (linear_taps(height, h), linear_taps(width, w));
    let mut out = Vec::with_capacity(h * w);
    for &(y0, y1, ly0, ly1) in &ys {
        for &(x0, x1, lx0, lx1) in &xs {
            let px = |y: usize, x: usize| m[y * width + x];
            out.push(ly0 * (lx0 * px(y0, x0) + lx1 * px(y0, x1)) + ly1 * (lx0 * px(y1, x0) + lx1 * px(y1, x1)));
        }
    }
    Tensor::new(vec![1, 1, h, w], out)
}

/// `F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)` (no antialias) of
/// latents `[1, C, H, W]`, each channel alone: the hires fix's latent upscaler (AUTOMATIC1111's
/// `Latent`).
pub fn resize_bilinear(x: &Tensor, h: usize, w: usize) -> Result<Tensor> {
    let d = &x.shape;
    ensure!(d.len() == 4 && d[0] == 1 && d[2] > 0 && d[3] > 0 && h > 0 && w > 0, "resize: latents {d:?} to {h}x{w}");
    let (c, ih, iw) = (d[1], d[2], d[3]);
    let (ys, xs) = (linear_taps(ih, h), linear_taps(iw, w));
    let mut out = Vec::with_capacity(c * h * w);
    for ch in 0..c {
        let px = |y: usize, x_: usize| x.data[(ch * ih + y) * iw + x_];
        for &(y0, y1, ly0, ly1) in &ys {
            for &(x0, x1, lx0, lx1) in &xs {
                out.push(ly0 * (lx0 * px(y0, x0) + lx1 * px(y0, x1)) + ly1 * (lx0 * px(y1, x0) + lx1 * px(y1, x1)));
            }
        }
    }
    Tensor::new(vec![1, c, h, w], out)
}

/// torch's bilinear source taps of each output index (align_corners false, CPU, f32):
/// `src = max(scale·(d + ½) − ½, 0)` with `scale = in/out`, `i0 = ⌊src⌋`, `i1 = i0 + 1` (but
/// `i0` at the last input), weights `1 − λ`, `λ = src − i0` (clamped to [0, 1]).
fn linear_taps(input: usize, output: usize) -> Vec<(usize, usize, f32, f32)> {
    let scale = input as f32 / output as f32;
    (0..output)
        .map(|d| {
            let src = (scale * (d as f32 + 0.5) - 0.5).max(0.0);
            let i0 = (src as usize).min(input - 1);
            let i1 = if i0 < input - 1 { i0 + 1 } else { i0 };
            let l1 = (src - i0 as f32).clamp(0.0, 1.0);
            (i0, i1, 1.0 - l1, l1)
        })
        .collect()
}

/// The inputs of an inpainting run's latent blend: the encoded picture `z0` and the run's
/// `noise` (`[1, C, h, w]`), and the mask at the latent grid (`[1, 1, h, w]`, [`latent_mask`]).
pub struct Inpaint {
    pub z0: Tensor,
    pub noise: Tensor,
    pub mask: Tensor,
}

impl Inpaint {
    pub fn new(z0: Tensor, noise: Tensor, mask: Tensor) -> Result<Inpaint> {
        let d = &z0.shape;
        ensure!(d.len() == 4 && d[0] == 1 && noise.shape == *d, "inpaint: latents {d:?}, noise {:?}", noise.shape);
        ensure!(mask.shape == [1, 1, d[2], d[3]], "inpaint: mask {:?} for latents {d:?}", mask.shape);
        Ok(Inpaint { z0, noise, mask })
    }

    /// The blend after a step (`sigma_next`: the schedule's next sigma; `None` after the last
    /// step): `(1 − m)·proper + m·x` with `proper = noised(z0, noise, σ_next)`, or `z0`.
    pub fn blend(&self, x: &Tensor, sigma_next: Option<f32>) -> Result<Tensor> {
        ensure!(x.shape == self.z0.shape, "inpaint: latents {:?}, expected {:?}", x.shape, self.z0.shape);
        let proper = match sigma_next {
            Some(s) => noised(&self.z0, &self.noise, s)?,
            None => self.z0.clone(),
        };
        let hw = self.mask.numel();
        let data = x
            .data
            .iter()
            .zip(&proper.data)
            .enumerate()
            .map(|(i, (&xv, &p))| {
                let m = self.mask.data[i % hw];
                (1.0 - m) * p + m * xv
            })
            .collect();
        Tensor::new(x.shape.clone(), data)
    }

    /// [`Self::blend`] after step `i` of a run over `sigmas` (ending in 0; `sigmas[i + 1]` is
    /// the next noise level), for [`crate::sampler::device::sample_blended`]: the latents come to the
    /// host and go back (`[1, 128, h, w]`, 2 MB at 1024x1024).
    pub fn after_step<B: Backend>(&self, b: &B, x: B::T, sigmas: &[f32], i: usize) -> Result<B::T> {
        b.upload_f32(&self.blend(&b.download(&x)?, next_sigma(sigmas, i)?)?)
    }

    /// [`Self::after_step`] on a host latent (the samplers that keep it there,
    /// [`crate::sampler::run_with`]).
    pub fn after_step_host(&self, x: Vec<f32>, sigmas: &[f32], i: usize) -> Result<Vec<f32>> {
        Ok(self.blend(&Tensor::new(self.z0.shape.clone(), x)?, next_sigma(sigmas, i)?)?.data)
    }
}

/// The noise level after step `i` of a run over `sigmas` (ending in 0): `sigmas[i + 1]`, `None`
/// after the last step (where the kept region is `z0` itself).
fn next_sigma(sigmas: &[f32], i: usize) -> Result<Option<f32>> {
    ensure!(i + 1 < sigmas.len(), "inpaint: step {i} of a schedule of {} sigmas", sigmas.len());
    Ok((i + 2 < sigmas.len()).then(|| sigmas[i + 1]))
}
