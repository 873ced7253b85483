//! `euler_ancestral`: ComfyUI's `sample_euler_ancestral_RF` (comfy/k_diffusion/sampling.py, the
//! function its `euler_ancestral` runs for a rectified-flow model), eta = 1, s_noise = 1:
//! step down to `σ_down = σ_{i+1}·(1 + (σ_{i+1}/σ_i − 1)·η)` along the flow,
//! `x ← (σ_down/σ_i)·x + (1 − σ_down/σ_i)·x0`, then rescale and re-noise to `σ_{i+1}`:
//! `x ← (α_{i+1}/α_down)·x + c·ε` with `α = 1 − σ` and
//! `c = √(σ_{i+1}² − σ_down²·α_{i+1}²/α_down²)`. The step to σ = 0 returns `x0` (no draw).

use super::{denoised, Ask, Sampler};
use crate::noise::TorchGenerator;
use anyhow::Result;

pub struct EulerAncestral {
    sigmas: Vec<f32>,
    eta: f32,
}

impl EulerAncestral {
    pub fn new(sigmas: Vec<f32>) -> Self {
        EulerAncestral { sigmas, eta: 1.0 }
    }
}

impl Sampler for EulerAncestral {
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, noise: &mut TorchGenerator) -> Result<Vec<f32>> {
        let (s, s_next) = (self.sigmas[i], self.sigmas[i + 1]);
        let x0 = denoised(&x, &model.velocity(&x, i, s)?, s);
        if s_next == 0.0 {
            return Ok(x0);
        }
        let downstep_ratio = 1.0 + (s_next / s - 1.0) * self.eta;
        let sigma_down = s_next * downstep_ratio;
        let alpha_next = 1.0 - s_next;
        let alpha_down = 1.0 - sigma_down;
        let renoise = (s_next * s_next - sigma_down * sigma_down * (alpha_next * alpha_next) / (alpha_down * alpha_down)).sqrt();
        let ratio = sigma_down / s;
        let scale = alpha_next / alpha_down;
        let eps = noise.randn(x.len());
        Ok(x.iter().zip(&x0).zip(&eps).map(|((&x, &d), &e)| scale * (ratio * x + (1.0 - ratio) * d) + e * renoise).collect())
    }
}
