//! The VAE decoder's convolutions: the split-fp16 kernel (cuda/vae/conv_fp16.cu, the default),
//! the split-TF32 halo kernel (cuda/vae/conv_tf32.cu, the fp16 overflow re-run), the split-TF32
//! tap-major and generic kernels and the f64 small-Cout kernel (cuda/vae/vae_ops.cu) where the
//! others do not take the shape or their shared memory does not fit.

use super::dims4;
use crate::kernels::{self, Dev, Elem, Family};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::Backend;

use crate::launch::{VAE_CONV16_SMEM, VAE_CONV_BM, VAE_CONV_BN, VAE_CONV_THREADS, VAE_HALO_SMEM, VAE_HALO_THREADS};

/// The implicit-GEMM conv kernels' output tile (channels × pixels), cuda/vae/launch.h.
pub(super) const CONV_BM: usize = VAE_CONV_BM;
pub(super) const CONV_BN: usize = VAE_CONV_BN;

/// Which convolution kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvKernel {
    /// Split TF32, any k and Cin (the last fallback).
    Tf32x3,
    /// Split TF32 with the weight re-laid out tap-major (`[Cout, k, k, Cin]`), so one k-step
    /// gathers one tap: for Cin a multiple of 16 and k 1 or 3 (else `Tf32x3`); where the fp16 or
    /// halo kernel's shared memory does not fit.
    Tf32x3Tap,
    /// The decoder's re-run after an fp16 overflow (cuda/vae/conv_tf32.cu): Cout <= 4 (conv_out) →
    /// the f64 SIMT kernel (`moss_vae_conv_small`); k 1 or 3 with Cin % 8 == 0 → the split-TF32
    /// halo kernel (weights pre-split and in fragment order, 8-channel input halos, cp.async);
    /// else `Tf32x3Tap`.
    Halo,
    /// The default: cuda/vae/conv_fp16.cu, split fp16 on m16n8k16 (weights scaled by a power of two
    /// per output channel, lo parts times 2^11, hi·hi in a fresh tile a k-step, the small terms
    /// in one running tile); Cout <= 4 → the f64 SIMT kernel; k not 1 or 3 → `Tf32x3Tap`. An
    /// activation past the fp16 range sets the overflow flag (the decoder decodes again on `Halo`).
    F16,
}

/// The convolution kernels by their parameter lists: the builds for an output-channel block and
/// kernel size (`_b{BM}_k{k}` for the halo and fp16 kernels, `_k1` / `_k3` for the implicit
/// GEMMs) are families of one type each.
pub(crate) type HaloConv = Family<fn(Dev, Dev, Dev, Dev, i32, i32, i32, i32, i32, i32, Dev, i32)>;
pub(crate) type F16Conv = Family<fn(Dev, Dev, Dev, Dev, Dev, i32, i32, i32, i32, i32, Dev)>;
pub(crate) type GemmConv = Family<fn(Dev, Dev, Dev, Dev, i32, i32, i32, i32, i32, i32)>;
/// The weight preps of the fp16 and the halo kernels.
pub(crate) type F16Prep = Family<fn(Dev, Dev, Dev, i32, i32)>;
type HaloPrep = Family<fn(Dev, Dev, i32, i32)>;

/// The halo kernel's build for `bm` output channels a block and `k`×`k` taps.
pub(crate) fn halo_kernel(bm: usize, k: usize) -> Result<&'static HaloConv> {
    Ok(match (bm, k) {
        (96, 1) => &kernels::VAE_CONV_HALO_B96_K1,
        (96, 3) => &kernels::VAE_CONV_HALO_B96_K3,
        (128, 1) => &kernels::VAE_CONV_HALO_B128_K1,
        (128, 3) => &kernels::VAE_CONV_HALO_B128_K3,
        _ => anyhow::bail!("no halo conv build for {bm} channels, {k}x{k}"),
    })
}

/// The fp16 kernel's build and its weight prep's, as [`halo_kernel`].
pub(crate) fn f16_kernel(bm: usize, k: usize) -> Result<(&'static F16Prep, &'static F16Conv)> {
    Ok(match (bm, k) {
        (96, 1) => (&kernels::VAE_WPREP16_B96_K1, &kernels::VAE_CONV16_B96_K1),
        (96, 3) => (&kernels::VAE_WPREP16_B96_K3, &kernels::VAE_CONV16_B96_K3),
        (128, 1) => (&kernels::VAE_WPREP16_B128_K1, &kernels::VAE_CONV16_B128_K1),
        (128, 3) => (&kernels::VAE_WPREP16_B128_K3, &kernels::VAE_CONV16_B128_K3),
        _ => anyhow::bail!("no fp16 conv build for {bm} channels, {k}x{k}"),
    })
}

