//! The sampling schedule (spec section 5.2): a shift-5 sigma grid snapped onto the 1000-point
//! training grid, bit-exact to torch's float32 arithmetic.

/// `torch.linspace(start, end, n)` in float32 as torch's CPU kernel computes it: the step in f32,
/// the first half counted up from `start`, the second half down from `end`, each a single
/// fused multiply-add.
pub fn linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    match n {
        0 => return vec![],
        1 => return vec![start],
        _ => {}
    }
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n).map(|i| if i < half { step.mul_add(i as f32, start) } else { (-step).mul_add((n - 1 - i) as f32, end) }).collect()
}

/// `s·v / (1 + (s−1)·v)` over `v = linspace(1, s/(T+s−1), n)`, descending from 1.
fn shifted_grid(n: usize, shift: f64, train_steps: usize) -> Vec<f32> {
    let end = (shift / (train_steps as f64 + shift - 1.0)) as f32;
    let s = shift as f32;
    let sm1 = (shift - 1.0) as f32;
    linspace_f32(1.0, end, n).into_iter().map(|v| (s * v) / (1.0 + sm1 * v)).collect()
}

/// The scheduler's configuration (`scheduler/scheduler_config.json`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScheduleConfig {
    pub num_train_timesteps: usize,
    pub shift: f64,
    pub training_shift: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig { num_train_timesteps: 1000, shift: 5.0, training_shift: 1.0 }
    }
}

/// The sigmas for `steps` steps: `steps` snapped values (fewer only if snapping made two equal)
/// followed by a terminal 0.
pub fn sigmas(steps: usize, cfg: &ScheduleConfig) -> Vec<f32> {
    let t = cfg.num_train_timesteps;
    let proposed = shifted_grid(steps, cfg.shift, t);
    let mut training = shifted_grid(t, cfg.training_shift, t);
    training.reverse(); // ascending
    let last = training.len() - 1;
    let mut out: Vec<f32> = Vec::with_capacity(steps + 1);
    for &s in &proposed {
        let upper = training.partition_point(|&x| x < s).min(last);
        let lower = upper.saturating_sub(1);
        let snapped = if (s - training[lower]).abs() <= (training[upper] - s).abs() { training[lower] } else { training[upper] };
        if out.last() != Some(&snapped) {
            out.push(snapped);
        }
    }
    out.push(0.0);
    out
}

/// The transformer's timestep for each step: `sigma * 1000` in float32 (not in [0, 1]).
pub fn timesteps(sigmas: &[f32]) -> Vec<f32> {
    sigmas[..sigmas.len() - 1].iter().map(|s| s * 1000.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 50-step table of spec section 5.2 (shortest float32 repr), an external reference.
    const SPEC_50: [f32; 51] = [
        1., 0.996, 0.992, 0.987, 0.983, 0.978, 0.973, 0.968, 0.963, 0.957, 0.952, 0.946, 0.939, 0.93299997, 0.926, 0.91899997, 0.912, 0.905, 0.897, 0.888,
        0.88, 0.871, 0.861, 0.851, 0.84, 0.829, 0.817, 0.805, 0.791, 0.777, 0.76199996, 0.746, 0.729, 0.71099997, 0.692, 0.671, 0.648, 0.62299997, 0.597,
        0.56799996, 0.53599995, 0.501, 0.46300003, 0.42100003, 0.37300003, 0.321, 0.261, 0.193, 0.115, 0.024, 0.,
    ];

    #[test]
    fn fifty_steps_match_the_spec_table_bit_for_bit() {
        let got = sigmas(50, &ScheduleConfig::default());
        assert_eq!(got.len(), 51);
        for (i, (g, e)) in got.iter().zip(SPEC_50.iter()).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "sigma {i}: got {g:e}, spec {e:e}");
        }
        assert_eq!(timesteps(&got)[0], 1000.0);
    }
}
