//! The VAE encode's memory plan (`moss_core::model::vae::VaeEncoder`): whole, or `conv_in` and the
//! down blocks with a downsampler in row strips with their kept pictures on the device or in
//! host memory, the rest whole at the latent resolution. The same shape of estimate as the
//! decoder's (`super::plan`), over the encoder's layers: pixels of `H × W` at full resolution,
//! widths `block_out_channels`, halved resolution after each downsampler.

use super::ATTN_CHUNK_BYTES;
use anyhow::{ensure, Result};
use moss_core::backend::ops::vae::{picture_bytes, StripPlan};
use moss_core::checkpoint::config::VaeConfig;

/// The strip levels: `(input channels, channels, rows, columns)` of each down block that ends in
/// a downsampler (run in strips), at its own resolution.
fn levels(cfg: &VaeConfig, height: usize, width: usize) -> Vec<(usize, usize, usize, usize)> {
    let w = &cfg.block_out_channels;
    let (mut h, mut wd, mut prev) = (height, width, w[0]);
    let mut out = vec![];
    for &c in &w[..w.len() - 1] {
        out.push((prev, c, h, wd));
        (h, wd, prev) = (h / 2, wd / 2, c);
    }
    out
}

/// The latent resolution's `(channels in, channels, pixels)`: the last down block and the mid
/// block, which a split encode runs whole.
fn tail(cfg: &VaeConfig, height: usize, width: usize) -> (usize, usize, usize) {
    let w = &cfg.block_out_channels;
    let n = w.len();
    let down = 1 << (n - 1);
    (if n > 1 { w[n - 2] } else { w[0] }, w[n - 1], (height / down) * (width / down))
}

/// Peak live bytes of the part run whole at the latent resolution: four pictures of the widest
/// channels there, or the attention's q, k, v, vᵀ, output and normed input and one chunk of
/// scores; a quarter on top (the pool's fragmentation).
pub fn encode_mid_bytes(cfg: &VaeConfig, height: usize, width: usize) -> usize {
    let (cin, c, l) = tail(cfg, height, width);
    let attn = 7 * l * c * 4 + ATTN_CHUNK_BYTES.min(l * l * 4);
    let peak = (4 * cin.max(c) * l * 4).max(attn + 2 * c * l * 4);
    peak + peak / 4
}

/// Peak live activation bytes of one whole encode of an `width`×`height` picture (fp32): four
/// pictures of the largest `channels × pixels` any level holds (a resnet's input, its first conv's
/// output, the normed input of the second and its output, then the sum; the downsampler's
/// full-resolution conv output), or the latent resolution's peak; a quarter on top.
pub fn encode_activation_bytes(cfg: &VaeConfig, height: usize, width: usize) -> usize {
    let biggest = levels(cfg, height, width).iter().map(|&(ci, c, h, w)| ci.max(c) * h * w).max().unwrap_or(0);
    let peak = 4 * biggest * 4;
    (peak + peak / 4).max(encode_mid_bytes(cfg, height, width))
}

/// Peak live bytes of the strips of a split encode with `rows` output rows a strip (kept
/// pictures not counted, [`encode_keep_bytes`]): at most 8 strip tensors of the widest
/// `channels × columns` of a strip level, `2·rows + 4` rows each (a downsampler's strip reads
/// and convolves twice its output rows, plus its halo); a quarter on top.
pub fn encode_strip_bytes(cfg: &VaeConfig, height: usize, width: usize, rows: usize) -> usize {
    let per_row = levels(cfg, height, width).iter().map(|&(ci, c, _, w)| ci.max(c) * w).max().unwrap_or(0);
    let b = 8 * (2 * rows + 4) * per_row * 4;
    b + b / 4
}

/// Device bytes of the pictures a split encode keeps between layers when all stay on the
/// device: the most live at once, as the model makes them (`conv_in`'s output; a resnet's input,
/// its first conv's output and a new picture for its output when it widens; a downsampler's
/// input and output).
pub fn encode_keep_bytes(cfg: &VaeConfig, height: usize, width: usize) -> usize {
    let g = cfg.norm_num_groups;
    let (mut peak, mut x) = (0, 0);
    for (i, (ci, c, h, w)) in levels(cfg, height, width).into_iter().enumerate() {
        let mut cur = ci;
        if i == 0 {
            x = picture_bytes(ci, h, w, g); // conv_in's output
            peak = x;
        }
        for _ in 0..cfg.layers_per_block {
            let hp = picture_bytes(c, h, w, g);
            let out = if c <= cur { 0 } else { picture_bytes(c, h, w, g) };
            peak = peak.max(x + hp + out);
            if c > cur {
                x = out;
            }
            cur = c;
        }
        let o = picture_bytes(c, h / 2, w / 2, g);
        peak = peak.max(x + o);
        x = o;
    }
    peak
}

/// The least activation bytes a split encode runs in: the latent-resolution part whole, or
/// one-row strips with every kept picture in host memory, whichever is more (for the run's
/// memory plan: `moss_core::plan::Network::strip_activations` of the VAE stage).
pub fn encode_split_least_bytes(cfg: &VaeConfig, height: usize, width: usize) -> usize {
    encode_mid_bytes(cfg, height, width).max(encode_strip_bytes(cfg, height, width, 8))
}