/// The halo kernel's weight prep for its build.
fn halo_prep(bm: usize, k: usize) -> Result<&'static HaloPrep> {
    Ok(match (bm, k) {
        (96, 1) => &kernels::VAE_WPREP_B96_K1,
        (96, 3) => &kernels::VAE_WPREP_B96_K3,
        (128, 1) => &kernels::VAE_WPREP_B128_K1,
        (128, 3) => &kernels::VAE_WPREP_B128_K3,
        _ => anyhow::bail!("no halo conv build for {bm} channels, {k}x{k}"),
    })
}

/// The split-TF32 implicit GEMM for `k`×`k` taps: the generic kernel (its 1x1 and 3x3 builds
/// with the size a compile-time constant), or the tap-major one (k 1 or 3).
pub(crate) fn gemm_kernel(tap_major: bool, k: usize) -> Result<&'static GemmConv> {
    Ok(match (tap_major, k) {
        (false, 1) => &kernels::VAE_CONV_TF32X3_K1,
        (false, 3) => &kernels::VAE_CONV_TF32X3_K3,
        (false, _) => &kernels::VAE_CONV_TF32X3,
        (true, 1) => &kernels::VAE_CONV_TF32X3T_K1,
        (true, 3) => &kernels::VAE_CONV_TF32X3T_K3,
        (true, _) => anyhow::bail!("the tap-major conv takes 1x1 and 3x3 kernels, not {k}x{k}"),
    })
}

/// The halo and fp16 kernels' output tile in pixels (rows × columns), cuda/vae/launch.h.
pub(super) const HALO_TH: usize = crate::launch::VAE_HALO_TH;
pub(super) const HALO_TW: usize = crate::launch::VAE_HALO_TW;

/// The halo kernel's output-channel block: 96 or 128, whichever pads Cout less (ties: 128).
pub(crate) fn halo_bm(cout: usize) -> usize {
    let pad = |bm: usize| cout.div_ceil(bm) * bm - cout;
    if pad(96) < pad(128) {
        96
    } else {
        128
    }
}

/// The halo kernel's dynamic shared memory in bytes (`VAE_HALO_SMEM`): two weight stages (hi
/// and lo) and two halo buffers (hi and lo).
pub(crate) fn halo_smem_bytes(bm: usize, k: usize) -> usize {
    VAE_HALO_SMEM(bm, k)
}

/// The fp16 kernel's (`VAE_CONV16_SMEM`): two weight stages (BM/16 fragments x hi/lo x 512
/// bytes a tap) and two halo stages (hi/lo x two channel halves x pixels x 16 bytes).
pub(crate) fn f16_smem_bytes(bm: usize, k: usize) -> usize {
    VAE_CONV16_SMEM(bm, k)
}

impl Cuda {
    /// `conv2d` on `kernel` (and its fallbacks for shapes it does not take).
    pub(crate) fn conv2d_on(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, upsample2x: bool, kernel: ConvKernel) -> Result<CudaTensor> {
        let (_, cin, h, wd) = dims4(x, "conv2d input")?;
        let (cout, wcin, k, k2) = dims4(w, "conv2d weight")?;
        ensure!(wcin == cin, "conv2d: weight {:?} for {cin} input channels", w.shape);
        ensure!(k == k2 && k % 2 == 1, "conv2d: kernel {k}x{k2} (odd square kernels only)");
        ensure!(b.numel() == cout, "conv2d: bias {:?} for {cout} outputs", b.shape);
        ensure!(h > 0 && wd > 0, "conv2d: empty picture {:?}", x.shape);
        let (x, w, b) = (self.f32(x)?, self.f32(w)?, self.f32(b)?);
        let small = cout <= 4 && k <= 3;
        let halo = (k == 1 || k == 3) && cin % 8 == 0 && self.halo_fits(halo_bm(cout), k);
        let f16 = (k == 1 || k == 3) && self.halo_fits_bytes(f16_smem_bytes(halo_bm(cout), k));
        match kernel {
            ConvKernel::Halo | ConvKernel::F16 if small => return self.conv2d_small(&x, &w, &b, upsample2x),
            ConvKernel::Halo if halo => return self.conv2d_halo(&x, &w, Some(&b), upsample2x, false),
            ConvKernel::F16 if f16 => return self.conv2d_f16(&x, &w, Some(&b), upsample2x),
            _ => {}
        }
        let tap = kernel != ConvKernel::Tf32x3 && cin % 16 == 0 && (k == 1 || k == 3);
        self.conv2d_gemm(tap, &x, &w, &b, upsample2x)
    }

