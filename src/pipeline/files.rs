//! Latents and embeds files: `moss encode` (the prompt's hidden states to a file), the final
//! latents as a self-describing safetensors file, and `moss decode` (a latents file to a PNG).

use super::*;
use crate::backend::cpu::Cpu;
use crate::backend::ops::VaeOps;
use crate::backend::Device;
use crate::checkpoint::Checkpoint;
use crate::embeds::Embeds;
use crate::png;
use crate::tensor::Tensor;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// The `format` of a latents file's `moss` metadata.
pub const LATENTS_FORMAT: &str = "moss-latents-1";

/// The final latents as a self-describing safetensors file: tensor `latents` (f32 `[1, C, h, w]`)
/// and the picture's settings, which `moss decode` reads back (no `--size` needed).
pub fn latents_bytes(req: &Request, ck: &Checkpoint, z: &Tensor) -> Result<Vec<u8>> {
    let bytes: Vec<u8> = z.data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, z.shape.clone(), &bytes)?;
    // One metadata key (a HashMap's order would change the bytes from run to run).
    let mut settings = serde_json::to_value(crate::metadata::Params::of(req, ck))?;
    settings["format"] = serde_json::json!(LATENTS_FORMAT);
    let meta = std::collections::HashMap::from([("moss".to_string(), settings.to_string())]);
    Ok(safetensors::tensor::serialize([("latents", view)], Some(meta))?)
}

/// Latents from a file: a `moss-latents-1` safetensors (with the settings it was made with) or
/// raw little-endian f32 (`size` or a square inferred from the length).
pub fn read_latents(path: &Path, channels: usize, size: Option<(u32, u32)>) -> Result<(Tensor, Option<crate::metadata::Params>)> {
    let f = read_latents_file(path, channels, size)?;
    Ok((f.z, f.params))
}

/// A latents file read back.
pub struct LatentsFile {
    /// f32 `[1, C, h, w]`.
    pub z: Tensor,
    /// The settings the file carries, their size that of the latents (`w*16` x `h*16`).
    pub params: Option<crate::metadata::Params>,
    /// What was wrong with the settings: a size that disagreed with the latents (corrected), or
    /// settings that do not read (left out).
    pub warnings: Vec<String>,
}

/// [`read_latents`], with what was wrong with the file's settings.
pub fn read_latents_file(path: &Path, channels: usize, size: Option<(u32, u32)>) -> Result<LatentsFile> {
    let mut warnings = vec![];
    let bytes = crate::bounded::read_bounded(path, max_latents_bytes(channels), "latents")?;
    let looks_st = bytes.len() > 9 && bytes[8] == b'{' && u64::from_le_bytes(bytes[..8].try_into().unwrap()) < bytes.len() as u64;
    let (z, params) = if looks_st {
        let bad = |why: String| anyhow::anyhow!("{} is not a moss latents file: {why}", path.display());
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("{e:?}")))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{e:?}")))?;
        let m = meta.metadata().clone().unwrap_or_default();
        let settings: serde_json::Value = m.get("moss").and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default();
        if settings["format"] != LATENTS_FORMAT {
            bail!(bad(format!("no `moss` metadata of format {LATENTS_FORMAT}")));
        }
        let v = st.tensor("latents").map_err(|_| bad("tensor `latents` missing".into()))?;
        let shape = v.shape().to_vec();
        if v.dtype() != safetensors::Dtype::F32 || shape.len() != 4 || shape[0] != 1 || shape[1] != channels {
            bail!(bad(format!("`latents` must be f32 [1,{channels},h,w], is {:?} {shape:?}", v.dtype())));
        }
        if let Some((w, h)) = size {
            if (h / 16, w / 16) != (shape[2] as u32, shape[3] as u32) {
                bail!("{} holds a {}x{} picture's latents, not {w}x{h}", path.display(), shape[3] * 16, shape[2] * 16);
            }
        }
        if shape[2] * 16 > crate::options::MAX_SIDE as usize || shape[3] * 16 > crate::options::MAX_SIDE as usize || shape[2] == 0 || shape[3] == 0 {
            bail!(bad(format!("latents {shape:?} are not a picture of 16..{} a side", crate::options::MAX_SIDE)));
        }
        let data = v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let params = match serde_json::from_value::<crate::metadata::Params>(settings) {
            Ok(mut p) => {
                let (w, h) = (shape[3] as u32 * 16, shape[2] as u32 * 16);
                if (p.spec.width, p.spec.height) != (w, h) {
                    warnings.push(format!(
                        "{}: its settings say {}x{}, its latents are a {w}x{h} picture; the picture records {w}x{h}",
                        path.display(),
                        p.spec.width,
                        p.spec.height
                    ));
                    (p.spec.width, p.spec.height) = (w, h);
                }
                Some(p)
            }
            Err(e) => {
                warnings.push(format!("{}: its `moss` settings do not read ({e}); the picture records only the model and the file", path.display()));
                None
            }
        };
        (Tensor::new(shape, data)?, params)
    } else {
        let (h, w) = latent_grid(bytes.len() as u64, channels, size)?;
        let data = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        (Tensor::new(vec![1, channels, h, w], data)?, None)
    };
    crate::tensor::ensure_finite(&format!("latents file {}", path.display()), &z.data)?;
    Ok(LatentsFile { z, params, warnings })
}

