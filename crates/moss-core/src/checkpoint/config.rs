//! The component configs of a MOSS-Image checkpoint, read from their JSON files with the
//! defaults the spec gives for keys a file leaves out.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

pub fn read_json(path: &Path) -> Result<Value> {
    let text = crate::bounded::read_text_bounded(path, crate::bounded::MAX_CONFIG, "config")?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// The largest size any config number may name (the real model's largest is 248,320): bounds
/// every allocation the configs imply before a tensor is looked at.
const MAX_SIZE: u64 = 1 << 24;

/// Keys a config file left out, whose documented defaults (the real model's values) were used;
/// named in the error when the stored tensors then disagree.
pub type Defaulted = Vec<String>;

fn get_usize_in(v: &Value, key: &str, default: Option<usize>, range: (u64, u64), file: &Path, d: &mut Defaulted) -> Result<usize> {
    let x = match v.get(key) {
        Some(x) => x.as_u64().with_context(|| format!("{}: `{key}` is not a non-negative integer", file.display()))?,
        None => {
            let x = default.with_context(|| format!("{}: missing `{key}`", file.display()))?;
            d.push(format!("{key} (default {x})"));
            x as u64
        }
    };
    if x < range.0 || x > range.1 {
        bail!("{}: `{key}` is {x}, outside {}..={}", file.display(), range.0, range.1);
    }
    Ok(x as usize)
}

fn get_usize(v: &Value, key: &str, default: Option<usize>, file: &Path, d: &mut Defaulted) -> Result<usize> {
    get_usize_in(v, key, default, (1, MAX_SIZE), file, d)
}

/// `" (the file leaves out K (default V), ...)"` when defaults were used, for error messages.
fn left_out(d: &Defaulted) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" (the file leaves out {}, so the real model's values were assumed)", d.join(", "))
    }
}

/// A finite number; `positive`: also > 0 (an eps, a RoPE base, a shift).
fn get_f64(v: &Value, key: &str, default: f64, positive: bool, file: &Path, d: &mut Defaulted) -> Result<f64> {
    let x = match v.get(key) {
        Some(x) => x.as_f64().with_context(|| format!("{}: `{key}` is not a number", file.display()))?,
        None => {
            d.push(format!("{key} (default {default})"));
            default
        }
    };
    if !x.is_finite() || (positive && x <= 0.0) {
        let want = if positive { "a finite number above 0" } else { "a finite number" };
        bail!("{}: `{key}` is {x}, not {want}", file.display());
    }
    Ok(x)
}

fn get_usize_list(v: &Value, key: &str, file: &Path) -> Result<Option<Vec<usize>>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().map(|x| x as usize).with_context(|| format!("{}: `{key}` holds a non-integer", file.display())))
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(_) => bail!("{}: `{key}` is not a list", file.display()),
    }
}

/// Which token mixer a Qwen3.5 layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet (`linear_attn.*`).
    Linear,
    /// Gated full attention (`self_attn.*`).
    Full,
}

/// `text_encoder/config.json` → `text_config` (Qwen3.5 text backbone, spec 3.1).
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layer_types: Vec<LayerType>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    pub rms_norm_eps: f64,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    /// Keys the file left out (defaults used).
    pub defaulted: Defaulted,
}

