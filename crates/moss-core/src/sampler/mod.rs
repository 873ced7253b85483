//! Samplers for the flow-matching model by name (issue 42): each a state machine over the
//! schedule's sigmas that asks for velocities. The loop around it (CFG, skip layers, step
//! caching) answers each [`ModelCall`] with `v(x, σ)`; the sampler never sees the transformer.
//!
//! The latents the samplers work on are host `f32` vectors (fp32 as the references): one
//! `[1, 128, h, w]` latent is 2 MiB at 1024², so moving it to and from the device per model call
//! costs nothing next to a forward. `euler` on the backend keeps today's fused device step
//! ([`device::sample`]), byte-identical to [`crate::sampling::sample`].
//!
//! Every sampler equals, on the same sigmas and the same velocities, its reference
//! (tests/samplers.rs against golden/make_samplers.py):
//!
//! | name | reference | model calls for n steps |
//! |---|---|---|
//! | `euler` | diffusers `FlowMatchEulerDiscreteScheduler` | n |
//! | `heun` | diffusers `FlowMatchHeunDiscreteScheduler` | 2n − 1 (Euler on the last step) |
//! | `dpm++2m` | diffusers `DPMSolverMultistepScheduler` (`dpmsolver++`, flow sigmas, order 2) | n |
//! | `dpm++2m_sde` | the same with `sde-dpmsolver++` | n |
//! | `unipc` | diffusers `UniPCMultistepScheduler` (flow sigmas, bh2, order 2) | n |
//! | `lcm` | diffusers `FlowMatchLCMScheduler` | n |
//! | `euler_ancestral` | ComfyUI `sample_euler_ancestral_RF` (eta 1) | n |
//!
//! The stochastic ones (`dpm++2m_sde`, `lcm`, `euler_ancestral`) draw their step noise from
//! [`crate::noise::TorchGenerator`]: the seed's CPU generator continued after the initial latent
//! (what diffusers does when one `generator` is given to the pipeline), one `randn(latent)` per
//! step; `dpm++2m_sde` and `lcm` draw on every step (diffusers does, the last step's noise has
//! weight 0), `euler_ancestral` on every step but the one to σ = 0 (ComfyUI's).

use crate::noise::TorchGenerator;
use anyhow::{ensure, Result};
use std::fmt;
use std::str::FromStr;

mod ancestral;
pub mod device;
mod dpmpp;
mod euler;
mod heun;
mod lcm;
mod unipc;

/// A sampler by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    #[default]
    Euler,
    Heun,
    DpmPp2m,
    DpmPp2mSde,
    UniPc,
    Lcm,
    EulerAncestral,
}

impl Kind {
    /// Every sampler, by the name it is chosen with.
    pub const ALL: [(Kind, &'static str); 7] = [
        (Kind::Euler, "euler"),
        (Kind::Heun, "heun"),
        (Kind::DpmPp2m, "dpm++2m"),
        (Kind::DpmPp2mSde, "dpm++2m_sde"),
        (Kind::UniPc, "unipc"),
        (Kind::Lcm, "lcm"),
        (Kind::EulerAncestral, "euler_ancestral"),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(k, _)| *k == self).map(|(_, n)| *n).expect("every sampler is named")
    }

    /// The accepted names, comma separated (for error messages and help).
    pub fn names() -> String {
        Self::ALL.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
    }

    /// Whether it draws step noise (so its result depends on the generator, not only on `x`).
    pub fn stochastic(self) -> bool {
        matches!(self, Kind::DpmPp2mSde | Kind::Lcm | Kind::EulerAncestral)
    }

    /// How many model calls `steps` steps take.
    pub fn calls(self, steps: usize) -> usize {
        match self {
            Kind::Heun => (2 * steps).saturating_sub(1),
            _ => steps,
        }
    }

    /// The state machine over `sigmas` (`n + 1` values ending in 0).
    pub fn start(self, sigmas: &[f32]) -> Result<Box<dyn Sampler>> {
        ensure!(sigmas.len() >= 2, "the schedule needs at least one step");
        ensure!(*sigmas.last().unwrap() == 0.0, "the schedule must end at sigma 0");
        ensure!(sigmas.windows(2).all(|w| w[0] > w[1]) && sigmas[0] <= 1.0, "the sigmas must descend from at most 1 to 0");
        let s = sigmas.to_vec();
        Ok(match self {
            Kind::Euler => Box::new(euler::Euler::new(s)),
            Kind::Heun => Box::new(heun::Heun::new(s)),
            Kind::DpmPp2m => Box::new(dpmpp::DpmPp2m::new(s, false)),
            Kind::DpmPp2mSde => Box::new(dpmpp::DpmPp2m::new(s, true)),
            Kind::UniPc => Box::new(unipc::UniPc::new(s)),
            Kind::Lcm => Box::new(lcm::Lcm::new(s)),
            Kind::EulerAncestral => Box::new(ancestral::EulerAncestral::new(s)),
        })
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(k, _)| *k).ok_or_else(|| format!("unknown sampler `{s}`; the samplers are {}", Self::names()))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a sampler asks the model for: the velocity at `sigma` during schedule step `step` of
/// `steps` (Heun's second call of step `i` is at `σ_{i+1}` and still step `i`; guidance and
/// skip windows are decided by `step / steps`). `call` counts the calls from 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelCall {
    pub step: usize,
    pub steps: usize,
    pub sigma: f32,
    pub call: usize,
}

