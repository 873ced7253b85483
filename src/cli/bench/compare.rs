//! `moss bench-compare A B` (hidden): PSNR and SSIM of two pictures of one size, for the quality
//! columns of bench/sampling.sh. PSNR over every RGB8 sample; SSIM as Wang et al. (2004) with
//! scikit-image's settings (`structural_similarity(..., gaussian_weights=True, sigma=1.5,
//! use_sample_covariance=False, data_range=255)`): an 11-tap Gaussian window, K1 = 0.01,
//! K2 = 0.03, the map's mean over the pixels the whole window covers, averaged over R, G and B.

use anyhow::{ensure, Context, Result};
use std::path::Path;

/// The 11 normalised taps of a σ = 1.5 Gaussian (scikit-image's truncate 3.5: radius 5).
fn taps() -> [f64; 11] {
    let mut t = [0.0; 11];
    for (i, v) in t.iter_mut().enumerate() {
        let x = i as f64 - 5.0;
        *v = (-x * x / (2.0 * 1.5 * 1.5)).exp();
    }
    let s: f64 = t.iter().sum();
    t.map(|v| v / s)
}

/// The window-weighted mean of `f` at every pixel the whole window covers: `(w − 10) x (h − 10)`.
fn filter(f: &[f64], w: usize, h: usize) -> Vec<f64> {
    let k = taps();
    let (ow, oh) = (w - 10, h - 10);
    let mut rows = vec![0.0; ow * h];
    for y in 0..h {
        for x in 0..ow {
            rows[y * ow + x] = (0..11).map(|i| k[i] * f[y * w + x + i]).sum();
        }
    }
    let mut out = vec![0.0; ow * oh];
    for y in 0..oh {
        for x in 0..ow {
            out[y * ow + x] = (0..11).map(|i| k[i] * rows[(y + i) * ow + x]).sum();
        }
    }
    out
}

/// SSIM of one channel (values 0..255), `w` x `h`.
fn ssim_channel(a: &[f64], b: &[f64], w: usize, h: usize) -> f64 {
    let (c1, c2) = ((0.01f64 * 255.0).powi(2), (0.03f64 * 255.0).powi(2));
    let prod = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).collect::<Vec<_>>();
    let (ma, mb) = (filter(a, w, h), filter(b, w, h));
    let (aa, bb, ab) = (filter(&prod(a, a), w, h), filter(&prod(b, b), w, h), filter(&prod(a, b), w, h));
    let n = ma.len();
    let sum: f64 = (0..n)
        .map(|i| {
            let (va, vb, cov) = (aa[i] - ma[i] * ma[i], bb[i] - mb[i] * mb[i], ab[i] - ma[i] * mb[i]);
            ((2.0 * ma[i] * mb[i] + c1) * (2.0 * cov + c2)) / ((ma[i] * ma[i] + mb[i] * mb[i] + c1) * (va + vb + c2))
        })
        .sum();
    sum / n as f64
}

/// PSNR (dB; infinite for equal pictures) and SSIM of RGB8 pictures `a`, `b` (rows of RGB), `w` x `h`.
pub fn psnr_ssim(a: &[u8], b: &[u8], w: usize, h: usize) -> (f64, f64) {
    let mse = a.iter().zip(b).map(|(&p, &q)| (p as f64 - q as f64).powi(2)).sum::<f64>() / a.len() as f64;
    let psnr = 10.0 * (255.0f64 * 255.0 / mse).log10();
    let plane = |p: &[u8], c: usize| p.iter().skip(c).step_by(3).map(|&v| v as f64).collect::<Vec<_>>();
    let ssim = (0..3).map(|c| ssim_channel(&plane(a, c), &plane(b, c), w, h)).sum::<f64>() / 3.0;
    (psnr, ssim)
}

/// The JSON line: `{"psnr_db", "ssim"}` (`psnr_db` null for equal pictures).
pub fn run(a: &Path, b: &Path) -> Result<serde_json::Value> {
    let read = |p: &Path| -> Result<(Vec<u8>, u32, u32)> {
        let (rgb, w, h, _) = moss::picture::decode(&std::fs::read(p).with_context(|| p.display().to_string())?)?;
        Ok((rgb, w, h))
    };
    let ((pa, wa, ha), (pb, wb, hb)) = (read(a)?, read(b)?);
    ensure!((wa, ha) == (wb, hb), "{}x{} and {}x{}: the pictures differ in size", wa, ha, wb, hb);
    ensure!(wa > 10 && ha > 10, "the pictures are smaller than the SSIM window");
    let (psnr, ssim) = psnr_ssim(&pa, &pb, wa as usize, ha as usize);
    Ok(serde_json::json!({"psnr_db": psnr.is_finite().then_some(psnr), "ssim": ssim}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_pictures_and_a_constant_offset() {
        let (w, h) = (16, 12);
        let a: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let (p, s) = psnr_ssim(&a, &a, w, h);
        assert!(p.is_infinite() && (s - 1.0).abs() < 1e-12, "{p} {s}");
        // Flat 100 against flat 110: MSE 100; no variance, so SSIM is the luminance term alone.
        let (x, y) = (vec![100u8; w * h * 3], vec![110u8; w * h * 3]);
        let (p, s) = psnr_ssim(&x, &y, w, h);
        assert!((p - 10.0 * (255.0f64.powi(2) / 100.0).log10()).abs() < 1e-9, "{p}");
        let c1 = (0.01f64 * 255.0).powi(2);
        let want = (2.0 * 100.0 * 110.0 + c1) / (100.0f64.powi(2) + 110.0f64.powi(2) + c1);
        assert!((s - want).abs() < 1e-9, "{s} vs {want}");
        // Noise lowers it.
        let n: Vec<u8> = a.iter().enumerate().map(|(i, &v)| v.wrapping_add((i % 7) as u8 * 9)).collect();
        assert!(psnr_ssim(&a, &n, w, h).1 < 0.99);
    }
}
