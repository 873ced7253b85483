//! The server's start-up plan (`moss serve --max-vram`): the three networks' byte counts for the
//! largest request the server accepts (its `--max-size` and `--max-tokens`), placed by
//! [`super::serve`] under the cap before any weights load: what stays loaded between
//! requests, what streams, what is loaded for each request, and the budgets the stages run in.

use super::run::{dit_activations, networks};
use super::serve::{self, Keep, ServePlan};
use super::{Budget, MemoryOptions, Placement, RESERVE};
use crate::checkpoint::Checkpoint;
use anyhow::Result;

/// What the server loads and how.
#[derive(Clone, Debug)]
pub struct ServeRunPlan {
    pub plan: ServePlan,
    /// Device bytes the cap leaves the VAE decode's activations beside what the others keep
    /// (`None`: no cap).
    pub vae_activations: Option<u64>,
    /// The most joint tokens (`W/16 * H/16` + prompt tokens) a DiT forward may take beside what
    /// is kept (`usize::MAX`: no cap); at least the largest request's.
    pub joint_tokens: usize,
    /// The cap was clamped to the device (the warning to print).
    pub warning: Option<String>,
    /// How the transformer's main blocks hold their matrices (the budget's).
    pub linears: crate::model::dit::MainLinears,
}

/// The plan for requests up to `max_size` (W, H) and `max_tokens` prompt tokens; refused before
/// anything loads when even streaming does not fit, naming the smallest cap that works.
pub fn decide(ck: &Checkpoint, budget: &Budget, opts: &MemoryOptions, max_size: (u32, u32), max_tokens: usize) -> Result<ServeRunPlan> {
    let mut nets = networks(ck, budget, max_tokens, max_size)?;
    // Edits encode a picture of up to the largest size in the VAE's stage.
    super::run::with_vae_encode(&mut nets, ck, budget, max_size);
    let (cap, warning) = budget.cap(opts);
    let plan = serve::plan(cap, budget.overhead, &nets)?;
    if cap == u64::MAX {
        return Ok(ServeRunPlan { plan, vae_activations: None, joint_tokens: usize::MAX, warning, linears: budget.linears });
    }
    let room = |name: &str| (cap - budget.overhead).saturating_sub(plan.kept_beside(name));
    let vae = nets.iter().find(|n| n.name == "vae").map_or(0, |n| n.weights);
    let vae_activations = Some(room("vae").saturating_sub(vae + RESERVE));
    // The DiT's activations get its stage's room less what it holds besides them.
    let joint_tokens = match (plan.get("transformer"), nets.iter().find(|n| n.name == "transformer")) {
        (Some(d), Some(n)) => {
            let act_room = room("transformer").saturating_sub(d.stage.device_bytes - n.activations);
            let most = (crate::options::MAX_SIDE as usize / 16).pow(2) + crate::prompt::MAX_TOKENS;
            largest(most, |t| dit_activations(ck, budget, t) <= act_room)
        }
        _ => usize::MAX,
    };
    Ok(ServeRunPlan { plan, vae_activations, joint_tokens, warning, linears: budget.linears })
}

/// The largest `t` in `0..=most` with `fits(t)` (`fits` true up to some point, false after).
fn largest(most: usize, fits: impl Fn(usize) -> bool) -> usize {
    if fits(most) {
        return most;
    }
    let (mut lo, mut hi) = (0, most);
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

impl ServeRunPlan {
    /// Whether `name` stays loaded between requests (else it is loaded for each).
    pub fn keeps(&self, name: &str) -> bool {
        self.plan.get(name).is_some_and(|n| matches!(n.keep, Keep::Blocks(_)))
    }

    /// The blocks of `name` resident when it is loaded (the rest stream; `usize::MAX`: all).
    pub fn resident_blocks(&self, name: &str) -> usize {
        match self.plan.get(name).map(|n| &n.stage.placement) {
            Some(Placement::Streamed { resident, .. }) => *resident as usize,
            _ => usize::MAX,
        }
    }

    /// The start-up log line.
    pub fn line(&self) -> String {
        self.plan.line()
    }

    /// The plan as the server's `/health` shows it.
    pub fn json(&self) -> serde_json::Value {
        let mut j = self.plan.json();
        if self.plan.cap == u64::MAX {
            j["cap_bytes"] = serde_json::Value::Null; // no cap (not a number a JSON reader rounds)
        }
        j["vae_activation_bytes"] = serde_json::json!(self.vae_activations);
        j["max_joint_tokens"] = serde_json::json!((self.joint_tokens != usize::MAX).then_some(self.joint_tokens));
        j
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn largest_finds_the_edge() {
        for edge in [0, 1, 7, 99, 100] {
            assert_eq!(super::largest(100, |t| t <= edge), edge);
        }
    }
}
