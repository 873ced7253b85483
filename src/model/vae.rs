//! The FLUX.2 small VAE decoder (spec section 7): packed latents → picture in [-1, 1].
//!
//! diffusers' `AutoencoderKLFlux2.decode` after the pipeline's glue: undo the BatchNorm and
//! unpatchify ([`VaeOps::bn_unpatchify`]), `post_quant_conv`, then `Decoder`: `conv_in`, the mid
//! block (resnet, single-head attention, resnet), the up blocks (widths
//! `reversed(decoder_block_out_channels)`, `layers_per_block + 1` resnets each, a nearest-×2
//! upsample + 3×3 conv after all but the last), `conv_norm_out` + SiLU, `conv_out`. Names follow
//! the checkpoint (spec 7.3).
//!
//! **Split decode** ([`Split::Strips`]): a decode that does not fit in free device memory runs
//! the part at the latent resolution (`post_quant_conv`, `conv_in`, the mid block with its
//! attention) whole on the backend, then every later layer in row strips. Between layers only
//! the pictures a later layer reads are kept ([`VaeOps::picture`]): a resnet's input (its
//! GroupNorm and its shortcut) and its first conv's output (the second GroupNorm), in device
//! memory while the plan's budget lasts, else in host memory; a resnet writes its output over
//! its input. Each conv gets its output rows' input rows plus the halo (`k/2` rows; through the
//! folded upsample, the low-resolution rows those need) and hands its valid rows to the next
//! picture. A conv's output pixel does not depend on the strip (same inputs, same summation
//! order), and the GroupNorm statistics are gathered as per-row partials
//! ([`VaeOps::group_norm_row_stats`]) combined in a fixed order, so the picture is the unsplit
//! one, bit for bit (tests/vae.rs checks it).

use crate::backend::ops::VaeOps;
use crate::backend::ops::vae::{group_norm_combine, picture_bytes};
use crate::checkpoint::{config::VaeConfig, Component};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};
use std::cell::Cell;

/// The eps of every GroupNorm in diffusers' `Decoder` (`resnet_eps`, fixed there, not in the config).
const NORM_EPS: f64 = 1e-6;

/// `Conv2d` with bias; the kernel size comes from the weight.
struct Conv<B: VaeOps> {
    weight: B::T,
    bias: B::T,
}

impl<B: VaeOps> Conv<B> {
    fn load(b: &B, c: &Component, p: &str) -> Result<Self> {
        Ok(Conv { weight: b.load(c, &format!("{p}.weight"))?, bias: b.load(c, &format!("{p}.bias"))? })
    }
    fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        b.conv2d(x, &self.weight, &self.bias, false)
    }
    /// diffusers' `Upsample2D`: nearest ×2, then this conv (folded into one op).
    fn forward_upsampled(&self, b: &B, x: &B::T) -> Result<B::T> {
        b.conv2d(x, &self.weight, &self.bias, true)
    }
    fn conv(&self, b: &B, x: &B::T, up: bool) -> Result<B::T> {
        b.conv2d(x, &self.weight, &self.bias, up)
    }
}

/// `GroupNorm(groups, eps 1e-6, affine)`.
struct GroupNorm<B: VaeOps> {
    weight: B::T,
    bias: B::T,
    groups: usize,
}

