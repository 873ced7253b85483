//! The parts of a [`super::PictureSpec`] that start from a picture (spec 7.4): the init image
//! with its strength, mask and outpainting border ([`InitSpec`]), and the hires fix
//! ([`HiresSpec`]). A picture in is recorded by the sha256 of its file's bytes: the spec says
//! which picture, the run is handed the picture itself.

use serde::{Deserialize, Serialize};

/// `--strength` when not given (AUTOMATIC1111's img2img default).
pub const DEFAULT_STRENGTH: f64 = 0.75;
/// `--mask-blur` when not given (AUTOMATIC1111's default), pixels.
pub const DEFAULT_MASK_BLUR: u32 = 4;
/// The largest mask blur, pixels.
pub const MAX_MASK_BLUR: u32 = 256;
/// `--hires-strength` when not given (AUTOMATIC1111's hires fix default).
pub const DEFAULT_HIRES_STRENGTH: f64 = 0.7;
/// The hires fix's largest scale.
pub const MAX_HIRES_SCALE: f64 = 4.0;

/// The picture a run starts from: img2img, inpainting (with a mask), outpainting (a border).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InitSpec {
    /// sha256 (hex) of the init image file's bytes.
    pub sha256: String,
    /// Denoising strength in (0, 1]: how much of the schedule runs (1: all of it, from pure
    /// noise; the picture then only matters where a mask keeps it).
    pub strength: f64,
    /// sha256 (hex) of the mask file's bytes (white = repaint, black = keep; or its alpha).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_sha256: Option<String>,
    /// Standard deviation in pixels of the Gaussian blur of the mask's feather, the final
    /// picture's blend of the rendered and the input pixels (set when there is a mask: a mask
    /// file, or an outpainting border).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_blur: Option<u32>,
    /// Pixels added around the init image, left, top, right, bottom: the canvas is the spec's
    /// size and the picture, resized to the size less the border, sits inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outpaint: Option<[u32; 4]>,
}

impl InitSpec {
    /// Whether the run repaints a region only (a mask file or an outpainting border).
    pub fn masked(&self) -> bool {
        self.mask_sha256.is_some() || self.outpaint.is_some()
    }

    /// The init image's place in a `width`×`height` canvas: `(x, y, w, h)`.
    pub fn inner(&self, width: u32, height: u32) -> (u32, u32, u32, u32) {
        let [l, t, r, b] = self.outpaint.unwrap_or_default();
        (l, t, width.saturating_sub(l + r), height.saturating_sub(t + b))
    }

    pub fn check(&self, width: u32, height: u32) -> Result<(), String> {
        check_strength("strength", self.strength)?;
        for (what, h) in [("init image", Some(&self.sha256)), ("mask", self.mask_sha256.as_ref())] {
            if let Some(h) = h {
                if h.len() != 64 || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(format!("the {what}'s sha256 `{h}` is not 64 hex digits"));
                }
            }
        }
        match self.mask_blur {
            Some(b) if b > MAX_MASK_BLUR => return Err(format!("mask blur {b} is above {MAX_MASK_BLUR} pixels")),
            Some(_) if !self.masked() => return Err("a mask blur without a mask or an outpainting border".into()),
            _ => {}
        }
        if let Some([l, t, r, b]) = self.outpaint {
            let (_, _, w, h) = self.inner(width, height);
            if l as u64 + r as u64 + 16 > width as u64 || t as u64 + b as u64 + 16 > height as u64 {
                return Err(format!("outpaint {l},{t},{r},{b} leaves less than 16x16 of the {width}x{height} canvas for the picture"));
            }
            if l + t + r + b == 0 {
                return Err("outpaint 0,0,0,0 adds no border".into());
            }
            debug_assert!(w >= 16 && h >= 16);
        }
        Ok(())
    }
}

/// How the hires fix enlarges the first pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Upscaler {
    /// The latents, bilinear (align_corners false), then noised: no decode and encode between.
    Latent,
    /// The decoded picture, Lanczos3, then encoded again.
    Lanczos,
}

impl Upscaler {
    pub const NAMES: [&'static str; 2] = ["latent", "lanczos"];

    /// As AUTOMATIC1111's `Hires upscaler` names them.
    pub fn a1111(self) -> &'static str {
        match self {
            Upscaler::Latent => "Latent",
            Upscaler::Lanczos => "Lanczos",
        }
    }
}

