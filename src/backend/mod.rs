//! The op set the three networks are written against, and its two implementations:
//! `cpu` (the readable fp32 reference with f64 accumulation, what CI runs) and `cuda`
//! (cuBLASLt and our kernels, what users run).
//!
//! `Backend` holds the generic ops every network uses. Fused ops that exist for one network live
//! in that network's own trait next to it (`ops_encoder`, `ops_dit`, `ops_vae`), each with a CPU
//! twin in `cpu/`, so every CUDA kernel has a reference.

pub mod cpu;
pub mod ops;
pub mod cuda;

use crate::checkpoint::{Component, Dtype};
use crate::lora::{plan::MergeClock, Term};
use crate::tensor::Tensor;
use anyhow::{Context, Result};

/// Which backend a run uses (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!("unknown device `{s}` (use cpu, cuda or cuda:N)")),
            },
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Generic ops. Shapes are row-major; "rows" means all leading dimensions flattened.
pub trait Backend {
    /// A tensor resident on this backend.
    type T: Clone;

    fn name(&self) -> String;
    fn upload(&self, t: &Tensor) -> Result<Self::T>;
    fn download(&self, x: &Self::T) -> Result<Tensor>;
    fn dims(&self, x: &Self::T) -> Vec<usize>;
    /// A checkpoint tensor by its name inside the component, in the backend's storage precision,
    /// with the component's LoRA updates merged in ([`merge_loras`]): the one point every weight
    /// passes, resident or streamed.
    fn load(&self, c: &Component, name: &str) -> Result<Self::T>;
    /// `w`, a checkpoint tensor as stored (its dtype `stored`), plus the LoRA updates `terms`:
    /// in fp32, the updates added in order, rounded once to `stored` ([`crate::lora::merge`]).
    /// Device time still running when it returns goes on `clock`.
    fn merge_lora(&self, w: Self::T, stored: Dtype, terms: &[Term], clock: &MergeClock) -> Result<Self::T>;

    /// `x [.., K] · wᵀ [N, K] (+ b [N])` → `[.., N]`.
    fn linear(&self, x: &Self::T, w: &Self::T, b: Option<&Self::T>) -> Result<Self::T>;
    /// Elementwise `a + b`; `b` either has `a`'s shape or `a`'s trailing shape (broadcast).
    fn add(&self, a: &Self::T, b: &Self::T) -> Result<Self::T>;
    /// Elementwise `a · b`, broadcasting like [`Backend::add`].
    fn mul(&self, a: &Self::T, b: &Self::T) -> Result<Self::T>;
    fn silu(&self, x: &Self::T) -> Result<Self::T>;
    fn sigmoid(&self, x: &Self::T) -> Result<Self::T>;
    /// RMSNorm over the last dim: `x · rsqrt(mean(x²) + eps) · g`, where `g = 1 + w` if
    /// `one_plus` (Qwen's zero-centred norms), `g = w` otherwise, `g = 1` without `w`.
    fn rms_norm(&self, x: &Self::T, w: Option<&Self::T>, eps: f64, one_plus: bool) -> Result<Self::T>;
    fn reshape(&self, x: &Self::T, shape: &[usize]) -> Result<Self::T>;
    /// `len` entries of dimension `dim` from `start`.
    fn narrow(&self, x: &Self::T, dim: usize, start: usize, len: usize) -> Result<Self::T>;
    fn cat(&self, xs: &[&Self::T], dim: usize) -> Result<Self::T>;
    fn permute(&self, x: &Self::T, perm: &[usize]) -> Result<Self::T>;

    /// Hand memory freed by a finished stage back to the system, so the next stage's memory plan
    /// sees it as free (the pipeline calls this between stages).
    fn release_cached(&self) -> Result<()> {
        Ok(())
    }
}

/// The LoRA step of every backend's `load`: `w` (tensor `name` of `c`, as stored) with the
/// component's updates for it merged in, timed on the plan's clock; `w` itself when none.
pub fn merge_loras<B: Backend + ?Sized>(b: &B, c: &Component, name: &str, w: B::T) -> Result<B::T> {
    let terms = c.lora_terms(name);
    if terms.is_empty() {
        return Ok(w);
    }
    let stored = c.info(name)?.dtype;
    let t = std::time::Instant::now();
    let out = b
        .merge_lora(w, stored, &terms, &c.loras.clock)
        .with_context(|| format!("merging LoRA updates into `{}`", c.full_name(name)))?;
    c.loras.clock.add_host(t.elapsed().as_secs_f64());
    Ok(out)
}
