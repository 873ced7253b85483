//! Sigma schedules by name (issue 42): the model's own (spec 5.2, [`crate::schedule::sigmas`]) and
//! the named alternatives people pick in ComfyUI and diffusers. Each gives `steps + 1` float32
//! sigmas, descending, ending in 0.
//!
//! - `karras`, `exponential`, `beta`: diffusers' `FlowMatchEulerDiscreteScheduler` with
//!   `use_karras_sigmas` / `use_exponential_sigmas` / `use_beta_sigmas` and the checkpoint's
//!   shift: its shifted grid `shift(linspace(σmax·T, σmin·T, n)/T)` sets the ends
//!   `[σ_lo, σ_hi]`, then the schedule is drawn between them, in float64, rounded to f32 once.
//! - `simple`, `sgm_uniform`: ComfyUI's `simple_scheduler` and `normal_scheduler(sgm=True)`
//!   (comfy/samplers.py) over `ModelSamplingDiscreteFlow`'s float32 table
//!   `σ_k = shift(k/1000)`, `k = 1..1000` (comfy/model_sampling.py).

use crate::schedule::{linspace_f32, ScheduleConfig};
use anyhow::{bail, Result};
use std::fmt;
use std::str::FromStr;

/// A sigma schedule by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// The checkpoint's own (spec 5.2): the shifted grid snapped to the training grid.
    #[default]
    Model,
    Simple,
    Karras,
    Exponential,
    Beta,
    SgmUniform,
}

impl Schedule {
    /// Every schedule, by the name it is chosen with.
    pub const ALL: [(Schedule, &'static str); 6] = [
        (Schedule::Model, "model"),
        (Schedule::Simple, "simple"),
        (Schedule::Karras, "karras"),
        (Schedule::Exponential, "exponential"),
        (Schedule::Beta, "beta"),
        (Schedule::SgmUniform, "sgm_uniform"),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(s, _)| *s == self).map(|(_, n)| *n).expect("every schedule is named")
    }

    /// The accepted names, comma separated (for error messages and help).
    pub fn names() -> String {
        Self::ALL.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
    }

    /// `steps + 1` sigmas ending in 0 (the model's own may have fewer steps, spec 5.2 step 4).
    pub fn sigmas(self, steps: usize, cfg: &ScheduleConfig) -> Result<Vec<f32>> {
        if steps == 0 {
            bail!("a schedule needs at least one step");
        }
        let mut s: Vec<f32> = match self {
            Schedule::Model => return Ok(crate::schedule::sigmas(steps, cfg)),
            Schedule::Karras | Schedule::Exponential | Schedule::Beta => {
                let (lo, hi) = flow_match_ends(steps, cfg);
                let s64: Vec<f64> = match self {
                    Schedule::Karras => karras(steps, lo, hi),
                    Schedule::Exponential => exponential(steps, lo, hi),
                    _ => beta(steps, lo, hi, 0.6, 0.6),
                };
                s64.into_iter().map(|v| v as f32).collect()
            }
            Schedule::Simple => {
                let table = comfy_flow_table(cfg);
                let ss = table.len() as f64 / steps as f64;
                (0..steps).map(|x| table[table.len() - 1 - (x as f64 * ss) as usize]).collect()
            }
            Schedule::SgmUniform => {
                let table = comfy_flow_table(cfg);
                let mult = 1000.0f32;
                let (start, end) = (table[table.len() - 1] * mult, table[0] * mult);
                let ts = linspace_f32(start, end, steps + 1);
                ts[..steps].iter().map(|&t| time_snr_shift(cfg.shift as f32, t / mult)).collect()
            }
        };
        s.push(0.0);
        Ok(s)
    }
}

impl FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(k, _)| *k).ok_or_else(|| format!("unknown schedule `{s}`; the schedules are {}", Self::names()))
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ComfyUI's `time_snr_shift(alpha, t) = alpha·t / (1 + (alpha−1)·t)` in float32.
fn time_snr_shift(alpha: f32, t: f32) -> f32 {
    if alpha == 1.0 {
        return t;
    }
    alpha * t / (1.0 + (alpha - 1.0) * t)
}

