//! Fused ops of the DiT (see `crate::model::dit`, spec section 4) and of the sampling loop
//! (spec 5.3).
//!
//! Each op is one kernel's worth of work. The CPU twins (`backend/cpu/dit.rs`) take and return
//! fp32 data and compute inside in f64 (every reduction, the softmax, the rotation); a CUDA
//! kernel is gated against them. Shapes: `N` tokens (`h·w` image tokens then `L` text tokens in
//! the joint stream, `L` in the refiner), `D` the model width, `H` heads of `hd` (= 128),
//! `F` the FFN width.

use crate::backend::Backend;
use anyhow::Result;

/// Ops the DiT and its loop need beyond the generic set.
pub trait DitOps: Backend {
    /// The timestep sinusoid, cos first (spec 4.3): `t` is promoted to f64, and for
    /// `half = dim/2`, `k < half`: `freq_k = 10000^(−k/half)`, `out[k] = cos(t·freq_k)`,
    /// `out[half + k] = sin(t·freq_k)`, all in f64, rounded to f32 once. → `[dim]`.
    fn timestep_sinusoid(&self, t: f32, dim: usize) -> Result<Self::T>;

    /// `x` as the main blocks' residual stream is held: each gated residual rounds into the
    /// stream's dtype. The default keeps `x` as it is (the CPU backend is f32 throughout); the
    /// CUDA backend holds the stream in f32 at every precision, so that the bf16 forward does
    /// not round the stream to bf16 twice a block (the norms' outputs, the next linears' inputs,
    /// stay in the activation dtype).
    fn residual_stream(&self, x: &Self::T) -> Result<Self::T> {
        Ok(x.clone())
    }

    /// `x · Wᵀ` (no bias) with the product kept in f32: the DiT's last linear, whose output, the
    /// velocity, the sampler reads as f32 (spec 4.4 step 6), so it is not rounded to the
    /// activation dtype on the way. The default is `linear` (the CPU backend is f32 throughout).
    fn linear_f32(&self, x: &Self::T, w: &Self::T) -> Result<Self::T> {
        self.linear(x, w, None)
    }

    /// RMSNorm with a plain weight fused with the adaLN modulation. `x [N, D]`, `w`, `shift`,
    /// `scale` `[D]` → `[N, D]`:
    /// `y = x · rsqrt(mean_D(x²) + eps) · w · (1 + scale) + shift` per row.
    fn rms_norm_modulate(&self, x: &Self::T, w: &Self::T, shift: &Self::T, scale: &Self::T, eps: f64) -> Result<Self::T>;

    /// Per-head QK-norm (RMSNorm with a plain weight) followed by rotate-half RoPE over the whole
    /// head. `x [N, H, hd]`, `w [hd]`, `cos`, `sin` `[N, hd/2]` (the table of
    /// [`crate::model::dit::rope`], one row per token) → `[N, H, hd]`. With
    /// `y = x · rsqrt(mean_hd(x²) + eps) · w` per (token n, head), for `m < hd/2`:
    /// `out[m] = y[m]·cos[n,m] − y[m + hd/2]·sin[n,m]`,
    /// `out[m + hd/2] = y[m + hd/2]·cos[n,m] + y[m]·sin[n,m]`.
    fn qk_norm_rope(&self, x: &Self::T, w: &Self::T, cos: &Self::T, sin: &Self::T, eps: f64) -> Result<Self::T>;

    /// [`DitOps::qk_norm_rope`] on the q and k parts of a packed projection, v passed through.
    /// `qkv [N, 3·H·hd]` = `[q | k | v]` (heads of `hd` contiguous within each part), `wq`, `wk`
    /// `[hd]`, `cos`, `sin` `[N, hd/2]` → `[N, 3·H·hd]` where the q part is
    /// `qk_norm_rope(q, wq, ..)`, the k part `qk_norm_rope(k, wk, ..)` and the v part is `v` as it
    /// was. Takes `qkv` by value: a backend may (the CUDA one does) write into its buffer.
    #[allow(clippy::too_many_arguments)]
    fn qkv_norm_rope(&self, qkv: Self::T, heads: usize, wq: &Self::T, wk: &Self::T, cos: &Self::T, sin: &Self::T, eps: f64) -> Result<Self::T>;

