//! A run that starts from a picture (spec 7.4): img2img (`--init-image`, `--strength`),
//! inpainting (`--mask`, `--mask-blur`) and outpainting (`--outpaint`).
//!
//! - The inputs are read once ([`Input`]: the bytes' sha256, which the picture's spec records,
//!   and the picture decoded under [`crate::picture_in::decode_image`]'s limits).
//! - [`PicturesIn::prepare`] puts them at the spec's size ([`Prepared`]): a picture of another
//!   size is resized with Lanczos3 (the `image` crate's), the mask likewise; outpainting places
//!   the picture inside the canvas, its edge pixels repeated over the border, which the mask
//!   repaints.
//! - The mask's values: 255 = repaint. A mask with an alpha channel that is not opaque everywhere
//!   is read by its alpha (transparent = repaint, as OpenAI's edits read it); otherwise by its
//!   grey level (white = repaint; colour as PIL's `convert("L")`).
//! - The run: the VAE encoder's latents ([`encode_picture`]), the schedule from
//!   [`crate::img2img::start_index`], the seed's noise mixed in ([`crate::img2img::noised`]),
//!   and with a mask the latent blend after every step ([`crate::img2img::Inpaint`]).
//! - The final picture keeps the input outside the mask: [`Prepared::composite`] blends the
//!   decoded pixels over the input with the binarised mask, Gaussian-blurred by the mask blur,
//!   as the feather (`round((f·out + (255 − f)·in) / 255)`: where the feather is 0, the input's
//!   own bytes).

use crate::backend::ops::VaeEncodeOps;
use crate::checkpoint::Checkpoint;
use crate::model::vae::{pixels_from_rgb8, VaeEncoder};
use crate::spec::{InitSpec, PictureSpec};
use crate::tensor::Tensor;
use anyhow::{bail, Context, Result};
use image::{DynamicImage, GrayImage, RgbImage};
use std::path::{Path, PathBuf};

/// The resampling filter of every resize of a picture in.
pub const RESIZE_FILTER: image::imageops::FilterType = image::imageops::FilterType::Lanczos3;

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// One picture in, as read: what it is called in messages, its file (for the input check), the
/// sha256 of its bytes, and the picture.
#[derive(Clone, Debug)]
pub struct Input {
    pub what: String,
    pub path: Option<PathBuf>,
    pub sha256: String,
    pub image: DynamicImage,
}

impl Input {
    /// The file at `path` (`what`: the flag, "--init-image").
    pub fn read(path: &Path, what: &str) -> Result<Input> {
        let bytes = crate::bounded::read_bounded(path, crate::bounded::MAX_PICTURE, what)?;
        Input::from_bytes(&bytes, &format!("{what} {}", path.display()), Some(path.to_path_buf()))
    }

    /// A picture's bytes (a file's, or an upload's).
    pub fn from_bytes(bytes: &[u8], what: &str, path: Option<PathBuf>) -> Result<Input> {
        let image = crate::picture_in::decode_image(bytes).with_context(|| what.to_string())?;
        Ok(Input { what: what.to_string(), path, sha256: sha256_hex(bytes), image })
    }

    pub fn size(&self) -> (u32, u32) {
        (self.image.width(), self.image.height())
    }
}

/// The pictures a run starts from: the init image and its mask.
#[derive(Clone, Debug)]
pub struct PicturesIn {
    pub image: Input,
    pub mask: Option<Input>,
}

impl PicturesIn {
    /// The two pictures; a mask must have the init image's size.
    pub fn new(image: Input, mask: Option<Input>) -> Result<PicturesIn> {
        if let Some(m) = &mask {
            let ((iw, ih), (mw, mh)) = (image.size(), m.size());
            if (iw, ih) != (mw, mh) {
                bail!("{} is {mw}x{mh} but the init image is {iw}x{ih}: a mask must be the init image's size", m.what);
            }
        }
        Ok(PicturesIn { image, mask })
    }

