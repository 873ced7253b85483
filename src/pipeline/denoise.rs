//! One picture's denoising loop as its spec says (issue 42): the sampler over the named sigma
//! schedule ([`crate::sampler::device::sample`]), the transformer's passes (with a step cache
//! per pass when `cache` is set: [`PassCaches`]), the negative pass only inside the guidance
//! window, live previews of the x0 prediction, and what it computed ([`Forwards`]).
//!
//! The defaults (`euler`, the model's schedule, no cache, the window `0:1`) are the loop of spec
//! 5.3 exactly: the same noise, the same fused step, the same passes, so the same bytes.
//!
//! A run from a picture (spec 7.4) is the same loop over the tail of the schedule: every
//! sampler and schedule starts at `σ[t_start]` from the noised latents, the windows and caches
//! count the steps of that tail, and inpainting blends the kept region back after every step
//! (`heun`, whose steps make two model calls, is refused with a mask:
//! [`crate::spec::PictureSpec::check_pictures_in`]).

use super::{Interrupted, Progress, Request, Start};
use crate::backend::ops::{DitOps, VaeOps};
use crate::checkpoint::Checkpoint;
use crate::img2img;
use crate::model::dit::{Dit, PassCaches, TextCond};
use crate::model::vae::VaeDecoder;
use crate::noise::TorchGenerator;
use crate::parallel::{self, Endpoints, Layout, Role};
use crate::sampling::Step;
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// What a picture's loop computed: the `--json` `forwards` and the metadata's. A full guided
/// loop of `n` calls runs `2n` passes of every block; `computed + cached + skipped` is that count
/// of passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwards {
    /// The sampler's model calls.
    pub calls: usize,
    /// Transformer passes run in full.
    pub computed: usize,
    /// Passes served from the step cache (their first and last compute blocks ran).
    pub cached: usize,
    /// Negative passes left out (outside the guidance window).
    pub skipped: usize,
    /// Main blocks run, and left out by the step cache (the negative pass's skipped layers are
    /// in neither).
    pub blocks_computed: usize,
    pub blocks_skipped: usize,
}

impl Forwards {
    /// The A1111 `Forwards` value: passes run of all the full loop would run.
    pub fn line(&self) -> String {
        let all = self.computed + self.cached + self.skipped;
        format!("{} of {all} computed ({} cached, {} left out)", self.computed, self.cached, self.skipped)
    }
}

/// Two loops' counts together (the hires fix's two passes).
impl std::ops::Add for Forwards {
    type Output = Forwards;
    fn add(self, o: Forwards) -> Forwards {
        Forwards {
            calls: self.calls + o.calls,
            computed: self.computed + o.computed,
            cached: self.cached + o.cached,
            skipped: self.skipped + o.skipped,
            blocks_computed: self.blocks_computed + o.blocks_computed,
            blocks_skipped: self.blocks_skipped + o.blocks_skipped,
        }
    }
}

/// The final latents and what the loop computed.
pub struct Denoised {
    pub latents: Tensor,
    pub forwards: Forwards,
}

/// The steps after which `progress` wants a preview (never after the last: that is the picture).
fn preview_steps(progress: &dyn Progress, n: usize) -> Vec<bool> {
    (0..n).map(|i| i + 1 < n && progress.preview_wanted(i + 1, n)).collect()
}

/// One denoising run's size and steps: the spec's, or the hires fix's second pass.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    pub width: u32,
    pub height: u32,
    pub steps: u32,
}

impl Pass {
    pub fn of(spec: &crate::spec::PictureSpec) -> Pass {
        Pass { width: spec.width, height: spec.height, steps: spec.steps }
    }
}

/// Denoise `req` at `pass`'s size and steps with `dit` loaded: from the seed's noise (`start`
/// None), or from a picture's latents (img2img, spec 7.4: the schedule from
/// [`crate::img2img::start_index`] on, for every sampler and schedule, as diffusers' img2img
/// pipelines truncate theirs; the start [`crate::img2img::noised`]; with a mask, the latent
/// blend after every step). `vae` decodes the previews ([`Progress::preview_wanted`]); without
/// one it is loaded at the first preview.
#[allow(clippy::too_many_arguments)]
pub fn denoise_loop<B: DitOps + VaeOps>(
    b: &B,
    dit: &Dit<B>,
    ck: &Checkpoint,
    req: &Request,
    pass: Pass,
    (cond, uncond): (&Tensor, &Tensor),
    start: Option<&Start>,
    progress: &mut dyn Progress,
    vae: Option<&VaeDecoder<B>>,
) -> Result<Denoised> {
    denoise_loop_on(b, dit, ck, req, pass, (cond, uncond), start, progress, vae, None)
}

