//! The FLUX.2 VAE encoder (spec 7.4): a picture → the packed, normalised latents the DiT works in.
//!
//! diffusers' `AutoencoderKLFlux2.encode` (`Encoder` + `quant_conv`), then the glue of its Flux2
//! pipelines (`_encode_vae_image`): the latent distribution's mean (no sampling), 2×2 patchify
//! (`c·4 + dy·2 + dx`) and the BatchNorm normalisation `(z − running_mean) / sqrt(running_var +
//! eps)`, the inverse of the decoder's first two steps. `Encoder`: `conv_in` (3×3), the down
//! blocks (widths `block_out_channels`, `layers_per_block` resnets each, the first changing the
//! width through a 1×1 `conv_shortcut`; all but the last end in `Downsample2D`: pad (0, 1, 0, 1),
//! 3×3 stride 2, [`VaeEncodeOps::conv2d_down2`]), the mid block (resnet, single-head attention,
//! resnet), `conv_norm_out` + SiLU, `conv_out` to the mean and log-variance. The layers are the
//! decoder's (`super::{Conv, GroupNorm, Resnet, Attention}`); names follow the checkpoint.
//!
//! **Split encode** ([`Split::Strips`]): an encode that does not fit in free device memory runs
//! `conv_in` and every down block with a downsampler (the full, half and quarter resolutions)
//! in row strips, through the decoder's kept pictures and strip bookkeeping (`super::split`),
//! then the last down block, the mid block and the output layers whole at the latent
//! resolution. A strip of a downsampler reads input rows `2·y0 .. 2·y1 + 1` for its output rows
//! `y0..y1` (the stride-2 conv's halo is the one row below). The result is the unsplit one, bit
//! for bit (tests/vae_encoder.rs).

use super::split::{input_span, Keep, Split, Strips};
use super::{Attention, Conv, GroupNorm, Resnet};
use crate::backend::ops::vae_encode::down2_side;
use crate::backend::ops::VaeEncodeOps;
use crate::checkpoint::{config::VaeConfig, Component};
use crate::tensor::Tensor;
use anyhow::{bail, ensure, Result};

/// `DownEncoderBlock2D`: resnets, then (all but the last block) `downsamplers.0`.
struct DownBlock<B: VaeEncodeOps> {
    resnets: Vec<Resnet<B>>,
    downsampler: Option<Conv<B>>,
}

pub struct VaeEncoder<B: VaeEncodeOps> {
    cfg: VaeConfig,
    /// The BatchNorm's running statistics, on the host: the last step runs there.
    bn_mean: Vec<f32>,
    bn_var: Vec<f32>,
    conv_in: Conv<B>,
    down_blocks: Vec<DownBlock<B>>,
    mid_resnets: Vec<Resnet<B>>,
    mid_attention: Option<Attention<B>>,
    conv_norm_out: GroupNorm<B>,
    conv_out: Conv<B>,
    quant_conv: Option<Conv<B>>,
}

/// A picture's RGB8 pixels (row-major HWC, `width · height · 3` bytes) as the encoder's input
/// `[1, 3, H, W]`, as diffusers' `VaeImageProcessor` makes it: `x/255`, then `2x − 1`, in f32.
pub fn pixels_from_rgb8(rgb: &[u8], width: usize, height: usize) -> Result<Tensor> {
    ensure!(rgb.len() == width * height * 3, "{} bytes for a {width}x{height} RGB picture", rgb.len());
    let hw = width * height;
    let mut data = vec![0f32; 3 * hw];
    for (i, px) in rgb.chunks_exact(3).enumerate() {
        for (c, &v) in px.iter().enumerate() {
            data[c * hw + i] = 2.0 * (v as f32 / 255.0) - 1.0;
        }
    }
    Tensor::new(vec![1, 3, height, width], data)
}

/// Rows `a..e` of a host picture `[1, C, H, W]`.
fn host_rows(t: &Tensor, a: usize, e: usize) -> Result<Tensor> {
    let (c, h, w) = (t.shape[1], t.shape[2], t.shape[3]);
    let mut data = Vec::with_capacity(c * (e - a) * w);
    for ci in 0..c {
        data.extend_from_slice(&t.data[(ci * h + a) * w..(ci * h + e) * w]);
    }
    Tensor::new(vec![1, c, e - a, w], data)
}

