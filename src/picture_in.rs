//! Pictures coming in: every picture moss reads (`moss info`, `generate --from`, and pictures given
//! as input) goes through this module, under fixed bounds, so a hostile file is refused in one
//! line instead of aborting or ballooning the process.
//!
//! - The file: at most [`crate::bounded::MAX_PICTURE`] bytes, read once.
//! - Its metadata ([`metadata`]): read without decoding a pixel (PNG text chunks around the image
//!   data, which is skipped unread; the EXIF block of a JPEG or WebP). A compressed text chunk
//!   inflates to at most [`MAX_TEXT`] bytes, all of them together to at most [`MAX_TEXTS`].
//! - Its pixels ([`decode_limited`], the one function that decodes a picture): at most
//!   [`MAX_SIDE`] pixels a side, checked from the header before anything is allocated, and the
//!   `image` crate's decoders under [`limits`] ([`MAX_ALLOC`] bytes of decoder allocations, the
//!   decoded picture included).

use crate::bounded::{read_bounded, size_text, MAX_PICTURE};
use crate::picture::{sniff, Format};
use crate::png::Metadata;
use anyhow::{bail, Context, Result};
use image::ImageDecoder;
use std::io::Cursor;
use std::path::Path;

/// The longest side of a picture moss decodes: twice the largest picture it makes
/// ([`crate::options::MAX_SIDE`]), room for any camera's or screen's picture.
pub const MAX_SIDE: u32 = 8192;
/// What the decoders may allocate for one picture: a [`MAX_SIDE`]-square picture of 8-bit RGBA.
pub const MAX_ALLOC: u64 = 256 << 20;
/// The longest one compressed text chunk (zTXt, compressed iTXt) may inflate to.
pub const MAX_TEXT: usize = 16 << 20;
/// The most the text chunks of one picture may hold together (inflated), and the most a PNG
/// decoder may keep of its chunks, or an EXIF block may be.
pub const MAX_TEXTS: usize = 64 << 20;

/// The `image` crate's limits for decoding pixels.
pub fn limits() -> image::Limits {
    let mut l = image::Limits::default();
    l.max_image_width = Some(MAX_SIDE);
    l.max_image_height = Some(MAX_SIDE);
    l.max_alloc = Some(MAX_ALLOC);
    l
}

fn image_format(f: Format) -> image::ImageFormat {
    match f {
        Format::Png => image::ImageFormat::Png,
        Format::Jpeg => image::ImageFormat::Jpeg,
        Format::Webp => image::ImageFormat::WebP,
    }
}

/// Decode a PNG, JPEG or WebP picture to RGB8 under [`limits`]: a side above [`MAX_SIDE`] is
/// refused from the header, before any pixel is allocated.
pub fn decode_limited(bytes: &[u8]) -> Result<image::RgbImage> {
    Ok(decode_image(bytes)?.to_rgb8())
}

/// [`decode_limited`], keeping the picture's channels (a mask's alpha).
pub fn decode_image(bytes: &[u8]) -> Result<image::DynamicImage> {
    let Some(format) = sniff(bytes) else { bail!("not a PNG, JPEG or WebP picture") };
    let reader = || {
        let mut r = image::ImageReader::with_format(Cursor::new(bytes), image_format(format));
        r.limits(limits());
        r
    };
    let mut unlimited = image::ImageReader::with_format(Cursor::new(bytes), image_format(format));
    unlimited.no_limits();
    let (w, h) = unlimited.into_dimensions().map_err(|e| anyhow::anyhow!("the {} header does not read: {e}", format.name()))?;
    if w > MAX_SIDE || h > MAX_SIDE {
        bail!("the picture is {w}x{h}; moss reads pictures of at most {MAX_SIDE} pixels a side");
    }
    if w == 0 || h == 0 {
        bail!("the picture is {w}x{h}, an empty picture");
    }
    let img = reader().decode().map_err(|e| match e {
        image::ImageError::Limits(_) => {
            anyhow::anyhow!("the {w}x{h} {} needs more than the {} moss gives a picture's decoding", format.name(), size_text(MAX_ALLOC))
        }
        e => anyhow::anyhow!("the {} does not decode: {e}", format.name()),
    })?;
    Ok(img)
}

/// [`decode_limited`] of the picture file `path` (`what` it is, for messages: `the init image`).
pub fn read_picture(path: &Path, what: &str) -> Result<image::RgbImage> {
    let bytes = read_bounded(path, MAX_PICTURE, what)?;
    decode_limited(&bytes).with_context(|| format!("{what} {}", path.display()))
}

/// A picture file as RGB8 (row-major HWC; an alpha channel dropped, grey expanded, 16-bit channels
/// scaled to 8): `(pixels, width, height)`.
pub fn read_rgb8(path: &Path, what: &str) -> Result<(Vec<u8>, u32, u32)> {
    let rgb = read_picture(path, what)?;
    let (w, h) = rgb.dimensions();
    Ok((rgb.into_raw(), w, h))
}

/// The metadata of the picture file `path` (`moss info`, `generate --from`), no pixel decoded.
pub fn read_metadata(path: &Path) -> Result<Metadata> {
    let bytes = read_bounded(path, MAX_PICTURE, "picture")?;
    metadata(&bytes).with_context(|| format!("{} is not a picture moss can read", path.display()))
}