/// The largest latents file: f32 `[1, channels, h, w]` of the largest picture, and a header with
/// room for the settings (prompts of up to [`crate::bounded::MAX_PROMPT_FILE`] each).
pub fn max_latents_bytes(channels: usize) -> u64 {
    let cells = (crate::options::MAX_SIDE as u64 / 16).pow(2);
    4 * channels as u64 * cells + 2 * crate::bounded::MAX_PROMPT_FILE + (1 << 20)
}

/// Raw little-endian f32 latents (the bench tools' format; `moss decode` reads it too).
pub fn write_latents_raw(path: &Path, z: &Tensor) -> Result<()> {
    let bytes: Vec<u8> = z.data.iter().flat_map(|v| v.to_le_bytes()).collect();
    crate::output::write(path, &bytes)
}

pub fn write_latents(path: &Path, req: &Request, ck: &Checkpoint, z: &Tensor) -> Result<()> {
    crate::output::write_as(path, &latents_bytes(req, ck, z)?, req.replace)
}

/// What `moss encode` encodes.
pub struct EncodeJob<'a> {
    pub prompt: &'a str,
    pub negative: &'a str,
    pub max_tokens: usize,
    /// bf16: bf16 hidden states (what the DiT is fed at bf16); fp32: F32 ones, unrounded; fp8,
    /// int8: the bf16 ones (their runs' encoder is the bf16 one).
    pub precision: Precision,
    pub out: &'a Path,
}

/// `moss encode`.
pub fn encode_to_file(job: &EncodeJob, model: &str, device: Device, progress: &mut dyn Progress) -> Result<()> {
    let EncodeJob { prompt, negative, max_tokens, precision, out } = *job;
    let precision = precision.encoder();
    crate::output::check(out)?;
    let ck = open_checkpoint(model)?;
    check_not_checkpoint(out, &ck)?;
    let (mut enc, cut) = match device {
        Device::Cpu => encode_prompts(&Cpu, &ck, &[prompt, negative], max_tokens, precision, progress)?,
        Device::Cuda(n) => {
            let b = cuda(n, precision)?;
            encode_prompts(&b, &ck, &[prompt, negative], max_tokens, precision, progress)?
        }
    };
    let uncond = enc.pop().unwrap();
    let cond = enc.pop().unwrap();
    let bytes = crate::embeds::to_bytes(&Embeds { cond, uncond, model: ck.loc.id.clone(), max_tokens, cut }, precision)?;
    crate::output::write(out, &bytes)
}

