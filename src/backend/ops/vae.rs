//! Fused ops of the VAE decoder (see `crate::model::vae`), at the granularity of the CUDA
//! kernels: 3×3 convolutions as implicit GEMMs with the nearest-×2 upsample folded into the
//! input indexing, GroupNorm with the SiLU fused, flash-style mid-block attention, and the final
//! clamp and rounding done where the picture lives, so only RGB8 comes back.
//!
//! Pictures are NCHW row-major `[N, C, H, W]`. Every reduction accumulates in f64 on the CPU
//! twins (`backend/cpu/vae.rs`).

use crate::backend::Backend;
use anyhow::Result;

/// Ops the VAE decoder needs beyond the generic set.
pub trait VaeOps: Backend {
    /// Fail early, with numbers, when decoding latents `[1, C, h, w]` would not fit in free
    /// device memory (weights, peak activations, reserve). The CPU has nothing to plan.
    fn plan_vae(&self, _c: &crate::checkpoint::Component, _cfg: &crate::checkpoint::config::VaeConfig, _h: usize, _w: usize) -> Result<()> {
        Ok(())
    }

    /// Upload host values as the decoder computes them: fp32 (the CUDA backend's `upload`
    /// would give bf16 at `--precision bf16`; the VAE is fp32 throughout).
    fn upload_f32(&self, t: &crate::tensor::Tensor) -> Result<Self::T> {
        self.upload(t)
    }

    /// Undo the latent BatchNorm and unpatchify (spec 7.2 steps 1–2), in one pass.
    ///
    /// `z [N, C·ph·pw, h, w]`, `mean`, `var` `[C·ph·pw]` (the BatchNorm's running statistics; it
    /// has no affine part) → `[N, C, ph·h, pw·w]` with
    /// `out[n, c, ph·y + dy, pw·x + dx] = z[n, k, y, x] · sqrt(var[k] + eps) + mean[k]`,
    /// `k = c·ph·pw + dy·pw + dx` (fp32, as torch computes it: `sqrt(f32(var + eps))`).
    fn bn_unpatchify(&self, z: &Self::T, mean: &Self::T, var: &Self::T, eps: f64, patch: [usize; 2])
        -> Result<Self::T>;

    /// 2-D convolution, stride 1, zero padding `k/2` ("same"), with bias:
    /// `x [N, Cin, H, W]`, `w [Cout, Cin, k, k]` (k odd: 1 or 3 here), `b [Cout]` →
    /// `[N, Cout, H', W']`,
    /// `out[n, o, Y, X] = b[o] + Σ_{i, ky, kx} w[o, i, ky, kx] · u[n, i, Y + ky − k/2, X + kx − k/2]`
    /// (zero outside the picture). Without `upsample2x`, `u = x` and `H' = H`; with it, `u` is the
    /// nearest-×2 upsample of `x`, `u[n, i, Y, X] = x[n, i, ⌊Y/2⌋, ⌊X/2⌋]`, `H' = 2H`, `W' = 2W`,
    /// never stored (diffusers' `Upsample2D`: `interpolate(nearest, ×2)` then the conv).
    fn conv2d(&self, x: &Self::T, w: &Self::T, b: &Self::T, upsample2x: bool) -> Result<Self::T>;

    /// GroupNorm over `x [N, C, H, W]` with `groups` groups of `C/groups` consecutive channels,
    /// affine, optionally followed by SiLU:
    /// `y = (x − μ) / sqrt(σ² + eps) · w[c] + b[c]`, `μ`, `σ²` the mean and biased variance of the
    /// group's `C/groups · H · W` values (f64 on the CPU); then `y · sigmoid(y)` if `silu`.
    fn group_norm(&self, x: &Self::T, w: &Self::T, b: &Self::T, groups: usize, eps: f64, silu: bool)
        -> Result<Self::T>;

    /// Single-head attention over all positions of a picture (the mid block):
    /// `q`, `k`, `v` `[N, L, D]` → `[N, L, D]`, `out[n, i] = Σ_j p_ij · v[n, j]` with
    /// `p_ij = softmax_j(q[n, i] · k[n, j] / √D)`. Never holds the `[L, L]` matrix at once
    /// (flash-style: query rows in tiles; the CPU twin holds `[L, 8]` scores, softmax in f64).
    fn spatial_attention(&self, q: &Self::T, k: &Self::T, v: &Self::T) -> Result<Self::T>;

    /// The picture `x [1, 3, H, W]` to RGB8, row-major HWC (`H·W·3` bytes):
    /// `round(clamp(clamp(x, −1, 1)/2 + 0.5, 0, 1) · 255)` in f32, round half to even (numpy's
    /// and torch's rounding of the reference).
    fn to_rgb8(&self, x: &Self::T) -> Result<Vec<u8>>;
}