/// A picture's metadata by its bytes' format, without decoding its pixels.
pub fn metadata(bytes: &[u8]) -> Result<Metadata> {
    match sniff(bytes) {
        Some(Format::Png) => png_text(bytes),
        Some(Format::Jpeg) => {
            let d = image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes))?;
            exif_of(d)
        }
        Some(Format::Webp) => {
            let d = image::codecs::webp::WebPDecoder::new(Cursor::new(bytes))?;
            exif_of(d)
        }
        None => bail!("not a PNG, JPEG or WebP picture"),
    }
}

/// The EXIF block of a JPEG or WebP decoder (headers read, no pixel), as metadata.
fn exif_of(mut d: impl ImageDecoder) -> Result<Metadata> {
    // Only an allocation bound: a picture too large to decode still has metadata to read.
    let mut l = image::Limits::default();
    l.max_alloc = Some(MAX_TEXTS as u64);
    d.set_limits(l)?;
    match d.exif_metadata()? {
        Some(tiff) => crate::picture::from_exif(&tiff),
        None => Ok(Metadata::default()),
    }
}

/// The text chunks (tEXt, zTXt, iTXt) before and after the image data of a PNG; the image data
/// is skipped, not inflated.
fn png_text(bytes: &[u8]) -> Result<Metadata> {
    let dec = png::Decoder::new_with_limits(Cursor::new(bytes), png::Limits { bytes: MAX_TEXTS });
    let mut reader = dec.read_info().map_err(png_error)?;
    reader.finish().map_err(png_error)?;
    let i = reader.info();
    let mut meta = Metadata::default();
    let mut budget = MAX_TEXTS;
    let mut take = |key: &str, text: String, meta: &mut Metadata| -> Result<()> {
        budget = budget.checked_sub(text.len()).with_context(|| format!("the PNG's text chunks hold more than {} together", size_text(MAX_TEXTS as u64)))?;
        meta.push(key, text);
        Ok(())
    };
    for t in &i.uncompressed_latin1_text {
        take(&t.keyword, t.text.clone(), &mut meta)?;
    }
    let inflated = |key: &str, e: png::DecodingError| {
        if e.to_string().contains("decompression space") {
            anyhow::anyhow!("PNG text chunk `{key}` inflates past {}, the most moss reads of one", size_text(MAX_TEXT as u64))
        } else {
            anyhow::anyhow!("PNG text chunk `{key}` is damaged: {e}")
        }
    };
    for t in &i.compressed_latin1_text {
        let mut t = t.clone();
        t.decompress_text_with_limit(MAX_TEXT).map_err(|e| inflated(&t.keyword, e))?;
        let text = t.get_text().map_err(|e| inflated(&t.keyword, e))?;
        take(&t.keyword, text, &mut meta)?;
    }
    for t in &i.utf8_text {
        let mut t = t.clone();
        t.decompress_text_with_limit(MAX_TEXT).map_err(|e| inflated(&t.keyword, e))?;
        let text = t.get_text().map_err(|e| inflated(&t.keyword, e))?;
        take(&t.keyword, text, &mut meta)?;
    }
    Ok(meta)
}

fn png_error(e: png::DecodingError) -> anyhow::Error {
    match e {
        png::DecodingError::LimitsExceeded => {
            anyhow::anyhow!("the PNG's chunks hold more than the {} moss reads of a picture's metadata", size_text(MAX_TEXTS as u64))
        }
        e => anyhow::anyhow!("the PNG does not read: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG of `w` x `h` (its IHDR claims them; the image data is one row of zeros).
    fn png_claiming(w: u32, h: u32) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, 1, 1);
            enc.set_color(png::ColorType::Rgb);
            let mut wr = enc.write_header().unwrap();
            wr.write_image_data(&[0, 0, 0]).unwrap();
        }
        // IHDR's width and height sit at bytes 16..24; its CRC at 29..33.
        out[16..20].copy_from_slice(&w.to_be_bytes());
        out[20..24].copy_from_slice(&h.to_be_bytes());
        let crc = crc32fast::hash(&out[12..29]);
        out[29..33].copy_from_slice(&crc.to_be_bytes());
        out
    }

    #[test]
    fn sides_above_the_limit_are_refused_from_the_header() {
        let e = decode_limited(&png_claiming(100_000, 50)).unwrap_err().to_string();
        assert!(e.contains("100000x50") && e.contains("8192"), "{e}");
        let e = decode_limited(&png_claiming(MAX_SIDE + 1, 1)).unwrap_err().to_string();
        assert!(e.contains("at most 8192"), "{e}");
        // The metadata of such a picture reads (nothing of its pixels is needed).
        assert_eq!(metadata(&png_claiming(100_000, 2_000_000_000)).unwrap(), Metadata::default());
        assert!(decode_limited(b"GIF89a").is_err());
    }

    #[test]
    fn a_picture_within_the_limits_decodes() {
        let rgb: Vec<u8> = (0..16 * 8 * 3).map(|i| i as u8).collect();
        let mut m = Metadata::default();
        m.push("moss", "{}");
        let bytes = crate::png::encode(&rgb, 16, 8, &m).unwrap();
        let img = decode_limited(&bytes).unwrap();
        assert_eq!((img.width(), img.height()), (16, 8));
        assert_eq!(img.into_raw(), rgb);
        assert_eq!(metadata(&bytes).unwrap(), m);
    }
}
