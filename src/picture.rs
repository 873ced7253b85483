//! The picture file: its format follows the output's extension, with the metadata each format
//! can carry.
//!
//! - `.png` (also `-`, FIFOs, devices and names without an extension): RGB8 with text chunks
//!   (`crate::png`).
//! - `.jpg`/`.jpeg`: baseline JPEG at a quality of 1..100 (default [`DEFAULT_QUALITY`]).
//! - `.webp`: lossless WebP (the `image` crate writes no lossy WebP).
//!
//! Every picture also carries the XMP packet of [`crate::provenance`] (IPTC's Digital Source Type
//! `trainedAlgorithmicMedia` and the software): a PNG in an iTXt chunk `XML:com.adobe.xmp`, a JPEG
//! in an APP1 segment after the EXIF one (placed by `img-parts`), a WebP in its `XMP ` chunk
//! (written by `image-webp`).
//!
//! JPEG and WebP carry an EXIF block as A1111 writes it (what sd-parsers and PNG Info panels read):
//! the Exif IFD's `UserComment` holds the `parameters` text (`UNICODE\0` and UTF-16BE), its
//! `MakerNote` the `moss` settings (JSON, UTF-8), IFD0's `Software` the version. A JPEG's EXIF
//! segment holds at most 64 KiB: for a prompt too long for it, the settings and then the
//! parameters are left out of that JPEG, with a warning ([`Encoded::left_out`]).

use crate::png::Metadata;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// JPEG quality when `--quality` is not given.
pub const DEFAULT_QUALITY: u8 = 90;

/// The picture formats moss writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    Webp,
}

/// The extensions [`Format::of`] knows, for messages.
pub const EXTENSIONS: &str = ".png, .jpg, .jpeg or .webp";

impl Format {
    /// The format of an output path, from its extension (any case): PNG for `-` and names without
    /// one; an unknown extension is refused.
    pub fn of(path: &Path) -> Result<Format> {
        let Some(ext) = path.extension() else {
            return Ok(Format::Png);
        };
        match ext.to_string_lossy().to_ascii_lowercase().as_str() {
            "png" => Ok(Format::Png),
            "jpg" | "jpeg" => Ok(Format::Jpeg),
            "webp" => Ok(Format::Webp),
            e => bail!("{}: moss writes no `.{e}` pictures (use {EXTENSIONS})", path.display()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "PNG",
            Format::Jpeg => "JPEG",
            Format::Webp => "WebP",
        }
    }
}

/// How a picture is written: the format of `path`, and the JPEG quality (`None`: the default).
/// Refuses an unknown extension and a quality for a format that has none.
pub fn check(path: &Path, quality: Option<u8>) -> Result<Format> {
    let f = Format::of(path)?;
    if let Some(q) = quality {
        if !(1..=100).contains(&q) {
            bail!("--quality {q} is not in 1..100");
        }
        if f != Format::Jpeg {
            let what = if crate::output::is_stdout(path) { "stdout (-)".to_string() } else { path.display().to_string() };
            bail!("--quality applies to JPEG (.jpg, .jpeg); {what} is written as {} (lossless)", f.name());
        }
    }
    Ok(f)
}

/// An encoded picture, and the metadata entries a JPEG had no room for.
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub left_out: Vec<&'static str>,
}

impl Encoded {
    /// The warning for what was left out, if anything was.
    pub fn warning(&self, path: &Path) -> Option<String> {
        (!self.left_out.is_empty()).then(|| {
            format!(
                "{}: the prompt is too long for a JPEG's 64 KiB EXIF block; left out: {} (PNG and WebP keep it all)",
                path.display(),
                self.left_out.join(", ")
            )
        })
    }
}

