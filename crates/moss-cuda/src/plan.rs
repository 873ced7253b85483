//! The CUDA backend's side of the planning room (`moss_core::plan`): its answer to the budget
//! question ([`Cuda::budget`]: free and total memory, its own overhead, the precision's element
//! sizes, its activation formulas [`ACTIVATIONS`]), and the last guard before a stage loads its
//! weights: add up what the stage will hold on the GPU and fail early, with numbers, when the
//! device does not have it free (another process may have taken memory since the plan).
//!
//! Use (the DiT stage, say):
//! ```text
//! let plan = MemoryPlan::component(&comp, precision)
//!     .activations(plan::dit_activation_bytes(&ck.dit, tokens, DType::of(precision)));
//! plan.check(cuda.gpu())?;          // "transformer needs 10.4 GiB (...), 3.1 GiB free on ..."
//! let dit = Dit::load(&cuda, &comp, &ck.dit)?;
//! ```

use super::Gpu;
use crate::ops::{held_dtype, loaded_dtype, DType, GIB};
use anyhow::{bail, Result};
use moss_core::checkpoint::config::VaeConfig;
use moss_core::checkpoint::config::{DitConfig, EncoderConfig};
use moss_core::checkpoint::kept::{self, Layout};
use moss_core::checkpoint::Component;
use moss_core::checkpoint::Dtype;
use moss_core::model::dit::MainLinears;
use moss_core::options::Precision;
use moss_core::plan::{Activations, Budget};

/// The CUDA backend's activation formulas (this file's and the VAE's `plan`/`encode_plan`).
pub struct CudaActivations;

/// What the planning room asks of the CUDA backend's activations.
pub static ACTIVATIONS: CudaActivations = CudaActivations;

/// The activation dtype of `bytes` an element (f32 or bf16: activations are never fp8).
fn act_dtype(bytes: usize) -> DType {
    if bytes >= 4 {
        DType::F32
    } else {
        DType::BF16
    }
}

impl Activations for CudaActivations {
    fn dit(&self, cfg: &DitConfig, tokens: usize, act: usize) -> u64 {
        dit_activation_bytes(cfg, tokens, act_dtype(act)) as u64
    }
    fn encoder(&self, cfg: &EncoderConfig, tokens: usize, act: usize) -> u64 {
        encoder_activation_bytes(cfg, tokens, act_dtype(act)) as u64
    }
    fn vae_decode(&self, cfg: &VaeConfig, lh: usize, lw: usize) -> (u64, u64) {
        (crate::vae::plan::vae_activation_bytes(cfg, lh, lw) as u64, crate::vae::plan::vae_split_least_bytes(cfg, lh, lw) as u64)
    }
    fn vae_encode(&self, cfg: &VaeConfig, h: usize, w: usize) -> (u64, u64) {
        use crate::vae::encode_plan::{encode_activation_bytes, encode_split_least_bytes};
        (encode_activation_bytes(cfg, h, w) as u64, encode_split_least_bytes(cfg, h, w) as u64)
    }
}

impl crate::ops::Cuda {
    /// The budget question, answered for this device now, at its precision.
    pub fn budget(&self) -> Result<Budget> {
        let (free, total) = self.gpu().mem_info()?;
        Ok(Budget {
            memory: Some((free as u64, total as u64)),
            overhead: self.process_overhead(),
            bf16_loaded: loaded_dtype(Dtype::BF16, self.precision).size(),
            act: self.act_dtype().size(),
            linears: MainLinears::of(self.precision),
            activations: &ACTIVATIONS,
        })
    }
}

/// The one reserve the planner keeps free on the device (cuBLASLt workspaces, the pool's slack):
/// [`moss_core::plan::RESERVE`].
pub const RESERVE_BYTES: usize = moss_core::plan::RESERVE as usize;

/// What one stage will hold on the device.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// The stage, as printed ("transformer").
    pub what: String,
    /// Weights as loaded (bf16 stays bf16 at bf16 precision, everything else f32).
    pub weights: usize,
    /// The stage's peak live activations (an estimate from the stage's own function).
    pub activations: usize,
    pub reserve: usize,
}

