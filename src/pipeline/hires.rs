//! The hires fix (`--hires SCALE`, AUTOMATIC1111's): the first pass at the spec's size, its
//! latents enlarged to [`crate::spec::HiresSpec::size`], then img2img at that size with the hires
//! strength and steps, from the seed's noise at the larger size.
//!
//! - `latent`: the latents resized bilinearly ([`crate::img2img::resize_bilinear`], torch's
//!   `interpolate(mode="bilinear")`); no VAE between the passes.
//! - `lanczos`: the first pass decoded, the picture resized with Lanczos3, encoded again (the
//!   transformer is freed for the VAE and loaded again: one load more than `latent`).

use super::{denoise_on, load_vae, Denoised, Pass, Progress, Request, Start, Team, TeamBackend};
use crate::backend::ops::VaeEncodeOps;
use crate::checkpoint::Checkpoint;
use crate::model::dit::Dit;
use crate::model::vae::{pixels_from_rgb8, VaeEncoder};
use crate::spec::{HiresSpec, Upscaler};
use crate::tensor::Tensor;
use anyhow::Result;

/// The second pass's start: the first pass's latents `z` enlarged to `(w, h)` pixels.
pub fn enlarge<B: VaeEncodeOps>(b: &B, ck: &Checkpoint, z: &Tensor, hr: &HiresSpec, (w, h): (u32, u32)) -> Result<Tensor> {
    match hr.upscaler {
        Upscaler::Latent => crate::img2img::resize_bilinear(z, (h / 16) as usize, (w / 16) as usize),
        Upscaler::Lanczos => {
            anyhow::ensure!(z.shape.len() == 4, "hires: latents {:?}", z.shape);
            let (zh, zw) = (z.shape[2] as u32 * 16, z.shape[3] as u32 * 16);
            let rgb = load_vae(b, ck, z.shape[2], z.shape[3])?.decode_rgb8(b, z)?;
            b.release_cached()?;
            let small = image::RgbImage::from_raw(zw, zh, rgb).ok_or_else(|| anyhow::anyhow!("hires: the decoded picture's size"))?;
            let big = image::imageops::resize(&small, w, h, super::RESIZE_FILTER);
            let comp = ck.open_component("vae")?;
            b.plan_vae_encode(&comp, &ck.vae, h as usize, w as usize)?;
            let z0 = VaeEncoder::load(b, &comp, &ck.vae)?.encode(b, &pixels_from_rgb8(big.as_raw(), w as usize, h as usize)?)?;
            b.release_cached()?;
            Ok(z0)
        }
    }
}

/// The hires fix's second pass on the first pass's latents `z` with the transformer loaded
/// (`dit`; `reload` gives it again after the Lanczos upscaler freed it), over `team`'s devices
/// too where there is one. Returns the final latents and what the second loop computed.
#[allow(clippy::too_many_arguments)]
pub fn second_pass<B: TeamBackend + VaeEncodeOps>(
    b: &B,
    ck: &Checkpoint,
    req: &Request,
    hr: &HiresSpec,
    (dit, reload): (Dit<B>, impl FnOnce() -> Result<Dit<B>>),
    z: &Tensor,
    conds: (&Tensor, &Tensor),
    team: Option<&mut Team<B>>,
    progress: &mut dyn Progress,
) -> Result<Denoised> {
    let (w, h) = hr.size(req.spec.width, req.spec.height);
    let pass = Pass { width: w, height: h, steps: hr.steps };
    let dit = match hr.upscaler {
        Upscaler::Latent => dit,
        Upscaler::Lanczos => {
            drop(dit);
            b.release_cached()?;
            let z0 = enlarge(b, ck, z, hr, (w, h))?;
            let start = Start { z0, strength: hr.strength, mask: None };
            progress.stage("hires");
            return denoise_on(team, b, &reload()?, ck, req, pass, conds, Some(&start), progress, None);
        }
    };
    let start = Start { z0: enlarge(b, ck, z, hr, (w, h))?, strength: hr.strength, mask: None };
    progress.stage("hires");
    denoise_on(team, b, &dit, ck, req, pass, conds, Some(&start), progress, None)
}
