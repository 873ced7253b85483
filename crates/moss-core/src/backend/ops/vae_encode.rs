//! Ops the VAE encoder (`crate::model::vae::VaeEncoder`, spec 7.4) needs beyond the decoder's
//! [`VaeOps`]: the stride-2 convolution of diffusers' `Downsample2D`, and the encode's memory
//! plan. Everything else the encoder runs (3×3 and 1×1 convolutions, GroupNorm, the mid block's
//! attention, the kept pictures of a split run) is the decoder's op set.

use super::vae::StripPlan;
use super::VaeOps;
use crate::checkpoint::config::VaeConfig;
use anyhow::Result;

pub trait VaeEncodeOps: VaeOps {
    /// diffusers' `Downsample2D` with `padding=0` (the encoder's): pad the picture with one zero
    /// column on the right and one zero row at the bottom, then a 3×3 convolution of stride 2
    /// with bias: `x [N, Cin, H, W]` (H, W ≥ 2), `w [Cout, Cin, 3, 3]`, `b [Cout]` →
    /// `[N, Cout, ⌊H/2⌋, ⌊W/2⌋]`,
    /// `out[n, o, y, x] = b[o] + Σ_{i, ky, kx} w[o, i, ky, kx] · x[n, i, 2y + ky, 2x + kx]`
    /// (zero past the last row or column). Output row `y` reads input rows `2y..2y + 2`, so
    /// rows `2·y0 .. 2·y1 + 1` of a picture give its output rows `y0..y1` exactly (a row strip).
    ///
    /// This is the "same" 3×3 convolution ([`VaeOps::conv2d`], padding 1 all round) read at the
    /// odd pixels: its output at `(2y + 1, 2x + 1)` reads input rows `2y..2y + 2` and columns
    /// `2x..2x + 2`, with zeros past the picture in both. The CUDA backend computes it that
    /// way; the CPU twin computes the stride-2 sum directly.
    fn conv2d_down2(&self, x: &Self::T, w: &Self::T, b: &Self::T) -> Result<Self::T>;

    /// Fail early, with numbers, when encoding an `width`×`height` picture would not fit in free
    /// device memory even in row strips. The CPU has nothing to plan.
    fn plan_vae_encode(&self, _c: &crate::checkpoint::Component, _cfg: &VaeConfig, _height: usize, _width: usize) -> Result<()> {
        Ok(())
    }

    /// How to encode an `width`×`height` picture with the encoder of `cfg` already loaded:
    /// `None` when the whole encode fits (always on the CPU), else row strips for the layers
    /// above the last down block and the device bytes for kept pictures ([`StripPlan`], rows
    /// at each layer's own resolution); an error when not even the smallest split fits.
    fn vae_encode_strip_plan(&self, _cfg: &VaeConfig, _height: usize, _width: usize) -> Result<Option<StripPlan>> {
        Ok(None)
    }
}

/// The output size of [`VaeEncodeOps::conv2d_down2`] for an input side of `n` (at least 2).
pub fn down2_side(n: usize) -> usize {
    n / 2
}
