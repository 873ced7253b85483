//! The VAE encoder's op beyond the decoder's on CUDA (math on
//! [`moss_core::backend::ops::VaeEncodeOps`]), and its memory plan ([`super::encode_plan`]).
//!
//! `conv2d_down2` (diffusers' `Downsample2D`: pad (0, 1, 0, 1), 3×3 stride 2) is the "same" 3×3
//! conv read at the odd pixels: the decoder's conv kernels (split fp16 by default, its overflow
//! flag and TF32 re-run included) compute the stride-1 output, `moss_vae_pick_odd`
//! (cuda/vae/encode.cu) keeps every second row and column. Four times the downsampler's
//! multiply-adds (about 16% of a FLUX.2 encode's) and one full-resolution picture more, for no
//! new convolution kernel.

use super::encode_plan::{encode_activation_bytes, encode_split_least_bytes, encode_strip_plan_for};
use crate::kernels;
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::ops::vae_encode::down2_side;
use moss_core::backend::ops::VaeEncodeOps;
use moss_core::checkpoint::config::VaeConfig;

impl Cuda {
    /// `out[p, y, x] = x[p, 2y + 1, 2x + 1]` over the planes of `x [N, C, H, W]` (f32)
    /// ([`kernels::VAE_PICK_ODD`]).
    pub(crate) fn pick_odd(&self, x: &CudaTensor) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 4, "pick_odd: expected [N, C, H, W], got {:?}", x.shape);
        let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        ensure!(h >= 2 && w >= 2 && h < i32::MAX as usize && w < i32::MAX as usize, "pick_odd: picture {:?}", x.shape);
        let x = self.f32(x)?;
        let out = self.alloc(DType::F32, &[n, c, down2_side(h), down2_side(w)])?;
        kernels::VAE_PICK_ODD.launch(self, (self.grid_for(out.numel()), 256, 0), &out, &x, (n * c) as i64, h as i32, w as i32)?;
        Ok(out)
    }

    /// [`VaeEncodeOps::conv2d_down2`]: the "same" conv on the decoder's current conv kernel, then
    /// the odd pixels.
    pub(crate) fn conv2d_down2_op(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 4 && w.shape.len() == 4, "conv2d_down2: input {:?}, weight {:?}", x.shape, w.shape);
        ensure!(w.shape[1] == x.shape[1] && w.shape[2] == 3 && w.shape[3] == 3, "conv2d_down2: weight {:?} for input {:?} (3x3 only)", w.shape, x.shape);
        ensure!(x.shape[2] >= 2 && x.shape[3] >= 2, "conv2d_down2: picture {:?} (at least 2x2)", x.shape);
        let same = self.conv2d_on(x, w, b, false, self.conv_kernel())?;
        self.pick_odd(&same)
    }
}

impl VaeEncodeOps for Cuda {
    fn conv2d_down2(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.timed(|| format!("down conv {}->{} at {}x{}", w.shape[1], w.shape[0], x.shape[2], x.shape[3]), || self.conv2d_down2_op(x, w, b))
    }

    fn plan_vae_encode(&self, c: &moss_core::checkpoint::Component, cfg: &VaeConfig, height: usize, width: usize) -> Result<()> {
        // Whole if it fits, else the smallest useful split must.
        let least = encode_activation_bytes(cfg, height, width).min(encode_split_least_bytes(cfg, height, width));
        let plan = crate::plan::MemoryPlan::component(c, moss_core::options::Precision::Fp32).activations(least);
        plan.check(self.gpu()).map_err(|e| e.context(format!("the VAE encode of a {width}x{height} picture does not fit, even in row strips")))
    }

    fn vae_encode_strip_plan(&self, cfg: &VaeConfig, height: usize, width: usize) -> Result<Option<moss_core::backend::ops::vae::StripPlan>> {
        // Free memory less the reserve, and no more than the run's plan leaves the VAE.
        let limit = self.vae_limit().unwrap_or(u64::MAX).min(usize::MAX as u64) as usize;
        let avail = |cuda: &Cuda| -> Result<usize> { Ok(cuda.gpu().mem_info()?.0.saturating_sub(crate::plan::RESERVE_BYTES).min(limit)) };
        if encode_activation_bytes(cfg, height, width) <= avail(self)? {
            return Ok(None);
        }
        self.trim_pool()?;
        encode_strip_plan_for(cfg, height, width, avail(self)?)
    }
}