/// The split for an `width`×`height` picture with `free` bytes for activations: `None` (whole)
/// when [`encode_activation_bytes`] fits; else every kept picture on the device beside the
/// tallest strips when those are at least [`super::plan::PREFERRED_ROWS`] rows; else strips of
/// at most that and the rest of `free` for pictures (the others in host memory); an error with
/// numbers when the latent-resolution part or one-row strips do not fit.
pub fn encode_strip_plan_for(cfg: &VaeConfig, height: usize, width: usize, free: usize) -> Result<Option<StripPlan>> {
    if encode_activation_bytes(cfg, height, width) <= free {
        return Ok(None);
    }
    let gib = |b: usize| b as f64 / crate::ops::GIB;
    let (mid, one) = (encode_mid_bytes(cfg, height, width), encode_strip_bytes(cfg, height, width, 1));
    ensure!(
        mid <= free && one <= free,
        "the VAE encode of a {width}x{height} picture does not fit even in row strips: the latent-resolution part \
         needs {:.2} GiB, a one-row strip {:.2} GiB, {:.2} GiB free (after the reserve)",
        gib(mid),
        gib(one),
        gib(free)
    );
    let tallest = |budget: usize| -> Option<usize> {
        if encode_strip_bytes(cfg, height, width, 1) > budget {
            return None;
        }
        let (mut lo, mut hi) = (1usize, height);
        while lo < hi {
            let m = (lo + hi).div_ceil(2);
            if encode_strip_bytes(cfg, height, width, m) <= budget {
                lo = m;
            } else {
                hi = m - 1;
            }
        }
        Some(lo)
    };
    let preferred = super::plan::PREFERRED_ROWS;
    let all = encode_keep_bytes(cfg, height, width);
    if let Some(rows) = free.checked_sub(all).and_then(tallest) {
        if rows >= preferred.min(height) {
            return Ok(Some(StripPlan { rows, keep_bytes: all }));
        }
    }
    let rows = tallest(free).unwrap_or(1).min(preferred);
    Ok(Some(StripPlan { rows, keep_bytes: free - encode_strip_bytes(cfg, height, width, rows) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::GIB;
    use crate::vae::plan::{vae_activation_bytes, vae_split_least_bytes, PREFERRED_ROWS};

    /// The estimates at 1024x1024 and 2048x2048 beside the decoder's: the whole encode peaks
    /// at full resolution (128 channels), under the whole decode (192 channels at full
    /// resolution); the least split is the latent-resolution part (512-wide attention).
    #[test]
    fn estimates_full_size() {
        let cfg = crate::vae::full_size_config();
        for side in [1024usize, 2048] {
            let px = side * side;
            let whole = encode_activation_bytes(&cfg, side, side);
            assert_eq!(whole, 4 * 128 * px * 4 + 128 * px * 4, "four full-resolution pictures of 128 channels, a quarter on top");
            let dec = vae_activation_bytes(&cfg, side / 16, side / 16);
            assert!(whole < dec, "{side}: the whole encode ({whole}) needs less than the whole decode ({dec})");
            let least = encode_split_least_bytes(&cfg, side, side);
            let dec_least = vae_split_least_bytes(&cfg, side / 16, side / 16);
            println!(
                "{side}x{side}: encode whole {:.2} GiB (decode {:.2}), least split {:.2} GiB (decode {:.2}), all pictures kept {:.2} GiB, 64-row strips {:.2} GiB",
                whole as f64 / GIB,
                dec as f64 / GIB,
                least as f64 / GIB,
                dec_least as f64 / GIB,
                encode_keep_bytes(&cfg, side, side) as f64 / GIB,
                encode_strip_bytes(&cfg, side, side, 64) as f64 / GIB
            );
            // The least split is the latent-resolution part, at most 1.25 of the decoder's.
            assert_eq!(least, encode_mid_bytes(&cfg, side, side));
            assert!(least * 4 <= dec_least * 5, "{side}: encode least {least} vs decode least {dec_least}");
        }
        // Kept pictures at 2048: conv_in's output (128 x 2048²) with a resnet's first conv output
        // beside it, or block 1's widening resnet (input 128, its 256-wide conv output and a new
        // 256-wide picture at 1024²).
        let g = 32;
        let a = 2 * picture_bytes(128, 2048, 2048, g);
        let b = picture_bytes(128, 1024, 1024, g) + 2 * picture_bytes(256, 1024, 1024, g);
        assert_eq!(encode_keep_bytes(&cfg, 2048, 2048), a.max(b));
    }

    /// The planner: whole when it fits; every kept picture on the device beside tall strips;
    /// 64-row strips and the rest for pictures; a refusal with numbers below the least.
    #[test]
    fn strip_plan_full_size() {
        let cfg = crate::vae::full_size_config();
        let (h, w) = (2048, 2048);
        assert_eq!(encode_strip_plan_for(&cfg, h, w, encode_activation_bytes(&cfg, h, w)).unwrap(), None);
        let all = encode_keep_bytes(&cfg, h, w);
        let free = all + encode_strip_bytes(&cfg, h, w, 200) + 7;
        assert_eq!(encode_strip_plan_for(&cfg, h, w, free).unwrap(), Some(StripPlan { rows: 200, keep_bytes: all }));
        let free = all + encode_strip_bytes(&cfg, h, w, PREFERRED_ROWS) - 1;
        let p = encode_strip_plan_for(&cfg, h, w, free).unwrap().unwrap();
        assert_eq!(p, StripPlan { rows: PREFERRED_ROWS, keep_bytes: free - encode_strip_bytes(&cfg, h, w, PREFERRED_ROWS) });
        let least = encode_split_least_bytes(&cfg, h, w);
        let p = encode_strip_plan_for(&cfg, h, w, least).unwrap().unwrap();
        assert!(p.rows >= 8 && encode_strip_bytes(&cfg, h, w, p.rows) + p.keep_bytes <= least, "{p:?}");
        let e = encode_strip_plan_for(&cfg, h, w, encode_mid_bytes(&cfg, h, w) - 1).unwrap_err().to_string();
        assert!(e.contains("2048x2048") && e.contains("does not fit even in row strips") && e.contains("GiB free"), "{e}");
    }
}
