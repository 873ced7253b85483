//! The sampling loop (spec 5.3): classifier-free guidance with the unconditional pass skipping
//! blocks inside the skip window, and the Euler update, all in fp32. The latents stay on the
//! backend; the combine and update is the fused [`DitOps::cfg_euler`].

use crate::backend::ops::DitOps;
use anyhow::{ensure, Result};

/// What one DiT call of the loop is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pass {
    pub step: usize,
    /// The transformer's timestep (σ·1000, in f32).
    pub t: f32,
    /// true: the prompt; false: the negative (unconditional) branch.
    pub cond: bool,
    /// Whether the unconditional skip applies at this step (`start <= i/n < stop`).
    pub skip_active: bool,
}

/// Run the loop from `x` over `sigmas` (ending in 0). For step `i` of `n`:
/// `v_c = velocity(cond)`; unless `guidance == 1` exactly, `v_u = velocity(uncond)` and
/// `v = v_u + guidance·(v_c − v_u)`, else `v = v_c`; then `x += (σ_{i+1} − σ_i)·v` (the σ
/// difference in f32). `on_step(i + 1, n, x)` is called after each step (for progress and
/// tests; an error stops the loop).
pub fn sample<B: DitOps>(
    b: &B,
    mut x: B::T,
    sigmas: &[f32],
    guidance: f32,
    skip_window: (f64, f64),
    mut velocity: impl FnMut(Pass, &B::T) -> Result<B::T>,
    mut on_step: impl FnMut(usize, usize, &B::T) -> Result<()>,
) -> Result<B::T> {
    ensure!(sigmas.len() >= 2, "the schedule needs at least one step");
    let n = sigmas.len() - 1;
    for i in 0..n {
        let t = sigmas[i] * 1000.0;
        let frac = i as f64 / n as f64;
        let skip_active = skip_window.0 <= frac && frac < skip_window.1;
        let v_c = velocity(Pass { step: i, t, cond: true, skip_active }, &x)?;
        let v_u = if guidance != 1.0 {
            Some(velocity(Pass { step: i, t, cond: false, skip_active }, &x)?)
        } else {
            None
        };
        let dsigma = sigmas[i + 1] - sigmas[i];
        x = b.cfg_euler(&x, &v_c, v_u.as_ref(), guidance, dsigma)?;
        on_step(i + 1, n, &x)?;
    }
    Ok(x)
}