/// `ModelSamplingDiscreteFlow.sigmas`: `σ(k/T·1000)` for `k = 1..T` (ascending), float32 as
/// torch computes `arange(1, T+1) / T * multiplier` then `/ multiplier`.
fn comfy_flow_table(cfg: &ScheduleConfig) -> Vec<f32> {
    let t = cfg.num_train_timesteps;
    let mult = 1000.0f32;
    (1..=t).map(|k| time_snr_shift(cfg.shift as f32, (k as f32 / t as f32) * mult / mult)).collect()
}

/// numpy's `linspace(start, stop, n)` in float64: `i·step + start`, the last exactly `stop`.
fn linspace_f64(start: f64, stop: f64, n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![start];
    }
    let step = (stop - start) / (n - 1) as f64;
    (0..n).map(|i| if i == n - 1 { stop } else { i as f64 * step + start }).collect()
}

/// The ends `(σ_lo, σ_hi)` of `FlowMatchEulerDiscreteScheduler.set_timesteps(steps)` before its
/// karras/exponential/beta conversion: its `__init__` table (float32) gives `σmax`, `σmin`; then
/// `linspace(σmax·T, σmin·T, steps)/T` is shifted again (float64), first and last taken.
fn flow_match_ends(steps: usize, cfg: &ScheduleConfig) -> (f64, f64) {
    let t = cfg.num_train_timesteps;
    let s32 = cfg.shift as f32;
    let shift32 = |v: f32| s32 * v / (1.0 + (s32 - 1.0) * v);
    // The table's ends: timesteps T and 1 over T.
    let sigma_max = shift32(1.0) as f64;
    let sigma_min = shift32(1.0 / t as f32) as f64;
    let ts = linspace_f64(sigma_max * t as f64, sigma_min * t as f64, steps);
    let s = cfg.shift;
    let shift64 = |v: f64| s * v / (1.0 + (s - 1.0) * v);
    (shift64(ts[steps - 1] / t as f64), shift64(ts[0] / t as f64))
}

/// Karras et al. (2022), ρ = 7: `(hi^(1/ρ) + ramp·(lo^(1/ρ) − hi^(1/ρ)))^ρ`.
fn karras(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let rho = 7.0;
    let (min_inv, max_inv) = (lo.powf(1.0 / rho), hi.powf(1.0 / rho));
    linspace_f64(0.0, 1.0, n).into_iter().map(|r| (max_inv + r * (min_inv - max_inv)).powf(rho)).collect()
}

/// Evenly spaced in log σ.
fn exponential(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    linspace_f64(hi.ln(), lo.ln(), n).into_iter().map(f64::exp).collect()
}

/// "Beta Sampling is All You Need" (arXiv 2407.12173): `lo + ppf(1 − u)·(hi − lo)` over
/// `u = linspace(0, 1, n)`, ppf the inverse CDF of Beta(α, β).
fn beta(n: usize, lo: f64, hi: f64, alpha: f64, beta: f64) -> Vec<f64> {
    linspace_f64(0.0, 1.0, n).into_iter().map(|u| lo + statrs::function::beta::inv_beta_reg(alpha, beta, 1.0 - u) * (hi - lo)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_accepted_ones() {
        for (s, n) in Schedule::ALL {
            assert_eq!(n.parse::<Schedule>().unwrap(), s);
            assert_eq!(s.to_string(), n);
        }
        let e = "karas".parse::<Schedule>().unwrap_err();
        assert!(e.contains("karas") && e.contains("sgm_uniform"), "{e}");
    }

    #[test]
    fn the_model_schedule_is_spec_5_2() {
        let cfg = ScheduleConfig::default();
        assert_eq!(Schedule::Model.sigmas(50, &cfg).unwrap(), crate::schedule::sigmas(50, &cfg));
    }

    #[test]
    fn every_schedule_descends_from_about_one_to_zero() {
        let cfg = ScheduleConfig::default();
        for (s, n) in Schedule::ALL {
            for steps in [1, 2, 9, 50] {
                let v = s.sigmas(steps, &cfg).unwrap();
                assert_eq!(v.len(), steps + 1, "{n} {steps}");
                assert_eq!(*v.last().unwrap(), 0.0);
                assert!(v.windows(2).all(|w| w[0] > w[1]), "{n} {steps}: {v:?}");
                assert!(v[0] <= 1.0 && v[0] > 0.99, "{n} {steps}: {v:?}");
            }
        }
        assert!(Schedule::Karras.sigmas(0, &cfg).is_err());
    }
}
