//! The sampling loop (spec 5.3): classifier-free guidance with the unconditional pass skipping
//! blocks inside the skip window, and the Euler update, all in fp32. The latents stay on the
//! backend; the combine and update is the fused [`DitOps::cfg_euler`].

use crate::backend::ops::DitOps;
use anyhow::{ensure, Result};

/// What one step of the loop asks the transformer for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub step: usize,
    /// The model call's index from 0 (equal to `step` for one call a step; step caching counts
    /// calls, [`crate::cache`]).
    pub call: usize,
    /// The transformer's timestep (σ·1000, in f32).
    pub t: f32,
    /// Whether the negative (unconditional) velocity is wanted too (guidance is not exactly 1 and
    /// the step is inside the guidance window).
    pub guided: bool,
    /// Whether the unconditional skip applies at this step (`start <= i/n < stop`).
    pub skip_active: bool,
}

/// Run the loop from `x` over `sigmas` (ending in 0). For step `i` of `n`, `velocities` gives
/// `v_c` (the prompt's) and, unless `guidance == 1` exactly, `v_u` (the negative's), and
/// `v = v_u + guidance·(v_c − v_u)`, else `v = v_c`; then `x += (σ_{i+1} − σ_i)·v` (the σ
/// difference in f32). `on_step(i + 1, n, x)` is called after each step (for progress and
/// tests; an error stops the loop).
pub fn sample<B: DitOps>(
    b: &B,
    x: B::T,
    sigmas: &[f32],
    guidance: f32,
    skip_window: (f64, f64),
    velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    on_step: impl FnMut(usize, usize, &B::T) -> Result<()>,
) -> Result<B::T> {
    sample_with(b, x, sigmas, guidance, skip_window, velocities, |_, x| Ok(x), on_step)
}

/// [`sample`] with `after_step(i, x)` applied to the latents after the Euler update of step
/// `i` (before `on_step`): inpainting's latent blend ([`crate::img2img::Inpaint::after_step`]).
#[allow(clippy::too_many_arguments)]
pub fn sample_with<B: DitOps>(
    b: &B,
    x: B::T,
    sigmas: &[f32],
    guidance: f32,
    skip_window: (f64, f64),
    velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    after_step: impl FnMut(usize, B::T) -> Result<B::T>,
    on_step: impl FnMut(usize, usize, &B::T) -> Result<()>,
) -> Result<B::T> {
    sample_in_window(b, x, sigmas, guidance, skip_window, (0.0, 1.0), velocities, after_step, on_step)
}

/// Whether step `i` of `n` is inside the window `(a, b)`: `a <= i/n < b`.
pub fn in_window(i: usize, n: usize, (a, b): (f64, f64)) -> bool {
    let frac = i as f64 / n as f64;
    a <= frac && frac < b
}

/// [`sample_with`] with the guidance applied only inside `guidance_window` (`a <= i/n < b`):
/// outside it the step is unguided (`v = v_c`) and the negative pass is not asked for. `(0, 1)`
/// guides every step.
#[allow(clippy::too_many_arguments)]
pub fn sample_in_window<B: DitOps>(
    b: &B,
    mut x: B::T,
    sigmas: &[f32],
    guidance: f32,
    skip_window: (f64, f64),
    guidance_window: (f64, f64),
    mut velocities: impl FnMut(Step, &B::T) -> Result<(B::T, Option<B::T>)>,
    mut after_step: impl FnMut(usize, B::T) -> Result<B::T>,
    mut on_step: impl FnMut(usize, usize, &B::T) -> Result<()>,
) -> Result<B::T> {
    ensure!(sigmas.len() >= 2, "the schedule needs at least one step");
    let n = sigmas.len() - 1;
    for i in 0..n {
        let t = sigmas[i] * 1000.0;
        let skip_active = in_window(i, n, skip_window);
        let guided = guidance != 1.0 && in_window(i, n, guidance_window);
        let (v_c, v_u) = velocities(Step { step: i, call: i, t, guided, skip_active }, &x)?;
        ensure!(v_u.is_some() == guided, "step {i}: {} negative velocity", if guided { "no" } else { "an unasked" });
        let dsigma = sigmas[i + 1] - sigmas[i];
        x = after_step(i, b.cfg_euler(&x, &v_c, v_u.as_ref(), guidance, dsigma)?)?;
        on_step(i + 1, n, &x)?;
    }
    Ok(x)
}
