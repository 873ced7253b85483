//! The one question the planner asks a backend: how much device memory is there, what does the
//! backend itself hold, how big is an element at this precision, and what do the networks'
//! activations take on it. The CUDA backend answers it for its device (`moss_cuda::Cuda::budget`);
//! the CPU has no device memory and is planned only under an explicit cap ([`Budget::cpu`]).

use super::GIB;
use crate::checkpoint::config::{DitConfig, EncoderConfig, VaeConfig};
use crate::model::dit::MainLinears;

/// How a run may use device memory (the CLI's `--max-vram`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryOptions {
    /// The cap in GiB (`None`: the device's free memory less a reserve; on the CPU, no cap).
    pub max_vram_gib: Option<f64>,
}

/// What a backend's buffers take for each network's activations (its kernels' workspaces, strip
/// plans, pool rounding): the activation half of what the networks declare.
pub trait Activations: Sync {
    /// One DiT forward's peak over `tokens` joint tokens, `act` bytes an activation element.
    fn dit(&self, cfg: &DitConfig, tokens: usize, act: usize) -> u64;
    /// One text-encoder forward's peak over `tokens` prompt tokens.
    fn encoder(&self, cfg: &EncoderConfig, tokens: usize, act: usize) -> u64;
    /// The VAE decode of an `lh` x `lw` latent: whole, and in the least split (row strips).
    fn vae_decode(&self, cfg: &VaeConfig, lh: usize, lw: usize) -> (u64, u64);
    /// The VAE encode of an `h` x `w` picture: whole, and in the least split.
    fn vae_encode(&self, cfg: &VaeConfig, h: usize, w: usize) -> (u64, u64);
}

/// The device a plan is made for: the backend's answer.
#[derive(Clone, Copy)]
pub struct Budget {
    /// Free and total bytes (`None`: the CPU, planned only under an explicit cap).
    pub memory: Option<(u64, u64)>,
    /// Device bytes the process holds outside its allocations (the CUDA context, modules,
    /// cuBLASLt workspace): part of the cap, as `nvidia-smi` counts them. 0 on the CPU.
    pub overhead: u64,
    /// Bytes a loaded weight element of a stored bf16 tensor takes.
    pub bf16_loaded: usize,
    /// Bytes an activation element takes.
    pub act: usize,
    /// How the transformer's main blocks hold their matrices (the run's precision).
    pub linears: MainLinears,
    /// What the networks' activations take on this backend.
    pub activations: &'static dyn Activations,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("memory", &self.memory)
            .field("overhead", &self.overhead)
            .field("bf16_loaded", &self.bf16_loaded)
            .field("act", &self.act)
            .field("linears", &self.linears)
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// The CPU: no device memory to measure, fp32 throughout. Planned only under an explicit
    /// cap, with `activations` the formulas of the device the plan rehearses (a `--max-vram` dry
    /// run without a GPU).
    pub fn cpu(activations: &'static dyn Activations) -> Budget {
        Budget { memory: None, overhead: 0, bf16_loaded: 4, act: 4, linears: MainLinears::Dense, activations }
    }

    /// This budget for a run whose transformer holds its main blocks' matrices as `linears`.
    pub fn with_linears(self, linears: MainLinears) -> Budget {
        Budget { linears, ..self }
    }

    /// The cap `opts` asks for on this device (on the CPU: the one given, else none), and the
    /// warning when it was clamped to the device.
    pub fn cap(&self, opts: &MemoryOptions) -> (u64, Option<String>) {
        match self.memory {
            Some((free, total)) => super::cap(opts.max_vram_gib, free, total, self.overhead),
            None => match opts.max_vram_gib {
                Some(g) => ((g * GIB) as u64, None),
                None => (u64::MAX, None),
            },
        }
    }
}
