//! The VAE decoder's fused ops on CUDA (kernels in cuda/vae/vae_ops.cu; math on [`VaeOps`]). The whole
//! decoder runs in fp32 whatever `--precision` says: its weights are f32 in the checkpoint and
//! `load` keeps f32 tensors f32; every op here casts its inputs to f32 first (a no-op for f32).
//!
//! - `conv2d`: implicit GEMM, the nearest-×2 upsample folded into the input indexing, on the
//!   tensor cores with split fp16 (cuda/vae/conv_fp16.cu, m16n8k16; measured on the H200: 100.5 ms a
//!   1024x1024 decode against 136.4 ms on the TF32 halo kernel, 536 against 682 ms at 2048); an
//!   activation past the fp16 range sets a device flag and the decoder decodes again on the
//!   split-TF32 halo kernel of cuda/vae/conv_tf32.cu; conv_out's 3 outputs on an f64 SIMT kernel;
//!   where a kernel's shared memory does not fit (or k is not 1 or 3) the split-TF32 tap-major
//!   kernel. The tensor cores' fp32 accumulation truncates, so each 16-deep k-step accumulates
//!   into a fresh tile that is then added to the running sum with round-to-nearest adds.
//! - `conv2d_normed` (a resnet's GroupNorm + SiLU + conv): the normalise pass then the conv.
//! - `group_norm`: f64 partials per (group, row) on the GPU (fixed order, no atomics), combined
//!   on the host in a fixed order (`group_norm_combine`), then one normalise(+SiLU) pass; the
//!   same bits for a row strip as for the whole picture (the split decode relies on it).
//! - `spatial_attention`: where D = 384 and its shared memory fits, one flash-style kernel on
//!   fp16 tensor cores with hi/lo split operands (cuda/vae/attention_fp16.cu;
//!   5.5 ms at L = 16384 and 85.9 ms at L = 65536 on the H200); else where 204 KB fit, the
//!   split-TF32 flash kernel (cuda/vae/attention_tf32.cu); else query chunks of scores (at most
//!   `ATTN_CHUNK_BYTES`): `S = Q_c·Kᵀ`, a row softmax kernel, `P·V`, the products on the
//!   split-TF32 halo kernel as 1×1 convs (L, D multiples of 16), else cuBLAS fp32 (TF32 off).
//! - `to_rgb8`: clamp, scale, `rintf`, HWC bytes; only the bytes come back.

pub mod attention;
pub mod attention_fp16;
pub mod conv;
pub mod encode;
pub mod encode_plan;
pub mod picture;
pub mod plan;
pub(crate) mod state;

pub(crate) use attention::FLASH_SMEM_BYTES;
pub use conv::ConvKernel;
use conv::{f16_smem_bytes, halo_smem_bytes};
pub use plan::{strip_plan_for, vae_activation_bytes, vae_keep_bytes, vae_mid_bytes, vae_split_least_bytes, vae_strip_bytes};

use crate::kernels::{self, Dev, Elem};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::ops::VaeOps;

impl Cuda {
    /// Run `f`, timed under `key` while the profile ([`crate::profile`]) is on.
    fn timed<T>(&self, key: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.timed_op(key, f)
    }
}

/// Bytes of attention scores one query chunk may hold.
pub const ATTN_CHUNK_BYTES: usize = 1 << 30;

