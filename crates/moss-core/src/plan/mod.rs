//! The planning room: every decision about device memory is made here, before any weights load.
//!
//! - The networks declare their bytes: [`run::networks`] reads each network's weights from the
//!   checkpoint (as the run's precision loads them) and asks the backend's [`Activations`] what
//!   its activations take at the run's sizes.
//! - The backend answers one question, its [`Budget`] (memory free and total, its own overhead,
//!   the precision's element sizes, its activation formulas), and keeps the one [`RESERVE`].
//! - The placement (this file): per network (text encoder, transformer, VAE), what stays resident
//!   and what streams from host memory under a cap (`--max-vram`). Pure arithmetic on byte counts,
//!   so every decision is unit-tested at full size without a GPU. The stages run one after another,
//!   each freeing the last, so each network must fit the cap alone.
//! - `generate` and batch plan a run through [`run::decide`]; `moss serve` plans what it keeps
//!   between requests through [`server::decide`] (placed by [`serve`]).
//!
//! Placements:
//! - Resident: weights + activations + reserve fit.
//! - Streamed: the non-block weights stay resident (less `host_only`, e.g. the encoder's
//!   embedding table, of which only the prompt's rows are uploaded), K of N blocks resident, and
//!   `ahead + 1` block buffers for the streamed rest (the one computing, the ones in flight).
//! - Strips: a network with strip activations (the VAE) decodes in row strips when whole does not fit.
//!
//! The cap means what `nvidia-smi` shows for the process: the process's fixed device memory
//! outside its allocations (the CUDA context, the kernel modules, the cuBLASLt workspace: the
//! `overhead`, measured at device init) comes off it first, and the networks are placed under
//! the rest.

pub mod budget;
pub mod run;
pub mod server;

pub use budget::{Activations, Budget, MemoryOptions};

use anyhow::{bail, Result};

/// Headroom on top of weights and activations (as the per-stage check keeps: cuBLASLt workspace,
/// pool rounding, per-op temporaries).
pub const RESERVE: u64 = 512 << 20;
/// Blocks copied ahead of the one computing: two, so a block's read and copy have the compute of
/// the two blocks before it to hide behind.
pub const PREFETCH: u64 = 2;
const GIB: f64 = (1u64 << 30) as f64;

/// One network's byte counts, as loaded at the run's precision.
#[derive(Clone, Debug)]
pub struct Network {
    pub name: &'static str,
    /// All weights.
    pub weights: u64,
    /// Repeated blocks that can stream, the bytes of one resident (the largest), and of all of
    /// them together (the encoder's attention and DeltaNet layers differ).
    pub blocks: u64,
    pub block_bytes: u64,
    pub all_blocks: u64,
    /// A streamed block: the bytes of its slot (what one fetch moves), and the bytes made from
    /// them while it computes (at fp8, its quantized codes and scales; 0 for most networks).
    pub slot_bytes: u64,
    pub derived_bytes: u64,
    /// Streamed blocks in flight beside the one computing ([`PREFETCH`] for the transformer).
    pub ahead: u64,
    /// Weights that may stay on the host when streaming (the embedding table).
    pub host_only: u64,
    /// Peak activations of the run (size, tokens).
    pub activations: u64,
    /// Peak activations when split into strips (`None`: no split).
    pub strip_activations: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    Resident,
    /// `resident` of `blocks` blocks resident, the rest copied each pass.
    Streamed {
        resident: u64,
        blocks: u64,
    },
    /// Whole weights, activations in strips.
    Strips,
}

#[derive(Clone, Debug)]
pub struct NetworkPlan {
    pub name: &'static str,
    pub placement: Placement,
    /// What the network holds on the device at its peak.
    pub device_bytes: u64,
    /// Host-to-device bytes per forward pass beyond the first load.
    pub moved_per_pass: u64,
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// The cap on the process's device memory (`u64::MAX`: none).
    pub cap: u64,
    /// The process's device memory outside its allocations (context, modules, workspace), part
    /// of the cap: the networks are placed under `cap - overhead`.
    pub overhead: u64,
    pub networks: Vec<NetworkPlan>,
}

