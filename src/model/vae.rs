//! The FLUX.2 small VAE decoder (spec section 7): packed latents → picture in [-1, 1].
//!
//! diffusers' `AutoencoderKLFlux2.decode` after the pipeline's glue: undo the BatchNorm and
//! unpatchify ([`VaeOps::bn_unpatchify`]), `post_quant_conv`, then `Decoder`: `conv_in`, the mid
//! block (resnet, single-head attention, resnet), the up blocks (widths
//! `reversed(decoder_block_out_channels)`, `layers_per_block + 1` resnets each, a nearest-×2
//! upsample + 3×3 conv after all but the last), `conv_norm_out` + SiLU, `conv_out`. Names follow
//! the checkpoint (spec 7.3).

use crate::backend::ops::VaeOps;
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
        let h = self.conv1.forward(b, &self.norm1.forward(b, x, true)?)?;
        let h = self.conv2.forward(b, &self.norm2.forward(b, &h, true)?)?;
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
        x = self.mid_resnets[1].forward(b, &x)?;
        for up in &self.up_blocks {
            for r in &up.resnets {
                x = r.forward(b, &x)?;
            }
            if let Some(u) = &up.upsampler {
                x = u.forward_upsampled(b, &x)?;
            }
        }
        self.conv_out.forward(b, &self.conv_norm_out.forward(b, &x, true)?)
    }

    /// Decode `z` `[1, C, h, w]` (normalised, packed) to `[3, 16h, 16w]` clamped to [-1, 1].
    pub fn decode(&self, b: &B, z: &Tensor) -> Result<Tensor> {
        let mut img = b.download(&self.forward(b, &b.upload_f32(z)?)?)?;
        img.shape.remove(0);
        img.data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
        Ok(img)
    }

    /// Decode `z` `[1, C, h, w]` to RGB8 pixels, row-major HWC; the clamp and rounding run on the
    /// backend, so only the bytes come back.
    pub fn decode_rgb8(&self, b: &B, z: &Tensor) -> Result<Vec<u8>> {
        b.to_rgb8(&self.forward(b, &b.upload_f32(z)?)?)
    }
}