impl MemoryPlan {
    pub fn new(what: &str, weights: usize) -> MemoryPlan {
        MemoryPlan { what: what.to_string(), weights, activations: 0, reserve: RESERVE_BYTES }
    }

    /// The weights of every tensor of `c` under its prefix, at `precision`.
    pub fn component(c: &Component, precision: Precision) -> MemoryPlan {
        // a quantized matrix kept as stored counts its stored bytes (its scales with it)
        let kept = |k: &str| k.strip_prefix(&c.prefix).and_then(|n| Layout::of(c, &[n]).ok().flatten()).map(|l| l.bytes);
        let weights = c
            .store
            .tensors
            .iter()
            .filter(|(k, _)| k.starts_with(&c.prefix) && !kept::is_companion(c, k))
            .map(|(k, t)| kept(k).unwrap_or_else(|| held_dtype(c, t.dtype, precision).size() * t.numel()))
            .sum();
        let mut plan = MemoryPlan::new(c.name, weights);
        plan.reserve += c.loras.scratch_bytes(); // one tensor's LoRA merge at a time
        plan
    }

    pub fn activations(mut self, bytes: usize) -> MemoryPlan {
        self.activations = bytes;
        self
    }

    pub fn needed(&self) -> usize {
        self.weights + self.activations + self.reserve
    }

    /// The verdict for `free` of `total` bytes on `device`.
    pub fn check_against(&self, free: usize, total: usize, device: &str) -> Result<()> {
        if self.needed() > free {
            // The text encoder does not shrink with the picture: its way out is the CPU.
            let hint = if self.what == "text_encoder" {
                "encode on the CPU (`moss encode --device cpu`) and pass the file to `generate --embeds`"
            } else {
                "use a smaller size"
            };
            bail!(
                "{} needs {:.1} GiB (weights {:.1} GiB + activations {:.1} GiB + reserve {:.1} GiB), \
                 {:.1} GiB free of {:.1} GiB on {device}; free GPU memory (other processes?) or {hint}",
                self.what,
                self.needed() as f64 / GIB,
                self.weights as f64 / GIB,
                self.activations as f64 / GIB,
                self.reserve as f64 / GIB,
                free as f64 / GIB,
                total as f64 / GIB
            );
        }
        Ok(())
    }

    /// Compare with `cuMemGetInfo` now.
    pub fn check(&self, gpu: &Gpu) -> Result<()> {
        let (free, total) = gpu.mem_info()?;
        self.check_against(free, total, &gpu.name)
    }
}

/// Peak live activations of one DiT forward over `tokens` = h·w + L joint tokens, one sample at
/// a time, in `dtype`. An estimate for the planner, assuming a fused attention kernel (no N×N
/// score matrix): the FFN holds `[N, 2F]` (up|gate), `[N, F]` (situ) and `~3 [N, D]` (residual,
/// normed input, output); attention holds q, k, v, their head-major copies, the attention
/// output and the residual (`~9 [N, D]`). A quarter on top for the pool's fragmentation, plus
/// the cached text conditions (cond and uncond, `[L, D]` each, bounded here by `N`), plus what
/// the residual stream takes beyond `dtype` (it is f32 at every precision; the old and the new
/// stream live together).
pub fn dit_activation_bytes(cfg: &DitConfig, tokens: usize, dtype: DType) -> usize {
    let (d, f) = (cfg.dim, cfg.ffn_dim);
    let per_token = (3 * f + 3 * d).max(9 * d);
    let peak = tokens * per_token * dtype.size();
    let stream = 2 * tokens * d * (DType::F32.size() - dtype.size());
    peak + peak / 4 + 2 * tokens * d * dtype.size() + stream
}

