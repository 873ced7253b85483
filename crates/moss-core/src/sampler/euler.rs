//! `euler`: `x ← x + (σ_{i+1} − σ_i)·v`, the σ difference in f32 (spec 5.3; diffusers
//! `FlowMatchEulerDiscreteScheduler.step`: `sample + dt * model_output`).

use super::{Ask, Sampler};
use crate::noise::TorchGenerator;
use anyhow::Result;

pub struct Euler {
    sigmas: Vec<f32>,
}

impl Euler {
    pub fn new(sigmas: Vec<f32>) -> Self {
        Euler { sigmas }
    }
}

impl Sampler for Euler {
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, _: &mut TorchGenerator) -> Result<Vec<f32>> {
        let v = model.velocity(&x, i, self.sigmas[i])?;
        let dt = self.sigmas[i + 1] - self.sigmas[i];
        Ok(x.iter().zip(&v).map(|(&x, &v)| x + dt * v).collect())
    }
}
