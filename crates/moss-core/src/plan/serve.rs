//! The server's memory plan (`moss serve --max-vram`). A server keeps networks loaded between
//! requests, so unlike a single run (each stage alone under the cap, [`super::plan`]) each stage
//! runs beside what the other two keep. A network either stays loaded with `k` of its blocks
//! resident (all of them: the whole network; the rest streamed each pass), or is loaded for each
//! request, placed under what the others keep as a single run places it.
//!
//! Kept first, with as many blocks as fit: the transformer (it runs 100 forwards a picture); then
//! the VAE (small); then the text encoder, with as many layers as fit. What a network keeps never
//! changes how a network kept before it runs (the VAE decoding the largest picture whole does not
//! go to row strips for encoder layers). With every network loaded per request the plan is the
//! single run's, so the smallest cap that works is `generate`'s.

use super::{cap_text, Network, NetworkPlan, Placement, GIB};
use anyhow::{anyhow, Result};

/// What a network keeps on the device between requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Loaded once, `k` of its blocks resident (all of them, or a network without blocks: whole).
    Blocks(u64),
    /// Loaded for each request.
    PerRequest,
}

/// One network in the server's plan.
#[derive(Clone, Debug)]
pub struct Kept {
    pub keep: Keep,
    /// Device bytes it holds between requests.
    pub bytes: u64,
    /// Its stage: how it runs then, and the stage's own peak (the others' kept bytes beside it).
    pub stage: NetworkPlan,
}

#[derive(Clone, Debug)]
pub struct ServePlan {
    /// The cap on the process's device memory (`u64::MAX`: none).
    pub cap: u64,
    /// The process's device memory outside its allocations, part of the cap.
    pub overhead: u64,
    /// Per network, in the order planned.
    pub networks: Vec<Kept>,
}

/// The order in which networks are kept.
const PRIORITY: [&str; 3] = ["transformer", "vae", "text_encoder"];

/// Every stage under `room` with what the others keep, networks keeping `keeps`; `None` when a
/// stage does not fit.
fn stages(nets: &[Network], keeps: &[Keep], room: u64) -> Option<Vec<Kept>> {
    let held: Vec<u64> = nets
        .iter()
        .zip(keeps)
        .map(|(n, keep)| match keep {
            Keep::Blocks(k) => n.kept_bytes(*k),
            Keep::PerRequest => 0,
        })
        .collect();
    let total: u64 = held.iter().sum();
    let mut out = vec![];
    for (i, (n, &keep)) in nets.iter().zip(keeps).enumerate() {
        let left = room.checked_sub(total - held[i])?;
        let stage = match keep {
            Keep::Blocks(k) => n.place_keeping(k, left)?,
            Keep::PerRequest => n.place(left)?,
        };
        out.push(Kept { keep, bytes: held[i], stage });
    }
    Some(out)
}

/// The server's plan under `cap` for a process holding `overhead` outside its allocations;
/// refused as [`super::plan_for_process`] refuses, naming the smallest cap that works.
pub fn plan(cap: u64, overhead: u64, nets: &[Network]) -> Result<ServePlan> {
    super::plan_for_process(cap, overhead, nets)?;
    let room = cap.saturating_sub(overhead);
    let mut keeps = vec![Keep::PerRequest; nets.len()];
    // How the networks kept so far run at their stages.
    let mut decided: Vec<Option<Placement>> = vec![None; nets.len()];
    for name in PRIORITY {
        let Some(i) = nets.iter().position(|n| n.name == name) else { continue };
        // The most blocks that fit beside what is kept so far, leaving the networks kept before
        // it running as they do (searched down: monotone enough).
        let fits = |keep: Keep| -> Option<Vec<Kept>> {
            let mut k = keeps.clone();
            k[i] = keep;
            let s = stages(nets, &k, room)?;
            s.iter().zip(&decided).all(|(s, d)| d.as_ref().is_none_or(|d| *d == s.stage.placement)).then_some(s)
        };
        let chosen = (0..=nets[i].blocks).rev().map(Keep::Blocks).find_map(|keep| fits(keep).map(|s| (keep, s)));
        if let Some((keep, s)) = chosen {
            keeps[i] = keep;
            decided[i] = Some(s[i].stage.placement.clone());
        }
    }
    let networks = stages(nets, &keeps, room).ok_or_else(|| anyhow!("the server's memory plan does not fit (a planner bug)"))?;
    Ok(ServePlan { cap, overhead, networks })
}

impl ServePlan {
    fn index(&self, name: &str) -> Option<usize> {
        self.networks.iter().position(|n| n.stage.name == name)
    }

    /// The network `name`'s part of the plan.
    pub fn get(&self, name: &str) -> Option<&Kept> {
        self.index(name).map(|i| &self.networks[i])
    }

    /// Device bytes the networks other than `name` keep between requests (beside its stage).
    pub fn kept_beside(&self, name: &str) -> u64 {
        self.networks.iter().filter(|n| n.stage.name != name).map(|n| n.bytes).sum()
    }

    /// Device bytes what is kept takes, with the overhead: the process between requests.
    pub fn idle_bytes(&self) -> u64 {
        self.overhead + self.networks.iter().map(|n| n.bytes).sum::<u64>()
    }

    /// The process's peak during `name`'s stage: the overhead, the others' kept bytes, the stage's.
    pub fn stage_peak(&self, name: &str) -> u64 {
        let own = self.get(name).map_or(0, |n| n.stage.device_bytes);
        self.overhead + self.kept_beside(name) + own
    }

    /// One line for the log: per network, what it keeps and how its stage runs.
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .networks
            .iter()
            .map(|n| {
                let s = &n.stage;
                let keep = match (n.keep, &s.placement) {
                    (Keep::PerRequest, _) => format!("loaded per request ({})", s.what()),
                    (Keep::Blocks(_), Placement::Streamed { .. }) => format!("kept, {}", s.what()),
                    (Keep::Blocks(_), _) => format!("kept {}", s.what()),
                };
                format!(
                    "{} {keep} ({:.2} GiB kept, {:.2} GiB peak at its stage, {:.2} GiB moved per pass)",
                    s.name,
                    n.bytes as f64 / GIB,
                    self.stage_peak(s.name) as f64 / GIB,
                    s.moved_per_pass as f64 / GIB
                )
            })
            .collect();
        format!("memory plan under {}: {}", cap_text(self.cap, self.overhead), parts.join("; "))
    }

    /// The plan as JSON (the server's `/health`).
    pub fn json(&self) -> serde_json::Value {
        let nets: Vec<serde_json::Value> = self
            .networks
            .iter()
            .map(|n| {
                let mut j = n.stage.json();
                let (keep, kept_blocks) = match n.keep {
                    Keep::Blocks(k) => ("kept", Some(k)),
                    Keep::PerRequest => ("per_request", None),
                };
                j["keep"] = serde_json::json!(keep);
                j["kept_blocks"] = serde_json::json!(kept_blocks);
                j["kept_bytes"] = serde_json::json!(n.bytes);
                j["stage_peak_bytes"] = serde_json::json!(self.stage_peak(n.stage.name));
                j
            })
            .collect();
        serde_json::json!({"cap_bytes": self.cap, "overhead_bytes": self.overhead, "idle_bytes": self.idle_bytes(), "networks": nets})
    }
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;