    /// [`DitOps::attention`] over a packed `[N, 3·H·hd]` projection `[q | k | v]` (as
    /// [`DitOps::qkv_norm_rope`] leaves it) → `[N, H·hd]`.
    fn attention_packed(&self, qkv: &Self::T, heads: usize, scale: f64) -> Result<Self::T>;

    /// [`DitOps::gated_residual`] followed by [`DitOps::rms_norm_modulate`] of its result:
    /// `x' = x + y · gate` (rounded to the dtype of `x`, as the unfused op writes it), then
    /// `n = rms_norm_modulate(x', w, shift, scale, eps)` → `(x', n)`, both `[N, D]`.
    #[allow(clippy::too_many_arguments)]
    fn gated_residual_norm_modulate(
        &self,
        x: &Self::T,
        y: &Self::T,
        gate: &Self::T,
        w: &Self::T,
        shift: &Self::T,
        scale: &Self::T,
        eps: f64,
    ) -> Result<(Self::T, Self::T)>;

    /// Bidirectional softmax attention, no mask, flash style (no `[N, N]` matrix needs to exist).
    /// `q`, `k`, `v` `[N, H, hd]` → `[N, H, hd]`:
    /// `out[n, h] = Σ_j softmax_j(scale · q[n,h]·k[j,h]) · v[j,h]`.
    fn attention(&self, q: &Self::T, k: &Self::T, v: &Self::T, scale: f64) -> Result<Self::T>;

    /// SiTU-GLU over a packed `[up | gate]` input. `x [.., 2F]` → `[.., F]`, with `h = x[.., :F]`,
    /// `g = x[.., F:]`: `out = (4·tanh(g/4)·sigmoid(g)) · (25·tanh(h/25))`.
    fn situ_glu(&self, x: &Self::T) -> Result<Self::T>;

    /// [`DitOps::situ_glu`] of the bias-free linear `x [.., K] · wᵀ`, `w [2F, K]` with rows
    /// `[up ; gate]` → `[.., F]`: `situ_glu(linear(x, w, None))`, the product rounded to the
    /// activation dtype before SiTU as the two ops round it. A backend may fuse the two (CUDA on
    /// Hopper: the product is never written); the default (the CPU twin) runs them in turn.
    fn linear_situ_glu(&self, x: &Self::T, w: &Self::T) -> Result<Self::T> {
        self.situ_glu(&self.linear(x, w, None)?)
    }

    /// [`DitOps::qkv_norm_rope`] of the bias-free linear `x [N, K] · wᵀ`, `w [3·H·hd, K]` with rows
    /// `[q ; k ; v]` → `[N, 3·H·hd]`: `qkv_norm_rope(linear(x, w, None), ..)`, the product rounded
    /// to the activation dtype before the norm as the two ops round it. A backend may fuse the two
    /// (CUDA on Hopper: the product is never written unnormed); the default (the CPU twin) runs
    /// them in turn.
    #[allow(clippy::too_many_arguments)]
    fn linear_qkv_norm_rope(
        &self,
        x: &Self::T,
        w: &Self::T,
        wq: &Self::T,
        wk: &Self::T,
        cos: &Self::T,
        sin: &Self::T,
        heads: usize,
        eps: f64,
    ) -> Result<Self::T> {
        self.qkv_norm_rope(self.linear(x, w, None)?, heads, wq, wk, cos, sin, eps)
    }

    /// [`DitOps::linear_qkv_norm_rope`] at fp8: the quantized rows `x = (codes, scales)` times
    /// the `[q ; k ; v]` codes and row scales `w` ([`Backend::linear_fp8_quantized`]), then
    /// `qkv_norm_rope`. A backend may fuse the two (CUDA on Hopper); the default runs them in turn.
    #[allow(clippy::too_many_arguments)]
    fn linear_qkv_norm_rope_fp8(
        &self,
        x: (&Self::T, &Self::T),
        w: (&Self::T, &Self::T),
        wq: &Self::T,
        wk: &Self::T,
        cos: &Self::T,
        sin: &Self::T,
        heads: usize,
        eps: f64,
    ) -> Result<Self::T> {
        self.qkv_norm_rope(self.linear_fp8_quantized(x.0, x.1, w.0, w.1)?, heads, wq, wk, cos, sin, eps)
    }

