//! One run's memory plan (`--max-vram`): the three networks' byte counts read from the
//! checkpoint (at the run's precision) and the run's sizes, placed by [`crate::memory_plan`]
//! under the cap before any weights load. Decides what `generate` loads resident, what streams,
//! and whether the transformer may load while the text encoder runs.

use crate::backend::cuda::ops::DType;
use crate::backend::cuda::plan::{dit_activation_bytes, encoder_activation_bytes};
use crate::backend::cuda::vae::plan::{vae_activation_bytes, vae_mid_bytes, vae_strip_bytes};
use crate::checkpoint::{Checkpoint, Component, Dtype};
use crate::memory_plan::{self, Network, Placement, Plan};
use anyhow::Result;

/// How a run may use device memory (the CLI's `--max-vram`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryOptions {
    /// The cap in GiB (`None`: the device's free memory less a reserve; on the CPU, no cap).
    pub max_vram_gib: Option<f64>,
}

/// The device a plan is made for.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Free and total bytes (`None`: the CPU, planned only under an explicit cap).
    pub memory: Option<(u64, u64)>,
    /// Bytes a loaded weight element of a stored dtype takes.
    pub bf16_loaded: usize,
    /// The activation dtype.
    pub act: DType,
}

/// What a run loads and how.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub plan: Plan,
    /// Resident text-encoder layers and transformer blocks (the rest stream).
    pub encoder_resident: usize,
    pub dit_resident: usize,
    /// Whether the transformer's weights fit beside the text encoder's, so they load while it runs.
    pub overlap: bool,
    /// The cap was clamped to the device (the warning to print).
    pub warning: Option<String>,
}

fn loaded(dtype: Dtype, numel: usize, bf16_loaded: usize) -> u64 {
    let es = match dtype {
        Dtype::BF16 => bf16_loaded,
        _ => 4,
    };
    (es * numel) as u64
}

/// Bytes of `c`'s tensors under `prefix` (inside the component), as loaded.
fn bytes_under(c: &Component, prefix: &str, bf16_loaded: usize) -> u64 {
    let full = c.full_name(prefix);
    c.store.tensors.iter().filter(|(k, _)| k.starts_with(&full)).map(|(_, t)| loaded(t.dtype, t.numel(), bf16_loaded)).sum()
}

/// The three networks of `ck` for prompts of `tokens` tokens and a `w` x `h` picture.
pub fn networks(ck: &Checkpoint, budget: &Budget, tokens: usize, (w, h): (u32, u32)) -> Result<Vec<Network>> {
    let bl = budget.bf16_loaded;
    let enc = ck.open_component_for_plan("text_encoder")?;
    let dit = ck.open_component_for_plan("transformer")?;
    let vae = ck.open_component_for_plan("vae")?;
    let enc_layers = ck.encoder.num_layers();
    let enc_block = (0..enc_layers).map(|i| bytes_under(&enc, &format!("layers.{i}."), bl)).max().unwrap_or(0);
    let dit_block = (0..ck.dit.num_layers).map(|i| bytes_under(&dit, &format!("layers.{i}.proj."), bl)).max().unwrap_or(0);
    let (lh, lw) = ((h / 16) as usize, (w / 16) as usize);
    let text = tokens.max(1);
    Ok(vec![
        Network {
            name: "text_encoder",
            weights: bytes_under(&enc, "", bl),
            blocks: enc_layers as u64,
            block_bytes: enc_block,
            // The embedding table stays on the device for now (its rows are gathered there).
            host_only: 0,
            activations: encoder_activation_bytes(&ck.encoder, text, budget.act) as u64,
            strip_activations: None,
        },
        Network {
            name: "transformer",
            weights: bytes_under(&dit, "", bl),
            blocks: ck.dit.num_layers as u64,
            block_bytes: dit_block,
            host_only: 0,
            activations: dit_activation_bytes(&ck.dit, lh * lw + text, budget.act) as u64,
            strip_activations: None,
        },
        Network {
            name: "vae",
            weights: bytes_under(&vae, "", 4),
            blocks: 0,
            block_bytes: 0,
            host_only: 0,
            activations: vae_activation_bytes(&ck.vae, lh, lw) as u64,
            strip_activations: Some(vae_mid_bytes(&ck.vae, lh, lw).max(vae_strip_bytes(&ck.vae, lh, lw, 8)) as u64),
        },
    ])
}

/// Place `nets` under the cap `opts` and `budget` give; refuses (naming the smallest cap that
/// works) before anything loads.
pub fn decide(nets: &[Network], budget: &Budget, opts: &MemoryOptions) -> Result<RunPlan> {
    let (cap, warning) = match budget.memory {
        Some((free, total)) => memory_plan::cap(opts.max_vram_gib, free, total),
        None => match opts.max_vram_gib {
            Some(g) => ((g * (1u64 << 30) as f64) as u64, None),
            None => (u64::MAX, None),
        },
    };
    let plan = memory_plan::plan(cap, nets)?;
    let resident = |name: &str, all: u64| match plan.networks.iter().find(|n| n.name == name).map(|n| &n.placement) {
        Some(Placement::Streamed { resident, .. }) => *resident as usize,
        _ => all as usize,
    };
    let encoder_resident = resident("text_encoder", nets[0].blocks);
    let dit_resident = resident("transformer", nets[1].blocks);
    let both_resident = encoder_resident as u64 == nets[0].blocks && dit_resident as u64 == nets[1].blocks;
    let enc_peak = plan.networks[0].device_bytes;
    let overlap = both_resident && enc_peak.saturating_add(nets[1].weights) <= cap;
    Ok(RunPlan { plan, encoder_resident, dit_resident, overlap, warning })
}

impl RunPlan {
    /// The `-v` line.
    pub fn line(&self) -> String {
        let mut l = self.plan.line();
        if self.overlap {
            l.push_str("; the transformer loads while the text encoder runs");
        }
        l
    }

    /// The `--json` `plan` value.
    pub fn json(&self) -> serde_json::Value {
        let mut j = self.plan.json();
        j["overlap_loads"] = serde_json::json!(self.overlap);
        j
    }
}