impl<B: VaeOps> GroupNorm<B> {
    fn load(b: &B, c: &Component, p: &str, groups: usize) -> Result<Self> {
        Ok(GroupNorm { weight: b.load(c, &format!("{p}.weight"))?, bias: b.load(c, &format!("{p}.bias"))?, groups })
    }
    fn forward(&self, b: &B, x: &B::T, silu: bool) -> Result<B::T> {
        b.group_norm(x, &self.weight, &self.bias, self.groups, NORM_EPS, silu)
    }
    /// The (mean, variance) per group of a kept picture, from the row partials gathered as its
    /// strips were written: the same partials, combined the same way, as [`VaeOps::group_norm`]
    /// over the whole picture.
    fn stats_of(&self, b: &B, x: &Pic<B>) -> Result<Vec<f64>> {
        let [c, h, w] = x.dims;
        ensure!(x.groups == self.groups && c % self.groups == 0, "VAE split: row partials for {} groups, wanted {}", x.groups, self.groups);
        let part = b.picture_row_stats(&x.p)?;
        ensure!(part.len() == self.groups * h * 2, "VAE split: {} row partials for {} groups x {h} rows", part.len(), self.groups);
        Ok(group_norm_combine(&part, self.groups, h, c / self.groups * w))
    }
    /// `conv(silu?(norm(x)))` with statistics given ([`GroupNorm::stats_of`] for a strip, the
    /// whole picture's otherwise), through [`VaeOps::conv2d_normed`] (fused on CUDA).
    fn conv_with(&self, b: &B, x: &B::T, stats: &[f64], silu: bool, conv: &Conv<B>, up: bool) -> Result<B::T> {
        b.conv2d_normed(x, &self.weight, &self.bias, self.groups, stats, NORM_EPS, silu, &conv.weight, &conv.bias, up)
    }
    /// `conv(silu?(norm(x)))` over the whole picture: the same statistics as
    /// [`VaeOps::group_norm`] (row partials, fixed-order combine).
    fn conv(&self, b: &B, x: &B::T, silu: bool, conv: &Conv<B>) -> Result<B::T> {
        let d = b.dims(x);
        ensure!(d.len() == 4 && d[1] % self.groups == 0, "VAE: GroupNorm({}) of {d:?}", self.groups);
        let rows = b.group_norm_row_stats(x, self.groups)?;
        let stats = group_norm_combine(&rows, d[0] * self.groups, d[2], d[1] / self.groups * d[3]);
        self.conv_with(b, x, &stats, silu, conv, false)
    }
}

/// `nn.Linear` with bias.
struct Linear<B: VaeOps> {
    weight: B::T,
    bias: B::T,
}

impl<B: VaeOps> Linear<B> {
    fn load(b: &B, c: &Component, p: &str) -> Result<Self> {
        Ok(Linear { weight: b.load(c, &format!("{p}.weight"))?, bias: b.load(c, &format!("{p}.bias"))? })
    }
    fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        b.linear(x, &self.weight, Some(&self.bias))
    }
}

/// diffusers' `ResnetBlock2D` without time embedding, output scale 1:
/// `shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))`, the shortcut a 1×1 conv when
/// the width changes.
struct Resnet<B: VaeOps> {
    norm1: GroupNorm<B>,
    conv1: Conv<B>,
    norm2: GroupNorm<B>,
    conv2: Conv<B>,
    conv_shortcut: Option<Conv<B>>,
}

