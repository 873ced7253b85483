//! The op set the three networks are written against, and its two implementations:
//! `cpu` (the readable fp32 reference with f64 accumulation, what CI runs) and `cuda`
//! (cuBLASLt and our kernels, what users run).
//!
//! `Backend` holds the generic ops every network uses. Fused ops that exist for one network live
//! in that network's own trait next to it (`ops_encoder`, `ops_dit`, `ops_vae`), each with a CPU
//! twin in `cpu/`, so every CUDA kernel has a reference.

pub mod cpu;
pub mod ops;

use crate::checkpoint::{Component, Dtype};
use crate::lora::{plan::MergeClock, Plan, Term};
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

/// Weights on their way to the backend: `value` may not be computed with before [`Behind::ready`].
pub struct Behind<R> {
    /// Declared first, so dropped first: a copy still being issued (a background read) finishes
    /// before `value` can free the memory it lands in.
    #[allow(clippy::type_complexity)]
    ready: Option<Box<dyn FnOnce() -> Result<()> + Send>>,
    value: R,
}

impl<R> Behind<R> {
    /// `ready` makes the compute wait for the copies (`None`: nothing to wait for).
    #[allow(clippy::type_complexity)]
    pub fn new(value: R, ready: Option<Box<dyn FnOnce() -> Result<()> + Send>>) -> Self {
        Behind { ready, value }
    }

    /// `f` of the value, still waiting for the same copies.
    pub fn map<S>(self, f: impl FnOnce(R) -> S) -> Behind<S> {
        Behind { ready: self.ready, value: f(self.value) }
    }

    /// The value, once the compute after this call is ordered after its copies.
    pub fn ready(self) -> Result<R> {
        if let Some(r) = self.ready {
            r()?;
        }
        Ok(self.value)
    }
}

/// Generic ops. Shapes are row-major; "rows" means all leading dimensions flattened.
pub trait Backend {
    /// A tensor resident on this backend.
    type T: Clone;

    fn name(&self) -> String;
    fn upload(&self, t: &Tensor) -> Result<Self::T>;
    /// `t` on this backend in f32 whatever the precision: what the VAE computes in, and the
    /// per-row scales of float8 weights ([`Backend::upload`] gives bf16 at `--precision bf16`).
    fn upload_f32(&self, t: &Tensor) -> Result<Self::T>;
    fn download(&self, x: &Self::T) -> Result<Tensor>;
    fn dims(&self, x: &Self::T) -> Vec<usize>;
    /// A checkpoint tensor by its name inside the component, in the backend's storage precision,
    /// with the component's LoRA updates merged in ([`merge_loras`]): the one point every weight
    /// passes, resident or streamed.
    fn load(&self, c: &Component, name: &str) -> Result<Self::T>;
    /// `w`, a checkpoint tensor as stored (its dtype `stored`), plus the LoRA updates `terms`:
    /// in fp32, the updates added in order, rounded once to `stored` ([`crate::lora::merge`]).
    /// Its time goes on `clock`: the host's (on the GPU, the preparation of the factors) and the
    /// device's, apart.
    fn merge_lora(&self, w: Self::T, stored: Dtype, terms: &[Term], clock: &MergeClock) -> Result<Self::T>;

    /// The checkpoint tensors `names` (one dtype, one trailing shape) stacked along dim 0 as one
    /// tensor: the values of `cat([load(n) for n in names], 0)`.
    fn load_rows(&self, c: &Component, names: &[&str]) -> Result<Self::T> {
        let parts = names.iter().map(|n| self.load(c, n)).collect::<Result<Vec<_>>>()?;
        self.cat(&parts.iter().collect::<Vec<_>>(), 0)
    }

    /// Run `f`, which only loads weights (through the backend it is given), as one batch: the
    /// CUDA backend reads them in parallel and copies them on its copy stream, and the compute
    /// waits for them before anything after. Elsewhere just `f(self)`.
    fn load_batch<R>(&self, f: impl FnOnce(&Self) -> Result<R>) -> Result<R> {
        f(self)
    }

    /// [`Backend::load_batch`] whose copies the compute waits for only at [`Behind::ready`]: a
    /// stage's weights load while another stage computes.
    fn load_behind<R>(&self, f: impl FnOnce(&Self) -> Result<R>) -> Result<Behind<R>> {
        Ok(Behind::new(f(self)?, None))
    }

    /// Whether [`Backend::load_behind`] overlaps the load with compute (so a caller may start it
    /// early on another thread).
    fn loads_behind(&self) -> bool {
        false
    }

    /// A streamed block's tensors, each the dim-0 stack of its names ([`Backend::load_rows`]),
    /// into the reusable memory of `slot` (`0..=`[`crate::plan::PREFETCH`]): the CUDA
    /// backend copies on its copy stream once the compute that read the slot's previous block is
    /// done (the compute enqueued up to [`Backend::free_slot`] of the slot; without one, all
    /// compute enqueued so far), and the compute waits at [`Behind::ready`].
    fn fetch(&self, c: &Component, slot: usize, groups: &[Vec<String>]) -> Result<Behind<Vec<Self::T>>> {
        let _ = slot;
        Ok(Behind::new(load_groups(self, c, groups)?, None))
    }

    /// The compute enqueued so far is the last to read `slot`'s tensors: its next
    /// [`Backend::fetch`] may overwrite them as soon as that compute is done, not waiting for
    /// compute enqueued later (the next blocks' copies overlap the blocks computing before them).
    fn free_slot(&self, slot: usize) -> Result<()> {
        let _ = slot;
        Ok(())
    }

