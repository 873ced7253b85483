//! `lcm`: diffusers `FlowMatchLCMScheduler`: the denoised `x0 = x − σ_i·v` re-noised to the next
//! sigma, `x ← (1 − σ_{i+1})·x0 + σ_{i+1}·ε`, with one `randn` draw every step (the last one's
//! weight is 0). Meant for the few-step (LCM/turbo) LoRAs at guidance 1.

use super::{denoised, lin2, Ask, Sampler};
use crate::noise::TorchGenerator;
use anyhow::Result;

pub struct Lcm {
    sigmas: Vec<f32>,
}

impl Lcm {
    pub fn new(sigmas: Vec<f32>) -> Self {
        Lcm { sigmas }
    }
}

impl Sampler for Lcm {
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, noise: &mut TorchGenerator) -> Result<Vec<f32>> {
        let (s, s_next) = (self.sigmas[i], self.sigmas[i + 1]);
        let x0 = denoised(&x, &model.velocity(&x, i, s)?, s);
        let eps = noise.randn(x.len());
        Ok(lin2(1.0 - s_next, &x0, s_next, &eps))
    }
}