impl<B: VaeOps> Resnet<B> {
    fn load(b: &B, c: &Component, p: &str, cin: usize, cout: usize, groups: usize) -> Result<Self> {
        Ok(Resnet {
            norm1: GroupNorm::load(b, c, &format!("{p}.norm1"), groups)?,
            conv1: Conv::load(b, c, &format!("{p}.conv1"))?,
            norm2: GroupNorm::load(b, c, &format!("{p}.norm2"), groups)?,
            conv2: Conv::load(b, c, &format!("{p}.conv2"))?,
            conv_shortcut: if cin != cout { Some(Conv::load(b, c, &format!("{p}.conv_shortcut"))?) } else { None },
        })
    }
    fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        let h = self.norm1.conv(b, x, true, &self.conv1)?;
        let h = self.norm2.conv(b, &h, true, &self.conv2)?;
        match &self.conv_shortcut {
            Some(s) => b.add(&s.forward(b, x)?, &h),
            None => b.add(x, &h),
        }
    }
    /// [`Resnet::forward`] in row strips, `x` and the result kept pictures: `h` (the first conv's
    /// output) is kept whole for the second GroupNorm's statistics; the output goes over `x`,
    /// strip by strip after its rows were read, when it has no more channels than `x`.
    fn forward_strips<'k>(&self, b: &B, x: Pic<'k, B>, sp: Strips, keep: &'k Keep) -> Result<Pic<'k, B>> {
        let [c, hh, w] = x.dims;
        let cout = b.dims(&self.conv1.weight)[0];
        let st1 = self.norm1.stats_of(b, &x)?;
        let mut h = keep.picture(b, [cout, hh, w], x.groups)?;
        conv_strips(b, &x, Some((&self.norm1, &st1)), &self.conv1, false, sp, |y0, y1, t, skip| h.put(b, y0, y1, &t, skip))?;
        let st2 = self.norm2.stats_of(b, &h)?;
        let mut x = x;
        let mut fresh = if cout <= c { None } else { Some(keep.picture(b, [cout, hh, w], x.groups)?) };
        conv_strips(b, &h, Some((&self.norm2, &st2)), &self.conv2, false, sp, |y0, y1, t, skip| {
            let t = if skip == 0 && b.dims(&t)[2] == y1 - y0 { t } else { b.narrow(&t, 2, skip, y1 - y0)? };
            let next = (y1 < hh).then(|| (y1, (y1 + sp.rows).min(hh)));
            let xs = x.rows(b, y0, y1, next)?;
            let o = match &self.conv_shortcut {
                Some(s) => b.add(&s.forward(b, &xs)?, &t)?,
                None => b.add(&xs, &t)?,
            };
            drop(xs);
            match fresh.as_mut() {
                Some(f) => f.put(b, y0, y1, &o, 0),
                None => x.put(b, y0, y1, &o, 0),
            }
        })?;
        drop(h);
        match fresh {
            Some(f) => Ok(f),
            None => {
                x.set_channels(b, cout)?;
                Ok(x)
            }
        }
    }
}

/// Where a split decode keeps its pictures: device memory while `budget` bytes last (pictures
/// live at once counted), host memory after; and what that cost.
struct Keep {
    budget: usize,
    used: Cell<usize>,
    report: Cell<SplitReport>,
}

/// What a split decode kept where ([`VaeDecoder::decode_rgb8_report`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitReport {
    /// Most device bytes the kept pictures held at once.
    pub kept_peak_bytes: usize,
    /// Pictures kept in device memory / in host memory.
    pub device_pictures: usize,
    pub host_pictures: usize,
    /// Bytes copied between host pictures and the device (rows read, rows written).
    pub host_bytes_moved: usize,
}

impl Keep {
    fn new(budget: usize) -> Keep {
        Keep { budget, used: Cell::new(0), report: Cell::new(SplitReport::default()) }
    }
    fn note(&self, f: impl FnOnce(&mut SplitReport)) {
        let mut r = self.report.get();
        f(&mut r);
        self.report.set(r);
    }
    /// A new picture `[1, c, h, w]`: on the device if it fits the budget next to those still live.
    fn picture<'k, B: VaeOps>(&'k self, b: &B, dims: [usize; 3], groups: usize) -> Result<Pic<'k, B>> {
        let [c, h, w] = dims;
        let bytes = picture_bytes(c, h, w, groups);
        let on_device = self.used.get() + bytes <= self.budget;
        let p = b.picture(c, h, w, groups, on_device)?;
        let device = if on_device { bytes } else { 0 };
        self.used.set(self.used.get() + device);
        let used = self.used.get();
        self.note(|r| {
            r.kept_peak_bytes = r.kept_peak_bytes.max(used);
            if on_device {
                r.device_pictures += 1;
            } else {
                r.host_pictures += 1;
            }
        });
        Ok(Pic { p, dims, groups, device, keep: self })
    }
}

/// A picture kept between layers ([`VaeOps::picture`]), `dims` `[C, H, W]`, holding `device`
/// bytes of the [`Keep`] budget until dropped.
struct Pic<'k, B: VaeOps> {
    p: B::Picture,
    dims: [usize; 3],
    groups: usize,
    device: usize,
    keep: &'k Keep,
}