impl std::str::FromStr for Upscaler {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "latent" => Ok(Upscaler::Latent),
            "lanczos" => Ok(Upscaler::Lanczos),
            _ => Err(format!("unknown upscaler `{s}` (use {})", Upscaler::NAMES.join(" or "))),
        }
    }
}

impl std::fmt::Display for Upscaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(Upscaler::NAMES[*self as usize])
    }
}

/// AUTOMATIC1111's hires fix: render at the spec's size, enlarge by `scale`, then img2img at
/// the larger size with `strength` over `steps` steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HiresSpec {
    pub scale: f64,
    pub strength: f64,
    pub steps: u32,
    pub upscaler: Upscaler,
}

impl HiresSpec {
    /// The second pass's size: each side times `scale`, to the nearest multiple of 16.
    pub fn size(&self, width: u32, height: u32) -> (u32, u32) {
        let side = |v: u32| ((v as f64 * self.scale / 16.0).round() as u32).max(1) * 16;
        (side(width), side(height))
    }

    pub fn check(&self, width: u32, height: u32) -> Result<(), String> {
        if !(self.scale.is_finite() && self.scale >= 1.0 && self.scale <= MAX_HIRES_SCALE) {
            return Err(format!("hires scale {} is not in 1..={MAX_HIRES_SCALE}", self.scale));
        }
        check_strength("hires strength", self.strength)?;
        super::check_steps(self.steps as u64).map_err(|e| format!("hires {e}"))?;
        let (w, h) = self.size(width, height);
        crate::options::check_size(w, h).map_err(|e| format!("hires size {w}x{h} ({width}x{height} times {}): {e}", self.scale))
    }
}

/// A strength in (0, 1].
pub fn check_strength(what: &str, s: f64) -> Result<(), String> {
    if !(s > 0.0 && s <= 1.0) {
        return Err(format!("{what} {s} is not in (0, 1]"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init() -> InitSpec {
        InitSpec { sha256: "ab".repeat(32), strength: 0.6, mask_sha256: None, mask_blur: None, outpaint: None }
    }

    #[test]
    fn init_rules() {
        assert_eq!(init().check(64, 64), Ok(()));
        for s in [0.0, -1.0, 1.01, f64::NAN] {
            assert!(InitSpec { strength: s, ..init() }.check(64, 64).unwrap_err().contains("strength"));
        }
        assert!(InitSpec { sha256: "x".into(), ..init() }.check(64, 64).unwrap_err().contains("sha256"));
        assert!(InitSpec { mask_blur: Some(4), ..init() }.check(64, 64).unwrap_err().contains("without a mask"));
        let m = InitSpec { mask_sha256: Some("0".repeat(64)), mask_blur: Some(4), ..init() };
        assert_eq!(m.check(64, 64), Ok(()));
        assert!(InitSpec { mask_blur: Some(999), ..m.clone() }.check(64, 64).unwrap_err().contains("blur"));
        let o = InitSpec { outpaint: Some([16, 0, 16, 8]), mask_blur: Some(0), ..init() };
        assert_eq!(o.check(64, 64), Ok(()));
        assert_eq!(o.inner(64, 64), (16, 0, 32, 56));
        assert!(o.check(32, 64).unwrap_err().contains("outpaint"));
        assert!(InitSpec { outpaint: Some([0; 4]), ..o }.check(64, 64).is_err());
    }

    #[test]
    fn hires_rules() {
        let h = HiresSpec { scale: 1.5, strength: 0.7, steps: 20, upscaler: Upscaler::Latent };
        assert_eq!(h.size(1024, 768), (1536, 1152));
        assert_eq!(HiresSpec { scale: 1.3, ..h.clone() }.size(100 * 16, 16), (2080, 16));
        assert_eq!(h.check(1024, 768), Ok(()));
        assert!(h.check(4096, 64).unwrap_err().contains("hires size"));
        assert!(HiresSpec { scale: 0.5, ..h.clone() }.check(64, 64).is_err());
        assert!(HiresSpec { steps: 0, ..h.clone() }.check(64, 64).is_err());
        assert!(HiresSpec { strength: 0.0, ..h }.check(64, 64).is_err());
        assert_eq!("Lanczos".parse::<Upscaler>(), Ok(Upscaler::Lanczos));
        assert!("nearest".parse::<Upscaler>().unwrap_err().contains("latent or lanczos"));
        assert_eq!(serde_json::to_value(Upscaler::Latent).unwrap(), "latent");
    }
}