/// The kernels the VAE's ops use on a device whose blocks may opt into shared memory for which
/// `fits(bytes)` holds ([`crate::select::choices`]).
pub fn kernel_choices(fits: impl Fn(usize) -> bool) -> Vec<crate::select::Choice> {
    use crate::select::Choice;
    let f16 = (1..=3).step_by(2).all(|k| [96, 128].iter().all(|&bm| fits(f16_smem_bytes(bm, k))));
    let halo = (1..=3).step_by(2).all(|k| [96, 128].iter().all(|&bm| fits(halo_smem_bytes(bm, k))));
    let conv = if f16 {
        "moss_vae_conv16_b{96,128}_k{1,3} (split fp16)"
    } else {
        "moss_vae_conv_tf32x3t_k{1,3} (split TF32, tap-major: the fp16 kernel's shared memory does not fit)"
    };
    let rerun = if halo { "moss_vae_conv_halo_b{96,128}_k{1,3} (split TF32)" } else { "moss_vae_conv_tf32x3t_k{1,3} (split TF32, tap-major)" };
    let attn = if fits(crate::vae::attention_fp16::SMEM16_BYTES) {
        crate::vae::attention_fp16::KERNEL.to_string()
    } else if fits(FLASH_SMEM_BYTES) {
        "moss_vae_flash_d384 (split TF32)".to_string()
    } else if halo {
        "moss_vae_conv_halo_b128_k1 products + moss_vae_softmax_rows".to_string()
    } else {
        "cuBLAS fp32 products + moss_vae_softmax_rows".to_string()
    };
    vec![
        Choice { op: "vae conv2d (k 1, 3)", kernel: conv.into() },
        Choice { op: "vae conv2d, fp16 overflow re-run", kernel: rerun.into() },
        Choice { op: "vae conv2d (Cout <= 4)", kernel: "moss_vae_conv_small (f64)".into() },
        Choice { op: "vae spatial_attention (D 384)", kernel: attn },
        Choice { op: "vae encode conv2d_down2", kernel: format!("{conv}, then {}", crate::kernels::VAE_PICK_ODD.info.stem) },
        Choice {
            op: "vae encode spatial_attention (D 512)",
            kernel: if halo {
                "moss_vae_conv_halo_b128_k1 products + moss_vae_softmax_rows".into()
            } else {
                "cuBLAS fp32 products + moss_vae_softmax_rows".into()
            },
        },
    ]
}