impl EncoderConfig {
    pub fn num_layers(&self) -> usize {
        self.layer_types.len()
    }
    /// Rotary dimensions of each full-attention head (64 of 256 for the real model).
    pub fn rotary_dim(&self) -> usize {
        let r = (self.head_dim as f64 * self.partial_rotary_factor) as usize;
        r - r % 2
    }
    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }
    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
    /// Channels of `in_proj_qkv` and of the depthwise conv: q, k, v.
    pub fn linear_conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let root = read_json(path)?;
        let v = root.get("text_config").unwrap_or(&root);
        let mut d = Defaulted::new();
        let num_layers = get_usize_in(v, "num_hidden_layers", Some(32), (1, 1024), path, &mut d)?;
        let layer_types = match v.get("layer_types") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| match x.as_str() {
                    Some("linear_attention") => Ok(LayerType::Linear),
                    Some("full_attention") => Ok(LayerType::Full),
                    other => bail!("{}: unknown layer type {other:?}", path.display()),
                })
                .collect::<Result<Vec<_>>>()?,
            _ => {
                let interval = get_usize(v, "full_attention_interval", Some(4), path, &mut d)?;
                (0..num_layers).map(|i| if (i + 1) % interval == 0 { LayerType::Full } else { LayerType::Linear }).collect()
            }
        };
        if layer_types.len() != num_layers {
            bail!("{}: layer_types has {} entries but num_hidden_layers is {num_layers}", path.display(), layer_types.len());
        }
        // transformers 5 keeps rope settings in `rope_parameters`; older files at the top level.
        let rope = v.get("rope_parameters").filter(|r| r.is_object()).unwrap_or(v);
        let mut ignore = Defaulted::new();
        let top_theta = get_f64(v, "rope_theta", 1e7, true, path, &mut ignore)?;
        let rope_theta = get_f64(rope, "rope_theta", top_theta, true, path, &mut d)?;
        let top_partial = get_f64(v, "partial_rotary_factor", 0.25, true, path, &mut ignore)?;
        let partial = get_f64(rope, "partial_rotary_factor", top_partial, true, path, &mut d)?;
        if partial > 1.0 {
            bail!("{}: `partial_rotary_factor` is {partial}, above 1", path.display());
        }
        let cfg = EncoderConfig {
            vocab_size: get_usize(v, "vocab_size", Some(248320), path, &mut d)?,
            hidden_size: get_usize(v, "hidden_size", Some(4096), path, &mut d)?,
            intermediate_size: get_usize(v, "intermediate_size", Some(12288), path, &mut d)?,
            layer_types,
            num_attention_heads: get_usize(v, "num_attention_heads", Some(16), path, &mut d)?,
            num_key_value_heads: get_usize(v, "num_key_value_heads", Some(4), path, &mut d)?,
            head_dim: get_usize(v, "head_dim", Some(256), path, &mut d)?,
            rope_theta,
            partial_rotary_factor: partial,
            rms_norm_eps: get_f64(v, "rms_norm_eps", 1e-6, true, path, &mut d)?,
            linear_num_key_heads: get_usize(v, "linear_num_key_heads", Some(16), path, &mut d)?,
            linear_num_value_heads: get_usize(v, "linear_num_value_heads", Some(32), path, &mut d)?,
            linear_key_head_dim: get_usize(v, "linear_key_head_dim", Some(128), path, &mut d)?,
            linear_value_head_dim: get_usize(v, "linear_value_head_dim", Some(128), path, &mut d)?,
            linear_conv_kernel_dim: get_usize_in(v, "linear_conv_kernel_dim", Some(4), (1, 64), path, &mut d)?,
            defaulted: d,
        };
        if !cfg.num_attention_heads.is_multiple_of(cfg.num_key_value_heads.max(1))
            || !cfg.linear_num_value_heads.is_multiple_of(cfg.linear_num_key_heads.max(1))
        {
            bail!("{}: head counts do not divide (GQA)", path.display());
        }
        Ok(cfg)
    }
}

/// `transformer/config.json` (MOSSImageTransformer, spec 4.1).
#[derive(Clone, Debug, PartialEq)]
pub struct DitConfig {
    pub dim: usize,
    pub ffn_dim: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub text_dim: usize,
    pub freq_dim: usize,
    pub latent_channels: usize,
    pub rope_base: f64,
    /// Text-refiner blocks (`text_embedder.blocks.N`); 2 in the real model.
    pub num_refiner_layers: usize,
    pub eps: f64,
    /// Keys the file left out (defaults used).
    pub defaulted: Defaulted,
}

impl DitConfig {
    pub fn head_dim(&self) -> usize {
        self.dim / self.num_heads
    }
    pub fn from_file(path: &Path) -> Result<Self> {
        let v = read_json(path)?;
        let mut d = Defaulted::new();
        let cfg = DitConfig {
            dim: get_usize(&v, "dim", Some(3072), path, &mut d)?,
            ffn_dim: get_usize(&v, "ffn_dim", Some(8192), path, &mut d)?,
            num_heads: get_usize(&v, "num_heads", Some(24), path, &mut d)?,
            num_layers: get_usize_in(&v, "num_layers", Some(42), (1, 1024), path, &mut d)?,
            text_dim: get_usize(&v, "text_dim", Some(4096), path, &mut d)?,
            freq_dim: get_usize(&v, "freq_dim", Some(256), path, &mut d)?,
            latent_channels: get_usize(&v, "latent_channels", Some(128), path, &mut d)?,
            rope_base: get_f64(&v, "rope_base", 10000.0, true, path, &mut d)?,
            num_refiner_layers: get_usize_in(&v, "num_refiner_layers", Some(2), (0, 64), path, &mut d)?,
            eps: get_f64(&v, "eps", 1e-6, true, path, &mut d)?,
            defaulted: d,
        };
        if cfg.num_heads == 0 || !cfg.dim.is_multiple_of(cfg.num_heads) || cfg.head_dim() != 128 {
            bail!(
                "{}: dim {} / num_heads {} must give head_dim 128 (4 RoPE axes x 16 bands x 2){}",
                path.display(),
                cfg.dim,
                cfg.num_heads,
                left_out(&cfg.defaulted)
            );
        }
        if !cfg.freq_dim.is_multiple_of(2) {
            bail!("{}: freq_dim must be even", path.display());
        }
        Ok(cfg)
    }
}