/// The latent grid `(h, w)` a raw latents file of `len` bytes holds (little-endian f32
/// `[1, channels, h, w]`): the given size `(W, H)`, or a square one inferred from the length.
/// A length that fits no size (or not the given one) is refused, naming the length expected.
pub fn latent_grid(len: u64, channels: usize, size: Option<(u32, u32)>) -> Result<(usize, usize)> {
    let per = (channels * 4) as u64; // bytes of one latent cell (16x16 pixels)
    match size {
        Some((w, h)) => {
            let (lh, lw) = ((h / 16) as u64, (w / 16) as u64);
            let want = per * lh * lw;
            if len != want {
                bail!("latents file is {len} bytes; a {w}x{h} picture needs exactly {want} (f32 [1,{channels},{lh},{lw}])");
            }
            Ok((lh as usize, lw as usize))
        }
        None => {
            let cells = len / per;
            let side = (cells as f64).sqrt().round() as u64;
            if len.is_multiple_of(per) && side > 0 && side * side == cells {
                if side * 16 > crate::options::MAX_SIDE as u64 {
                    bail!("latents file is {len} bytes, a {0}x{0} picture, above the cap of {1}x{1}", side * 16, crate::options::MAX_SIDE);
                }
                return Ok((side as usize, side as usize));
            }
            // The square sizes on either side of this length, for the message.
            let lo = ((len as f64 / per as f64).sqrt().floor() as u64).max(1);
            let near = [lo, lo + 1].map(|s| format!("{0}x{0} needs {1} bytes", s * 16, per * s * s)).join(", ");
            if !len.is_multiple_of(per) || cells == 0 {
                bail!(
                    "latents file is {len} bytes, which fits no picture size: f32 [1,{channels},h,w] latents are \
                     {per}*h*w bytes (a square picture: {near})"
                );
            }
            bail!(
                "latents file is {len} bytes ({cells} latent cells), which fits no square size ({near}); \
                 pass --size WxH for a non-square picture"
            )
        }
    }
}

/// What `moss decode` reads and writes.
pub struct DecodeJob<'a> {
    pub latents: &'a Path,
    /// `(W, H)` of raw latents (a square is inferred when left out).
    pub size: Option<(u32, u32)>,
    pub out: &'a Path,
    /// JPEG quality (`out` a JPEG only).
    pub quality: Option<u8>,
    /// Decode in strips of that many rows (of each layer) with every kept picture in host memory,
    /// instead of what the memory plan picks (the same bytes; for tests of the split path).
    pub strip_rows: Option<usize>,
}

/// `moss decode`.
pub fn decode_file(job: &DecodeJob, model: &str, device: Device, progress: &mut dyn Progress) -> Result<()> {
    let DecodeJob { latents, size, out, quality, strip_rows } = *job;
    std::fs::metadata(latents).with_context(|| format!("cannot read latents {}", latents.display()))?;
    crate::output::check(out)?;
    crate::output::check_distinct(&[("--out", out)], &[("the latents file", latents)])?;
    let ck = open_checkpoint(model)?;
    check_not_checkpoint(out, &ck)?;
    crate::picture::check(out, quality)?;
    let LatentsFile { z, params, warnings } = read_latents_file(latents, ck.dit.latent_channels, size)?;
    for w in &warnings {
        progress.warn(w);
    }
    let (h, w) = (z.shape[2], z.shape[3]);
    fn decode_on<B: VaeOps>(b: &B, ck: &Checkpoint, z: &Tensor, strip_rows: Option<usize>) -> Result<Vec<u8>> {
        let vae = load_vae(b, ck, z.shape[2], z.shape[3])?;
        match strip_rows {
            Some(n) => vae.decode_rgb8_with(b, z, crate::model::vae::Split::strips(n)),
            None => vae.decode_rgb8(b, z),
        }
    }
    let rgb = match device {
        Device::Cpu => decode_on(&Cpu, &ck, &z, strip_rows)?,
        Device::Cuda(n) => decode_on(&cuda(n, crate::options::Precision::Fp32)?, &ck, &z, strip_rows)?,
    };
    // The settings the latents were made with, when the file carries them.
    let m = match params {
        Some(p) => p.to_png(),
        None => {
            let mut m = png::Metadata::default();
            m.push("moss:model", &ck.loc.id);
            m.push("moss:source", latents.display());
            m.push("Software", crate::metadata::version());
            m
        }
    };
    let pic = crate::picture::encode(out, quality, &rgb, (w * 16) as u32, (h * 16) as u32, &m)?;
    if let Some(w) = pic.warning(out) {
        progress.warn(&w);
    }
    crate::output::write(out, &pic.bytes)
}