fn dims4(x: &CudaTensor, what: &str) -> Result<(usize, usize, usize, usize)> {
    ensure!(x.shape.len() == 4, "{what}: expected [N, C, H, W], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2], x.shape[3]))
}

impl Cuda {
    pub(crate) fn f32(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.cast(x, DType::F32)
    }

    /// [`VaeOps::bn_unpatchify`].
    pub(crate) fn bn_unpatchify_op(&self, z: &CudaTensor, mean: &CudaTensor, var: &CudaTensor, eps: f64, patch: [usize; 2]) -> Result<CudaTensor> {
        let (n, ck, h, w) = dims4(z, "bn_unpatchify")?;
        let [ph, pw] = patch;
        let pp = ph * pw;
        ensure!(pp > 0 && ck % pp == 0, "bn_unpatchify: {ck} channels do not split into {ph}x{pw} patches");
        ensure!(mean.numel() == ck && var.numel() == ck, "bn_unpatchify: statistics {:?} / {:?}", mean.shape, var.shape);
        let (z, mean, var) = (self.f32(z)?, self.f32(mean)?, self.f32(var)?);
        let c = ck / pp;
        let out = self.alloc(DType::F32, &[n, c, h * ph, w * pw])?;
        let total = out.numel();
        let dims = [n, c, h, w, ph, pw].map(|v| v as i32);
        let [n, c, h, w, ph, pw] = dims;
        kernels::VAE_BN_UNPATCHIFY.launch(self, (self.grid_for(total), 256, 0), &out, &z, &mean, &var, eps as f32, n, c, h, w, ph, pw)?;
        Ok(out)
    }

    /// [`VaeOps::group_norm_row_stats`], untimed.
    pub(crate) fn group_norm_rows(&self, x: &CudaTensor, groups: usize) -> Result<Vec<f64>> {
        let bytes = self.download_bytes(&self.group_norm_row_partials(x, groups)?)?;
        Ok(bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect())
    }

    /// `group_norm_row_stats` left on the device: `[N, groups, H, 2]` f64 in an f32 buffer of
    /// `N·groups·H·4` words.
    pub(crate) fn group_norm_row_partials(&self, x: &CudaTensor, groups: usize) -> Result<CudaTensor> {
        let (n, c, h, wd) = dims4(x, "group_norm")?;
        ensure!(groups > 0 && c % groups == 0, "group_norm: {c} channels in {groups} groups");
        let cg = c / groups;
        ensure!(cg * wd < i32::MAX as usize && h < i32::MAX as usize, "group_norm: rows too long");
        let x = self.f32(x)?;
        let units = n * groups * h;
        ensure!(units < i32::MAX as usize, "group_norm: {units} rows");
        // [units, 2] doubles in an f32 buffer of twice the length.
        let out = self.alloc(DType::F32, &[units * 4])?;
        kernels::VAE_GN_ROW_STATS.launch(self, (units as u32, 256, 0), Dev::new(out.ptr(), Elem::F64), &x, cg as i32, h as i32, wd as i32)?;
        Ok(out)
    }

    /// [`VaeOps::group_norm_apply`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn group_norm_normalise(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        b: &CudaTensor,
        groups: usize,
        stats: &[f64],
        eps: f64,
        silu: bool,
    ) -> Result<CudaTensor> {
        let (n, c, h, wd) = dims4(x, "group_norm")?;
        ensure!(groups > 0 && c % groups == 0, "group_norm: {c} channels in {groups} groups");
        ensure!(w.numel() == c && b.numel() == c, "group_norm: affine {:?} / {:?} for {c} channels", w.shape, b.shape);
        ensure!(stats.len() == n * groups * 2, "group_norm: {} statistics for {n}x{groups} groups", stats.len());
        let (x, w, b) = (self.f32(x)?, self.f32(w)?, self.f32(b)?);
        let hw = h * wd;
        // [n·groups, 2] doubles (mean, variance) in an f32 buffer of twice the length.
        let st = self.alloc(DType::F32, &[stats.len() * 2])?;
        let bytes: Vec<u8> = stats.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_bytes(st.ptr(), &bytes)?;
        let out = self.alloc(DType::F32, &x.shape)?;
        let total = x.numel();
        let st = Dev::new(st.ptr(), Elem::F64);
        let (c, groups, eps_bits) = (c as i32, groups as i32, eps.to_bits() as i64);
        kernels::VAE_GN_APPLY.launch(self, (self.grid_for(total), 256, 0), &out, &x, st, &w, &b, total as i64, c, hw as i64, groups, eps_bits, silu as i32)?;
        Ok(out)
    }

    /// Whether `bytes` of dynamic shared memory fit a block on this GPU.
    pub(crate) fn halo_fits_bytes(&self, bytes: usize) -> bool {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
        self.gpu().ctx.attribute(OPTIN).map(|v| v as usize >= bytes).unwrap_or(false)
    }

    /// [`VaeOps::to_rgb8`]: the bytes made on the device.
    pub(crate) fn rgb8_bytes(&self, x: &CudaTensor) -> Result<Vec<u8>> {
        let (n, c, h, w) = dims4(x, "to_rgb8")?;
        ensure!(n == 1 && c == 3, "to_rgb8: expected one RGB picture [1, 3, H, W], got {:?}", x.shape);
        let x = self.f32(x)?;
        let hw = h * w;
        // A byte buffer: an f32 tensor of ceil(3hw/4) elements holds the 3hw bytes.
        let out = self.alloc(DType::F32, &[(3 * hw).div_ceil(4)])?;
        kernels::VAE_TO_RGB8.launch(self, (self.grid_for(3 * hw), 256, 0), Dev::new(out.ptr(), Elem::U8), &x, hw as i64)?;
        let mut bytes = self.download_bytes(&out)?;
        bytes.truncate(3 * hw);
        Ok(bytes)
    }
}

impl VaeOps for Cuda {
    type Picture = picture::CudaPicture;