    /// The spec's record of these pictures. `mask_blur` applies where there is a mask (a mask
    /// file or an outpainting border); `outpaint`: left, top, right, bottom.
    pub fn spec(&self, strength: f64, mask_blur: u32, outpaint: Option<[u32; 4]>) -> InitSpec {
        let masked = self.mask.is_some() || outpaint.is_some();
        InitSpec {
            sha256: self.image.sha256.clone(),
            strength,
            mask_sha256: self.mask.as_ref().map(|m| m.sha256.clone()),
            mask_blur: masked.then_some(mask_blur),
            outpaint,
        }
    }

    /// The size a run takes when none is given: the picture's (with the outpainting border),
    /// each side down to a multiple of 16.
    pub fn natural_size(&self, outpaint: Option<[u32; 4]>) -> Result<(u32, u32)> {
        let (w, h) = self.image.size();
        let [l, t, r, b] = outpaint.unwrap_or_default();
        let (cw, ch) = ((w + l + r) / 16 * 16, (h + t + b) / 16 * 16);
        crate::options::check_size(cw, ch)
            .map_err(|e| anyhow::anyhow!("{} is {w}x{h}, which gives no picture size ({e}): give --size (it is resized to it)", self.image.what))?;
        Ok((cw, ch))
    }

    /// The pictures at `spec`'s size, as its `init_image` says (which must name these pictures).
    pub fn prepare(&self, spec: &PictureSpec) -> Result<Prepared> {
        let Some(init) = &spec.init_image else { bail!("the spec starts from no picture") };
        if init.sha256 != self.image.sha256 {
            bail!("{} is not the init image the settings name (sha256 {}, named {})", self.image.what, self.image.sha256, init.sha256);
        }
        if init.mask_sha256.as_ref() != self.mask.as_ref().map(|m| &m.sha256) {
            bail!("the mask given and the mask the settings name differ");
        }
        let (width, height) = (spec.width, spec.height);
        let (x, y, iw, ih) = init.inner(width, height);
        let inner = resized_rgb(&self.image.image, iw, ih);
        let inner_mask = self.mask.as_ref().map(|m| resized_grey(&repaint_values(&m.image), iw, ih));
        let (rgb, mask) = match init.outpaint {
            None => (inner.into_raw(), inner_mask.map(GrayImage::into_raw)),
            Some(_) => {
                // The border repeats the picture's edge pixels and is repainted.
                let (sx, sy) = (|cx: u32| cx.saturating_sub(x).min(iw - 1), |cy: u32| cy.saturating_sub(y).min(ih - 1));
                let canvas = RgbImage::from_fn(width, height, |cx, cy| *inner.get_pixel(sx(cx), sy(cy)));
                let inside = |cx: u32, cy: u32| cx >= x && cx < x + iw && cy >= y && cy < y + ih;
                let m = GrayImage::from_fn(width, height, |cx, cy| match (&inner_mask, inside(cx, cy)) {
                    (_, false) => image::Luma([255]),
                    (Some(m), true) => *m.get_pixel(cx - x, cy - y),
                    (None, true) => image::Luma([0]),
                });
                (canvas.into_raw(), Some(m.into_raw()))
            }
        };
        let feather = mask.as_ref().map(|m| feather(m, width, height, init.mask_blur.unwrap_or(0)));
        let named = [("the init image", Some(&self.image)), ("the mask", self.mask.as_ref())];
        let inputs = named.iter().filter_map(|&(what, i)| Some((what, i.and_then(|i| i.path.clone())?))).collect();
        Ok(Prepared { width, height, strength: init.strength, rgb, mask, feather, inputs })
    }
}

