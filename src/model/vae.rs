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
//! attention) whole on the backend, then every later layer in row strips: the layer's full input
//! lives in host memory, each conv gets its output rows' input rows plus the halo (`k/2` rows;
//! through the folded upsample, the low-resolution rows those need), computes them on the
//! backend and the strip's valid rows come back. A conv's output pixel does not depend on the
//! strip (same inputs, same summation order), and the GroupNorm statistics are gathered as
//! per-row partials ([`VaeOps::group_norm_row_stats`]) combined in a fixed order, so the picture
//! is the unsplit one, bit for bit (tests/vae.rs checks it).

use crate::backend::ops::VaeOps;
use crate::backend::ops::vae::group_norm_combine;
use crate::checkpoint::{config::VaeConfig, Component};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

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
    /// The (mean, variance) per group of a host picture, from the row partials gathered when it
    /// was made ([`HostAct`]): the same partials, combined the same way, as
    /// [`VaeOps::group_norm`] over the whole picture.
    fn stats_of(&self, x: &HostAct) -> Result<Vec<f64>> {
        let (c, h, w) = (x.t.shape[1], x.t.shape[2], x.t.shape[3]);
        ensure!(x.groups == self.groups && x.part.len() == self.groups * h * 2, "VAE split: row partials for {} groups, wanted {}", x.groups, self.groups);
        Ok(group_norm_combine(&x.part, self.groups, h, c / self.groups * w))
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
    /// [`Resnet::forward`] in row strips, `x` and the result in host memory.
    fn forward_strips(&self, b: &B, x: &HostAct, sp: Strips) -> Result<HostAct> {
        let st1 = self.norm1.stats_of(x)?;
        let h = conv_strips_host(b, &x.t, Some((&self.norm1, &st1)), &self.conv1, false, sp, x.groups, |_, _, t| Ok(t))?;
        let st2 = self.norm2.stats_of(&h)?;
        conv_strips_host(b, &h.t, Some((&self.norm2, &st2)), &self.conv2, false, sp, x.groups, |y0, y1, t| {
            let xs = b.upload_rows(&x.t, y0, y1)?;
            match &self.conv_shortcut {
                Some(s) => b.add(&s.forward(b, &xs)?, &t),
                None => b.add(&xs, &t),
            }
        })
    }
}

/// A picture `[1, C, H, W]` in host memory with the GroupNorm row partials of its rows
/// ([`VaeOps::group_norm_row_stats`] for `groups` groups, `[groups, H, 2]`), taken on the
/// backend from each strip as it was made (the same bits as over the whole picture).
struct HostAct {
    t: Tensor,
    part: Vec<f64>,
    groups: usize,
}

