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

use crate::backend::ops::vae::group_norm_combine;
use crate::backend::ops::VaeOps;
use crate::checkpoint::{config::VaeConfig, Component};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

mod encoder;
mod split;
pub use encoder::{pixels_from_rgb8, VaeEncoder};
pub use split::{Split, SplitReport, Strips};

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
    /// Every weight, in one load batch.
    pub fn load(b: &B, c: &Component, cfg: &VaeConfig) -> Result<Self> {
        b.load_batch(|b| Self::load_unbatched(b, c, cfg))
    }

    fn load_unbatched(b: &B, c: &Component, cfg: &VaeConfig) -> Result<Self> {
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
            let upsampler = if i + 1 < rev.len() { Some(Conv::load(b, c, &format!("{p}.upsamplers.0.conv"))?) } else { None };
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
            mid_resnets: (0..2).map(|r| Resnet::load(b, c, &format!("{mid}.resnets.{r}"), top, top, g)).collect::<Result<_>>()?,
            mid_attention: if cfg.mid_block_add_attention { Some(Attention::load(b, c, &format!("{mid}.attentions.0"), g)?) } else { None },
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
        b.run_decode(|| self.decode_rgb8_once(b, z, split))
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
