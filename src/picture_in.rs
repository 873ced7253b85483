//! Pictures in (init images, masks, `moss encode --image`): every picture moss reads goes
//! through [`decode_limited`], the `image` crate's decoders (PNG, JPEG, WebP, told apart by
//! their bytes, not the file name) under [`image::Limits`]: at most [`MAX_SIDE_IN`] pixels a side
//! and [`MAX_ALLOC`] bytes of decoder memory, so a decompression bomb or an absurd header is one
//! line of error before any large allocation.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// The largest width or height a picture read may have (the encoder's own cap, spec 8's 4096,
/// is checked by its caller; larger pictures may still be read to be scaled down).
pub const MAX_SIDE_IN: u32 = 8192;
/// The most bytes a decoder may allocate: an 8192x8192 RGBA picture with 16-bit channels.
pub const MAX_ALLOC: u64 = 8192 * 8192 * 8;

/// Decode `bytes` (PNG, JPEG or WebP) within the limits; `what` names the input in errors
/// ("--image a.png").
pub fn decode_limited(bytes: &[u8], what: &str) -> Result<image::DynamicImage> {
    let reader = image::ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().with_context(|| format!("{what}: cannot read"))?;
    let Some(format) = reader.format() else {
        bail!("{what} is not a picture moss reads (PNG, JPEG or WebP)");
    };
    let name = match format {
        image::ImageFormat::Png => "PNG",
        image::ImageFormat::Jpeg => "JPEG",
        image::ImageFormat::WebP => "WebP",
        f => bail!("{what} is a {f:?} picture; moss reads PNG, JPEG and WebP"),
    };
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE_IN);
    limits.max_image_height = Some(MAX_SIDE_IN);
    limits.max_alloc = Some(MAX_ALLOC);
    let mut reader = reader;
    reader.limits(limits);
    reader.decode().map_err(|e| match e {
        image::ImageError::Limits(l) => anyhow::anyhow!("{what}: the picture is too large to read ({l}; at most {MAX_SIDE_IN}x{MAX_SIDE_IN} pixels)"),
        e => anyhow::anyhow!("{what} is not a readable {name} picture: {e}"),
    })
}

/// A picture file as RGB8 (row-major HWC; an alpha channel is dropped, grey expanded, 16-bit
/// channels scaled to 8): `(pixels, width, height)`.
pub fn read_rgb8(path: &Path, what: &str) -> Result<(Vec<u8>, u32, u32)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))?;
    let img = decode_limited(&bytes, &format!("{what} {}", path.display()))?;
    let rgb = img.to_rgb8();
    let (w, h) = rgb.dimensions();
    Ok((rgb.into_raw(), w, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_of(w: u32, h: u32, rgb: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(png::ColorType::Rgb);
        e.write_header().unwrap().write_image_data(rgb).unwrap();
        out
    }

    #[test]
    fn reads_png_and_refuses_what_it_should() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| i as u8).collect();
        let img = decode_limited(&png_of(4, 3, &rgb), "test").unwrap();
        assert_eq!(img.to_rgb8().into_raw(), rgb);
        let e = decode_limited(b"hello, not a picture", "--image x").unwrap_err().to_string();
        assert!(e.contains("not a picture"), "{e}");
        // A header claiming 9000x9000: refused by the limits before the pixels are allocated.
        let big = png_of(9000, 1, &vec![0u8; 9000 * 3]);
        let e = decode_limited(&big, "--image big.png").unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
        // A truncated PNG: an error, not a panic.
        let cut = &png_of(4, 3, &rgb)[..40];
        assert!(decode_limited(cut, "cut").is_err());
    }
}
