//! The VAE decode's memory plan (whole, or in row strips with the kept pictures on the device
//! or in host memory) and the 2-D copy descriptor of a host picture's rows.

use super::ATTN_CHUNK_BYTES;
use anyhow::{ensure, Result};
use cudarc::driver::sys;
use moss_core::backend::ops::vae::{picture_bytes, StripPlan};

/// Peak live activation bytes of one decode of latents `[1, C, h, w]` (fp32): about four
/// pictures of the largest `channels × pixels` any stage holds (a resnet's input, normed input,
/// conv outputs and sum), plus the mid block's attention (q, k, v, vᵀ, output, the normed input
/// and one chunk of scores), a quarter on top for the pool's fragmentation.
pub fn vae_activation_bytes(cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize) -> usize {
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
pub fn vae_mid_bytes(cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize) -> usize {
    let c = *cfg.decoder_block_out_channels.last().unwrap_or(&0);
    let l = h * cfg.patch_size[0] * w * cfg.patch_size[1];
    let attn = 7 * l * c * 4 + ATTN_CHUNK_BYTES.min(l * l * 4);
    let peak = (4 * c * l * 4).max(attn + 2 * c * l * 4);
    peak + peak / 4
}

/// Peak live bytes of the strips of a split decode with `rows` output rows a strip (the kept
/// pictures not counted, [`vae_keep_bytes`]): at most 8 strip tensors (the rows read and those
/// fetched ahead for the next strip, the normalised input, the conv output and its valid rows,
/// the shortcut and the sum, two strips on their way to host memory) of `rows` + 4 halo rows at
/// the widest `channels × width` of any layer after the mid block; a quarter on top.
pub fn vae_strip_bytes(cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize, rows: usize) -> usize {
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
    let b = 8 * (rows + 4) * per_row * 4;
    b + b / 4
}

/// Device bytes of the pictures a split decode keeps between layers when all of them stay on
/// the device: the most live at once, as `moss_core::model::vae` makes them (a resnet's input, its
/// first conv's output, its own output over its input when it has no more channels, else a
/// new picture; an upsampler's input and output), each [`picture_bytes`] of its size when made.
pub fn vae_keep_bytes(cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize) -> usize {
    let g = cfg.norm_num_groups;
    let rev: Vec<usize> = cfg.decoder_block_out_channels.iter().rev().copied().collect();
    let (mut hh, mut ww) = (h * cfg.patch_size[0], w * cfg.patch_size[1]);
    let mut c = rev[0];
    let mut x = picture_bytes(c, hh, ww, g); // the mid block's output
    let mut peak = x;
    for (i, &ch) in rev.iter().enumerate() {
        for _ in 0..=cfg.layers_per_block {
            let hp = picture_bytes(ch, hh, ww, g);
            let out = if ch <= c { 0 } else { picture_bytes(ch, hh, ww, g) };
            peak = peak.max(x + hp + out);
            if ch > c {
                x = out;
            }
            c = ch;
        }
        if i + 1 < rev.len() {
            let o = picture_bytes(c, 2 * hh, 2 * ww, g);
            peak = peak.max(x + o);
            (x, hh, ww) = (o, 2 * hh, 2 * ww);
        }
    }
    peak
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

/// The least activation bytes a split decode of latents `[1, C, h, w]` runs in: the mid block
/// (run whole) or strips of 8 rows with every kept picture in host memory, whichever is more
/// (`moss_core::plan`'s `strip_activations` for the VAE).
pub fn vae_split_least_bytes(cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize) -> usize {
    vae_mid_bytes(cfg, h, w).max(vae_strip_bytes(cfg, h, w, 8))
}

/// Strip height the planner settles for when not every kept picture fits on the device: taller
/// strips save little (halo rows, launches) and take memory the pictures could use.
pub const PREFERRED_ROWS: usize = 64;

/// The split for latents `[1, C, h, w]` with `free` bytes available to activations: `None`
/// (whole) if [`vae_activation_bytes`] fits; else, when every kept picture fits on the device
/// ([`vae_keep_bytes`]) beside strips of [`PREFERRED_ROWS`] rows (or the whole height), those
/// pictures on the device and the tallest strips that fit beside them; else strips of at most
/// [`PREFERRED_ROWS`] rows and the rest of `free` for pictures (the others in host memory);
/// an error with numbers when the mid block (run whole) or a one-row strip does not fit.
/// Peak device bytes: `max(mid, min(keep, vae_keep_bytes) + vae_strip_bytes(rows))`.
pub fn strip_plan_for(cfg: &moss_core::checkpoint::config::VaeConfig, h: usize, w: usize, free: usize) -> Result<Option<StripPlan>> {
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
        mid as f64 / crate::ops::GIB,
        one as f64 / crate::ops::GIB,
        free as f64 / crate::ops::GIB
    );
    let height = h * 16;
    // The tallest strip (at most the picture) within `budget`, if a one-row strip is.
    let tallest = |budget: usize| -> Option<usize> {
        if vae_strip_bytes(cfg, h, w, 1) > budget {
            return None;
        }
        let (mut lo, mut hi) = (1usize, height);
        while lo < hi {
            let m = (lo + hi).div_ceil(2);
            if vae_strip_bytes(cfg, h, w, m) <= budget {
                lo = m;
            } else {
                hi = m - 1;
            }
        }
        Some(lo)
    };
    let all = vae_keep_bytes(cfg, h, w);
    if let Some(rows) = free.checked_sub(all).and_then(tallest) {
        if rows >= PREFERRED_ROWS.min(height) {
            return Ok(Some(StripPlan { rows, keep_bytes: all }));
        }
    }
    let rows = tallest(free).unwrap_or(1).min(PREFERRED_ROWS);
    Ok(Some(StripPlan { rows, keep_bytes: free - vae_strip_bytes(cfg, h, w, rows) }))
}
