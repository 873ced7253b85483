//! The sampling loop (spec 5.3): classifier-free guidance with the unconditional pass skipping
//! blocks inside the skip window, and the Euler update, all in fp32.

use anyhow::Result;

/// What one DiT call of the loop is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pass {
    pub step: usize,
    /// The transformer's timestep (σ·1000).
    pub t: f32,
    /// true: the prompt; false: the negative (unconditional) branch.
    pub cond: bool,
    /// Whether the unconditional skip applies at this step.
    pub skip_active: bool,
}

/// `v = v_u + g (v_c − v_u)` then `x += dσ · v`, elementwise in f32 (the CPU twin of the
/// `moss_cfg_euler_f32` kernel).
pub fn cfg_euler(x: &mut [f32], v_c: &[f32], v_u: Option<&[f32]>, guidance: f32, dsigma: f32) {
    match v_u {
        Some(v_u) => {
            for ((x, &c), &u) in x.iter_mut().zip(v_c).zip(v_u) {
                *x += dsigma * (u + guidance * (c - u));
            }
        }
        None => {
            for (x, &c) in x.iter_mut().zip(v_c) {
                *x += dsigma * c;
            }
        }
    }
}

/// Run the loop from `x` over `sigmas` (ending in 0). `velocity(pass, x)` returns the DiT's
/// f32 velocity; `on_step(i, n)` is called after each step (for progress, and to stop early by
/// returning an error).
pub fn sample(
    mut x: Vec<f32>,
    sigmas: &[f32],
    guidance: f32,
    skip_window: (f64, f64),
    mut velocity: impl FnMut(Pass, &[f32]) -> Result<Vec<f32>>,
    mut on_step: impl FnMut(usize, usize) -> Result<()>,
) -> Result<Vec<f32>> {
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
        cfg_euler(&mut x, &v_c, v_u.as_deref(), guidance, dsigma);
        on_step(i + 1, n)?;
    }
    Ok(x)
}