/// `vae/config.json` (diffusers AutoencoderKLFlux2, spec 7.1), the decoder side.
#[derive(Clone, Debug, PartialEq)]
pub struct VaeConfig {
    pub latent_channels: usize,
    pub out_channels: usize,
    /// The encoder's widths (`block_out_channels`), its input channels, whether it has a
    /// `quant_conv`, and its `down_block_types` (empty when the file leaves them out): read for
    /// pictures in (`crate::model::vae::VaeEncoder`), checked only when the encoder loads.
    pub block_out_channels: Vec<usize>,
    pub in_channels: usize,
    pub use_quant_conv: bool,
    pub down_block_types: Vec<String>,
    pub decoder_block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub norm_num_groups: usize,
    pub batch_norm_eps: f64,
    pub patch_size: [usize; 2],
    pub use_post_quant_conv: bool,
    pub mid_block_add_attention: bool,
    /// Keys the file left out (defaults used).
    pub defaulted: Defaulted,
}

impl VaeConfig {
    /// Channels of the packed latent the DiT works in: latent_channels · p · p.
    pub fn packed_channels(&self) -> usize {
        self.latent_channels * self.patch_size[0] * self.patch_size[1]
    }
    pub fn from_file(path: &Path) -> Result<Self> {
        let v = read_json(path)?;
        let mut d = Defaulted::new();
        let enc = get_usize_list(&v, "block_out_channels", path)?.unwrap_or_else(|| vec![128, 256, 512, 512]);
        let dec = get_usize_list(&v, "decoder_block_out_channels", path)?.unwrap_or_else(|| enc.clone());
        let patch = get_usize_list(&v, "patch_size", path)?.unwrap_or_else(|| vec![2, 2]);
        if patch.len() != 2 || !(1..=8).contains(&patch[0]) || !(1..=8).contains(&patch[1]) {
            bail!("{}: patch_size {patch:?} is not two numbers in 1..=8", path.display());
        }
        if dec.is_empty() || dec.len() > 16 || dec.iter().any(|&c| c == 0 || c as u64 > MAX_SIZE) {
            bail!("{}: decoder_block_out_channels {dec:?} is not 1..=16 widths in 1..={MAX_SIZE}", path.display());
        }
        let cfg = VaeConfig {
            latent_channels: get_usize(&v, "latent_channels", Some(32), path, &mut d)?,
            out_channels: get_usize(&v, "out_channels", Some(3), path, &mut d)?,
            block_out_channels: enc,
            in_channels: v.get("in_channels").and_then(Value::as_u64).unwrap_or(3) as usize,
            use_quant_conv: v.get("use_quant_conv").and_then(Value::as_bool).unwrap_or(true),
            down_block_types: v
                .get("down_block_types")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|t| t.as_str().unwrap_or("?").to_string()).collect())
                .unwrap_or_default(),
            decoder_block_out_channels: dec,
            layers_per_block: get_usize_in(&v, "layers_per_block", Some(2), (0, 64), path, &mut d)?,
            norm_num_groups: get_usize(&v, "norm_num_groups", Some(32), path, &mut d)?,
            batch_norm_eps: get_f64(&v, "batch_norm_eps", 1e-4, true, path, &mut d)?,
            patch_size: [patch[0], patch[1]],
            use_post_quant_conv: v.get("use_post_quant_conv").and_then(Value::as_bool).unwrap_or(true),
            mid_block_add_attention: v.get("mid_block_add_attention").and_then(Value::as_bool).unwrap_or(true),
            defaulted: d,
        };
        if cfg.decoder_block_out_channels.iter().any(|c| c % cfg.norm_num_groups != 0) {
            bail!(
                "{}: decoder widths {:?} must be multiples of norm_num_groups {}{}",
                path.display(),
                cfg.decoder_block_out_channels,
                cfg.norm_num_groups,
                left_out(&cfg.defaulted)
            );
        }
        if cfg.out_channels != 3 {
            bail!("{}: out_channels {} (only RGB is supported)", path.display(), cfg.out_channels);
        }
        // diffusers' Decoder builds one up block per `up_block_types` entry, with the widths of
        // `decoder_block_out_channels`; only plain `UpDecoderBlock2D`s and SiLU are implemented.
        if let Some(types) = v.get("up_block_types").and_then(Value::as_array) {
            if types.len() != cfg.decoder_block_out_channels.len() || types.iter().any(|t| t.as_str() != Some("UpDecoderBlock2D")) {
                bail!(
                    "{}: up_block_types {types:?} (expected {} x \"UpDecoderBlock2D\", one per decoder width)",
                    path.display(),
                    cfg.decoder_block_out_channels.len()
                );
            }
        }
        match v.get("act_fn").and_then(Value::as_str) {
            None | Some("silu") | Some("swish") => {}
            Some(a) => bail!("{}: act_fn {a:?} (only silu is supported)", path.display()),
        }
        Ok(cfg)
    }
}

/// `scheduler/scheduler_config.json`.
pub fn scheduler_from_file(path: &Path) -> Result<crate::schedule::ScheduleConfig> {
    let v = read_json(path)?;
    let mut d = Defaulted::new();
    Ok(crate::schedule::ScheduleConfig {
        num_train_timesteps: get_usize_in(&v, "num_train_timesteps", Some(1000), (2, 100_000), path, &mut d)?,
        shift: get_f64(&v, "shift", 5.0, true, path, &mut d)?,
        training_shift: get_f64(&v, "training_shift", 1.0, true, path, &mut d)?,
    })
}
