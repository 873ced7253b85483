//! What a finished picture reports: the `--json` line and the `-v` timings.

use super::{parallel_json, Forwards};
use crate::backend::Device;
use std::path::PathBuf;

/// What a finished picture reports.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub path: PathBuf,
    pub seed: u64,
    pub steps: u32,
    pub width: u32,
    pub height: u32,
    pub encode_s: f64,
    /// The VAE encoder on the init image (0 for a picture from text).
    pub image_encode_s: f64,
    pub denoise_s: f64,
    pub decode_s: f64,
    pub total_s: f64,
    /// Merging the LoRAs into the transformer's weights (part of `denoise_s`, where they load):
    /// the host's preparation and the device's time, apart.
    pub lora_merge: crate::lora::plan::MergeTime,
    /// Reading and checking the LoRA files (before the stages; beside the device's start-up).
    pub lora_read_s: f64,
    /// Each stage split into loading its weights (host time reading and issuing the copies, or
    /// waiting for a load that ran behind the previous stage) and the rest.
    pub encode_load_s: f64,
    pub denoise_load_s: f64,
    pub decode_load_s: f64,
    /// The transformer's load time on its own thread while the text encoder ran (0: it did not).
    pub denoise_load_behind_s: f64,
    /// The memory plan (`--json` `plan`), when one was made.
    pub plan: Option<serde_json::Value>,
    pub warnings: Vec<String>,
    /// What the denoising loop computed.
    pub forwards: Forwards,
    /// `--devices`: the devices and how the picture's passes spread over them.
    pub parallel: Option<(Vec<Device>, crate::parallel::Layout)>,
}

impl Report {
    pub fn json(&self) -> String {
        let mut j = serde_json::json!({
            "path": self.path.display().to_string(),
            "seed": self.seed,
            "steps": self.steps,
            "width": self.width,
            "height": self.height,
            "timings": {"encode_s": self.encode_s, "image_encode_s": self.image_encode_s, "denoise_s": self.denoise_s,
                        "decode_s": self.decode_s, "total_s": self.total_s,
                        "encode_load_s": self.encode_load_s, "encode_compute_s": self.encode_s - self.encode_load_s,
                        "denoise_load_s": self.denoise_load_s, "denoise_compute_s": self.denoise_s - self.denoise_load_s,
                        "denoise_load_behind_s": self.denoise_load_behind_s,
                        "decode_load_s": self.decode_load_s, "decode_compute_s": self.decode_s - self.decode_load_s,
                        "lora_read_s": self.lora_read_s},
            "plan": self.plan,
            "forwards": self.forwards,
            "parallel": self.parallel.as_ref().map(parallel_json),
        });
        for (k, v) in self.lora_merge.json_entries() {
            j["timings"][k] = v.into();
        }
        j.to_string()
    }

    /// The `-v` line of the timings: each stage's load and compute.
    pub fn timing_line(&self) -> String {
        format!(
            "timings: {}encode {:.2} s (load {:.2}), denoise {:.2} s (load {:.2}{}{}), decode {:.2} s (load {:.2}), total {:.2} s",
            if self.image_encode_s > 0.0 { format!("init image encode {:.2} s, ", self.image_encode_s) } else { String::new() },
            self.encode_s,
            self.encode_load_s,
            self.denoise_s,
            self.denoise_load_s,
            if self.denoise_load_behind_s > 0.0 { format!(", {:.2} behind the encoder", self.denoise_load_behind_s) } else { String::new() },
            if self.lora_merge.tensors > 0 { format!(", LoRA merge {}", self.lora_merge.line()) } else { String::new() },
            self.decode_s,
            self.decode_load_s,
            self.total_s
        )
    }
}
