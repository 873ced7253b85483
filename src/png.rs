//! PNG encoding and decoding: RGB8 with tEXt/iTXt metadata (writing files: `crate::output`).

use anyhow::Result;

pub use crate::tensor::to_u8;

/// What we record in the picture.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    pub entries: Vec<(String, String)>,
}

impl Metadata {
    pub fn push(&mut self, k: &str, v: impl ToString) {
        self.entries.push((k.to_string(), v.to_string()));
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.entries.iter().find(|e| e.0 == k).map(|e| e.1.as_str())
    }
}

/// tEXt holds Latin-1; anything else goes into an iTXt chunk (UTF-8), which common tools read too.
fn is_latin1(s: &str) -> bool {
    s.chars().all(|c| (c as u32) < 256 && c != '\0')
}

/// Encode an RGB8 picture (HWC) with its metadata.
pub fn encode(rgb: &[u8], width: u32, height: u32, meta: &Metadata) -> Result<Vec<u8>> {
    anyhow::ensure!(rgb.len() == (width * height * 3) as usize, "picture buffer has the wrong size");
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in &meta.entries {
            // An XMP packet goes in an iTXt chunk (XMP Specification Part 3, 1.1.5).
            if is_latin1(v) && k != crate::provenance::PNG_KEYWORD {
                enc.add_text_chunk(k.clone(), v.clone())?;
            } else {
                enc.add_itxt_chunk(k.clone(), v.clone())?;
            }
        }
        let mut w = enc.write_header()?;
        w.write_image_data(rgb)?;
        w.finish()?;
    }
    Ok(out)
}

/// Read back a PNG as RGB8 and its text metadata (tEXt, zTXt and iTXt), under the bounds of
/// [`crate::picture_in`] (no buffer is allocated before the header's size is checked).
pub fn decode(bytes: &[u8]) -> Result<(Vec<u8>, u32, u32, Metadata)> {
    if crate::picture::sniff(bytes) != Some(crate::picture::Format::Png) {
        anyhow::bail!("not a PNG");
    }
    crate::picture::decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_half_to_even() {
        // x/2 + 0.5 = 0.5/255 * k for half steps: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
        assert_eq!(to_u8(-1.0), 0);
        assert_eq!(to_u8(1.0), 255);
        assert_eq!(to_u8(0.0), 128); // 127.5 -> 128 (even)
        assert_eq!((2.5f32).round_ties_even(), 2.0);
    }
}