/// The run's pictures at its size.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    pub width: u32,
    pub height: u32,
    pub strength: f64,
    /// The canvas, RGB8 rows.
    pub rgb: Vec<u8>,
    /// The mask at the canvas size, 255 = repaint (before binarising).
    pub mask: Option<Vec<u8>>,
    /// The binarised mask blurred by the mask blur: the final blend's weight of the rendered pixels.
    pub feather: Option<Vec<u8>>,
    /// The files read (`what`, path): no output may be one of them.
    pub inputs: Vec<(&'static str, PathBuf)>,
}

impl Prepared {
    /// The encoder's input `[1, 3, H, W]`.
    pub fn pixels(&self) -> Result<Tensor> {
        pixels_from_rgb8(&self.rgb, self.width as usize, self.height as usize)
    }

    /// The mask at the latent grid `h × w` ([`crate::img2img::latent_mask`]), if there is one.
    pub fn latent_mask(&self, h: usize, w: usize) -> Result<Option<Tensor>> {
        self.mask.as_ref().map(|m| crate::img2img::latent_mask(m, self.width as usize, self.height as usize, h, w)).transpose()
    }

    /// The final picture: the rendered `rgb` over the input, weighted by the feather (no change
    /// without a mask).
    pub fn composite(&self, rgb: &mut [u8]) -> Result<()> {
        let Some(f) = &self.feather else {
            return Ok(());
        };
        anyhow::ensure!(rgb.len() == self.rgb.len(), "composite: {} bytes rendered for a {}x{} picture", rgb.len(), self.width, self.height);
        for (i, (o, &src)) in rgb.iter_mut().zip(&self.rgb).enumerate() {
            let w = f[i / 3] as u32;
            *o = ((w * *o as u32 + (255 - w) * src as u32 + 127) / 255) as u8;
        }
        Ok(())
    }
}

/// The mask's values, 255 = repaint: by its alpha where it has transparency, else its grey
/// level (colour as PIL's `convert("L")`: `(19595·R + 38470·G + 7471·B + 2^15) >> 16`).
pub fn repaint_values(m: &DynamicImage) -> GrayImage {
    if m.color().has_alpha() {
        let rgba = m.to_rgba8();
        if rgba.pixels().any(|p| p[3] < 255) {
            return GrayImage::from_fn(m.width(), m.height(), |x, y| image::Luma([255 - rgba.get_pixel(x, y)[3]]));
        }
    }
    if matches!(m.color(), image::ColorType::L8 | image::ColorType::La8 | image::ColorType::L16 | image::ColorType::La16) {
        return m.to_luma8();
    }
    let rgb = m.to_rgb8();
    GrayImage::from_fn(m.width(), m.height(), |x, y| {
        let [r, g, b] = rgb.get_pixel(x, y).0;
        image::Luma([((19595 * r as u32 + 38470 * g as u32 + 7471 * b as u32 + 0x8000) >> 16) as u8])
    })
}

fn resized_rgb(img: &DynamicImage, w: u32, h: u32) -> RgbImage {
    let rgb = img.to_rgb8();
    if rgb.dimensions() == (w, h) {
        return rgb;
    }
    image::imageops::resize(&rgb, w, h, RESIZE_FILTER)
}

fn resized_grey(m: &GrayImage, w: u32, h: u32) -> GrayImage {
    if m.dimensions() == (w, h) {
        return m.clone();
    }
    image::imageops::resize(m, w, h, RESIZE_FILTER)
}

/// The mask binarised at half (`v/255 >= 0.5`, as the latent mask is) and blurred with a
/// Gaussian of `blur` pixels (none at 0).
pub fn feather(mask: &[u8], width: u32, height: u32, blur: u32) -> Vec<u8> {
    let bin = GrayImage::from_fn(width, height, |x, y| image::Luma([if mask[(y * width + x) as usize] >= 128 { 255 } else { 0 }]));
    if blur == 0 {
        return bin.into_raw();
    }
    image::imageops::blur(&bin, blur as f32).into_raw()
}