impl<B: VaeEncodeOps> VaeEncoder<B> {
    /// Every weight, in one load batch; the tensors are checked against `cfg` first.
    pub fn load(b: &B, c: &Component, cfg: &VaeConfig) -> Result<Self> {
        let g = cfg.norm_num_groups;
        let widths = &cfg.block_out_channels;
        ensure!(!widths.is_empty() && widths.len() <= 16, "vae/config.json: block_out_channels {widths:?} (1..=16 widths)");
        if let Some(w) = widths.iter().find(|&&w| w == 0 || w % g != 0) {
            bail!("vae/config.json: encoder width {w} in block_out_channels {widths:?} is not a multiple of norm_num_groups {g}");
        }
        ensure!(cfg.in_channels == 3, "vae/config.json: in_channels {} (only RGB pictures are encoded)", cfg.in_channels);
        ensure!(cfg.layers_per_block >= 1, "vae/config.json: layers_per_block 0 (the encoder needs a resnet a block)");
        if !cfg.down_block_types.is_empty() && (cfg.down_block_types.len() != widths.len() || cfg.down_block_types.iter().any(|t| t != "DownEncoderBlock2D")) {
            bail!("vae/config.json: down_block_types {:?} (expected {} x \"DownEncoderBlock2D\", one per width)", cfg.down_block_types, widths.len());
        }
        c.validate(&crate::checkpoint::expected::vae_encoder(cfg)).map_err(|e| e.context("the VAE encoder (for pictures in) cannot load"))?;
        let (_, bn_mean) = c.f32("bn.running_mean")?;
        let (_, bn_var) = c.f32("bn.running_var")?;
        let packed = cfg.packed_channels();
        ensure!(bn_mean.len() == packed && bn_var.len() == packed, "vae: BatchNorm statistics for {} channels, expected {packed}", bn_mean.len());
        if let Some(i) = bn_var.iter().position(|&v| !(v as f64 + cfg.batch_norm_eps > 0.0)) {
            bail!("vae: `bn.running_var` element {i} is {} (the encoder divides by sqrt(var + eps))", bn_var[i]);
        }
        b.load_batch(|b| {
            let mut down_blocks = vec![];
            let mut prev = widths[0];
            for (i, &ch) in widths.iter().enumerate() {
                let p = format!("encoder.down_blocks.{i}");
                let resnets = (0..cfg.layers_per_block)
                    .map(|r| Resnet::load(b, c, &format!("{p}.resnets.{r}"), if r == 0 { prev } else { ch }, ch, g))
                    .collect::<Result<_>>()?;
                let downsampler = if i + 1 < widths.len() { Some(Conv::load(b, c, &format!("{p}.downsamplers.0.conv"))?) } else { None };
                down_blocks.push(DownBlock { resnets, downsampler });
                prev = ch;
            }
            let mid = "encoder.mid_block";
            Ok(VaeEncoder {
                cfg: cfg.clone(),
                bn_mean,
                bn_var,
                conv_in: Conv::load(b, c, "encoder.conv_in")?,
                down_blocks,
                mid_resnets: (0..2).map(|r| Resnet::load(b, c, &format!("{mid}.resnets.{r}"), prev, prev, g)).collect::<Result<_>>()?,
                mid_attention: if cfg.mid_block_add_attention { Some(Attention::load(b, c, &format!("{mid}.attentions.0"), g)?) } else { None },
                conv_norm_out: GroupNorm::load(b, c, "encoder.conv_norm_out", g)?,
                conv_out: Conv::load(b, c, "encoder.conv_out")?,
                quant_conv: if cfg.use_quant_conv { Some(Conv::load(b, c, "quant_conv")?) } else { None },
            })
        })
    }

    /// The side a picture's width and height must be multiples of: the downsamplers halve it
    /// `blocks − 1` times, the patchify halves it once more (16 for FLUX.2).
    pub fn multiple(&self) -> [usize; 2] {
        let down = 1 << (self.down_blocks.len() - 1);
        [down * self.cfg.patch_size[0], down * self.cfg.patch_size[1]]
    }