/// How `req`'s passes spread over `ranks` ranks ([`crate::parallel`]): refused (before any work)
/// where they cannot (step caching; heads the sequence groups do not divide).
pub fn layout_for(req: &Request, ck: &Checkpoint, ranks: usize) -> Result<Layout> {
    if req.spec.cache.is_some() {
        bail!("step caching (cache) runs on one device: give one device, or no cache");
    }
    match req.spec.guidance != 1.0 {
        true => Layout::guided(ranks, ck.dit.num_heads),
        false => Layout::unguided(ranks, ck.dit.num_heads),
    }
}

/// [`denoise_loop`] as one rank of several (`ranks`: this rank's endpoints; every rank calls it
/// with the same request): the same loop on every rank, each rank running its part of the
/// transformer's passes ([`Endpoints::role`]); the velocities exchanged, so every rank ends with
/// the same latents. Only the first rank's `progress` is asked to stop (the ranks vote after
/// each step and stop together) or for previews.
#[allow(clippy::too_many_arguments)]
pub fn denoise_loop_on<B: DitOps + VaeOps>(
    b: &B,
    dit: &Dit<B>,
    ck: &Checkpoint,
    req: &Request,
    pass: Pass,
    (cond, uncond): (&Tensor, &Tensor),
    start: Option<&Start>,
    progress: &mut dyn Progress,
    vae: Option<&VaeDecoder<B>>,
    ranks: Option<&Endpoints<B>>,
) -> Result<Denoised> {
    let spec = &req.spec;
    let (h, w) = ((pass.height / 16) as usize, (pass.width / 16) as usize);
    let c = ck.dit.latent_channels;
    check_for(req, ck)?;
    let role = match ranks {
        Some(e) => Some(e.role(layout_for(req, ck, e.ranks)?)),
        None => None,
    };
    let seq = role.as_ref().and_then(|r| r.seq);
    let sigmas = spec.schedule.sigmas(pass.steps as usize, &ck.scheduler)?;
    // diffusers' retrieve_timesteps then get_timesteps: the strength cuts the steps the schedule has.
    let sigmas = match start {
        Some(s) => sigmas[img2img::start_index(sigmas.len() - 1, s.strength)?..].to_vec(),
        None => sigmas,
    };
    let tc = dit.refine_text(b, cond)?;
    let tu = if spec.guidance != 1.0 { Some(dit.refine_text(b, uncond)?) } else { None };
    progress.stage("denoise");
    let mut noise = TorchGenerator::new(spec.seed);
    let eps = Tensor::new(vec![1, c, h, w], noise.randn(c * h * w))?;
    let inpaint = match start {
        Some(Start { z0, mask: Some(m), .. }) => Some(img2img::Inpaint::new(z0.clone(), eps.clone(), m.clone())?),
        _ => None,
    };
    let x0 = match start {
        Some(s) => b.upload(&img2img::noised(&s.z0, &eps, sigmas[0])?)?,
        None => b.upload(&eps)?,
    };
    let n = sigmas.len() - 1;
    let want = preview_steps(progress, n);
    // The x0 prediction of a step that wants a preview, until the step ends.
    let pending: RefCell<Option<(usize, B::T)>> = RefCell::new(None);
    let mut caches = spec.cache.map(PassCaches::new);
    let blocks = ck.dit.num_layers;
    let mut blocks_plain = 0;
    let velocities = |step: Step, x: &B::T| -> Result<(B::T, Option<B::T>)> {
        let skip: &[usize] = if step.skip_active { &spec.uncond_skip } else { &[] };
        let (v_c, v_u) = match (&mut caches, &tu) {
            (_, None) if step.guided => bail!("an unconditional pass with guidance 1"),
            (Some(caches), _) => dit.velocities_cached(b, x, &step, (&tc, &[]), tu.as_ref().map(|t| (t, skip)), caches)?,
            (None, Some(tu)) if step.guided => {
                blocks_plain += 2 * blocks - (0..blocks).filter(|i| skip.contains(i)).count();
                match &role {
                    Some(r) if r.groups == 2 => cfg_parallel(b, dit, x, step.t, (&tc, tu, skip), r)?,
                    _ => {
                        let mut v = dit.velocities_on(b, x, step.t, &[(&tc, &[]), (tu, skip)], seq)?;
                        let v_u = v.pop();
                        (v.pop().expect("two passes, two velocities"), v_u)
                    }
                }
            }
            (None, _) => {
                blocks_plain += blocks;
                (dit.velocity_on(b, x, step.t, &tc, &[], seq)?, None)
            }
        };
        let first_call = pending.borrow().as_ref().is_none_or(|p| p.0 != step.step);
        if want[step.step] && first_call {
            // x0 = x − σ·v with v the step's combined velocity (the fused step with dσ = −σ).
            let x0 = b.cfg_euler(x, &v_c, v_u.as_ref(), spec.guidance, -sigmas[step.step])?;
            *pending.borrow_mut() = Some((step.step, x0));
        }
        Ok((v_c, v_u))
    };
    let mut own_vae = None;
    let on_step = |i: usize, n: usize| -> Result<()> {
        progress.step(i, n);
        if let Some((_, x0)) = pending.borrow_mut().take() {
            // The step's activations go back to the device: the decode gets the room it plans for.
            b.release_cached()?;
            let vae = match vae {
                Some(v) => v,
                None => &*own_vae.insert(super::load_vae(b, ck, h, w)?),
            };
            let rgb = vae.decode_rgb8(b, &b.download(&x0)?)?;
            progress.preview(i, n, &rgb, pass.width, pass.height)?;
        }
        let stop = match ranks {
            Some(e) => e.crew.any_stop(progress.cancelled())?,
            None => progress.cancelled(),
        };
        if stop {
            return Err(Interrupted.into());
        }
        Ok(())
    };
    let windows = (spec.guidance, spec.skip_window, spec.guidance_window);
    let (x, count) = crate::sampler::device::sample_blended(b, x0, &sigmas, spec.sampler, &mut noise, windows, inpaint.as_ref(), velocities, on_step)?;
    let skipped = if spec.guidance != 1.0 { 2 * count.calls - count.passes } else { 0 };
    let forwards = match &caches {
        Some(pc) => Forwards {
            calls: count.calls,
            computed: pc.cond.computed + pc.uncond.computed,
            cached: pc.cond.served + pc.uncond.served,
            skipped,
            blocks_computed: pc.cond.blocks_run + pc.uncond.blocks_run,
            blocks_skipped: pc.cond.blocks_skipped + pc.uncond.blocks_skipped,
        },
        None => Forwards { calls: count.calls, computed: count.passes, cached: 0, skipped, blocks_computed: blocks_plain, blocks_skipped: 0 },
    };
    let z = b.download(&x)?;
    crate::tensor::ensure_finite("the latents after denoising", &z.data)?;
    Ok(Denoised { latents: z, forwards })
}