    /// The split-TF32 implicit GEMM ([`gemm_kernel`]) on f32 `x`, `w`, `b` of a checked shape;
    /// `tap_major`: the weight re-laid out `[Cout, k, k, Cin]` first (the tap-major kernel, Cin a
    /// multiple of 16, k 1 or 3).
    pub(crate) fn conv2d_gemm(&self, tap_major: bool, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, upsample2x: bool) -> Result<CudaTensor> {
        let (n, cin, h, wd) = dims4(x, "conv2d input")?;
        let (cout, _, k, _) = dims4(w, "conv2d weight")?;
        let w = if tap_major && k > 1 { self.permute(w, &[0, 2, 3, 1])? } else { w.clone() };
        let (oh, ow) = if upsample2x { (2 * h, 2 * wd) } else { (h, wd) };
        ensure!((oh * ow) < i32::MAX as usize && cin * k * k < i32::MAX as usize, "conv2d: picture too large");
        let out = self.alloc(DType::F32, &[n, cout, oh, ow])?;
        let blocks = n * cout.div_ceil(CONV_BM) * (oh * ow).div_ceil(CONV_BN);
        ensure!(blocks < i32::MAX as usize, "conv2d: {blocks} blocks");
        let [cin, h, wd, cout, k] = [cin, h, wd, cout, k].map(|v| v as i32);
        gemm_kernel(tap_major, k as usize)?.launch(
            self,
            (blocks as u32, VAE_CONV_THREADS as u32, 0),
            &out,
            x,
            &w,
            b,
            cin,
            h,
            wd,
            cout,
            k,
            upsample2x as i32,
        )?;
        Ok(out)
    }

    /// Whether the halo kernel's shared memory fits this GPU (171 KB for 128 channels, 3x3: an
    /// H100/H200 has 227 KB, an A100 163 KB, sm_86/89/120 99 KB; else the tap-major kernel runs).
    pub(crate) fn halo_fits(&self, bm: usize, k: usize) -> bool {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
        self.gpu().ctx.attribute(OPTIN).map(|v| v as usize >= halo_smem_bytes(bm, k)).unwrap_or(false)
    }

    /// The split-TF32 halo conv (k 1 or 3, Cin % 8 == 0): the weight split into hi/lo and put
    /// in fragment order (`moss_vae_wprep_*`, a pass over the weight), then one launch of the
    /// kernel ([`halo_kernel`]). `ksplit`: split-K over the images: the weight has `n · Cin` input
    /// channels, image `i` multiplies its slice `[i·Cin, (i+1)·Cin)` (the caller sums the `n` outputs).
    pub(crate) fn conv2d_halo(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>, up: bool, ksplit: bool) -> Result<CudaTensor> {
        let (n, cin, h, wd) = dims4(x, "conv2d input")?;
        let (cout, wcin, k, _) = dims4(w, "conv2d weight")?;
        ensure!(wcin == if ksplit { n * cin } else { cin }, "conv2d_halo: weight {:?} for input {:?}", w.shape, x.shape);
        let bm = halo_bm(cout);
        let mblocks = cout.div_ceil(bm);
        let wf = self.alloc(DType::F32, &[mblocks * bm * wcin * k * k * 2])?;
        halo_prep(bm, k)?.launch(self, (self.grid_for(wf.numel()), 256, 0), &wf, w, cout as i32, wcin as i32)?;
        let (oh, ow) = if up { (2 * h, 2 * wd) } else { (h, wd) };
        ensure!(cin * h * wd < i32::MAX as usize, "conv2d: input {:?} too large", x.shape);
        let out = self.alloc(DType::F32, &[n, cout, oh, ow])?;
        let blocks = n * oh.div_ceil(HALO_TH) * ow.div_ceil(HALO_TW) * mblocks;
        ensure!(blocks < i32::MAX as usize, "conv2d: {blocks} blocks");
        let cfg = (blocks as u32, VAE_HALO_THREADS as u32, halo_smem_bytes(bm, k) as u32);
        let b = b.map_or(Dev::null(Elem::F32), Dev::from);
        let [cin, h, wd, cout] = [cin, h, wd, cout].map(|v| v as i32);
        // The kernel's GroupNorm-on-load inputs (coefficients, SiLU): unused (the fused path was
        // measured slower and deleted).
        let (norm, silu) = (Dev::null(Elem::F64), 0);
        halo_kernel(bm, k)?.launch(self, cfg, &out, x, &wf, b, cin, h, wd, cout, up as i32, ksplit as i32, norm, silu)?;
        Ok(out)
    }