    fn check_pixels(&self, x: &Tensor) -> Result<(usize, usize)> {
        let d = &x.shape;
        ensure!(d.len() == 4 && d[0] == 1 && d[1] == self.cfg.in_channels, "VAE encode: picture {d:?}, expected [1, 3, H, W]");
        let [mh, mw] = self.multiple();
        ensure!(
            d[2] > 0 && d[3] > 0 && d[2].is_multiple_of(mh) && d[3].is_multiple_of(mw),
            "VAE encode: a {}x{} picture; width and height must be positive multiples of {mw} and {mh}",
            d[3],
            d[2]
        );
        Ok((d[2], d[3]))
    }

    /// The encoder and `quant_conv`, whole: `x [1, 3, H, W]` → the moments `[1, 2·C, H/8, W/8]`
    /// (mean, then log-variance), on the backend.
    pub fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        let mut h = self.conv_in.forward(b, x)?;
        let last = self.down_blocks.len() - 1;
        for blk in &self.down_blocks[..last] {
            h = blk.forward(b, &h)?;
        }
        self.forward_tail(b, &h)
    }

    /// From the last down block on (the latent resolution), whole on the backend.
    fn forward_tail(&self, b: &B, x: &B::T) -> Result<B::T> {
        let mut x = self.down_blocks[self.down_blocks.len() - 1].forward(b, x)?;
        x = self.mid_resnets[0].forward(b, &x)?;
        if let Some(a) = &self.mid_attention {
            x = a.forward(b, &x)?;
        }
        x = self.mid_resnets[1].forward(b, &x)?;
        x = self.conv_norm_out.conv(b, &x, true, &self.conv_out)?;
        match &self.quant_conv {
            Some(q) => q.forward(b, &x),
            None => Ok(x),
        }
    }

    /// The split encode: `conv_in` and the down blocks with a downsampler in row strips (the
    /// picture read from the host strip by strip), the rest whole ([`Self::forward_tail`]).
    fn forward_strips(&self, b: &B, x: &Tensor, sp: Strips) -> Result<B::T> {
        let g = self.conv_norm_out.groups;
        let keep = Keep::new(sp.keep_bytes);
        let (hh, ww) = (x.shape[2], x.shape[3]);
        let c0 = b.dims(&self.conv_in.weight)[0];
        let mut pic = keep.picture(b, [c0, hh, ww], g)?;
        for y0 in (0..hh).step_by(sp.rows) {
            let y1 = (y0 + sp.rows).min(hh);
            let (a, e, skip) = input_span(y0, y1, hh, 3, false, !sp.no_halo);
            let o = self.conv_in.forward(b, &b.upload_f32(&host_rows(x, a, e)?)?)?;
            pic.put(b, y0, y1, &o, skip)?;
        }
        let last = self.down_blocks.len() - 1;
        for blk in &self.down_blocks[..last] {
            for r in &blk.resnets {
                pic = r.forward_strips(b, pic, sp, &keep)?;
            }
            let Some(d) = &blk.downsampler else { bail!("VAE encode: down block without a downsampler before the last") };
            let [_, h, w] = pic.dims;
            let oh = down2_side(h);
            let mut out = keep.picture(b, [b.dims(&d.weight)[0], oh, down2_side(w)], g)?;
            // Output rows y0..y1 read input rows 2·y0 ..= 2·y1 (the last one the halo).
            let span = |y0: usize, y1: usize| (2 * y0, if sp.no_halo { 2 * y1 } else { (2 * y1 + 1).min(h) });
            for y0 in (0..oh).step_by(sp.rows) {
                let y1 = (y0 + sp.rows).min(oh);
                let next = (y1 < oh).then(|| span(y1, (y1 + sp.rows).min(oh)));
                let (a, e) = span(y0, y1);
                let t = b.conv2d_down2(&pic.rows(b, a, e, next)?, &d.weight, &d.bias)?;
                out.put(b, y0, y1, &t, 0)?;
            }
            pic = out;
        }
        let h = pic.dims[1];
        let t = pic.rows(b, 0, h, None)?;
        drop(pic);
        self.forward_tail(b, &t)
    }

    /// The moments `[1, 2·C, h8, w8]` → the DiT's latents `[1, C·ph·pw, h8/ph, w8/pw]`: the mean
    /// (the first `C` channels), patchified (`k = c·ph·pw + dy·pw + dx` from pixel
    /// `(ph·y + dy, pw·x + dx)`) and normalised, `(z − mean[k]) / sqrt(var[k] + eps)` in f32 as
    /// torch computes it.
    pub fn latents_of(&self, moments: &Tensor) -> Result<Tensor> {
        let lc = self.cfg.latent_channels;
        let [ph, pw] = self.cfg.patch_size;
        let d = &moments.shape;
        ensure!(d.len() == 4 && d[0] == 1 && d[1] == 2 * lc && d[2].is_multiple_of(ph) && d[3].is_multiple_of(pw), "VAE encode: moments {d:?}");
        let (h8, w8) = (d[2], d[3]);
        let (h, w) = (h8 / ph, w8 / pw);
        let pp = ph * pw;
        let mut out = vec![0f32; lc * pp * h * w];
        for k in 0..lc * pp {
            let (c, dy, dx) = (k / pp, (k % pp) / pw, k % pw);
            let std = (self.bn_var[k] + self.cfg.batch_norm_eps as f32).sqrt();
            let mean = self.bn_mean[k];
            let src = &moments.data[c * h8 * w8..(c + 1) * h8 * w8];
            for y in 0..h {
                for x in 0..w {
                    out[(k * h + y) * w + x] = (src[(ph * y + dy) * w8 + pw * x + dx] - mean) / std;
                }
            }
        }
        let z = Tensor::new(vec![1, lc * pp, h, w], out)?;
        crate::tensor::ensure_finite("the encoded latents", &z.data)?;
        Ok(z)
    }

    /// How to encode an `width`×`height` picture here: the backend's memory plan decides
    /// ([`VaeEncodeOps::vae_encode_strip_plan`]: whole when it fits).
    pub fn split_for(&self, b: &B, height: usize, width: usize) -> Result<Split> {
        Ok(match b.vae_encode_strip_plan(&self.cfg, height, width)? {
            Some(p) => Split::strips_keeping(p.rows, p.keep_bytes),
            None => Split::Whole,
        })
    }

    /// Encode `pixels` `[1, 3, H, W]` (in [−1, 1], [`pixels_from_rgb8`]) to the latents
    /// `[1, C·4, H/16, W/16]`, split when it does not fit ([`Self::split_for`]).
    pub fn encode(&self, b: &B, pixels: &Tensor) -> Result<Tensor> {
        let (h, w) = self.check_pixels(pixels)?;
        self.encode_with(b, pixels, self.split_for(b, h, w)?)
    }

    /// [`Self::encode`] with the split given. Runs through [`crate::backend::ops::VaeOps::run_decode`]:
    /// on CUDA, an activation past the fp16 convolution's range encodes again on the TF32 one.
    pub fn encode_with(&self, b: &B, pixels: &Tensor, split: Split) -> Result<Tensor> {
        self.check_pixels(pixels)?;
        b.run_decode(|| self.encode_once(b, pixels, split))
    }

    /// The moments of one encode, outside `run_decode`.
    pub fn moments_once(&self, b: &B, pixels: &Tensor, split: Split) -> Result<Tensor> {
        self.check_pixels(pixels)?;
        let m = match split {
            Split::Whole => self.forward(b, &b.upload_f32(pixels)?)?,
            Split::Strips(sp) => self.forward_strips(b, pixels, sp)?,
        };
        b.download(&m)
    }

    fn encode_once(&self, b: &B, pixels: &Tensor, split: Split) -> Result<Tensor> {
        self.latents_of(&self.moments_once(b, pixels, split)?)
    }
}

impl<B: VaeEncodeOps> DownBlock<B> {
    fn forward(&self, b: &B, x: &B::T) -> Result<B::T> {
        let mut h = self.resnets[0].forward(b, x)?;
        for r in &self.resnets[1..] {
            h = r.forward(b, &h)?;
        }
        match &self.downsampler {
            Some(d) => b.conv2d_down2(&h, &d.weight, &d.bias),
            None => Ok(h),
        }
    }
}