/// The VAE encoder's latents of the prepared picture.
pub fn encode_picture<B: VaeEncodeOps>(b: &B, ck: &Checkpoint, p: &Prepared) -> Result<Tensor> {
    let comp = ck.open_component("vae")?;
    b.plan_vae_encode(&comp, &ck.vae, p.height as usize, p.width as usize)?;
    let enc = VaeEncoder::load(b, &comp, &ck.vae)?;
    enc.encode(b, &p.pixels()?)
}

/// Where a denoising run starts: the encoded picture, the strength, and the mask at the latent
/// grid (inpainting).
#[derive(Clone, Debug)]
pub struct Start {
    pub z0: Tensor,
    pub strength: f64,
    pub mask: Option<Tensor>,
}

impl Start {
    /// The start of `p`'s run from its latents `z0`.
    pub fn of(p: &Prepared, z0: Tensor) -> Result<Start> {
        anyhow::ensure!(z0.shape.len() == 4, "init latents {:?}", z0.shape);
        let mask = p.latent_mask(z0.shape[2], z0.shape[3])?;
        Ok(Start { z0, strength: p.strength, mask })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(img: DynamicImage, tag: &str) -> Input {
        Input { what: tag.into(), path: None, sha256: sha256_hex(tag.as_bytes()), image: img }
    }

    fn spec(p: &PicturesIn, w: u32, h: u32, blur: u32, outpaint: Option<[u32; 4]>) -> PictureSpec {
        PictureSpec { width: w, height: h, init_image: Some(p.spec(0.5, blur, outpaint)), ..Default::default() }
    }

    #[test]
    fn masks_by_alpha_or_grey() {
        // Opaque RGBA: the grey level; a transparent pixel: the alpha.
        let opaque = image::RgbaImage::from_fn(2, 1, |x, _| image::Rgba(if x == 0 { [255, 255, 255, 255] } else { [0, 0, 0, 255] }));
        assert_eq!(repaint_values(&DynamicImage::ImageRgba8(opaque.clone())).into_raw(), vec![255, 0]);
        let mut holed = opaque;
        holed.put_pixel(1, 0, image::Rgba([0, 0, 0, 0]));
        holed.put_pixel(0, 0, image::Rgba([255, 255, 255, 255]));
        assert_eq!(repaint_values(&DynamicImage::ImageRgba8(holed)).into_raw(), vec![0, 255]);
        // Colour as PIL's convert("L") (PIL: 76 for pure red, 150 green, 29 blue).
        let rgb = image::RgbImage::from_fn(3, 1, |x, _| image::Rgb([[255, 0, 0], [0, 255, 0], [0, 0, 255]][x as usize]));
        assert_eq!(repaint_values(&DynamicImage::ImageRgb8(rgb)).into_raw(), vec![76, 150, 29]);
    }

    #[test]
    fn mask_size_must_match_and_the_spec_must_name_the_pictures() {
        let img = input(DynamicImage::new_rgb8(32, 16), "a");
        let e = PicturesIn::new(img.clone(), Some(input(DynamicImage::new_luma8(16, 16), "--mask m.png"))).unwrap_err();
        assert!(e.to_string().contains("--mask m.png is 16x16 but the init image is 32x16: a mask must be"), "{e}");
        let p = PicturesIn::new(img.clone(), None).unwrap();
        let mut s = spec(&p, 32, 16, 4, None);
        assert_eq!(s.init_image.as_ref().unwrap().mask_blur, None, "no mask, no blur recorded");
        assert!(p.prepare(&s).is_ok());
        s.init_image.as_mut().unwrap().sha256 = "0".repeat(64);
        assert!(p.prepare(&s).unwrap_err().to_string().contains("not the init image"));
    }

    #[test]
    fn resized_with_lanczos_and_sized_from_the_picture() {
        let grad = DynamicImage::ImageRgb8(image::RgbImage::from_fn(40, 20, |x, y| image::Rgb([(x * 6) as u8, (y * 12) as u8, 7])));
        let p = PicturesIn::new(input(grad.clone(), "g"), None).unwrap();
        assert_eq!(p.natural_size(None).unwrap(), (32, 16));
        assert_eq!(p.natural_size(Some([8, 0, 8, 12])).unwrap(), (48, 32));
        let prep = p.prepare(&spec(&p, 64, 32, 0, None)).unwrap();
        let want = image::imageops::resize(&grad.to_rgb8(), 64, 32, image::imageops::FilterType::Lanczos3).into_raw();
        assert_eq!(prep.rgb, want);
        let tiny = PicturesIn::new(input(DynamicImage::new_rgb8(8, 8), "t"), None).unwrap();
        assert!(tiny.natural_size(None).unwrap_err().to_string().contains("give --size"));
    }

    /// All keep: the input's bytes exactly; all repaint: the rendered bytes; a blurred edge blends.
    #[test]
    fn composite_keeps_the_input_outside_the_feather() {
        let (w, h) = (32u32, 16u32);
        let src = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8 * 7, y as u8 * 13, 200]));
        let keep = GrayImage::new(w, h);
        let p = PicturesIn::new(input(DynamicImage::ImageRgb8(src.clone()), "i"), Some(input(DynamicImage::ImageLuma8(keep), "m"))).unwrap();
        let prep = p.prepare(&spec(&p, w, h, 4, None)).unwrap();
        let mut out = vec![9u8; (w * h * 3) as usize];
        prep.composite(&mut out).unwrap();
        assert_eq!(out, src.clone().into_raw(), "an all-keep mask returns the input");
        // The right half repainted, blur 2: far from the edge each side is its own.
        let half = GrayImage::from_fn(w, h, |x, _| image::Luma([if x >= 16 { 255 } else { 0 }]));
        let p = PicturesIn::new(input(DynamicImage::ImageRgb8(src.clone()), "i"), Some(input(DynamicImage::ImageLuma8(half), "m2"))).unwrap();
        let prep = p.prepare(&spec(&p, w, h, 2, None)).unwrap();
        let mut out = vec![9u8; (w * h * 3) as usize];
        prep.composite(&mut out).unwrap();
        let f = prep.feather.as_ref().unwrap();
        for y in 0..h {
            for x in 0..w {
                let i = ((y * w + x) * 3) as usize;
                match f[(y * w + x) as usize] {
                    0 => assert_eq!(&out[i..i + 3], &src.get_pixel(x, y).0, "({x},{y}) outside the feather"),
                    255 => assert_eq!(&out[i..i + 3], &[9, 9, 9], "({x},{y}) inside"),
                    _ => assert!((10..22).contains(&x), "({x},{y}): the feather is the edge's"),
                }
            }
        }
        assert_eq!(f[0], 0);
        assert_eq!(f[(w - 1) as usize], 255);
    }

    #[test]
    fn outpaint_pads_and_masks_the_border() {
        let src = image::RgbImage::from_fn(16, 16, |x, y| image::Rgb([x as u8, y as u8, 1]));
        let p = PicturesIn::new(input(DynamicImage::ImageRgb8(src.clone()), "i"), None).unwrap();
        let prep = p.prepare(&spec(&p, 48, 32, 0, Some([16, 0, 16, 16]))).unwrap();
        let m = prep.mask.as_ref().unwrap();
        let at = |x: u32, y: u32| (y * 48 + x) as usize;
        assert_eq!((m[at(0, 0)], m[at(16, 0)], m[at(31, 15)], m[at(32, 0)], m[at(20, 16)]), (255, 0, 0, 255, 255));
        assert_eq!(&prep.rgb[at(16, 0) * 3..at(16, 0) * 3 + 3], &[0, 0, 1]);
        assert_eq!(&prep.rgb[at(0, 31) * 3..at(0, 31) * 3 + 3], &[0, 15, 1], "the corner repeats the nearest edge pixel");
    }
}