/// Encode an RGB8 picture (HWC) with its metadata in the format of `path`.
pub fn encode(path: &Path, quality: Option<u8>, rgb: &[u8], width: u32, height: u32, meta: &Metadata) -> Result<Encoded> {
    anyhow::ensure!(rgb.len() == width as usize * height as usize * 3, "picture buffer has the wrong size");
    let format = check(path, quality)?;
    let mut bytes = Vec::new();
    let mut left_out = vec![];
    let xmp = crate::provenance::xmp(meta.get("Software").unwrap_or(&crate::metadata::version()));
    match format {
        Format::Png => {
            let mut m = meta.clone();
            m.entries.retain(|e| e.0 != crate::provenance::PNG_KEYWORD);
            m.push(crate::provenance::PNG_KEYWORD, xmp);
            bytes = crate::png::encode(rgb, width, height, &m)?
        }
        Format::Jpeg => {
            use image::ImageEncoder;
            // The APP1 segment: a 2-byte length that counts itself and the 6-byte `Exif\0\0`.
            const MAX_TIFF: usize = 65535 - 2 - 6;
            let mut m = meta.clone();
            let mut exif = exif_block(&m)?;
            for key in ["moss", "parameters"] {
                if exif.len() <= MAX_TIFF {
                    break;
                }
                m.entries.retain(|e| e.0 != key);
                left_out.push(if key == "moss" { "the moss settings" } else { "the parameters" });
                exif = exif_block(&m)?;
            }
            let mut enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, quality.unwrap_or(DEFAULT_QUALITY));
            enc.set_exif_metadata(exif).context("JPEG: cannot embed the EXIF block")?;
            enc.write_image(rgb, width, height, image::ExtendedColorType::Rgb8).context("cannot encode the JPEG")?;
            bytes = jpeg_with_xmp(bytes, &xmp)?;
        }
        Format::Webp => {
            let mut enc = image_webp::WebPEncoder::new(&mut bytes);
            enc.set_exif_metadata(exif_block(meta)?);
            enc.set_xmp_metadata(xmp.into_bytes());
            enc.encode(rgb, width, height, image_webp::ColorType::Rgb8).context("cannot encode the WebP")?;
        }
    }
    Ok(Encoded { bytes, left_out })
}

/// The XMP namespace header of a JPEG APP1 segment (XMP Specification Part 3, 1.1.3).
const JPEG_XMP: &[u8] = b"http://ns.adobe.com/xap/1.0/\0";

/// `jpeg` with an APP1 segment holding `xmp` after its leading APPn segments (JFIF, EXIF).
fn jpeg_with_xmp(jpeg: Vec<u8>, xmp: &str) -> Result<Vec<u8>> {
    use img_parts::jpeg::{markers, Jpeg, JpegSegment};
    let mut j = Jpeg::from_bytes(jpeg.into()).map_err(|e| anyhow::anyhow!("JPEG: cannot read back its segments: {e}"))?;
    let at = j.segments().iter().position(|s| !(markers::APP0..=markers::APP15).contains(&s.marker())).unwrap_or(j.segments().len());
    let contents = [JPEG_XMP, xmp.as_bytes()].concat();
    j.segments_mut().insert(at, JpegSegment::new_with_contents(markers::APP1, contents.into()));
    Ok(j.encoder().bytes().to_vec())
}

/// The format of a picture's bytes, from its signature.
pub fn sniff(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(Format::Png)
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(Format::Jpeg)
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some(Format::Webp)
    } else {
        None
    }
}

/// Read back a picture (PNG, JPEG or WebP) as RGB8 and its metadata, under the bounds of
/// [`crate::picture_in`].
pub fn decode(bytes: &[u8]) -> Result<(Vec<u8>, u32, u32, Metadata)> {
    let img = crate::picture_in::decode_limited(bytes)?;
    let meta = crate::picture_in::metadata(bytes)?;
    let (w, h) = img.dimensions();
    Ok((img.into_raw(), w, h, meta))
}

/// `UserComment`'s character-code prefix for UTF-16 text (EXIF 2.3, 4.6.5; piexif writes
/// big-endian, sd-parsers and A1111 read big-endian).
const UNICODE: &[u8; 8] = b"UNICODE\0";

/// The EXIF block (a big-endian TIFF structure, as piexif writes it) holding `meta`'s
/// `parameters`, `moss` and `Software` entries; other entries have no place in it.
fn exif_block(meta: &Metadata) -> Result<Vec<u8>> {
    use exif::{Field, In, Tag, Value};
    let mut fields = vec![];
    if let Some(p) = meta.get("parameters") {
        let mut v = UNICODE.to_vec();
        v.extend(p.encode_utf16().flat_map(|u| u.to_be_bytes()));
        fields.push(Field { tag: Tag::UserComment, ifd_num: In::PRIMARY, value: Value::Undefined(v, 0) });
    }
    if let Some(j) = meta.get("moss") {
        fields.push(Field { tag: Tag::MakerNote, ifd_num: In::PRIMARY, value: Value::Undefined(j.as_bytes().to_vec(), 0) });
    }
    if let Some(s) = meta.get("Software") {
        fields.push(Field { tag: Tag::Software, ifd_num: In::PRIMARY, value: Value::Ascii(vec![s.as_bytes().to_vec()]) });
    }
    let mut w = exif::experimental::Writer::new();
    for f in &fields {
        w.push_field(f);
    }
    let mut out = std::io::Cursor::new(Vec::new());
    w.write(&mut out, false).map_err(|e| anyhow::anyhow!("cannot build the EXIF block: {e}"))?;
    Ok(out.into_inner())
}