impl Network {
    /// What stays on the device when the blocks stream: the rest, less what stays on the host.
    fn streamed_fixed(&self) -> u64 {
        let rest = self.weights.saturating_sub(self.all_blocks);
        rest - self.host_only.min(rest)
    }

    /// The device bytes with `k` of the blocks resident (`k` < `blocks`) and `ahead + 1` slots
    /// for the streamed rest, beside what the computing one derives from its slot.
    fn streamed_with(&self, k: u64) -> NetworkPlan {
        let streamed = self.blocks - k;
        let buffers = (self.ahead + 1).min(streamed) * self.slot_bytes + self.derived_bytes;
        let device = self.streamed_fixed() + k * self.block_bytes + buffers + self.activations + RESERVE;
        NetworkPlan {
            name: self.name,
            placement: Placement::Streamed { resident: k, blocks: self.blocks },
            device_bytes: device,
            moved_per_pass: streamed * self.slot_bytes,
        }
    }

    /// The least cap this network runs under (streaming every block, strips if it has them).
    pub fn minimum(&self) -> u64 {
        let act = self.strip_activations.unwrap_or(self.activations).min(self.activations);
        let whole = self.weights + act + RESERVE;
        if self.blocks == 0 {
            return whole;
        }
        whole.min(self.streamed_with(0).device_bytes)
    }

    /// The placement under `cap`, or `None` when even streaming does not fit.
    pub fn place(&self, cap: u64) -> Option<NetworkPlan> {
        if let Some(p) = self.place_whole(cap) {
            return Some(p);
        }
        if self.blocks == 0 {
            return None;
        }
        let least = self.streamed_with(0);
        if least.device_bytes > cap {
            return None;
        }
        // Every block made resident frees nothing from the buffers until all but the buffered ones are.
        let k = ((cap - least.device_bytes) / self.block_bytes.max(1)).min(self.blocks - 1);
        Some(self.streamed_with(k))
    }

    /// Every weight resident under `cap`: activations whole, else in strips; `None` if neither fits.
    pub fn place_whole(&self, cap: u64) -> Option<NetworkPlan> {
        let plan = |placement, device_bytes| NetworkPlan { name: self.name, placement, device_bytes, moved_per_pass: 0 };
        let resident = self.weights + self.activations + RESERVE;
        if resident <= cap {
            return Some(plan(Placement::Resident, resident));
        }
        let need = self.weights + self.strip_activations? + RESERVE;
        (need <= cap).then(|| plan(Placement::Strips, need))
    }

    /// `k` of the blocks kept resident (all of them: [`Network::place_whole`]), the rest
    /// streamed, under `cap`; `None` if that does not fit.
    pub fn place_keeping(&self, k: u64, cap: u64) -> Option<NetworkPlan> {
        if k >= self.blocks {
            return self.place_whole(cap);
        }
        Some(self.streamed_with(k)).filter(|p| p.device_bytes <= cap)
    }

    /// The device bytes kept between passes with `k` blocks resident: the weights that stay on
    /// the device when streaming, and those blocks (all of them: every weight).
    pub fn kept_bytes(&self, k: u64) -> u64 {
        if k >= self.blocks {
            self.weights
        } else {
            self.streamed_fixed() + k * self.block_bytes
        }
    }
}

/// The cap to plan under, on the process's device memory as `nvidia-smi` shows it: `requested`
/// GiB (clamped to the device's total with a warning), or the device's free memory less
/// [`RESERVE`] plus the `overhead` the process already holds (free memory is measured after the
/// context exists, so it is already taken out). Returns the cap and the warning, if any.
pub fn cap(requested_gib: Option<f64>, free: u64, total: u64, overhead: u64) -> (u64, Option<String>) {
    match requested_gib {
        Some(g) => {
            let want = (g * GIB) as u64;
            if want > total {
                let w = format!("--max-vram {g} GiB is above the device's {:.1} GiB; using {:.1} GiB", total as f64 / GIB, total as f64 / GIB);
                (total, Some(w))
            } else {
                (want, None)
            }
        }
        None => (free.saturating_sub(RESERVE).saturating_add(overhead), None),
    }
}