    fn plan_vae(&self, c: &moss_core::checkpoint::Component, cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize) -> Result<()> {
        // Whole if it fits, else the smallest useful split (strips of 8 rows, every picture in
        // host memory) must fit.
        let least = vae_activation_bytes(cfg, h, w).min(vae_split_least_bytes(cfg, h, w));
        let plan = crate::plan::MemoryPlan::component(c, moss_core::options::Precision::Fp32).activations(least);
        plan.check(self.gpu()).map_err(|e| e.context(format!("the VAE decode of a {}x{} picture does not fit, even in row strips", w * 16, h * 16)))
    }
    fn limit_vae_activations(&self, bytes: Option<u64>) {
        self.set_vae_limit(bytes)
    }
    fn vae_strip_plan(&self, cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize) -> Result<Option<moss_core::backend::ops::vae::StripPlan>> {
        // Free memory less the reserve, and no more than the run's plan leaves (--max-vram).
        let limit = self.vae_limit().unwrap_or(u64::MAX).min(usize::MAX as u64) as usize;
        let avail = |cuda: &Cuda| -> Result<usize> { Ok(cuda.gpu().mem_info()?.0.saturating_sub(crate::plan::RESERVE_BYTES).min(limit)) };
        if vae_activation_bytes(cfg, h, w) <= avail(self)? {
            return Ok(None);
        }
        // Freed tensors the pool still holds count as used: hand them back and look again.
        self.trim_pool()?;
        strip_plan_for(cfg, h, w, avail(self)?)
    }
    fn picture(&self, c: usize, h: usize, w: usize, groups: usize, on_device: bool) -> Result<Self::Picture> {
        self.picture_new(c, h, w, groups, on_device)
    }
    fn picture_rows(&self, p: &Self::Picture, y0: usize, y1: usize, next: Option<(usize, usize)>) -> Result<CudaTensor> {
        self.picture_rows_of(p, y0, y1, next)
    }
    fn picture_put(&self, p: &mut Self::Picture, y0: usize, y1: usize, t: &CudaTensor, skip: usize) -> Result<()> {
        self.picture_put_in(p, y0, y1, t, skip)
    }
    fn picture_row_stats(&self, p: &Self::Picture) -> Result<Vec<f64>> {
        self.picture_partials(p)
    }
    fn picture_set_channels(&self, p: &mut Self::Picture, c: usize) -> Result<()> {
        self.picture_channels(p, c)
    }
    fn bn_unpatchify(&self, z: &CudaTensor, mean: &CudaTensor, var: &CudaTensor, eps: f64, patch: [usize; 2]) -> Result<CudaTensor> {
        self.bn_unpatchify_op(z, mean, var, eps, patch)
    }
    fn conv2d(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, upsample2x: bool) -> Result<CudaTensor> {
        self.timed(
            || format!("conv {}->{} k{} at {}x{}{}", w.shape[1], w.shape[0], w.shape[2], x.shape[2], x.shape[3], if upsample2x { " up2x" } else { "" }),
            || self.conv2d_on(x, w, b, upsample2x, self.conv_kernel()),
        )
    }
    fn group_norm(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, groups: usize, eps: f64, silu: bool) -> Result<CudaTensor> {
        self.timed(
            || format!("group_norm {:?}", x.shape),
            || {
                let d = &x.shape;
                ensure!(d.len() == 4 && groups > 0 && d[1].is_multiple_of(groups), "group_norm: {d:?} in {groups} groups");
                let rows = self.group_norm_rows(x, groups)?;
                let stats = moss_core::backend::ops::vae::group_norm_combine(&rows, d[0] * groups, d[2], d[1] / groups * d[3]);
                self.group_norm_normalise(x, w, b, groups, &stats, eps, silu)
            },
        )
    }
    fn group_norm_row_stats(&self, x: &CudaTensor, groups: usize) -> Result<Vec<f64>> {
        self.timed(|| format!("group_norm stats {:?}", x.shape), || self.group_norm_rows(x, groups))
    }
    #[allow(clippy::too_many_arguments)]
    fn conv2d_normed(
        &self,
        x: &CudaTensor,
        nw: &CudaTensor,
        nb: &CudaTensor,
        groups: usize,
        stats: &[f64],
        eps: f64,
        silu: bool,
        w: &CudaTensor,
        b: &CudaTensor,
        up: bool,
    ) -> Result<CudaTensor> {
        self.timed(
            || format!("norm+conv {}->{} k{} at {}x{}{}", w.shape[1], w.shape[0], w.shape[2], x.shape[2], x.shape[3], if up { " up2x" } else { "" }),
            || {
                // The normalise pass then the conv (GroupNorm fused into the halo conv's load was
                // measured slower on the H200: the conv kernel is instruction-bound).
                let t = self.group_norm_normalise(x, nw, nb, groups, stats, eps, silu)?;
                self.conv2d_on(&t, w, b, up, self.conv_kernel())
            },
        )
    }
    #[allow(clippy::too_many_arguments)]
    fn group_norm_apply(&self, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, groups: usize, stats: &[f64], eps: f64, silu: bool) -> Result<CudaTensor> {
        self.group_norm_normalise(x, w, b, groups, stats, eps, silu)
    }
    fn spatial_attention(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor) -> Result<CudaTensor> {
        let fits = q.shape.len() == 3;
        let f16 = fits && self.f16_attn_fits(q.shape[2]);
        let flash = fits && self.flash_fits(q.shape[2]);
        let split = fits && q.shape[1].is_multiple_of(16) && q.shape[2].is_multiple_of(16);
        self.timed(
            || format!("attention {:?}", q.shape),
            || {
                if f16 {
                    self.spatial_attention_f16(q, k, v)
                } else if flash {
                    self.spatial_attention_flash(q, k, v)
                } else if split {
                    self.spatial_attention_split(q, k, v, ATTN_CHUNK_BYTES)
                } else {
                    self.spatial_attention_chunks(q, k, v, ATTN_CHUNK_BYTES)
                }
            },
        )
    }
    fn to_rgb8(&self, x: &CudaTensor) -> Result<Vec<u8>> {
        self.rgb8_bytes(x)
    }
    /// `decode`, and again with the convolutions on the split-TF32 halo kernel when the fp16-split
    /// one met an activation past the fp16 range (|x| > 65504; one line on stderr). The flag is
    /// read once, after the decode (which has synchronised to bring its result back anyway).
    fn run_decode<R>(&self, decode: impl Fn() -> Result<R>) -> Result<R> {
        self.conv_overflow()?; // a stale flag (an earlier failed decode) is not this decode's
        let r = decode()?;
        if !self.conv_overflow()? {
            return Ok(r);
        }
        eprintln!("moss: VAE decode: an activation past the fp16 range (|x| > 65504) in the fp16-split convolution; decoding again with the TF32 convolution");
        self.set_conv_fallback(true);
        let r = decode();
        self.set_conv_fallback(false);
        r
    }
}

