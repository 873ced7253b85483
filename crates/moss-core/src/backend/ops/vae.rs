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
    /// A picture a split decode keeps between layers ([`VaeOps::picture`]).
    type Picture;

    /// Fail early, with numbers, when decoding latents `[1, C, h, w]` would not fit in free
    /// device memory even split into row strips (weights, the smallest peak activations,
    /// reserve). The CPU has nothing to plan.
    fn plan_vae(&self, _c: &crate::checkpoint::Component, _cfg: &crate::checkpoint::config::VaeConfig, _h: usize, _w: usize) -> Result<()> {
        Ok(())
    }

    /// Undo the latent BatchNorm and unpatchify (spec 7.2 steps 1–2), in one pass.
    ///
    /// `z [N, C·ph·pw, h, w]`, `mean`, `var` `[C·ph·pw]` (the BatchNorm's running statistics; it
    /// has no affine part) → `[N, C, ph·h, pw·w]` with
    /// `out[n, c, ph·y + dy, pw·x + dx] = z[n, k, y, x] · sqrt(var[k] + eps) + mean[k]`,
    /// `k = c·ph·pw + dy·pw + dx` (fp32, as torch computes it: `sqrt(f32(var + eps))`).
    fn bn_unpatchify(&self, z: &Self::T, mean: &Self::T, var: &Self::T, eps: f64, patch: [usize; 2]) -> Result<Self::T>;

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
    /// group's `C/groups · H · W` values (f64); then `y · sigmoid(y)` if `silu`.
    ///
    /// The statistics are split-invariant by construction: [`VaeOps::group_norm_row_stats`]
    /// gives per-(image, group, row) partials, [`group_norm_combine`] reduces them in a fixed
    /// order on the host, [`VaeOps::group_norm_apply`] normalises. A decode split into row strips
    /// (`crate::model::vae`) gathers the same partials strip by strip, so it gets the same bits.
    fn group_norm(&self, x: &Self::T, w: &Self::T, b: &Self::T, groups: usize, eps: f64, silu: bool) -> Result<Self::T> {
        let d = self.dims(x);
        anyhow::ensure!(d.len() == 4, "group_norm: expected [N, C, H, W], got {d:?}");
        anyhow::ensure!(groups > 0 && d[1] % groups == 0, "group_norm: {} channels in {groups} groups", d[1]);
        let rows = self.group_norm_row_stats(x, groups)?;
        let stats = group_norm_combine(&rows, d[0] * groups, d[2], d[1] / groups * d[3]);
        self.group_norm_apply(x, w, b, groups, &stats, eps, silu)
    }

    /// GroupNorm statistics, part 1: for `x [N, C, H, W]`, per image `n`, group `g` and row `y`,
    /// over the group's `C/groups · W` values of that row: their sum `s` and the sum of squared
    /// deviations from their own mean `s / (C/groups · W)`, both f64, laid out
    /// `[N, groups, H, 2]`. A row's pair depends on that row's values only, computed in an order
    /// that depends only on the position inside the row, never on `H` or on where the row sits:
    /// a row strip of a picture gives bit for bit the pairs of those rows of the whole picture.
    fn group_norm_row_stats(&self, x: &Self::T, groups: usize) -> Result<Vec<f64>>;

    /// GroupNorm, part 2: normalise `x [N, C, H, W]` with `stats` `[N, groups, 2]` = (mean,
    /// biased variance) per image and group (from [`group_norm_combine`]):
    /// `y = f32((x − mean) · (w[c] / sqrt(var + eps)) + b[c])` in f64, then SiLU in f32 if `silu`.
    /// Elementwise given `stats`, so any row strip normalises exactly as the whole picture does.
    #[allow(clippy::too_many_arguments)]
    fn group_norm_apply(&self, x: &Self::T, w: &Self::T, b: &Self::T, groups: usize, stats: &[f64], eps: f64, silu: bool) -> Result<Self::T>;

    /// `conv2d(group_norm_apply(x, nw, nb, groups, stats, eps, silu), w, b, upsample2x)`: a conv
    /// whose input is normalised (and SiLU'd) with given statistics. The default (the CPU twin)
    /// is that composition; a backend may fuse it so the normalised tensor is never stored, with
    /// the same bits (the normalisation is elementwise given `stats`).
    #[allow(clippy::too_many_arguments)]
    fn conv2d_normed(
        &self,
        x: &Self::T,
        nw: &Self::T,
        nb: &Self::T,
        groups: usize,
        stats: &[f64],
        eps: f64,
        silu: bool,
        w: &Self::T,
        b: &Self::T,
        upsample2x: bool,
    ) -> Result<Self::T> {
        let t = self.group_norm_apply(x, nw, nb, groups, stats, eps, silu)?;
        self.conv2d(&t, w, b, upsample2x)
    }

    /// The device bytes the run's plan leaves the decode's activations (`--max-vram`; `None`: no
    /// limit but free memory): [`VaeOps::vae_strip_plan`] plans within the smaller of the two.
    fn limit_vae_activations(&self, _bytes: Option<u64>) {}

    /// How to decode latents `[1, C, h, w]` with the decoder of `cfg` already loaded: `None`
    /// when the whole decode fits in free device memory (always on the CPU), else the row strips
    /// and the device bytes for kept pictures that fit ([`StripPlan`]); an error when not even
    /// the smallest split fits.
    fn vae_strip_plan(&self, _cfg: &crate::checkpoint::config::VaeConfig, _h: usize, _w: usize) -> Result<Option<StripPlan>> {
        Ok(None)
    }

    /// A picture `[1, c, h, w]` (fp32) that a split decode keeps between two layers, with room
    /// for the GroupNorm row partials of its rows for `groups` groups; in device memory if
    /// `on_device`, else in host memory (its rows then travel to the device strip by strip).
    /// Laid out by channel planes of `h·w` values. Rows are undefined until written.
    fn picture(&self, c: usize, h: usize, w: usize, groups: usize, on_device: bool) -> Result<Self::Picture>;

    /// Rows `y0..y1` of `p` as a backend tensor `[1, C, y1 − y0, W]` (`C` its channels now);
    /// `next`: the rows the caller asks `p` for next, which a backend may start fetching now.
    fn picture_rows(&self, p: &Self::Picture, y0: usize, y1: usize, next: Option<(usize, usize)>) -> Result<Self::T>;

    /// Write rows `skip..skip + (y1 − y0)` of `t [1, C', r, W]` into rows `y0..y1` of `p`'s first
    /// `C'` channel planes (`C'` at most the channels `p` was made with), and their GroupNorm row
    /// partials ([`VaeOps::group_norm_row_stats`] of those rows of `t`) into `p`'s. Nothing else
    /// of `p` changes: a layer may write its output over its input strip by strip, rows it has
    /// read for the last time (then [`VaeOps::picture_set_channels`]).
    fn picture_put(&self, p: &mut Self::Picture, y0: usize, y1: usize, t: &Self::T, skip: usize) -> Result<()>;

    /// The row partials `[groups, H, 2]` written into `p` (waits for the backend).
    fn picture_row_stats(&self, p: &Self::Picture) -> Result<Vec<f64>>;

    /// `p` from now on holds `c` channels (at most those it was made with), the planes it has.
    fn picture_set_channels(&self, p: &mut Self::Picture, c: usize) -> Result<()>;

    /// Single-head attention over all positions of a picture (the mid block):
    /// `q`, `k`, `v` `[N, L, D]` → `[N, L, D]`, `out[n, i] = Σ_j p_ij · v[n, j]` with
    /// `p_ij = softmax_j(q[n, i] · k[n, j] / √D)`. Never holds the `[L, L]` matrix at once
    /// (flash-style: query rows in tiles; the CPU twin holds `[L, 8]` scores, softmax in f64).
    fn spatial_attention(&self, q: &Self::T, k: &Self::T, v: &Self::T) -> Result<Self::T>;

    /// The picture `x [1, 3, H, W]` to RGB8, row-major HWC (`H·W·3` bytes):
    /// `round(clamp(clamp(x, −1, 1)/2 + 0.5, 0, 1) · 255)` in f32, round half to even (numpy's
    /// and torch's rounding of the reference).
    fn to_rgb8(&self, x: &Self::T) -> Result<Vec<u8>>;

    /// Run `decode`, one whole decode on this backend. A backend whose fast kernels have a
    /// limited range runs it again on full-range ones when they met a value outside it (CUDA: the
    /// fp16-split convolutions, re-run on split TF32). Default: once.
    fn run_decode<R>(&self, decode: impl Fn() -> Result<R>) -> Result<R> {
        decode()
    }
}

