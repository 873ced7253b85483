//! `generate`'s flags for pictures from pictures (spec 7.4): img2img, inpainting, outpainting,
//! the hires fix. Mapped onto the spec in `generate.rs` (`spec_of_flags`, `init_of_flags`).

use clap::Args;
use moss::spec::{Upscaler, DEFAULT_HIRES_STRENGTH, DEFAULT_MASK_BLUR, DEFAULT_STRENGTH, MAX_HIRES_SCALE};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct PicturesInArgs {
    /// Start from this picture (img2img; PNG, JPEG or WebP). One of another size is resized to
    /// --size with Lanczos3; without --size the picture's own size is used (each side down to a
    /// multiple of 16).
    #[arg(long, value_name = "PATH")]
    pub init_image: Option<PathBuf>,
    /// How much of the schedule runs from the init image, in (0, 1]: 1 starts from pure noise
    /// (the text-to-image picture where nothing is kept), small values keep more of the picture.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_STRENGTH, value_parser = parse_strength)]
    pub strength: f64,
    /// Repaint only where this mask is white (black keeps; grey binarised at half); a PNG with
    /// transparency is read by its alpha (transparent repaints). The init image's size.
    #[arg(long, value_name = "PATH")]
    pub mask: Option<PathBuf>,
    /// The mask's feather in the final picture: a Gaussian blur of this many pixels; outside it
    /// the init image's own pixels are kept.
    #[arg(long, value_name = "PX", default_value_t = DEFAULT_MASK_BLUR, value_parser = clap::value_parser!(u32).range(0..=moss::spec::MAX_MASK_BLUR as i64))]
    pub mask_blur: u32,
    /// Outpaint: pad the init image by LEFT,TOP,RIGHT,BOTTOM pixels and paint the border (the
    /// canvas is --size, or the picture's size plus the border). Strength defaults to 1 here.
    #[arg(long, value_name = "L,T,R,B", value_parser = parse_outpaint)]
    pub outpaint: Option<[u32; 4]>,
    /// Hires fix: render at --size, enlarge by SCALE (1..4; sides to the nearest multiple of 16),
    /// then img2img at the larger size.
    #[arg(long, value_name = "SCALE", value_parser = parse_scale)]
    pub hires: Option<f64>,
    /// The hires pass's strength, in (0, 1].
    #[arg(long, value_name = "S", default_value_t = DEFAULT_HIRES_STRENGTH, value_parser = parse_strength)]
    pub hires_strength: f64,
    /// The hires pass's steps [default: --steps].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub hires_steps: Option<u32>,
    /// How the hires fix enlarges: latent (the latents, bilinear) or lanczos (the decoded
    /// picture, Lanczos3, encoded again).
    #[arg(long, value_name = "NAME", default_value_t = Upscaler::Latent, value_parser = parse_upscaler)]
    pub hires_upscaler: Upscaler,
}

impl PicturesInArgs {
    /// The first flag of a picture in given without `--init-image` (`--from` may bring one).
    pub fn stray_flag(&self, given: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        if self.init_image.is_some() {
            return None;
        }
        [("--strength", "strength"), ("--mask", "mask"), ("--mask-blur", "mask_blur"), ("--outpaint", "outpaint")].into_iter().find(|f| given(f.1)).map(|f| f.0)
    }

    /// The first hires flag given without `--hires`.
    pub fn stray_hires_flag(&self, given: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        if self.hires.is_some() {
            return None;
        }
        [("--hires-strength", "hires_strength"), ("--hires-steps", "hires_steps"), ("--hires-upscaler", "hires_upscaler")]
            .into_iter()
            .find(|f| given(f.1))
            .map(|f| f.0)
    }
}

fn parse_strength(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    moss::spec::check_strength("strength", v)?;
    Ok(v)
}

fn parse_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (1.0..=MAX_HIRES_SCALE).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a scale from 1 to {MAX_HIRES_SCALE}")),
    }
}

fn parse_upscaler(s: &str) -> Result<Upscaler, String> {
    s.parse()
}

fn parse_outpaint(s: &str) -> Result<[u32; 4], String> {
    let v: Vec<u32> =
        s.split(',').map(|p| p.trim().parse::<u32>()).collect::<Result<_, _>>().map_err(|_| format!("`{s}` is not LEFT,TOP,RIGHT,BOTTOM pixels"))?;
    let v: [u32; 4] = v.try_into().map_err(|_| format!("`{s}` is not four numbers LEFT,TOP,RIGHT,BOTTOM"))?;
    if v.iter().any(|&p| p > moss::options::MAX_SIDE) {
        return Err(format!("`{s}`: a border is at most {} pixels", moss::options::MAX_SIDE));
    }
    if v == [0; 4] {
        return Err("--outpaint 0,0,0,0 adds no border".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse_strength("0.6"), Ok(0.6));
        assert!(parse_strength("0").is_err() && parse_strength("1.5").is_err() && parse_strength("x").is_err());
        assert_eq!(parse_outpaint("64,0, 64,32"), Ok([64, 0, 64, 32]));
        assert!(parse_outpaint("1,2,3").is_err() && parse_outpaint("0,0,0,0").is_err() && parse_outpaint("-1,0,0,0").is_err());
        assert_eq!(parse_scale("1.5"), Ok(1.5));
        assert!(parse_scale("0.5").is_err() && parse_scale("5").is_err() && parse_scale("nan").is_err());
    }
}