impl Cuda {
    /// Whether a convolution since the last call met an activation past the fp16-split conv's
    /// range; clears the flag. Waits for the stream.
    pub(crate) fn conv_overflow(&self) -> Result<bool> {
        self.vae_flag_take()
    }

    /// Run the convolutions on the split-TF32 halo kernel (full range) while on.
    pub(crate) fn set_conv_fallback(&self, on: bool) {
        self.set_vae_tf32_fallback(on)
    }
}

/// FLUX.2's VAE at full size (encoder widths 128/256/512/512, decoder 96/192/384/384, two resnets
/// a block): the configuration the plans' tests estimate.
#[cfg(test)]
pub(crate) fn full_size_config() -> moss_core::checkpoint::config::VaeConfig {
    use moss_core::checkpoint::config::VaeConfig;
    VaeConfig {
        latent_channels: 32,
        out_channels: 3,
        block_out_channels: vec![128, 256, 512, 512],
        in_channels: 3,
        use_quant_conv: true,
        down_block_types: vec![],
        decoder_block_out_channels: vec![96, 192, 384, 384],
        layers_per_block: 2,
        norm_num_groups: 32,
        batch_norm_eps: 1e-4,
        patch_size: [2, 2],
        use_post_quant_conv: true,
        mid_block_add_attention: true,
        defaulted: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vae::plan::PREFERRED_ROWS;
    use moss_core::backend::ops::vae::{picture_bytes, StripPlan};

    #[test]
    fn activation_estimate_full_size() {
        let cfg = super::full_size_config();
        // 1024x1024: the largest picture is the 192-wide upsampler output at 1024x1024.
        let b = vae_activation_bytes(&cfg, 64, 64);
        let peak = 4 * 192 * 1024 * 1024 * 4;
        assert_eq!(b, peak + peak / 4);
        // 2048x2048: four times that (attention's 1 GiB chunk and q/k/v stay below it).
        assert_eq!(vae_activation_bytes(&cfg, 128, 128), 4 * b);
        // Split: the widest row is 384 channels x 512 columns (up block 2's input) = 192 x 1024
        // (the last upsampler's output).
        let s = vae_strip_bytes(&cfg, 64, 64, 28);
        let want = 8 * 32 * 192 * 1024 * 4;
        assert_eq!(s, want + want / 4);
        assert!(vae_mid_bytes(&cfg, 64, 64) < b);
        // Kept pictures, all on the device: the peak is the first resnet of the last up block,
        // its 192-wide input (the upsampler's output, 1024x1024) and its 96-wide first conv
        // output; its own output goes over its input.
        let px = 1024 * 1024;
        assert_eq!(vae_keep_bytes(&cfg, 64, 64), picture_bytes(192, 1024, 1024, 32) + picture_bytes(96, 1024, 1024, 32));
        assert_eq!(vae_keep_bytes(&cfg, 64, 64), 4 * 288 * px + 2 * 16 * 32 * 1024);
        assert!(vae_keep_bytes(&cfg, 64, 64) < b / 2);
    }

    /// The planner: whole when it fits; every kept picture on the device beside the tallest
    /// strips when that leaves strips of [`PREFERRED_ROWS`]; else strips of at most that and
    /// the rest for pictures; a refusal with numbers.
    #[test]
    fn strip_plan_full_size() {
        let cfg = super::full_size_config();
        let (h, w) = (128, 128); // 2048x2048
        let whole = vae_activation_bytes(&cfg, h, w);
        let all = vae_keep_bytes(&cfg, h, w);
        assert_eq!(strip_plan_for(&cfg, h, w, whole).unwrap(), None);
        let free = all + vae_strip_bytes(&cfg, h, w, 300) + 5;
        assert_eq!(strip_plan_for(&cfg, h, w, free).unwrap(), Some(StripPlan { rows: 300, keep_bytes: all }));
        let free = all + vae_strip_bytes(&cfg, h, w, 301) - 1;
        assert_eq!(strip_plan_for(&cfg, h, w, free).unwrap(), Some(StripPlan { rows: 300, keep_bytes: all }));
        // Not room for all pictures beside 64-row strips: 64-row strips, the rest for pictures.
        let free = all + vae_strip_bytes(&cfg, h, w, PREFERRED_ROWS) - 1;
        let p = strip_plan_for(&cfg, h, w, free).unwrap().unwrap();
        assert_eq!(p, StripPlan { rows: PREFERRED_ROWS, keep_bytes: free - vae_strip_bytes(&cfg, h, w, PREFERRED_ROWS) });
        assert!(p.keep_bytes < all);
        // Just above what the mid block needs: strips, nothing kept beyond what is left.
        let free = vae_mid_bytes(&cfg, h, w).max(vae_strip_bytes(&cfg, h, w, 8));
        let p = strip_plan_for(&cfg, h, w, free).unwrap().unwrap();
        assert!(p.rows >= 8 && p.rows <= PREFERRED_ROWS && vae_strip_bytes(&cfg, h, w, p.rows) + p.keep_bytes <= free, "{p:?}");
        let e = strip_plan_for(&cfg, h, w, vae_mid_bytes(&cfg, h, w) - 1).unwrap_err().to_string();
        assert!(e.contains("does not fit even in row strips") && e.contains("GiB free"), "{e}");
        // A small picture whose strips reach the whole height: the whole height will do.
        let (h1, w1) = (4, 4);
        let free = vae_keep_bytes(&cfg, h1, w1) + vae_strip_bytes(&cfg, h1, w1, 64);
        if vae_activation_bytes(&cfg, h1, w1) > free {
            assert_eq!(strip_plan_for(&cfg, h1, w1, free).unwrap().unwrap().rows, 64);
        }
        // The peak device bytes of a split decode (pictures + strips, or the mid block), for the
        // report: 2048x2048 and 4096x4096 at 64-row strips.
        let g = crate::ops::GIB;
        for (side, h) in [(2048, 128), (4096, 256)] {
            let (mid, strips, all) = (vae_mid_bytes(&cfg, h, h), vae_strip_bytes(&cfg, h, h, 64), vae_keep_bytes(&cfg, h, h));
            println!(
                "{side}x{side}: whole {:.2} GiB; split at 64 rows: mid block {:.2} GiB, strips {:.2} GiB, all pictures kept {:.2} GiB \
                 -> peak {:.2} GiB all on the device, {:.2} GiB all in host memory",
                vae_activation_bytes(&cfg, h, h) as f64 / g,
                mid as f64 / g,
                strips as f64 / g,
                all as f64 / g,
                mid.max(all + strips) as f64 / g,
                mid.max(strips) as f64 / g
            );
        }
    }
}