/// Place every network under `cap`; refuses, naming the smallest cap that works, when one cannot fit.
pub fn plan(cap: u64, nets: &[Network]) -> Result<Plan> {
    plan_for_process(cap, 0, nets)
}

/// [`plan`] for a process that holds `overhead` bytes of device memory outside its allocations:
/// the networks are placed under `cap - overhead`, and the smallest cap named includes it.
pub fn plan_for_process(cap: u64, overhead: u64, nets: &[Network]) -> Result<Plan> {
    let room = cap.saturating_sub(overhead);
    let mut networks = vec![];
    for n in nets {
        match n.place(room) {
            Some(p) => networks.push(p),
            None => {
                let least = nets.iter().map(Network::minimum).max().unwrap_or(0).saturating_add(overhead);
                let context = if overhead > 0 { format!(" (with {:.2} GiB for the CUDA context)", overhead as f64 / GIB) } else { String::new() };
                bail!(
                    "{} does not fit in {:.2} GiB even streamed; the smallest cap that works is {:.2} GiB{context} (--max-vram {})",
                    n.name,
                    cap as f64 / GIB,
                    least as f64 / GIB,
                    (least as f64 / GIB * 100.0).ceil() / 100.0
                );
            }
        }
    }
    Ok(Plan { cap, overhead, networks })
}

impl NetworkPlan {
    /// How it runs: "resident", "resident, row strips", "K/N blocks resident, M streamed".
    pub fn what(&self) -> String {
        match &self.placement {
            Placement::Resident => "resident".to_string(),
            Placement::Strips => "resident, row strips".to_string(),
            Placement::Streamed { resident, blocks } => format!("{resident}/{blocks} blocks resident, {} streamed", blocks - resident),
        }
    }

    /// Its `--json` fields.
    pub fn json(&self) -> serde_json::Value {
        let (mode, resident, blocks) = match &self.placement {
            Placement::Resident => ("resident", None, None),
            Placement::Strips => ("strips", None, None),
            Placement::Streamed { resident, blocks } => ("streamed", Some(*resident), Some(*blocks)),
        };
        serde_json::json!({"name": self.name, "mode": mode, "resident_blocks": resident, "blocks": blocks,
            "device_bytes": self.device_bytes, "moved_per_pass": self.moved_per_pass})
    }
}

/// "no cap", or the cap and the part of it the context takes.
fn cap_text(cap: u64, overhead: u64) -> String {
    if cap == u64::MAX {
        "no cap".to_string()
    } else {
        format!("{:.2} GiB ({:.2} GiB of it the CUDA context)", cap as f64 / GIB, overhead as f64 / GIB)
    }
}

impl Plan {
    /// One line for `-v`: per network, what is resident, what streams, bytes moved per pass.
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .networks
            .iter()
            .map(|n| {
                format!("{} {} ({:.2} GiB on device, {:.2} GiB moved per pass)", n.name, n.what(), n.device_bytes as f64 / GIB, n.moved_per_pass as f64 / GIB)
            })
            .collect();
        format!("memory plan under {}: {}", cap_text(self.cap, self.overhead), parts.join("; "))
    }

    /// The `--json` value.
    pub fn json(&self) -> serde_json::Value {
        let nets: Vec<serde_json::Value> = self.networks.iter().map(NetworkPlan::json).collect();
        serde_json::json!({"cap_bytes": self.cap, "overhead_bytes": self.overhead, "networks": nets})
    }
}

/// The server's plan: what stays on the device between requests.
pub mod serve;

#[cfg(test)]
mod tests;