/// GroupNorm statistics, part 2 (host, f64, a fixed order): the per-row partials `rows`
/// `[ng, h, 2]` (sum, squared deviations from the row's own mean, `per_row` values a row) of
/// [`VaeOps::group_norm_row_stats`] → `[ng, 2]` (mean, biased variance) per (image, group):
/// `mean = Σ_y s_y / (h · per_row)`, `M2 = Σ_y (m2_y + per_row · (s_y / per_row − mean)²)`
/// (Chan et al.'s pairwise update, summed over rows in order), `var = M2 / (h · per_row)`.
pub fn group_norm_combine(rows: &[f64], ng: usize, h: usize, per_row: usize) -> Vec<f64> {
    assert_eq!(rows.len(), ng * h * 2, "group_norm_combine: {} partials for {ng} groups x {h} rows", rows.len());
    let n = per_row as f64;
    let total = (h * per_row) as f64;
    let mut out = Vec::with_capacity(ng * 2);
    for g in rows.chunks_exact((2 * h).max(1)).take(ng) {
        let mut s = 0f64;
        for r in g.chunks_exact(2) {
            s += r[0];
        }
        let mean = s / total;
        let mut m2 = 0f64;
        for r in g.chunks_exact(2) {
            let d = r[0] / n - mean;
            m2 += r[1] + n * (d * d);
        }
        out.push(mean);
        out.push(m2 / total);
    }
    out
}

