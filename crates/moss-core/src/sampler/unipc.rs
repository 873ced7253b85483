//! `unipc`: diffusers `UniPCMultistepScheduler` with flow sigmas (`α = 1 − σ`),
//! `flow_prediction`, its defaults: `bh2`, solver order 2, `predict_x0`, `lower_order_final`, the
//! corrector on every step. Step `i`: the model at `σ_i` gives `m_i = x − σ_i·v`; the corrector
//! UniC (from step 1) revises `x` with `m_i`; the predictor UniP takes it to `σ_{i+1}`.
//! With `λ = ln α − ln σ`, `h = λ_t − λ_{s0}`, `hh = −h`, `φ₁ = e^{hh} − 1`, `B = e^{hh} − 1`:
//!
//! - UniP: `x_t = (σ_t/σ_{s0})·x − α_t·φ₁·m_{s0} − α_t·B·ρ·D1`, order 2 with `ρ = ½`,
//!   `D1 = (m_{s1} − m_{s0})/r`, `r = (λ_{s1} − λ_{s0})/h`;
//! - UniC: the same base from the previous step's `x`, plus `α_t·B·(ρ_c·D1 + ρ_t·(m_t − m_{s0}))`
//!   with `(ρ_c, ρ_t)` from `R ρ = b` (`ρ_t = ½` at order 1).
//!
//! Orders warm up (1, then 2) and step down to 1 on the last step. σ = 1 gives `λ = −∞` and
//! infinite `r`, handled as torch's infinities (and LAPACK's pivoting) handle them.

use super::{denoised, lambda, Ask, Sampler};
use crate::noise::TorchGenerator;
use anyhow::Result;

pub struct UniPc {
    sigmas: Vec<f32>,
    /// The data predictions of the last two steps, oldest first.
    outputs: Vec<Vec<f32>>,
    /// The latent the last predictor started from (the corrector's base).
    last_sample: Option<Vec<f32>>,
    /// The order of the last predictor (the corrector uses it).
    this_order: usize,
    lower_order_nums: usize,
}

const ORDER: usize = 2;

impl UniPc {
    pub fn new(sigmas: Vec<f32>) -> Self {
        UniPc { sigmas, outputs: vec![], last_sample: None, this_order: 1, lower_order_nums: 0 }
    }
}

/// The shared coefficients of a UniP/UniC update from `σ_{s0}` to `σ_t`.
struct Coef {
    /// `σ_t/σ_{s0}`
    cx: f32,
    /// `α_t·φ₁`
    cm: f32,
    /// `α_t·B`
    cb: f32,
    h: f32,
    hh: f32,
    phi1: f32,
    b_h: f32,
}

fn coef(s0: f32, st: f32) -> Coef {
    let at = 1.0 - st;
    let h = lambda(st) - lambda(s0);
    let hh = -h;
    let phi1 = hh.exp_m1();
    let b_h = hh.exp_m1();
    Coef { cx: st / s0, cm: at * phi1, cb: at * b_h, h, hh, phi1, b_h }
}

/// `(m_i − m0)/r` with `r = (λ(σ_i) − λ(σ_{s0}))/h`.
fn d1(mi: &[f32], m0: &[f32], s_i: f32, s0: f32, h: f32) -> Vec<f32> {
    let r = (lambda(s_i) - lambda(s0)) / h;
    mi.iter().zip(m0).map(|(&a, &b)| (a - b) / r).collect()
}

/// `[[1, 1], [r, 1]] ρ = b` by LU with partial pivoting (LAPACK `sgesv`), in f32.
fn solve2(r: f32, b: [f32; 2]) -> [f32; 2] {
    let (mut a, mut b) = ([[1.0f32, 1.0], [r, 1.0]], b);
    if a[1][0].abs() > a[0][0].abs() {
        a.swap(0, 1);
        b.swap(0, 1);
    }
    let l = a[1][0] / a[0][0];
    let u11 = a[1][1] - l * a[0][1];
    let y1 = b[1] - l * b[0];
    let x1 = y1 / u11;
    let x0 = (b[0] - a[0][1] * x1) / a[0][0];
    [x0, x1]
}

impl UniPc {
    /// UniC: the latent at `σ_i` again, from the last predictor's start, with `m_t` (the data
    /// prediction made at `σ_i`).
    fn correct(&self, i: usize, m_t: &[f32], order: usize) -> Vec<f32> {
        let (s0, st) = (self.sigmas[i - 1], self.sigmas[i]);
        let x = self.last_sample.as_ref().expect("the corrector follows a predictor");
        let m0 = &self.outputs[self.outputs.len() - 1];
        let c = coef(s0, st);
        let (rho, d) = if order == 1 {
            ([0.0, 0.5], None)
        } else {
            let s1 = self.sigmas[i - 2];
            let m1 = &self.outputs[self.outputs.len() - 2];
            let r = (lambda(s1) - lambda(s0)) / c.h;
            // b_k = h_phi_k · k! / B_h for k = 1, 2.
            let mut h_phi_k = c.phi1 / c.hh - 1.0;
            let b1 = h_phi_k * 1.0 / c.b_h;
            h_phi_k = h_phi_k / c.hh - 1.0 / 2.0;
            let b2 = h_phi_k * 2.0 / c.b_h;
            (solve2(r, [b1, b2]), Some(d1(m1, m0, s1, s0, c.h)))
        };
        (0..x.len())
            .map(|k| {
                let base = c.cx * x[k] - c.cm * m0[k];
                let corr = match &d {
                    Some(d) => rho[0] * d[k],
                    None => 0.0,
                };
                base - c.cb * (corr + rho[1] * (m_t[k] - m0[k]))
            })
            .collect()
    }

    /// UniP: from `x` at `σ_i` to `σ_{i+1}` with the last `order` data predictions.
    fn predict(&self, i: usize, x: &[f32], order: usize) -> Vec<f32> {
        let (s0, st) = (self.sigmas[i], self.sigmas[i + 1]);
        let m0 = &self.outputs[self.outputs.len() - 1];
        let c = coef(s0, st);
        let d = (order == 2).then(|| d1(&self.outputs[self.outputs.len() - 2], m0, self.sigmas[i - 1], s0, c.h));
        (0..x.len())
            .map(|k| {
                let base = c.cx * x[k] - c.cm * m0[k];
                match &d {
                    Some(d) => base - c.cb * (0.5 * d[k]),
                    None => base,
                }
            })
            .collect()
    }
}

impl Sampler for UniPc {
    fn step(&mut self, i: usize, x: Vec<f32>, model: &mut Ask<'_, '_>, _: &mut TorchGenerator) -> Result<Vec<f32>> {
        let n = self.sigmas.len() - 1;
        let s = self.sigmas[i];
        let m = denoised(&x, &model.velocity(&x, i, s)?, s);
        let x = if i > 0 && self.last_sample.is_some() { self.correct(i, &m, self.this_order) } else { x };
        self.outputs.push(m);
        if self.outputs.len() > ORDER {
            self.outputs.remove(0);
        }
        self.this_order = ORDER.min(n - i).min(self.lower_order_nums + 1);
        let out = self.predict(i, &x, self.this_order);
        self.last_sample = Some(x);
        self.lower_order_nums = (self.lower_order_nums + 1).min(ORDER);
        Ok(out)
    }
}
