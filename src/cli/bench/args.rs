//! The hidden benchmark commands' arguments (`moss bench-dit`, `bench-encode`, `bench-vae`,
//! `bench-vae-encode`).

use crate::cli::args::{parse_device, parse_precision, parse_size, parse_skip, parse_strip_rows, parse_window, ModelArgs, Precision, SkipList};
use clap::Args;
use moss::backend::Device;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct BenchVaeEncodeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The picture (PNG, JPEG or WebP; sides multiples of 16).
    #[arg(long)]
    pub image: PathBuf,
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Write the latents (raw little-endian f32 [1,128,H/16,W/16]) here.
    #[arg(long)]
    pub out_f32: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchVaeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Raw little-endian f32 latents [1,128,H/16,W/16] (square).
    #[arg(long)]
    pub latents: PathBuf,
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Write the raw decoder output [3,H,W] f32 here.
    #[arg(long)]
    pub out_f32: Option<PathBuf>,
    /// Write the RGB8 bytes (HWC) here.
    #[arg(long)]
    pub out_rgb: Option<PathBuf>,
    /// Only the pipeline's decode (`decode_rgb8`, split as the memory plan says): no whole
    /// forwards, no profile.
    #[arg(long)]
    pub decode_only: bool,
    /// Strip mode: time the whole decode against a split decode in strips of N rows (the RGB8
    /// bytes compared; --out-rgb gets the split decode's).
    #[arg(long, value_name = "N", value_parser = parse_strip_rows)]
    pub strip_rows: Option<usize>,
    /// Strip mode: GiB of device memory the split decode may keep pictures in (default 0: every
    /// picture in host memory).
    #[arg(long, value_name = "GIB", requires = "strip_rows")]
    pub keep_gib: Option<f64>,
    /// Strip mode with the planner's split for this many GiB free for activations (strips and
    /// kept pictures), instead of --strip-rows/--keep-gib.
    #[arg(long, value_name = "GIB", conflicts_with = "strip_rows")]
    pub plan_free_gib: Option<f64>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchDitArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Embeds file (`moss encode`) with the cond and uncond hidden states.
    #[arg(long, value_name = "PATH")]
    pub embeds: PathBuf,
    #[arg(long, default_value = "1024x1024", value_parser = parse_size)]
    pub size: (u32, u32),
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub steps: u32,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long, default_value_t = 3.0, allow_negative_numbers = true)]
    pub guidance: f32,
    #[arg(long, default_value = "22", value_parser = parse_skip)]
    pub uncond_skip: SkipList,
    #[arg(long, default_value = "0:1", value_parser = parse_window)]
    pub skip_window: (f64, f64),
    #[arg(long, default_value_t = Precision::Bf16, value_parser = parse_precision)]
    pub precision: Precision,
    /// Timed forwards (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub forwards: usize,
    /// Skip the guided loop.
    #[arg(long)]
    pub forward_only: bool,
    /// Write the loop's final latents (raw little-endian f32 [1,C,h,w]).
    #[arg(long, value_name = "PATH")]
    pub save_latents: Option<PathBuf>,
    /// Write the velocity of the (last) timed forward (raw little-endian f32 [1,C,h,w]).
    #[arg(long, value_name = "PATH")]
    pub save_velocity: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchEncodeArgs {
    /// A `text_encoder/` folder: config.json and safetensors with `language_model.` keys.
    #[arg(long)]
    pub model: PathBuf,
    /// How many pseudo-random token ids (from --seed), unless --ids-file is given.
    #[arg(long, default_value_t = 128)]
    pub ids: usize,
    /// Token ids, whitespace- or comma-separated (a JSON list works); repeatable (the model
    /// is loaded once).
    #[arg(long)]
    pub ids_file: Vec<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Timed forwards after the first.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    #[arg(long, default_value = "cuda", value_parser = parse_device)]
    pub device: Device,
    #[arg(long, default_value_t = Precision::Bf16, value_parser = parse_precision)]
    pub precision: Precision,
    /// Write the hidden states (f32 safetensors, key `hidden`); one per --ids-file.
    #[arg(long)]
    pub out: Vec<PathBuf>,
}