    /// [`DitOps::rms_norm_modulate`] with its output quantized per row as
    /// [`Backend::quantize_rows`] quantizes it (the input of a float8 linear,
    /// [`Backend::linear_fp8_quantized`]) → `(codes [N, D], scales [N])`, bit for bit
    /// `quantize_rows(rms_norm_modulate(..))`, which is what this default does.
    fn rms_norm_modulate_fp8(&self, x: &Self::T, w: &Self::T, shift: &Self::T, scale: &Self::T, eps: f64) -> Result<(Self::T, Self::T)> {
        self.quantize_rows(&self.rms_norm_modulate(x, w, shift, scale, eps)?)
    }

    /// [`DitOps::gated_residual_norm_modulate`] with the norm quantized per row:
    /// `(x', quantize_rows(n))`, bit for bit (this default).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn gated_residual_norm_modulate_fp8(
        &self,
        x: &Self::T,
        y: &Self::T,
        gate: &Self::T,
        w: &Self::T,
        shift: &Self::T,
        scale: &Self::T,
        eps: f64,
    ) -> Result<(Self::T, (Self::T, Self::T))> {
        let (x, n) = self.gated_residual_norm_modulate(x, y, gate, w, shift, scale, eps)?;
        Ok((x, self.quantize_rows(&n)?))
    }

    /// [`DitOps::situ_glu`] of `x [N, 2F]` quantized per row: `quantize_rows(situ_glu(x))`, bit
    /// for bit (this default).
    fn situ_glu_fp8(&self, x: &Self::T) -> Result<(Self::T, Self::T)> {
        self.quantize_rows(&self.situ_glu(x)?)
    }

    /// [`DitOps::linear_situ_glu`] at fp8: the quantized rows `xq`, `xs` times the `[up ; gate]`
    /// codes `wq [2F, K]`, `ws [2F]` ([`Backend::linear_fp8_quantized`]), then SiTU-GLU quantized
    /// per row for the down projection → `(codes [N, F], scales [N])`. The default is
    /// `situ_glu_fp8(linear_fp8_quantized(..))`; a backend may put SiTU in the product's epilogue
    /// (CUDA on Hopper: the `[N, 2F]` product is never written; the SiTU output, rounded as the
    /// unfused path rounds it, is then quantized).
    fn linear_situ_glu_fp8(&self, xq: &Self::T, xs: &Self::T, wq: &Self::T, ws: &Self::T) -> Result<(Self::T, Self::T)> {
        self.situ_glu_fp8(&self.linear_fp8_quantized(xq, xs, wq, ws)?)
    }

    /// Gated residual: `x [N, D]`, `y [N, D]`, `gate [D]` → `x + y · gate` (raw gate: no tanh,
    /// no `1 +`).
    fn gated_residual(&self, x: &Self::T, y: &Self::T, gate: &Self::T) -> Result<Self::T>;

    /// Before the transformer loads: check that its weights and the activations of one forward
    /// over `image + text` joint tokens fit on the device, and fail with needed/free (and the
    /// largest size that fits) if not. The CPU has nothing to plan.
    fn plan_dit(&self, _c: &crate::checkpoint::Component, _cfg: &crate::checkpoint::config::DitConfig, _image: usize, _text: usize) -> Result<()> {
        Ok(())
    }

    /// CFG combine and Euler step, elementwise in f32 in this order (the reference's rounding):
    /// `v = v_u + guidance·(v_c − v_u)` (or `v = v_c` without `v_u`), then `x + dsigma·v`.
    /// `x`, `v_c`, `v_u` of one shape → that shape.
    fn cfg_euler(&self, x: &Self::T, v_c: &Self::T, v_u: Option<&Self::T>, guidance: f32, dsigma: f32) -> Result<Self::T>;
}
