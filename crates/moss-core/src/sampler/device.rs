//! The sampling loop on a backend, for any [`Kind`]: what the pipeline calls in place of
//! [`crate::sampling::sample`], with the same `velocities` closure (the transformer's passes for
//! a [`Step`]: the prompt's, and the negative's when guided).
//!
//! - `euler` is today's loop itself ([`crate::sampling::sample`]: the fused device CFG + Euler
//!   update), so its latents are byte-identical to it.
//! - Every other sampler keeps the latent on the host in f32 ([`super::run`]). Per model call
//!   the latent is uploaded, the passes run, their CFG combine `v_u + g·(v_c − v_u)` is formed on
//!   the device by the same kernel as Euler's (`cfg_euler` from a zero latent with `dσ = 1`, so
//!   the same rounding), and `v` comes back.

use super::{Kind, ModelCall};
use crate::backend::ops::DitOps;
use crate::img2img::Inpaint;
use crate::noise::TorchGenerator;
use crate::sampling::{in_window, Step};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// What a loop did: model calls (each one guided step's passes count once) and DiT passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    pub calls: usize,
    pub passes: usize,
}

/// Run `kind` over `sigmas` (ending in 0) from `x`. `noise`: the seed's generator after the
/// initial latent was drawn from it (only the stochastic samplers draw). For a model call at
/// schedule step `i` of `n` the closure gets `Step { step: i, t: σ·1000, guided, skip_active }`
/// with `guided = guidance != 1` and `a <= i/n < b` of `guidance_window`, and `skip_active` the
/// same of `skip_window`, as today; it returns `v_c` and, when guided, `v_u`. `on_step(i + 1, n)`
/// after each step (an error stops the loop). Returns the final latent and the [`Count`].
#[allow(clippy::too_many_arguments)]
pub fn sample<B: DitOps>(
    b: &B,
    x: B::T,
    sigmas: &[f32],
    kind: Kind,
    noise: &mut TorchGenerator,
    guidance: f32,
    skip_window: (f64, f64),
    guidance_window: (f64, f64),
    velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    on_step: impl FnMut(usize, usize) -> Result<()>,
) -> Result<(B::T, Count)> {
    sample_blended(b, x, sigmas, kind, noise, (guidance, skip_window, guidance_window), None, velocities, on_step)
}

/// [`sample`] (its `guidance`, `skip_window` and `guidance_window` as one triple) with
/// inpainting's latent blend after every step when `blend` is given
/// ([`Inpaint::after_step`], on the host for the samplers that keep the latent there).
#[allow(clippy::too_many_arguments)]
pub fn sample_blended<B: DitOps>(
    b: &B,
    x: B::T,
    sigmas: &[f32],
    kind: Kind,
    noise: &mut TorchGenerator,
    (guidance, skip_window, guidance_window): (f32, (f64, f64), (f64, f64)),
    blend: Option<&Inpaint>,
    mut velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    mut on_step: impl FnMut(usize, usize) -> Result<()>,
) -> Result<(B::T, Count)> {
    if kind == Kind::Euler {
        let mut count = Count::default();
        let counted = |s: Step, x: &B::T| {
            count.calls += 1;
            count.passes += 1 + s.guided as usize;
            velocities(s, x)
        };
        let after = |i: usize, x: B::T| match blend {
            Some(p) => p.after_step(b, x, sigmas, i),
            None => Ok(x),
        };
        let x = crate::sampling::sample_in_window(b, x, sigmas, guidance, skip_window, guidance_window, counted, after, |i, n, _| on_step(i, n))?;
        return Ok((x, count));
    }
    on_host(b, x, sigmas, kind, noise, (guidance, skip_window, guidance_window), blend, velocities, on_step)
}

/// [`sample`]'s path for every sampler but `euler`: the latent on the host, each model call's
/// combined velocity from the device. For `euler` too it gives, on the CPU backend, exactly the
/// fused loop's latents (tests/samplers.rs).
#[allow(clippy::too_many_arguments)]
pub fn sample_on_host<B: DitOps>(
    b: &B,
    x: B::T,
    sigmas: &[f32],
    kind: Kind,
    noise: &mut TorchGenerator,
    guidance: f32,
    skip_window: (f64, f64),
    guidance_window: (f64, f64),
    velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    on_step: impl FnMut(usize, usize) -> Result<()>,
) -> Result<(B::T, Count)> {
    on_host(b, x, sigmas, kind, noise, (guidance, skip_window, guidance_window), None, velocities, on_step)
}

#[allow(clippy::too_many_arguments)]
fn on_host<B: DitOps>(
    b: &B,
    x: B::T,
    sigmas: &[f32],
    kind: Kind,
    noise: &mut TorchGenerator,
    (guidance, skip_window, guidance_window): (f32, (f64, f64), (f64, f64)),
    blend: Option<&Inpaint>,
    mut velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    mut on_step: impl FnMut(usize, usize) -> Result<()>,
) -> Result<(B::T, Count)> {
    let shape = b.dims(&x);
    let host = b.download(&x)?.data;
    let zero = if guidance != 1.0 { Some(b.upload_f32(&Tensor::new(shape.clone(), vec![0.0; host.len()])?)?) } else { None };
    let mut passes = 0;
    let mut model = |x: &[f32], call: ModelCall| -> Result<Vec<f32>> {
        let guided = guidance != 1.0 && in_window(call.step, call.steps, guidance_window);
        let step = Step { step: call.step, call: call.call, t: call.t(), guided, skip_active: in_window(call.step, call.steps, skip_window) };
        passes += 1 + guided as usize;
        let (v_c, v_u) = velocities(step, &b.upload_f32(&Tensor::new(shape.clone(), x.to_vec())?)?)?;
        ensure!(v_u.is_some() == guided, "step {}: {} negative velocity", call.step, if guided { "no" } else { "an unasked" });
        let v = match (&zero, v_u) {
            (Some(zero), Some(v_u)) => b.cfg_euler(zero, &v_c, Some(&v_u), guidance, 1.0)?,
            _ => v_c,
        };
        Ok(b.download(&v)?.data)
    };
    let after = |i: usize, x: Vec<f32>| match blend {
        Some(p) => p.after_step_host(x, sigmas, i),
        None => Ok(x),
    };
    let (x, calls) = super::run_with(kind, sigmas, host, noise, &mut model, after, |i, n, _| on_step(i, n))?;
    Ok((b.upload_f32(&Tensor::new(shape, x)?)?, Count { calls, passes }))
}