    /// `x [.., K] · wᵀ [N, K] (+ b [N])` → `[.., N]`.
    fn linear(&self, x: &Self::T, w: &Self::T, b: Option<&Self::T>) -> Result<Self::T>;
    /// A linear's weight `w [N, K]` quantized per output row to float8 e4m3 ([`crate::fp8`]):
    /// `scale[n] = max(amax(w[n]), MIN_AMAX) / 448`, `q[n, k] = e4m3(w[n, k] / scale[n])` →
    /// `(q [N, K], scale [N] f32)`. The CPU holds `q` as the codes' f32 values, CUDA as one byte each.
    fn quantize_rows(&self, w: &Self::T) -> Result<(Self::T, Self::T)>;
    /// `x [.., K]` times a weight from [`Backend::quantize_rows`]: each row of `x` quantized the
    /// same way (`s_x[r]`, `q_x[r, k]`), then `y[r, n] = s_x[r] · s_w[n] · Σ_k q_x[r, k] · q_w[n, k]`
    /// (fp32 or wider accumulation) → `[.., N]` in `x`'s dtype.
    fn linear_fp8(&self, x: &Self::T, q: &Self::T, scale: &Self::T) -> Result<Self::T>;
    /// [`Backend::linear_fp8`] of rows already quantized: `xq [.., K]` codes and `xs [rows]` f32
    /// scales (as `quantize_rows` makes them, or an op that writes its output quantized) →
    /// `y[r, n] = xs[r] · s_w[n] · Σ_k xq[r, k] · q_w[n, k]` `[.., N]` in the activation dtype.
    /// `linear_fp8(x, ..)` is `linear_fp8_quantized(quantize_rows(x), ..)`, bit for bit.
    fn linear_fp8_quantized(&self, xq: &Self::T, xs: &Self::T, q: &Self::T, scale: &Self::T) -> Result<Self::T>;
    /// `x [.., K]` quantized per row to int8 ([`crate::int8`]): `scale[r] = max(amax(x[r]),
    /// MIN_AMAX) / 127`, `q = round_half_even(x / scale)` clamped to ±127 → `(q [.., K], scale
    /// [rows] f32)`; with `convrot = Some(g)` each group of `g` values of a row is turned by the
    /// normalized Hadamard matrix first ([`crate::int8::turn`]: the input of a ConvRot matrix).
    /// The CPU holds `q` as the codes' f32 values, CUDA as one byte each.
    fn quantize_rows_int8(&self, x: &Self::T, convrot: Option<usize>) -> Result<(Self::T, Self::T)>;
    /// int8 codes as a checkpoint stores them (one two's-complement byte each, `shape` `[N, K]`),
    /// held as [`Backend::quantize_rows_int8`] holds its codes.
    fn upload_int8(&self, shape: &[usize], codes: &[u8]) -> Result<Self::T>;
    /// Whether this backend loads a quantized checkpoint matrix kept as stored
    /// ([`crate::checkpoint::kept`]: the CUDA backend) rather than dequantized (the CPU).
    fn keeps_quantized(&self) -> bool {
        false
    }
    /// The codes of `w`, a kept stack of int8 parts ([`crate::checkpoint::kept::Layout::int8_codes`]),
    /// as [`Backend::upload_int8`] holds codes, in `w`'s memory (no copy).
    fn kept_int8_codes(&self, _w: &Self::T) -> Result<Self::T> {
        anyhow::bail!("this backend does not keep quantized matrices")
    }
    /// Int8 rows `xq [.., K]`, `xs [rows]` times the int8 weight `q [N, K]`, `scale [N]`:
    /// `y[r, n] = xs[r] · scale[n] · Σ_k xq[r, k] · q[n, k]`, the sum exact in 32-bit integers →
    /// `[.., N]` in the activation dtype.
    fn linear_int8_quantized(&self, xq: &Self::T, xs: &Self::T, q: &Self::T, scale: &Self::T) -> Result<Self::T>;
    /// `x [.., K]` times the int8 weight `q`, `scale` (of `W · H` when `convrot` is its ConvRot
    /// group): `linear_int8_quantized(quantize_rows_int8(x, convrot), q, scale)`.
    fn linear_int8(&self, x: &Self::T, q: &Self::T, scale: &Self::T, convrot: Option<usize>) -> Result<Self::T> {
        let (xq, xs) = self.quantize_rows_int8(x, convrot)?;
        self.linear_int8_quantized(&xq, &xs, q, scale)
    }
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

/// The tensors `groups`, each the dim-0 stack of its names ([`Backend::load_rows`]): what a
/// [`Backend::fetch`] of them gives, loaded as resident weights.
pub fn load_groups<B: Backend + ?Sized>(b: &B, c: &Component, groups: &[Vec<String>]) -> Result<Vec<B::T>> {
    groups.iter().map(|g| b.load_rows(c, &g.iter().map(String::as_str).collect::<Vec<_>>())).collect()
}

/// The LoRA step of every backend's `load`: `w` (the checkpoint tensor `name`, a full name, as
/// stored: `stored`) with the updates `plan` has for it merged in, timed on the plan's clock; `w`
/// itself when there are none.
pub fn merge_loras<B: Backend + ?Sized>(b: &B, plan: &Plan, name: &str, stored: Dtype, w: B::T) -> Result<B::T> {
    if plan.is_empty() {
        return Ok(w);
    }
    let terms = plan.terms(name);
    if terms.is_empty() {
        return Ok(w);
    }
    b.merge_lora(w, stored, &terms, &plan.clock).with_context(|| format!("merging LoRA updates into `{name}`"))
}
