//! `heun`: diffusers `FlowMatchHeunDiscreteScheduler` (no churn). Step `i` takes the Euler
//! predictor `x₁ = x + d₁·Δσ` with `d₁ = (x − x0)/σ_i`, `x0 = x − v·σ_i`, then (except on the
//! last step, which stays Euler) the model again at `σ_{i+1}`: `d₂ = (x₁ − x0₂)/σ_{i+1}` and
//! `x ← x + ½(d₁ + d₂)·Δσ`. 2n − 1 model calls for n steps.

use super::{Ask, Sampler};
use crate::noise::TorchGenerator;
use anyhow::Result;

pub struct Heun {
    sigmas: Vec<f32>,
}

impl Heun {
    pub fn new(sigmas: Vec<f32>) -> Self {
        Heun { sigmas }
    }
}

/// `(x − (x − v·σ))/σ`: the derivative as diffusers forms it through the denoised sample.
fn derivative(x: &[f32], v: &[f32], sigma: f32) -> Vec<f32> {
    x.iter().zip(v).map(|(&x, &v)| (x - (x - v * sigma)) / sigma).collect()
}

impl Sampler for Heun {
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, _: &mut TorchGenerator) -> Result<Vec<f32>> {
        let (s, s_next) = (self.sigmas[i], self.sigmas[i + 1]);
        let dt = s_next - s;
        let d1 = derivative(&x, &model.velocity(&x, i, s)?, s);
        let x1: Vec<f32> = x.iter().zip(&d1).map(|(&x, &d)| x + d * dt).collect();
        if i + 2 == self.sigmas.len() {
            return Ok(x1);
        }
        let d2 = derivative(&x1, &model.velocity(&x1, i, s_next)?, s_next);
        Ok(x.iter().zip(d1.iter().zip(&d2)).map(|(&x, (&a, &b))| x + (0.5 * (a + b)) * dt).collect())
    }
}
