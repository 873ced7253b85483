//! `moss encode --image`: a picture to the latents the DiT works in, through the VAE encoder
//! (spec 7.4), written as a self-describing latents file that `moss decode` turns back into a
//! picture.

use super::{check_not_checkpoint, cuda, open_checkpoint, LATENTS_FORMAT};
use crate::backend::cpu::Cpu;
use crate::backend::ops::VaeEncodeOps;
use crate::backend::Device;
use crate::checkpoint::Checkpoint;
use crate::model::vae::{pixels_from_rgb8, VaeEncoder};
use crate::tensor::Tensor;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Load the VAE encoder for a `width`×`height` picture (the backend's plan checked first).
pub fn load_vae_encoder<B: VaeEncodeOps>(b: &B, ck: &Checkpoint, height: usize, width: usize) -> Result<VaeEncoder<B>> {
    let comp = ck.open_component("vae")?;
    b.plan_vae_encode(&comp, &ck.vae, height, width)?;
    VaeEncoder::load(b, &comp, &ck.vae)
}

/// The picture at `path` as the encoder's input `[1, 3, H, W]`: read through
/// [`crate::picture_in::decode_limited`]; width and height must be multiples of 16 and at most
/// [`crate::options::MAX_SIDE`] (no resize here).
pub fn read_init_picture(path: &Path, what: &str) -> Result<Tensor> {
    let (rgb, w, h) = crate::picture_in::read_rgb8(path, what)?;
    let max = crate::options::MAX_SIDE;
    if w % 16 != 0 || h % 16 != 0 || w > max || h > max {
        bail!("{what} {} is {w}x{h}; width and height must be multiples of 16, at most {max}", path.display());
    }
    pixels_from_rgb8(&rgb, w as usize, h as usize)
}

/// The latents file of an encoded picture: tensor `latents` (f32 `[1, C, h, w]`) and `moss`
/// metadata of format [`LATENTS_FORMAT`] naming the model, the size and the picture (not a
/// picture's settings: `moss decode` then writes plain metadata).
pub fn encoded_latents_bytes(ck: &Checkpoint, z: &Tensor, source: &Path) -> Result<Vec<u8>> {
    let bytes: Vec<u8> = z.data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, z.shape.clone(), &bytes)?;
    let settings = serde_json::json!({
        "format": LATENTS_FORMAT,
        "encoded_from": source.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "width": z.shape[3] * 16,
        "height": z.shape[2] * 16,
        "model": ck.loc.id,
        "version": crate::metadata::version(),
    });
    let meta = std::collections::HashMap::from([("moss".to_string(), settings.to_string())]);
    Ok(safetensors::tensor::serialize([("latents", view)], Some(meta))?)
}

/// `moss encode --image PATH -o LATENTS`.
pub fn encode_image_to_file(image: &Path, out: &Path, model: &str, device: Device) -> Result<()> {
    std::fs::metadata(image).with_context(|| format!("cannot read --image {}", image.display()))?;
    crate::output::check(out)?;
    crate::output::check_distinct(&[("--out", out)], &[("the --image picture", image)])?;
    let ck = open_checkpoint(model)?;
    check_not_checkpoint(out, &ck)?;
    let x = read_init_picture(image, "--image")?;
    fn encode_on<B: VaeEncodeOps>(b: &B, ck: &Checkpoint, x: &Tensor) -> Result<Tensor> {
        load_vae_encoder(b, ck, x.shape[2], x.shape[3])?.encode(b, x)
    }
    let z = match device {
        Device::Cpu => encode_on(&Cpu, &ck, &x)?,
        Device::Cuda(n) => encode_on(&cuda(n, crate::options::Precision::Fp32)?, &ck, &x)?,
    };
    crate::output::write(out, &encoded_latents_bytes(&ck, &z, image)?)
}