/// The split decode's plan ([`VaeOps::vae_strip_plan`]): `rows` output rows of each layer per
/// strip, and `keep_bytes` of device memory for the pictures kept between layers (the rest wait
/// in host memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripPlan {
    pub rows: usize,
    pub keep_bytes: usize,
}

/// Bytes of a kept picture `[1, c, h, w]` ([`VaeOps::picture`]): its f32 values and the f64
/// pairs of its row partials for `groups` groups.
pub fn picture_bytes(c: usize, h: usize, w: usize, groups: usize) -> usize {
    4 * c * h * w + 16 * groups * h
}

/// A picture kept in host memory (the CPU backend's [`VaeOps::Picture`]): `cap` values laid out
/// by channel planes of `h·w`, `c` channels in use, the row partials `[groups, h, 2]`.
pub struct HostPicture {
    pub data: Vec<f32>,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub groups: usize,
    pub part: Vec<f64>,
}

impl HostPicture {
    pub fn new(c: usize, h: usize, w: usize, groups: usize) -> Result<HostPicture> {
        anyhow::ensure!(groups > 0 && h > 0 && w > 0, "picture [{c}, {h}, {w}] in {groups} groups");
        Ok(HostPicture { data: vec![0f32; c * h * w], c, h, w, groups, part: vec![0f64; groups * h * 2] })
    }

    /// Rows `y0..y1` as `[1, C, y1 − y0, W]`.
    pub fn rows(&self, y0: usize, y1: usize) -> Result<crate::tensor::Tensor> {
        let (c, h, w) = (self.c, self.h, self.w);
        anyhow::ensure!(y0 < y1 && y1 <= h, "rows {y0}..{y1} of a picture of {h} rows");
        let mut data = Vec::with_capacity(c * (y1 - y0) * w);
        for ci in 0..c {
            data.extend_from_slice(&self.data[(ci * h + y0) * w..(ci * h + y1) * w]);
        }
        crate::tensor::Tensor::new(vec![1, c, y1 - y0, w], data)
    }

    /// [`VaeOps::picture_put`] given the partials `part` `[groups, r, 2]` of all rows of `t`.
    pub fn put(&mut self, y0: usize, y1: usize, t: &crate::tensor::Tensor, skip: usize, part: &[f64]) -> Result<()> {
        let (h, w, g) = (self.h, self.w, self.groups);
        anyhow::ensure!(t.shape.len() == 4 && t.shape[0] == 1 && t.shape[3] == w, "picture_put: strip {:?} into [{}, {h}, {w}]", t.shape, self.c);
        let (tc, r, n) = (t.shape[1], t.shape[2], y1 - y0);
        anyhow::ensure!(y0 < y1 && y1 <= h && skip + n <= r, "picture_put: rows {skip}..{} of {r} into rows {y0}..{y1} of {h}", skip + n);
        anyhow::ensure!(
            tc * h * w <= self.data.len() && part.len() == g * r * 2,
            "picture_put: {tc} channels / {} partials into [{}, {h}, {w}]",
            part.len(),
            self.c
        );
        for ci in 0..tc {
            self.data[(ci * h + y0) * w..(ci * h + y1) * w].copy_from_slice(&t.data[(ci * r + skip) * w..(ci * r + skip + n) * w]);
        }
        for gi in 0..g {
            self.part[(gi * h + y0) * 2..(gi * h + y1) * 2].copy_from_slice(&part[(gi * r + skip) * 2..(gi * r + skip + n) * 2]);
        }
        Ok(())
    }

    pub fn set_channels(&mut self, c: usize) -> Result<()> {
        anyhow::ensure!(c * self.h * self.w <= self.data.len(), "picture of {} values set to {c} channels of {}x{}", self.data.len(), self.h, self.w);
        self.c = c;
        Ok(())
    }
}

/// `(N, L, D)` of `spatial_attention`'s q, k, v: `[N, L, D]` each, one shape.
pub fn attention_dims(q: &[usize], k: &[usize], v: &[usize]) -> anyhow::Result<(usize, usize, usize)> {
    anyhow::ensure!(q.len() == 3 && k == q && v == q, "spatial_attention: q {q:?}, k {k:?}, v {v:?} (expected [N, L, D] each)");
    Ok((q[0], q[1], q[2]))
}