impl<B: VaeOps> Pic<'_, B> {
    fn moved(&self, b: &B, t: &B::T, rows: usize) {
        if self.device == 0 {
            let d = b.dims(t);
            let bytes = 4 * d[1] * rows * d[3];
            self.keep.note(|r| r.host_bytes_moved += bytes);
        }
    }
    fn rows(&self, b: &B, y0: usize, y1: usize, next: Option<(usize, usize)>) -> Result<B::T> {
        let t = b.picture_rows(&self.p, y0, y1, next)?;
        self.moved(b, &t, y1 - y0);
        Ok(t)
    }
    fn put(&mut self, b: &B, y0: usize, y1: usize, t: &B::T, skip: usize) -> Result<()> {
        b.picture_put(&mut self.p, y0, y1, t, skip)?;
        self.moved(b, t, y1 - y0);
        Ok(())
    }
    fn set_channels(&mut self, b: &B, c: usize) -> Result<()> {
        b.picture_set_channels(&mut self.p, c)?;
        self.dims[0] = c;
        Ok(())
    }
}

impl<B: VaeOps> Drop for Pic<'_, B> {
    fn drop(&mut self) {
        self.keep.used.set(self.keep.used.get() - self.device);
    }
}

/// How a decode runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every activation on the backend at once.
    Whole,
    /// After the mid block, layer by layer in row strips (see the module doc).
    Strips(Strips),
}

/// Row strips: `rows` output rows of each layer (at its own resolution) per strip; the pictures
/// kept between layers on the device while they fit in `keep_bytes`, in host memory after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strips {
    pub rows: usize,
    pub keep_bytes: usize,
    /// Planted for the tests' control: strips get no halo rows (each strip's edges then see the
    /// conv's zero padding instead of their neighbours). Never set outside tests.
    pub no_halo: bool,
}

impl Split {
    /// Strips of `rows` rows (at least 1), with the halo, every kept picture in host memory
    /// (the least device memory; `moss decode --strip-rows`).
    pub fn strips(rows: usize) -> Split {
        Split::strips_keeping(rows, 0)
    }
    /// Strips of `rows` rows, pictures kept on the device while they fit in `keep_bytes`.
    pub fn strips_keeping(rows: usize, keep_bytes: usize) -> Split {
        Split::Strips(Strips { rows: rows.max(1), keep_bytes, no_halo: false })
    }
}

/// The input rows `a..b` (of `h_in`) a conv with kernel `k` needs for its output rows
/// `y0..y1`, and where `y0` sits in the conv's output over those input rows. The halo is `k/2`
/// rows; with the folded ×2 upsample, output row `Y` reads upsampled rows `Y ± k/2`, i.e. input
/// rows `⌊(Y ± k/2)/2⌋`. Rows of the strip's own output that saw the strip's edge (zero padding
/// standing in for a neighbour row) lie outside `y0..y1` and are dropped.
fn input_span(y0: usize, y1: usize, h_in: usize, k: usize, up: bool, halo: bool) -> (usize, usize, usize) {
    let p = if halo { k / 2 } else { 0 };
    if up {
        let a = y0.saturating_sub(p) / 2;
        let b = ((y1 - 1 + p) / 2 + 1).min(h_in);
        (a, b, y0 - 2 * a)
    } else {
        let a = y0.saturating_sub(p);
        (a, (y1 + p).min(h_in), y0 - a)
    }
}

/// One conv (optionally after a GroupNorm + SiLU with given statistics) over the kept picture
/// `x` in row strips: `out(y0, y1, strip, skip)` gets each strip's output, whose rows
/// `skip..skip + y1 − y0` are the conv's output rows `y0..y1` (the others saw the strip's edge).
#[allow(clippy::too_many_arguments)]
fn conv_strips<B: VaeOps>(
    b: &B,
    x: &Pic<B>,
    norm: Option<(&GroupNorm<B>, &[f64])>,
    conv: &Conv<B>,
    up: bool,
    sp: Strips,
    mut out: impl FnMut(usize, usize, B::T, usize) -> Result<()>,
) -> Result<()> {
    let h_in = x.dims[1];
    let k = b.dims(&conv.weight)[2];
    let oh = if up { 2 * h_in } else { h_in };
    let span = |y0: usize| input_span(y0, (y0 + sp.rows).min(oh), h_in, k, up, !sp.no_halo);
    for y0 in (0..oh).step_by(sp.rows) {
        let y1 = (y0 + sp.rows).min(oh);
        let (a, e, off) = span(y0);
        let next = (y1 < oh).then(|| span(y1)).map(|(a, e, _)| (a, e));
        let xs = x.rows(b, a, e, next)?;
        let o = match norm {
            Some((n, st)) => n.conv_with(b, &xs, st, true, conv, up)?,
            None => conv.conv(b, &xs, up)?,
        };
        drop(xs);
        out(y0, y1, o, off)?;
    }
    Ok(())
}

