//! The VAE decode's memory plan (whole or in row strips) and the row copies of a split decode.

use super::ATTN_CHUNK_BYTES;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};
use cudarc::driver::sys;

/// Peak live activation bytes of one decode of latents `[1, C, h, w]` (fp32): about four
/// pictures of the largest `channels × pixels` any stage holds (a resnet's input, normed input,
/// conv outputs and sum), plus the mid block's attention (q, k, v, vᵀ, output, the normed input
/// and one chunk of scores), a quarter on top for the pool's fragmentation.
pub fn vae_activation_bytes(cfg: &crate::checkpoint::config::VaeConfig, h: usize, w: usize) -> usize {
    let rev: Vec<usize> = cfg.decoder_block_out_channels.iter().rev().copied().collect();
    let (ph, pw) = (cfg.patch_size[0], cfg.patch_size[1]);
    let mut px = h * ph * w * pw; // pixels at the mid block's resolution
    let mut biggest = rev[0] * px;
    let l = px;
    for (i, &ch) in rev.iter().enumerate() {
        biggest = biggest.max(ch * px);
        if i + 1 < rev.len() {
            px *= 4;
            biggest = biggest.max(ch * px); // the upsampler's output
        }
    }
    let attn = 7 * l * rev[0] * 4 + ATTN_CHUNK_BYTES.min(l * l * 4);
    let peak = (4 * biggest * 4).max(attn + 2 * rev[0] * l * 4);
    peak + peak / 4
}

/// Peak live bytes of the part a split decode runs whole: up to the mid block's output (the
/// latent resolution, widest channels), the attention included; a quarter on top.
pub fn vae_mid_bytes(cfg: &crate::checkpoint::config::VaeConfig, h: usize, w: usize) -> usize {
    let c = *cfg.decoder_block_out_channels.last().unwrap_or(&0);
    let l = h * cfg.patch_size[0] * w * cfg.patch_size[1];
    let attn = 7 * l * c * 4 + ATTN_CHUNK_BYTES.min(l * l * 4);
    let peak = (4 * c * l * 4).max(attn + 2 * c * l * 4);
    peak + peak / 4
}

/// Peak live bytes of one strip of `rows` output rows in a split decode: at most 7 strip
/// tensors (input, normed input, conv output and its valid rows, the shortcut's input and
/// output, the sum) of `rows` + 2 halo rows at the widest `channels × width` of any layer after
/// the mid block; a quarter on top.
pub fn vae_strip_bytes(cfg: &crate::checkpoint::config::VaeConfig, h: usize, w: usize, rows: usize) -> usize {
    let rev: Vec<usize> = cfg.decoder_block_out_channels.iter().rev().copied().collect();
    let mut width = w * cfg.patch_size[1];
    let mut prev = rev[0];
    let mut per_row = 0;
    for (i, &ch) in rev.iter().enumerate() {
        per_row = per_row.max(prev.max(ch) * width);
        if i + 1 < rev.len() {
            width *= 2;
            per_row = per_row.max(ch * width);
        }
        prev = ch;
    }
    let _ = h;
    let b = 7 * (rows + 2) * per_row * 4;
    b + b / 4
}

/// `(C, H, W)` of a host picture `[1, C, H, W]` whose rows `y0..y1` exist.
pub(super) fn host_rows_dims(x: &Tensor, y0: usize, y1: usize) -> Result<(usize, usize, usize)> {
    ensure!(x.shape.len() == 4 && x.shape[0] == 1, "row strips of {:?}: expected [1, C, H, W]", x.shape);
    let (c, h, w) = (x.shape[1], x.shape[2], x.shape[3]);
    ensure!(y0 < y1 && y1 <= h && x.data.len() == c * h * w, "rows {y0}..{y1} of {:?}", x.shape);
    Ok((c, h, w))
}

/// A `cuMemcpy2D` descriptor: `height` rows of `width` bytes, each side with its pitch.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy2d_desc(
    src_type: sys::CUmemorytype,
    src_host: *mut std::ffi::c_void,
    src_dev: u64,
    src_pitch: usize,
    dst_type: sys::CUmemorytype,
    dst_host: *mut std::ffi::c_void,
    dst_dev: u64,
    dst_pitch: usize,
    width: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host as *const std::ffi::c_void,
        srcDevice: src_dev,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_dev,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    }
}

/// The split for latents `[1, C, h, w]` with `free` bytes available to activations: `None`
/// (whole) if [`vae_activation_bytes`] fits, else the tallest strip whose
/// [`vae_strip_bytes`] fits, else an error with numbers (the mid block, run whole, or a
/// one-row strip does not fit).
pub fn strip_rows_for(cfg: &crate::checkpoint::config::VaeConfig, h: usize, w: usize, free: usize) -> Result<Option<usize>> {
    if vae_activation_bytes(cfg, h, w) <= free {
        return Ok(None);
    }
    let (mid, one) = (vae_mid_bytes(cfg, h, w), vae_strip_bytes(cfg, h, w, 1));
    ensure!(
        mid <= free && one <= free,
        "the VAE decode of a {}x{} picture does not fit even in row strips: the mid block needs {:.2} GiB, \
         a one-row strip {:.2} GiB, {:.2} GiB free (after the reserve)",
        w * 16,
        h * 16,
        mid as f64 / crate::backend::cuda::ops::GIB,
        one as f64 / crate::backend::cuda::ops::GIB,
        free as f64 / crate::backend::cuda::ops::GIB
    );
    // The tallest strip that fits (strip bytes grow with the rows).
    let (mut lo, mut hi) = (1usize, h * 16);
    while lo < hi {
        let m = (lo + hi).div_ceil(2);
        if vae_strip_bytes(cfg, h, w, m) <= free {
            lo = m;
        } else {
            hi = m - 1;
        }
    }
    Ok(Some(lo))
}