/// A guided step under CFG-parallel: this rank's group runs its pass (group 0 the prompt's, group 1
/// the negative's with its skipped blocks), over its sequence group if it has one; the pair
/// exchanges the two velocities, so every rank returns `(v_c, v_u)`, the same bytes.
fn cfg_parallel<B: DitOps>(
    b: &B,
    dit: &Dit<B>,
    x: &B::T,
    t: f32,
    (tc, tu, skip): (&TextCond<B>, &TextCond<B>, &[usize]),
    role: &Role<'_, B>,
) -> Result<(B::T, Option<B::T>)> {
    let mine = match role.group {
        0 => dit.velocity_on(b, x, t, tc, &[], role.seq)?,
        _ => dit.velocity_on(b, x, t, tu, skip, role.seq)?,
    };
    let pair = role.cfg.expect("two CFG groups have a pair transport");
    let (v_c, v_u) = parallel::exchange(b, pair, &mine)?;
    Ok((v_c, Some(v_u)))
}

/// The loop's settings against the checkpoint (the cache's compute blocks against its blocks):
/// checked before any weights load.
pub fn check_for(req: &Request, ck: &Checkpoint) -> Result<()> {
    if let Some(c) = &req.spec.cache {
        crate::spec::check_cache_blocks(c, ck.dit.num_layers).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}