/// The mid block's `Attention` (one head of the full width, residual):
/// `x + to_out(attention(to_q(n), to_k(n), to_v(n)))`, `n = group_norm(x)` as `[1, H·W, C]`.
struct Attention<B: VaeOps> {
    group_norm: GroupNorm<B>,
    to_q: Linear<B>,
    to_k: Linear<B>,
    to_v: Linear<B>,
    to_out: Linear<B>,
}

impl<B: VaeOps> Attention<B> {
    fn load(b: &B, c: &Component, p: &str, groups: usize) -> Result<Self> {
        Ok(Attention {
            group_norm: GroupNorm::load(b, c, &format!("{p}.group_norm"), groups)?,
            to_q: Linear::load(b, c, &format!("{p}.to_q"))?,
            to_k: Linear::load(b, c, &format!("{p}.to_k"))?,
            to_v: Linear::load(b, c, &format!("{p}.to_v"))?,
            to_out: Linear::load(b, c, &format!("{p}.to_out.0"))?,
        })
    }
    fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        let d = b.dims(x);
        let (n, c, hw) = (d[0], d[1], d[2] * d[3]);
        let t = b.reshape(&self.group_norm.forward(b, x, false)?, &[n, c, hw])?;
        let t = b.permute(&t, &[0, 2, 1])?; // [N, H·W, C]
        let (q, k, v) = (self.to_q.forward(b, &t)?, self.to_k.forward(b, &t)?, self.to_v.forward(b, &t)?);
        let o = self.to_out.forward(b, &b.spatial_attention(&q, &k, &v)?)?;
        let o = b.reshape(&b.permute(&o, &[0, 2, 1])?, &d)?;
        b.add(x, &o)
    }
}

/// `UpDecoderBlock2D`: resnets, then (all but the last block) `upsamplers.0`.
struct UpBlock<B: VaeOps> {
    resnets: Vec<Resnet<B>>,
    upsampler: Option<Conv<B>>,
}

pub struct VaeDecoder<B: VaeOps> {
    cfg: VaeConfig,
    bn_mean: B::T,
    bn_var: B::T,
    bn_eps: f64,
    patch: [usize; 2],
    packed_channels: usize,
    post_quant_conv: Option<Conv<B>>,
    conv_in: Conv<B>,
    mid_resnets: Vec<Resnet<B>>,
    mid_attention: Option<Attention<B>>,
    up_blocks: Vec<UpBlock<B>>,
    conv_norm_out: GroupNorm<B>,
    conv_out: Conv<B>,
}