/// The entries [`exif_block`] writes, read back from an EXIF block (TIFF structure).
pub(crate) fn from_exif(tiff: &[u8]) -> Result<Metadata> {
    use exif::{In, Tag, Value};
    let x = exif::Reader::new().read_raw(tiff.to_vec()).map_err(|e| anyhow::anyhow!("the EXIF block is not valid: {e}"))?;
    let mut m = Metadata::default();
    let bytes = |tag| match x.get_field(tag, In::PRIMARY).map(|f| &f.value) {
        Some(Value::Undefined(v, _)) => Some(v.clone()),
        Some(Value::Ascii(v)) => Some(v.concat()),
        _ => None,
    };
    if let Some(v) = bytes(Tag::UserComment) {
        m.push("parameters", user_comment(&v));
    }
    if let Some(v) = bytes(Tag::MakerNote) {
        m.push("moss", String::from_utf8_lossy(&v));
    }
    if let Some(v) = bytes(Tag::Software) {
        m.push("Software", String::from_utf8_lossy(&v).trim_end_matches('\0'));
    }
    Ok(m)
}

/// A `UserComment` value as text: `UNICODE\0` + UTF-16 (big-endian; a byte-order mark wins),
/// otherwise the bytes after the 8-byte code as UTF-8.
fn user_comment(v: &[u8]) -> String {
    let (code, body) = v.split_at(v.len().min(8));
    if code == UNICODE {
        let le = body.starts_with(&[0xFF, 0xFE]);
        let units = body.chunks_exact(2).map(|c| if le { u16::from_le_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], c[1]]) });
        String::from_utf16_lossy(&units.collect::<Vec<_>>()).trim_start_matches('\u{feff}').to_string()
    } else {
        String::from_utf8_lossy(body).trim_end_matches('\0').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Metadata {
        let mut m = Metadata::default();
        m.push("parameters", "ein Fuchs ☕ im Schnee\nSteps: 2, Sampler: Euler, Seed: 7");
        m.push("moss", r#"{"prompt":"ein Fuchs ☕ im Schnee"}"#);
        m.push("Software", "moss 0.1.0");
        m
    }

    #[test]
    fn formats_by_extension() {
        assert_eq!(Format::of(Path::new("a.png")).unwrap(), Format::Png);
        assert_eq!(Format::of(Path::new("a.JPG")).unwrap(), Format::Jpeg);
        assert_eq!(Format::of(Path::new("d/a.jpeg")).unwrap(), Format::Jpeg);
        assert_eq!(Format::of(Path::new("a.webp")).unwrap(), Format::Webp);
        assert_eq!(Format::of(Path::new("-")).unwrap(), Format::Png);
        assert_eq!(Format::of(Path::new("/dev/null")).unwrap(), Format::Png);
        assert!(Format::of(Path::new("a.gif")).unwrap_err().to_string().contains("no `.gif` pictures"));
        assert!(check(Path::new("a.png"), Some(80)).unwrap_err().to_string().contains("--quality applies to JPEG"));
        assert!(check(Path::new("a.webp"), Some(80)).is_err());
        assert!(check(Path::new("a.jpg"), Some(0)).is_err());
        assert_eq!(check(Path::new("a.jpg"), Some(100)).unwrap(), Format::Jpeg);
    }

    #[test]
    fn exif_round_trip_and_a1111_layout() {
        let b = exif_block(&meta()).unwrap();
        assert!(b.starts_with(b"MM\0\x2a"), "big-endian TIFF");
        // The UserComment bytes as piexif's UserComment.dump(text, encoding="unicode") makes them.
        let want: Vec<u8> = UNICODE.iter().copied().chain("ein Fuchs".encode_utf16().flat_map(|u| u.to_be_bytes())).collect();
        assert!(b.windows(want.len()).any(|w| w == want), "UserComment is not UNICODE + UTF-16BE");
        assert_eq!(from_exif(&b).unwrap(), meta());
    }

    #[test]
    fn jpeg_and_webp_carry_the_metadata() {
        let (w, h) = (48u32, 32u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        for (name, q) in [("a.jpg", Some(95)), ("a.webp", None), ("a.png", None)] {
            let e = encode(Path::new(name), q, &rgb, w, h, &meta()).unwrap();
            assert!(e.left_out.is_empty());
            let (px, gw, gh, m) = decode(&e.bytes).unwrap();
            assert_eq!((gw, gh), (w, h), "{name}");
            for (k, v) in &meta().entries {
                assert_eq!(m.get(k), Some(v.as_str()), "{name}: {k}");
            }
            if name != "a.jpg" {
                assert!(px == rgb, "{name} is lossless");
            }
        }
    }

    /// The provenance XMP packet is where each format's readers look for it: a PNG's iTXt chunk
    /// `XML:com.adobe.xmp`, a JPEG's APP1 segment with the XMP namespace (beside the EXIF one), a
    /// WebP's `XMP ` chunk; the moss metadata still reads back.
    #[test]
    fn every_format_carries_the_xmp_packet() {
        let (w, h) = (32u32, 16u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 5 % 253) as u8).collect();
        let want = crate::provenance::xmp("moss 0.1.0");
        let png = encode(Path::new("a.png"), None, &rgb, w, h, &meta()).unwrap().bytes;
        let r = png::Decoder::new(std::io::Cursor::new(&png)).read_info().unwrap();
        let itxt: Vec<_> = r.info().utf8_text.iter().filter(|t| t.keyword == crate::provenance::PNG_KEYWORD).collect();
        assert_eq!(itxt.len(), 1, "one iTXt XMP chunk");
        assert_eq!(itxt[0].get_text().unwrap(), want);
        assert!(r.info().uncompressed_latin1_text.iter().all(|t| t.keyword != crate::provenance::PNG_KEYWORD), "XMP in a tEXt chunk");
        let jpg = encode(Path::new("a.jpg"), None, &rgb, w, h, &meta()).unwrap().bytes;
        let j = img_parts::jpeg::Jpeg::from_bytes(jpg.clone().into()).unwrap();
        let app1: Vec<&[u8]> = j.segments_by_marker(img_parts::jpeg::markers::APP1).map(|s| s.contents().as_ref()).collect();
        assert_eq!(app1.len(), 2, "EXIF and XMP");
        assert!(app1[0].starts_with(b"Exif\0\0"), "the EXIF segment first");
        assert_eq!(app1[1], [JPEG_XMP, want.as_bytes()].concat());
        let webp = encode(Path::new("a.webp"), None, &rgb, w, h, &meta()).unwrap().bytes;
        let mut d = image_webp::WebPDecoder::new(std::io::Cursor::new(&webp)).unwrap();
        assert_eq!(d.xmp_metadata().unwrap().unwrap(), want.as_bytes());
        for (name, bytes) in [("png", &png), ("jpg", &jpg), ("webp", &webp)] {
            let (px, gw, gh, m) = decode(bytes).unwrap();
            assert_eq!((gw, gh), (w, h), "{name}");
            assert!(name == "jpg" || px == rgb, "{name}");
            for (k, v) in &meta().entries {
                assert_eq!(m.get(k), Some(v.as_str()), "{name}: {k}");
            }
        }
    }

    #[test]
    fn a_jpeg_leaves_out_what_does_not_fit() {
        let mut m = Metadata::default();
        m.push("parameters", "x".repeat(20_000)); // 40 kB as UTF-16
        m.push("moss", "y".repeat(30_000));
        m.push("Software", "moss");
        let e = encode(Path::new("a.jpg"), None, &[0; 16 * 16 * 3], 16, 16, &m).unwrap();
        assert_eq!(e.left_out, ["the moss settings"]);
        let (_, _, _, got) = decode(&e.bytes).unwrap();
        assert_eq!(got.get("parameters").map(str::len), Some(20_000));
        assert!(got.get("moss").is_none());
        assert!(e.warning(Path::new("a.jpg")).unwrap().contains("left out: the moss settings"));
    }
}