impl ModelCall {
    /// The transformer's timestep, `σ·1000` in f32 (spec 5.2).
    pub fn t(&self) -> f32 {
        self.sigma * 1000.0
    }
}

/// The model as the samplers see it: `v(x, call)` for the latent `x`.
pub type Model<'a> = dyn FnMut(&[f32], ModelCall) -> Result<Vec<f32>> + 'a;

/// One sampler's state over its sigmas.
pub trait Sampler {
    /// Step `i` (of `sigmas.len() − 1`): from `x` at `σ_i` to the latent at `σ_{i+1}`, asking
    /// `model` for the velocities it needs and `noise` for step noise.
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, noise: &mut TorchGenerator) -> Result<Vec<f32>>;
}

/// The model with the call counter (what a [`Sampler`] is handed).
pub struct Ask<'m, 'a> {
    model: &'m mut Model<'a>,
    steps: usize,
    calls: usize,
}

impl Ask<'_, '_> {
    /// `v(x, σ)` for step `step`, checked to have the latent's size.
    pub fn velocity(&mut self, x: &[f32], step: usize, sigma: f32) -> Result<Vec<f32>> {
        let call = ModelCall { step, steps: self.steps, sigma, call: self.calls };
        self.calls += 1;
        let v = (self.model)(x, call)?;
        ensure!(v.len() == x.len(), "the model gave {} values for a latent of {}", v.len(), x.len());
        Ok(v)
    }
}

/// Run `kind` over `sigmas` from `x`, asking `model` for velocities; `noise`: the seed's
/// generator after the initial latent (see the module notes). `on_step(i + 1, n, x)` after each
/// step (an error stops the loop). Returns the final latent and the number of model calls.
pub fn run(
    kind: Kind,
    sigmas: &[f32],
    x: Vec<f32>,
    noise: &mut TorchGenerator,
    model: &mut Model<'_>,
    on_step: impl FnMut(usize, usize, &[f32]) -> Result<()>,
) -> Result<(Vec<f32>, usize)> {
    run_with(kind, sigmas, x, noise, model, |_, x| Ok(x), on_step)
}

/// [`run`] with `after_step(i, x)` applied to the latent after step `i` (before `on_step`):
/// inpainting's latent blend ([`crate::img2img::Inpaint::after_step_host`]), which the sampler's
/// next step then starts from (its history of model outputs is its own, as in diffusers'
/// inpaint pipelines).
pub fn run_with(
    kind: Kind,
    sigmas: &[f32],
    mut x: Vec<f32>,
    noise: &mut TorchGenerator,
    model: &mut Model<'_>,
    mut after_step: impl FnMut(usize, Vec<f32>) -> Result<Vec<f32>>,
    mut on_step: impl FnMut(usize, usize, &[f32]) -> Result<()>,
) -> Result<(Vec<f32>, usize)> {
    let mut sampler = kind.start(sigmas)?;
    let n = sigmas.len() - 1;
    let mut ask = Ask { model, steps: n, calls: 0 };
    for i in 0..n {
        x = after_step(i, sampler.step(i, x, &mut ask, noise)?)?;
        on_step(i + 1, n, &x)?;
    }
    Ok((x, ask.calls))
}

/// `x0 = x − σ·v`, the flow model's denoised prediction, elementwise in f32.
fn denoised(x: &[f32], v: &[f32], sigma: f32) -> Vec<f32> {
    x.iter().zip(v).map(|(&x, &v)| x - sigma * v).collect()
}

/// `a·x + b·y` elementwise in f32 (each product rounded, then the sum).
fn lin2(a: f32, x: &[f32], b: f32, y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(&x, &y)| a * x + b * y).collect()
}

/// `λ(σ) = ln(1 − σ) − ln σ`, the half log-SNR of the flow parametrisation `α = 1 − σ`, in f32
/// as torch evaluates `log(alpha_t) − log(sigma_t)` (−∞ at σ = 1, +∞ at σ = 0).
fn lambda(sigma: f32) -> f32 {
    (1.0 - sigma).ln() - sigma.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_accepted_ones() {
        for (k, n) in Kind::ALL {
            assert_eq!(n.parse::<Kind>().unwrap(), k);
            assert_eq!(k.to_string(), n);
        }
        let e = "dpmpp_2m".parse::<Kind>().unwrap_err();
        assert!(e.contains("dpmpp_2m") && e.contains("dpm++2m_sde") && e.contains("euler_ancestral"), "{e}");
    }

    #[test]
    fn bad_sigmas_are_refused() {
        for bad in [&[1.0f32][..], &[1.0, 0.5], &[0.5, 0.6, 0.0], &[1.5, 0.5, 0.0]] {
            assert!(Kind::Euler.start(bad).is_err(), "{bad:?}");
        }
    }
}