impl<B: VaeOps> VaeDecoder<B> {
    pub fn load(b: &B, c: &Component, cfg: &VaeConfig) -> Result<Self> {
        // z·sqrt(var + eps) needs var + eps >= 0: a negative running variance would make NaN.
        let (_, var) = c.f32("bn.running_var")?;
        if let Some(i) = var.iter().position(|&v| !(v as f64 + cfg.batch_norm_eps >= 0.0)) {
            anyhow::bail!("vae: `bn.running_var` element {i} is {} (a variance must be at least 0)", var[i]);
        }
        let g = cfg.norm_num_groups;
        let rev: Vec<usize> = cfg.decoder_block_out_channels.iter().rev().copied().collect();
        let top = rev[0];
        let mid = "decoder.mid_block";
        let mut up_blocks = vec![];
        let mut prev = top;
        for (i, &ch) in rev.iter().enumerate() {
            let p = format!("decoder.up_blocks.{i}");
            let resnets = (0..=cfg.layers_per_block)
                .map(|r| Resnet::load(b, c, &format!("{p}.resnets.{r}"), if r == 0 { prev } else { ch }, ch, g))
                .collect::<Result<_>>()?;
            let upsampler =
                if i + 1 < rev.len() { Some(Conv::load(b, c, &format!("{p}.upsamplers.0.conv"))?) } else { None };
            up_blocks.push(UpBlock { resnets, upsampler });
            prev = ch;
        }
        Ok(VaeDecoder {
            cfg: cfg.clone(),
            bn_mean: b.load(c, "bn.running_mean")?,
            bn_var: b.load(c, "bn.running_var")?,
            bn_eps: cfg.batch_norm_eps,
            patch: cfg.patch_size,
            packed_channels: cfg.packed_channels(),
            post_quant_conv: if cfg.use_post_quant_conv { Some(Conv::load(b, c, "post_quant_conv")?) } else { None },
            conv_in: Conv::load(b, c, "decoder.conv_in")?,
            mid_resnets: (0..2)
                .map(|r| Resnet::load(b, c, &format!("{mid}.resnets.{r}"), top, top, g))
                .collect::<Result<_>>()?,
            mid_attention: if cfg.mid_block_add_attention {
                Some(Attention::load(b, c, &format!("{mid}.attentions.0"), g)?)
            } else {
                None
            },
            up_blocks,
            conv_norm_out: GroupNorm::load(b, c, "decoder.conv_norm_out", g)?,
            conv_out: Conv::load(b, c, "decoder.conv_out")?,
        })
    }

    /// The decoder's raw output `[1, 3, 16h, 16w]` (not clamped) for `z` `[1, C, h, w]`
    /// (normalised, packed), resident on the backend.
    pub fn forward(&self, b: &B, z: &B::T) -> Result<B::T> {
        let mut x = self.forward_mid(b, z)?;
        for up in &self.up_blocks {
            for r in &up.resnets {
                x = r.forward(b, &x)?;
            }
            if let Some(u) = &up.upsampler {
                x = u.forward_upsampled(b, &x)?;
            }
        }
        self.conv_norm_out.conv(b, &x, true, &self.conv_out)
    }

    /// Up to the mid block's output (the latent resolution), whole on the backend.
    fn forward_mid(&self, b: &B, z: &B::T) -> Result<B::T> {
        let d = b.dims(z);
        ensure!(
            d.len() == 4 && d[0] == 1 && d[1] == self.packed_channels && d[2] > 0 && d[3] > 0,
            "VAE decode: latents {d:?}, expected [1, {}, h, w]",
            self.packed_channels
        );
        let mut x = b.bn_unpatchify(z, &self.bn_mean, &self.bn_var, self.bn_eps, self.patch)?;
        if let Some(pq) = &self.post_quant_conv {
            x = pq.forward(b, &x)?;
        }
        x = self.conv_in.forward(b, &x)?;
        x = self.mid_resnets[0].forward(b, &x)?;
        if let Some(a) = &self.mid_attention {
            x = a.forward(b, &x)?;
        }
        self.mid_resnets[1].forward(b, &x)
    }

    /// The split decode: the mid block whole, then every layer in row strips, the pictures
    /// between layers kept as `sp` says; the last conv's strips (`[1, 3, r, W]`, on the backend,
    /// not clamped) go to `sink(y0, strip)` in order.
    fn forward_strips(&self, b: &B, z: &B::T, sp: Strips, mut sink: impl FnMut(usize, B::T) -> Result<()>) -> Result<SplitReport> {
        let g = self.conv_norm_out.groups;
        let keep = Keep::new(sp.keep_bytes);
        let mid = self.forward_mid(b, z)?;
        let d = b.dims(&mid);
        let mut x = keep.picture(b, [d[1], d[2], d[3]], g)?;
        x.put(b, 0, d[2], &mid, 0)?;
        drop(mid);
        for up in &self.up_blocks {
            for r in &up.resnets {
                x = r.forward_strips(b, x, sp, &keep)?;
            }
            if let Some(u) = &up.upsampler {
                let [_, h, w] = x.dims;
                let mut o = keep.picture(b, [b.dims(&u.weight)[0], 2 * h, 2 * w], g)?;
                conv_strips(b, &x, None, u, true, sp, |y0, y1, t, skip| o.put(b, y0, y1, &t, skip))?;
                x = o;
            }
        }
        let st = self.conv_norm_out.stats_of(b, &x)?;
        conv_strips(b, &x, Some((&self.conv_norm_out, &st)), &self.conv_out, false, sp, |y0, y1, t, skip| {
            sink(y0, if skip == 0 && b.dims(&t)[2] == y1 - y0 { t } else { b.narrow(&t, 2, skip, y1 - y0)? })
        })?;
        drop(x);
        Ok(keep.report.get())
    }