/// Peak live activations of one encoder forward over `tokens` prompt tokens, in `dtype`. An
/// estimate for the planner: the FFN holds gate, up and their product (`3 F`) next to the residual,
/// the normed input and the output (`3 D`); a Gated-DeltaNet layer its fused q|k|v before and after
/// the conv, z, b/a and the output; a quarter on top for the pool, plus the delta rule's fp32
/// per-chunk states (`ceil(L/64)` chunks x value heads x dk x dv) and 256 MiB of scratch (the
/// causal attention's score rows, cuBLASLt).
pub fn encoder_activation_bytes(cfg: &EncoderConfig, tokens: usize, dtype: DType) -> usize {
    let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
    let qkv = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim;
    let attn = 2 * cfg.num_attention_heads * cfg.head_dim + 2 * cfg.num_key_value_heads * cfg.head_dim;
    let per_token = (3 * f + 3 * d).max(2 * qkv + 3 * d).max(attn + 3 * d);
    let peak = tokens * per_token * dtype.size();
    let states = tokens.div_ceil(64) * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4;
    peak + peak / 4 + states + (256 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_with_numbers() {
        let p = MemoryPlan::new("transformer", 10 << 30).activations(1 << 30);
        let e = p.check_against(4 << 30, 80 << 30, "GPU X").unwrap_err().to_string();
        println!("{e}");
        assert!(e.contains("transformer needs 11.5 GiB"), "{e}");
        assert!(e.contains("4.0 GiB free of 80.0 GiB on GPU X"), "{e}");
        assert!(e.contains("or use a smaller size"), "{e}");
        assert!(p.check_against(12 << 30, 80 << 30, "GPU X").is_ok());
        let enc = MemoryPlan::new("text_encoder", 15 << 30).check_against(4 << 30, 80 << 30, "GPU X").unwrap_err().to_string();
        assert!(enc.contains("moss encode --device cpu") && !enc.contains("smaller size"), "{enc}");
    }

    #[test]
    fn dit_estimate_full_size() {
        let cfg = DitConfig {
            dim: 3072,
            ffn_dim: 8192,
            num_heads: 24,
            num_layers: 42,
            text_dim: 4096,
            freq_dim: 256,
            latent_channels: 128,
            rope_base: 1e4,
            num_refiner_layers: 2,
            eps: 1e-6,
            defaulted: vec![],
        };
        // 1024x1024 with a 128-token prompt: 4224 tokens, (3·8192 + 3·3072)·2 B a token; the f32
        // stream, old and new, 2 B an element more than bf16.
        let b = dit_activation_bytes(&cfg, 4224, DType::BF16);
        let peak = 4224 * 33792 * 2;
        assert_eq!(b, peak + peak / 4 + 2 * 4224 * 3072 * 2 + 2 * 4224 * 3072 * 2);
        let peak32 = 4224 * 33792 * 4;
        assert_eq!(dit_activation_bytes(&cfg, 4224, DType::F32), peak32 + peak32 / 4 + 2 * 4224 * 3072 * 4, "fp32: the stream is the activation dtype");
        println!("DiT activations at 4224 tokens, bf16: {:.2} GiB", b as f64 / GIB);
    }

    #[test]
    fn encoder_estimate_full_size() {
        let cfg = EncoderConfig {
            vocab_size: 248320,
            hidden_size: 4096,
            intermediate_size: 12288,
            layer_types: vec![],
            num_attention_heads: 16,
            num_key_value_heads: 4,
            head_dim: 256,
            rope_theta: 1e7,
            partial_rotary_factor: 0.25,
            rms_norm_eps: 1e-6,
            linear_num_key_heads: 16,
            linear_num_value_heads: 32,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            defaulted: vec![],
        };
        // The FFN dominates: (3·12288 + 3·4096)·2 B a token; 64 chunks of fp32 states at 4096.
        let b = encoder_activation_bytes(&cfg, 4096, DType::BF16);
        let peak = 4096 * 49152 * 2;
        assert_eq!(b, peak + peak / 4 + 64 * 32 * 128 * 128 * 4 + (256 << 20));
        println!("encoder activations at 4096 tokens, bf16: {:.2} GiB", b as f64 / GIB);
    }
}