    /// The split-fp16 conv (cuda/vae/conv_fp16.cu; k 1 or 3, any Cin): the weight scaled per output
    /// channel, split into fp16 hi/lo and put in m16n8k16 fragment order (`moss_vae_wprep16*`,
    /// one block per output channel), then one launch of the kernel ([`f16_kernel`]). An
    /// activation past the fp16 range sets the device flag ([`Cuda::vae_flag_take`]).
    pub(crate) fn conv2d_f16(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>, up: bool) -> Result<CudaTensor> {
        let (n, cin, h, wd) = dims4(x, "conv2d input")?;
        let (cout, wcin, k, k2) = dims4(w, "conv2d weight")?;
        ensure!(wcin == cin && k == k2 && (k == 1 || k == 3), "conv2d_f16: weight {:?} for input {:?}", w.shape, x.shape);
        ensure!(b.is_none_or(|b| b.numel() == cout), "conv2d_f16: bias for {cout} outputs");
        let (x, w) = (self.f32(x)?, self.f32(w)?);
        let b = b.map(|b| self.f32(b)).transpose()?;
        let bm = halo_bm(cout);
        let (prep, conv) = f16_kernel(bm, k)?;
        let mblocks = cout.div_ceil(bm);
        let chunks = cin.div_ceil(16);
        // [Cout/BM][Cin/16][tap][BM/16][hi|lo][lane][4] words of two halves.
        let wf = self.alloc(DType::F32, &[mblocks * chunks * k * k * (bm / 16) * 2 * 128])?;
        let rs = self.alloc(DType::F32, &[mblocks * bm])?;
        // the weights as pairs of halves, one 32-bit word each
        let wf = Dev::new(wf.ptr(), Elem::U32);
        prep.launch(self, ((mblocks * bm) as u32, 256, 0), wf, &rs, &w, cout as i32, cin as i32)?;
        let (oh, ow) = if up { (2 * h, 2 * wd) } else { (h, wd) };
        ensure!((oh * ow) < i32::MAX as usize, "conv2d: picture {:?} too large", x.shape);
        let out = self.alloc(DType::F32, &[n, cout, oh, ow])?;
        let blocks = n * oh.div_ceil(HALO_TH) * ow.div_ceil(HALO_TW) * mblocks;
        ensure!(blocks < i32::MAX as usize, "conv2d: {blocks} blocks");
        let flag = Dev::new(self.vae_flag_ptr()?, Elem::I32);
        let cfg = (blocks as u32, VAE_HALO_THREADS as u32, f16_smem_bytes(bm, k) as u32);
        let b = b.as_ref().map_or(Dev::null(Elem::F32), Dev::from);
        let [cin, h, wd, cout] = [cin, h, wd, cout].map(|v| v as i32);
        conv.launch(self, cfg, &out, &x, wf, &rs, b, cin, h, wd, cout, up as i32, flag)?;
        Ok(out)
    }

    /// The decoder's conv kernel: [`ConvKernel::F16`]; the TF32 halo kernel while the decoder
    /// re-runs after an fp16 overflow.
    pub(super) fn conv_kernel(&self) -> ConvKernel {
        if self.vae_tf32_fallback() {
            ConvKernel::Halo
        } else {
            ConvKernel::F16
        }
    }

    /// Cout <= 4 (conv_out): one thread per output pixel, f64 sums ([`kernels::VAE_CONV_SMALL`]).
    pub(crate) fn conv2d_small(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, up: bool) -> Result<CudaTensor> {
        let (n, cin, h, wd) = dims4(x, "conv2d input")?;
        let (cout, _, k, _) = dims4(w, "conv2d weight")?;
        let (oh, ow) = if up { (2 * h, 2 * wd) } else { (h, wd) };
        let out = self.alloc(DType::F32, &[n, cout, oh, ow])?;
        let [cin, h, wd, cout, k, n32] = [cin, h, wd, cout, k, n].map(|v| v as i32);
        kernels::VAE_CONV_SMALL.launch(self, (self.grid_for(n * oh * ow), 256, 0), &out, x, w, b, cin, h, wd, cout, k, up as i32, n32)?;
        Ok(out)
    }
}