    /// How to decode latents `[1, C, h, w]` here: the backend's memory plan decides
    /// ([`VaeOps::vae_strip_plan`]: whole when it fits).
    pub fn split_for(&self, b: &B, h: usize, w: usize) -> Result<Split> {
        Ok(match b.vae_strip_plan(&self.cfg, h, w)? {
            Some(p) => Split::strips_keeping(p.rows, p.keep_bytes),
            None => Split::Whole,
        })
    }

    /// Decode `z` `[1, C, h, w]` (normalised, packed) to `[3, 16h, 16w]` clamped to [-1, 1],
    /// split when it does not fit ([`VaeDecoder::split_for`]).
    pub fn decode(&self, b: &B, z: &Tensor) -> Result<Tensor> {
        ensure!(z.shape.len() == 4, "VAE decode: latents {:?}", z.shape);
        self.decode_with(b, z, self.split_for(b, z.shape[2], z.shape[3])?)
    }

    /// [`VaeDecoder::decode`] with the split given.
    pub fn decode_with(&self, b: &B, z: &Tensor, split: Split) -> Result<Tensor> {
        self.with_overflow_fallback(b, || self.decode_once(b, z, split))
    }

    /// `run` (a decode); again with the convolutions on their full-range kernel when one of
    /// them reported an overflow ([`VaeOps::conv_overflow`]; one line on stderr). The flag is read
    /// once, after the decode (which has synchronised to bring its result back anyway).
    fn with_overflow_fallback<T>(&self, b: &B, run: impl Fn() -> Result<T>) -> Result<T> {
        b.conv_overflow()?; // a stale flag (an earlier failed decode) is not this decode's
        let r = run()?;
        if !b.conv_overflow()? {
            return Ok(r);
        }
        eprintln!("moss: VAE decode: an activation past the fp16 range (|x| > 65504) in the fp16-split convolution; decoding again with the TF32 convolution");
        b.set_conv_fallback(true);
        let r = run();
        b.set_conv_fallback(false);
        r
    }

    /// One decode, without the re-run after an fp16 overflow (`moss check`'s planted "flag
    /// ignored" control; the product always decodes through [`Self::decode_with`]).
    pub fn decode_once(&self, b: &B, z: &Tensor, split: Split) -> Result<Tensor> {
        let gz = b.upload_f32(z)?;
        let mut img = match split {
            Split::Whole => b.download(&self.forward(b, &gz)?)?,
            Split::Strips(sp) => {
                let (h, w) = (z.shape[2] * 16, z.shape[3] * 16);
                let mut img = Tensor { shape: vec![1, 3, h, w], data: vec![0f32; 3 * h * w] };
                self.forward_strips(b, &gz, sp, |y0, t| {
                    let s = b.download(&t)?;
                    let r = s.shape[2];
                    ensure!(s.shape == vec![1, 3, r, w] && y0 + r <= h, "VAE decode: strip {:?} at row {y0}", s.shape);
                    for ci in 0..3 {
                        img.data[(ci * h + y0) * w..(ci * h + y0 + r) * w].copy_from_slice(&s.data[ci * r * w..(ci + 1) * r * w]);
                    }
                    Ok(())
                })?;
                img
            }
        };
        img.shape.remove(0);
        img.data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
        Ok(img)
    }