impl HostAct {
    /// Download a whole backend picture, with its row partials.
    fn download<B: VaeOps>(b: &B, x: &B::T, groups: usize) -> Result<HostAct> {
        Ok(HostAct { part: b.group_norm_row_stats(x, groups)?, t: b.download(x)?, groups })
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

/// Row strips: `rows` output rows of each layer (at its own resolution) per strip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strips {
    pub rows: usize,
    /// Planted for the tests' control: strips get no halo rows (each strip's edges then see the
    /// conv's zero padding instead of their neighbours). Never set outside tests.
    pub no_halo: bool,
}

impl Split {
    /// Strips of `rows` rows (at least 1), with the halo.
    pub fn strips(rows: usize) -> Split {
        Split::Strips(Strips { rows: rows.max(1), no_halo: false })
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

/// One conv (optionally after a GroupNorm + SiLU with given statistics) over the host picture
/// `x` in row strips; `post(y0, y1, strip)` gets each strip's valid output rows `y0..y1` on the
/// backend and returns what is kept; `sink` takes it.
#[allow(clippy::too_many_arguments)]
fn conv_strips<B: VaeOps>(
    b: &B,
    x: &Tensor,
    norm: Option<(&GroupNorm<B>, &[f64])>,
    conv: &Conv<B>,
    up: bool,
    sp: Strips,
    mut post: impl FnMut(usize, usize, B::T) -> Result<B::T>,
    mut sink: impl FnMut(usize, usize, B::T) -> Result<()>,
) -> Result<()> {
    let h_in = x.shape[2];
    let k = b.dims(&conv.weight)[2];
    let oh = if up { 2 * h_in } else { h_in };
    for y0 in (0..oh).step_by(sp.rows) {
        let y1 = (y0 + sp.rows).min(oh);
        let (a, e, off) = input_span(y0, y1, h_in, k, up, !sp.no_halo);
        let xs = b.upload_rows(x, a, e)?;
        let o = match norm {
            Some((n, st)) => n.conv_with(b, &xs, st, true, conv, up)?,
            None => conv.conv(b, &xs, up)?,
        };
        drop(xs);
        let o = if off == 0 && b.dims(&o)[2] == y1 - y0 { o } else { b.narrow(&o, 2, off, y1 - y0)? };
        sink(y0, y1, post(y0, y1, o)?)?;
    }
    Ok(())
}

/// [`conv_strips`] into a new host picture, with the row partials for `groups` groups of
/// every strip taken on the backend before it comes back.
#[allow(clippy::too_many_arguments)]
fn conv_strips_host<B: VaeOps>(
    b: &B,
    x: &Tensor,
    norm: Option<(&GroupNorm<B>, &[f64])>,
    conv: &Conv<B>,
    up: bool,
    sp: Strips,
    groups: usize,
    post: impl FnMut(usize, usize, B::T) -> Result<B::T>,
) -> Result<HostAct> {
    let (h, w) = if up { (2 * x.shape[2], 2 * x.shape[3]) } else { (x.shape[2], x.shape[3]) };
    let cout = b.dims(&conv.weight)[0];
    let mut out = Tensor { shape: vec![1, cout, h, w], data: vec![0f32; cout * h * w] };
    let mut part = vec![0f64; groups * h * 2];
    conv_strips(b, x, norm, conv, up, sp, post, |y0, y1, t| {
        let s = b.group_norm_row_stats(&t, groups)?;
        for gi in 0..groups {
            part[(gi * h + y0) * 2..(gi * h + y1) * 2].copy_from_slice(&s[gi * (y1 - y0) * 2..(gi + 1) * (y1 - y0) * 2]);
        }
        b.download_rows(&t, &mut out, y0)
    })?;
    Ok(HostAct { t: out, part, groups })
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

    /// The split decode: the mid block whole, then every layer in row strips with the
    /// activations in host memory; the last conv's strips (`[1, 3, r, W]`, on the backend, not
    /// clamped) go to `sink(y0, strip)` in order.
    fn forward_strips(&self, b: &B, z: &B::T, sp: Strips, mut sink: impl FnMut(usize, B::T) -> Result<()>) -> Result<()> {
        let g = self.conv_norm_out.groups;
        let mut x = HostAct::download(b, &self.forward_mid(b, z)?, g)?;
        for up in &self.up_blocks {
            for r in &up.resnets {
                x = r.forward_strips(b, &x, sp)?;
            }
            if let Some(u) = &up.upsampler {
                x = conv_strips_host(b, &x.t, None, u, true, sp, g, |_, _, t| Ok(t))?;
            }
        }
        let st = self.conv_norm_out.stats_of(&x)?;
        conv_strips(b, &x.t, Some((&self.conv_norm_out, &st)), &self.conv_out, false, sp, |_, _, t| Ok(t), |y0, _, t| sink(y0, t))
    }

    /// How to decode latents `[1, C, h, w]` here: the backend's memory plan decides
    /// ([`VaeOps::vae_strip_rows`]: whole when it fits).
    pub fn split_for(&self, b: &B, h: usize, w: usize) -> Result<Split> {
        Ok(match b.vae_strip_rows(&self.cfg, h, w)? {
            Some(rows) => Split::strips(rows),
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
        b.run_decode(|| self.decode_once(b, z, split))
    }

    /// One decode, outside [`VaeOps::run_decode`] (`moss check`'s planted "overflow ignored"
    /// control; the product always decodes through [`Self::decode_with`]).
    pub fn decode_once(&self, b: &B, z: &Tensor, split: Split) -> Result<Tensor> {
        let gz = b.upload_f32(z)?;
        let mut img = match split {
            Split::Whole => b.download(&self.forward(b, &gz)?)?,
            Split::Strips(sp) => {
                let (h, w) = (z.shape[2] * 16, z.shape[3] * 16);
                let mut img = Tensor { shape: vec![1, 3, h, w], data: vec![0f32; 3 * h * w] };
                self.forward_strips(b, &gz, sp, |y0, t| b.download_rows(&t, &mut img, y0))?;
                ensure!(img.shape == vec![1, 3, h, w], "VAE decode: picture {:?}", img.shape);
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
        b.run_decode(|| self.decode_rgb8_once(b, z, split))
    }

    fn decode_rgb8_once(&self, b: &B, z: &Tensor, split: Split) -> Result<Vec<u8>> {
        let gz = b.upload_f32(z)?;
        match split {
            Split::Whole => {
                let y = self.forward(b, &gz)?;
                ensure_picture_finite(b, &y)?;
                b.to_rgb8(&y)
            }
            Split::Strips(sp) => {
                // HWC rows are contiguous: the strips' bytes, in order, are the picture's.
                let mut rgb = Vec::with_capacity(z.shape[2] * z.shape[3] * 256 * 3);
                self.forward_strips(b, &gz, sp, |_, t| {
                    ensure_picture_finite(b, &t)?;
                    rgb.extend_from_slice(&b.to_rgb8(&t)?);
                    Ok(())
                })?;
                Ok(rgb)
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
