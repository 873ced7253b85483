//! `dpm++2m` and `dpm++2m_sde`: diffusers `DPMSolverMultistepScheduler` with flow sigmas
//! (`α = 1 − σ`), `prediction_type = "flow_prediction"` (the data prediction `m = x − σ·v`),
//! `algorithm_type` `dpmsolver++` / `sde-dpmsolver++`, its defaults: solver order 2, midpoint,
//! `lower_order_final`, final sigma 0. With `λ = ln α − ln σ`, `h = λ_{i+1} − λ_i`:
//!
//! - first order (the first step and the last):
//!   ODE `x ← (σ_{i+1}/σ_i)·x − α_{i+1}(e^{−h} − 1)·m_i`;
//!   SDE `x ← (σ_{i+1}/σ_i·e^{−h})·x + α_{i+1}(1 − e^{−2h})·m_i + σ_{i+1}√(1 − e^{−2h})·ε`;
//! - second order: `D0 = m_i`, `D1 = (m_i − m_{i−1})/r0`, `r0 = (λ_i − λ_{i−1})/h`, and the
//!   first-order update on `D0` plus `½` of the same coefficient on `D1`.
//!
//! σ = 1 (the model's first sigma) makes `λ = −∞`: `e^{−h} = 0` and `D1 = 0`, exactly as torch's
//! infinities do. The SDE draws `ε` on every step.

use super::{denoised, lambda, Ask, Sampler};
use crate::noise::TorchGenerator;
use anyhow::Result;

pub struct DpmPp2m {
    sigmas: Vec<f32>,
    sde: bool,
    /// The previous step's data prediction (None before the first step).
    prev: Option<Vec<f32>>,
}

impl DpmPp2m {
    pub fn new(sigmas: Vec<f32>, sde: bool) -> Self {
        DpmPp2m { sigmas, sde, prev: None }
    }
}

impl Sampler for DpmPp2m {
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, noise: &mut TorchGenerator) -> Result<Vec<f32>> {
        let n = self.sigmas.len() - 1;
        let (s0, st) = (self.sigmas[i], self.sigmas[i + 1]);
        let m0 = denoised(&x, &model.velocity(&x, i, s0)?, s0);
        let eps = if self.sde { Some(noise.randn(x.len())) } else { None };
        let at = 1.0 - st;
        let h = lambda(st) - lambda(s0);
        let first_order = i == n - 1;
        // D1 = (1/r0)·(m0 − m1), or none (first order).
        let d1: Option<Vec<f32>> = match (&self.prev, first_order) {
            (Some(m1), false) => {
                let r0 = (lambda(s0) - lambda(self.sigmas[i - 1])) / h;
                let k = 1.0 / r0;
                Some(m0.iter().zip(m1).map(|(&a, &b)| k * (a - b)).collect())
            }
            _ => None,
        };
        let out: Vec<f32> = if let Some(eps) = eps {
            let cx = st / s0 * (-h).exp();
            let cm = at * (1.0 - (-2.0 * h).exp());
            let ce = st * (1.0 - (-2.0 * h).exp()).sqrt();
            (0..x.len())
                .map(|k| {
                    let mut y = cx * x[k] + cm * m0[k];
                    if let Some(d1) = &d1 {
                        y += 0.5 * cm * d1[k];
                    }
                    y + ce * eps[k]
                })
                .collect()
        } else {
            let cx = st / s0;
            let cm = at * ((-h).exp() - 1.0);
            (0..x.len())
                .map(|k| {
                    let mut y = cx * x[k] - cm * m0[k];
                    if let Some(d1) = &d1 {
                        y -= 0.5 * cm * d1[k];
                    }
                    y
                })
                .collect()
        };
        self.prev = Some(m0);
        Ok(out)
    }
}