    /// Decode `z` `[1, C, h, w]` to RGB8 pixels, row-major HWC; the clamp and rounding run on the
    /// backend, so only the bytes come back. Split when it does not fit.
    pub fn decode_rgb8(&self, b: &B, z: &Tensor) -> Result<Vec<u8>> {
        ensure!(z.shape.len() == 4, "VAE decode: latents {:?}", z.shape);
        self.decode_rgb8_with(b, z, self.split_for(b, z.shape[2], z.shape[3])?)
    }

    /// [`VaeDecoder::decode_rgb8`] with the split given.
    pub fn decode_rgb8_with(&self, b: &B, z: &Tensor, split: Split) -> Result<Vec<u8>> {
        Ok(self.decode_rgb8_report(b, z, split)?.0)
    }

    /// [`VaeDecoder::decode_rgb8_with`], and for a split decode what it kept where.
    pub fn decode_rgb8_report(&self, b: &B, z: &Tensor, split: Split) -> Result<(Vec<u8>, Option<SplitReport>)> {
        self.with_overflow_fallback(b, || self.decode_rgb8_once(b, z, split))
    }

    fn decode_rgb8_once(&self, b: &B, z: &Tensor, split: Split) -> Result<(Vec<u8>, Option<SplitReport>)> {
        let gz = b.upload_f32(z)?;
        match split {
            Split::Whole => {
                let y = self.forward(b, &gz)?;
                ensure_picture_finite(b, &y)?;
                Ok((b.to_rgb8(&y)?, None))
            }
            Split::Strips(sp) => {
                // HWC rows are contiguous: the strips' bytes, in order, are the picture's.
                let mut rgb = Vec::with_capacity(z.shape[2] * z.shape[3] * 256 * 3);
                let report = self.forward_strips(b, &gz, sp, |_, t| {
                    ensure_picture_finite(b, &t)?;
                    rgb.extend_from_slice(&b.to_rgb8(&t)?);
                    Ok(())
                })?;
                Ok((rgb, Some(report)))
            }
        }
    }
}

/// The decoded picture (or strip) holds only finite values: the 8-bit conversion would turn a
/// NaN into a plausible colour. One download of the f32 picture (12 MB at 1024x1024).
fn ensure_picture_finite<B: VaeOps>(b: &B, y: &B::T) -> Result<()> {
    crate::tensor::ensure_finite("the decoded picture", &b.download(y)?.data)
}

#[cfg(test)]
mod tests {
    use super::input_span;

    /// Every output row of every strip sees, for each 3×3 tap, exactly what it sees in the whole
    /// picture: the same input row where the whole picture has one, zero padding where the whole
    /// picture pads; with and without the folded ×2 upsample, for all small heights and strips.
    /// Without the halo that fails (the planted control of the model's own test, here on the
    /// bookkeeping alone).
    #[test]
    fn input_span_covers_every_tap() {
        let ok = |halo: bool| -> bool {
            for up in [false, true] {
                let f = if up { 2 } else { 1 };
                for h_in in 1..12usize {
                    let oh = f * h_in;
                    for rows in 1..8usize {
                        for y0 in (0..oh).step_by(rows) {
                            let y1 = (y0 + rows).min(oh);
                            let (a, b, off) = input_span(y0, y1, h_in, 3, up, halo);
                            assert!(a < b && b <= h_in && off == y0 - f * a);
                            let u = (b - a) * f as usize; // rows of the strip's (upsampled) input
                            for y in y0..y1 {
                                for ky in 0..3 {
                                    let yy = y as isize + ky - 1; // the whole picture's row
                                    let yl = yy - (f * a) as isize; // the strip's row
                                    let whole = (0..oh as isize).contains(&yy).then(|| yy as usize / f);
                                    let strip = (0..u as isize).contains(&yl).then(|| yl as usize / f + a);
                                    if whole != strip {
                                        return false;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            true
        };
        assert!(ok(true), "a strip reads a different row than the whole picture");
        assert!(!ok(false), "without the halo the check must fail");
    }
}
