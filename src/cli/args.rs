//! The command line (clap). `main` parses it and hands the values to the library.

use clap::{Args, Parser, Subcommand};
use moss::backend::Device;
pub use moss::options::{parse_size, Precision};
use std::path::PathBuf;

pub use super::bench::args::*;

/// `--version`: the crate version, the git revision, and the CUDA kernels built in.
pub fn long_version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let kernels = match moss::backend::cuda::kernel_archs() {
            Some(sms) => format!("CUDA kernels for sm_{}", sms.replace(',', ", sm_")),
            None => "built without CUDA kernels (CPU only)".to_string(),
        };
        format!("{} (git {})\n{kernels}", env!("CARGO_PKG_VERSION"), moss_cuda::GIT_REV)
    })
}

#[derive(Parser, Debug)]
#[command(
    name = "moss",
    version,
    long_version = long_version(),
    about = "Text to picture with the MOSS-Image model (OpenMOSS), on its own CUDA kernels",
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per run
pub enum Command {
    /// Render a prompt to a picture (PNG, JPEG or WebP): encode, denoise (50 Euler steps, CFG), decode.
    Generate(GenerateArgs),
    /// Encode a prompt (and the negative) to hidden states, for `generate --embeds`; or, with
    /// --image, a picture to latents for `moss decode`.
    Encode(EncodeArgs),
    /// Decode latents (--save-latents' file, or raw little-endian f32 [1,128,H/16,W/16]) to a picture.
    Decode(DecodeArgs),
    /// Check the checkpoint (and with --device cuda, every GPU kernel against the CPU reference).
    Check(CheckArgs),
    /// Print the settings a moss picture (PNG, JPEG or WebP) was made with.
    Info(InfoArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the man page (roff) to stdout, or write one page per subcommand into a folder.
    Man(ManArgs),
    /// Write the folder's transformer (or text encoder) as one quantized file: GGUF (q8_0, q4_0,
    /// q4_k, q5_k, q6_k) or ComfyUI comfy_quant safetensors (int8, int8-convrot, w4a8, w6a8), for
    /// --transformer (--text-encoder).
    Quantize(QuantizeArgs),
    /// Serve pictures over HTTP (OpenAI-compatible POST /v1/images/generations), weights resident.
    Serve(ServeArgs),
    /// Time the prompt encoder on token ids (a bench tool: src/cli/bench/encoder.rs).
    #[command(hide = true)]
    BenchEncode(BenchEncodeArgs),
    /// The DiT stage alone from an embeds file: timed forwards and guided loop, JSON out
    /// (a bench tool: src/cli/bench/dit.rs).
    #[command(hide = true)]
    BenchDit(BenchDitArgs),
    /// The VAE decoder alone on raw latents: synchronised timings, JSON out (src/cli/bench/vae.rs).
    #[command(hide = true)]
    BenchVae(BenchVaeArgs),
    /// The VAE encoder alone on a picture: synchronised timings, JSON out (src/cli/bench/vae_encode.rs).
    #[command(hide = true)]
    BenchVaeEncode(BenchVaeEncodeArgs),
    /// PSNR and SSIM of two pictures of one size, JSON out (src/cli/bench/compare.rs).
    #[command(hide = true)]
    BenchCompare { a: PathBuf, b: PathBuf },
}

#[derive(Args, Debug, Clone)]
pub struct ManArgs {
    /// Write moss.1 and a page per subcommand (moss-generate.1, moss-serve.1, ...) into DIR
    /// instead of printing moss.1.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Checkpoint folder, or a Hugging Face repo id resolved in the local HF cache.
    #[arg(long, env = "MOSS_MODEL", default_value = moss::checkpoint::DEFAULT_MODEL)]
    pub model: String,
    /// Where to compute: cuda, cuda:N or cpu (the slow fp32 reference).
    #[arg(long, default_value = "cuda", value_parser = parse_device)]
    pub device: Device,
    #[command(flatten)]
    pub files: ComponentFileArgs,
}

/// Components given as one file each; the rest of the model (configs, tokenizer, VAE) comes from
/// --model.
#[derive(Args, Debug, Clone, Default)]
pub struct ComponentFileArgs {
    /// A single-file transformer (DiT) instead of the folder's: GGUF (Q8_0, Q6_K, Q5_K, Q4_K,
    /// Q4_0, ..., F16/BF16/F32) or safetensors (bf16, or ComfyUI comfy_quant INT8 / INT8 ConvRot /
    /// FP8), recognised by its header.
    #[arg(long, value_name = "FILE")]
    pub transformer: Option<PathBuf>,
    /// A single-file text encoder instead of the folder's (safetensors, bf16 or comfy_quant INT8).
    #[arg(long, value_name = "FILE")]
    pub text_encoder: Option<PathBuf>,
}

impl ComponentFileArgs {
    pub fn files(&self) -> moss::checkpoint::ComponentFiles {
        moss::checkpoint::ComponentFiles { transformer: self.transformer.clone(), text_encoder: self.text_encoder.clone() }
    }
}

#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    /// The prompt text (blank prompts are refused).
    #[arg(long, short = 'p', conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from a UTF-8 text file instead.
    #[arg(long, value_name = "PATH")]
    pub prompt_file: Option<PathBuf>,
    /// The negative prompt (also --negative-prompt; the unconditional branch of CFG; unused at
    /// --guidance 1).
    #[arg(long, short = 'n', visible_alias = "negative-prompt", default_value = "")]
    pub negative: String,
    /// Keep at most this many prompt tokens (1..4096); longer prompts are cut with a warning.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_tokens: u32,
}

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Seed of the initial noise (torch CPU generator: the same seed gives the official noise);
    /// `random` or -1 draws one (printed on stderr and recorded in the picture).
    #[arg(long, short = 's', default_value = "42", value_parser = parse_seed, allow_negative_numbers = true)]
    pub seed: Seed,
    /// Render N pictures of the prompt in one load, seeds --seed, --seed + 1, ... (as batch items;
    /// -o without a `{seed}` gets `-{seed}` before its extension).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100000), conflicts_with = "seeds")]
    pub count: Option<u64>,
    /// Render one picture per seed (comma-separated) in one load.
    #[arg(long, value_name = "A,B,...", value_delimiter = ',', conflicts_with = "seed")]
    pub seeds: Option<Vec<u64>>,
    /// Render the picture a moss picture was made from again, with its recorded settings; flags
    /// given beside it override them.
    #[arg(long, value_name = "PICTURE", conflicts_with_all = ["prompts", "embeds"])]
    pub from: Option<PathBuf>,
    /// Denoising steps (the schedule: --schedule; the sampler: --sampler).
    #[arg(long, default_value_t = 50)]
    pub steps: u32,
    /// Classifier-free guidance scale (also --cfg-scale); exactly 1 runs no negative pass.
    #[arg(long, visible_alias = "cfg-scale", default_value_t = 3.0, allow_negative_numbers = true)]
    pub guidance: f32,
    /// Picture size WIDTHxHEIGHT, both multiples of 16, at most 4096.
    #[arg(long, default_value = "1024x1024", value_parser = parse_size, conflicts_with_all = ["width", "height"])]
    pub size: (u32, u32),
    /// Picture width (a multiple of 16, at most 4096), instead of --size [default: 1024].
    #[arg(long, short = 'W', value_name = "N")]
    pub width: Option<u32>,
    /// Picture height (a multiple of 16, at most 4096), instead of --size [default: 1024].
    #[arg(long, short = 'H', value_name = "N")]
    pub height: Option<u32>,
    /// Output picture, its format by the extension: .png, .jpg/.jpeg (--quality) or .webp
    /// (lossless); `-` writes PNG to stdout. An existing file is not replaced without --force.
    #[arg(long, short, default_value = "moss.png")]
    pub out: PathBuf,
    /// Replace output files that exist already (without it, moss refuses before any work; FIFOs,
    /// devices and `-` are always written; batch mode: --skip-existing skips them instead).
    #[arg(long, short = 'y')]
    pub force: bool,
    /// JPEG quality, 1..100 [default: 90] (JPEG output only).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: Option<u8>,
    #[command(flatten)]
    pub c2pa: super::c2pa_args::C2paArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Spread each picture's denoising over several GPUs, e.g. cuda:0,cuda:1 (lower latency; for
    /// throughput run one moss per GPU): with two, the prompt's and the negative's passes run on
    /// one each; with more, each pass also splits its tokens (Ulysses). The first GPU also
    /// encodes and decodes. `cpu` entries are ranks on CPU threads (the same logic, for tests).
    #[arg(long, value_name = "DEV,DEV,...", value_delimiter = ',', value_parser = parse_device, conflicts_with = "device")]
    pub devices: Option<Vec<Device>>,
    /// Also write the final latents: safetensors with `latents` f32 [1,128,H/16,W/16] and the
    /// settings, which `moss decode` reads without --size.
    #[arg(long, value_name = "PATH")]
    pub save_latents: Option<PathBuf>,
    /// Use hidden states written by `moss encode` instead of running the encoder.
    #[arg(long, value_name = "PATH")]
    pub embeds: Option<PathBuf>,
    /// DiT blocks the unconditional pass skips (comma-separated; "none" for none).
    #[arg(long, default_value = "22", value_parser = parse_skip)]
    pub uncond_skip: SkipList,
    /// Fraction of the steps START:STOP in which the skip applies (step i skips if START <= i/n < STOP).
    #[arg(long, default_value = "0:1", value_parser = parse_window)]
    pub skip_window: (f64, f64),
    #[command(flatten)]
    pub sampling: super::sampling_args::SamplingArgs,
    /// bf16: the model's own (bf16 weights and activations on the GPU, the hidden states
    /// rounded to bf16 between encoder and transformer); fp32: fp32 end to end, for verification
    /// (the CPU computes in fp32 either way; this keeps its hidden states fp32); fp8: as bf16 but
    /// the transformer's main-block linears in float8 e4m3 (per-row weight scales, per-token
    /// activation scales; GPUs of compute capability 8.9 and later, and the CPU); int8: the same
    /// linears as int8 (exact int32 sums; GPUs of compute capability 8.0 and later, and the CPU).
    #[arg(long, default_value_t = Precision::Bf16, value_parser = parse_precision)]
    pub precision: Precision,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print one JSON line with the result instead of the path (batch: one per finished picture).
    #[arg(long)]
    pub json: bool,
    /// A LoRA to merge into the transformer, PATH[:SCALE] (default scale 1); repeat to add several.
    #[arg(long, value_name = "PATH[:SCALE]", value_parser = moss::lora::LoraSpec::parse)]
    pub lora: Vec<moss::lora::LoraSpec>,
    /// GPU memory moss may use, in GiB [default: the device's free memory less 0.5 GiB]. Networks
    /// that do not fit stream their weights from host memory (same picture, slower); a cap above
    /// the device's memory is clamped, one below the smallest that works is refused naming it.
    #[arg(long, value_name = "GIB", value_parser = parse_max_vram)]
    pub max_vram: Option<f64>,
    /// Print the memory plan (what is resident, what streams, bytes moved per pass) and each
    /// stage's load and compute time on stderr.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub pictures: super::pictures_in_args::PicturesInArgs,
    #[command(flatten)]
    pub batch: BatchArgs,
}

/// Batch mode: many pictures from one invocation, the weights loaded once.
#[derive(Args, Debug, Clone)]
pub struct BatchArgs {
    /// Render every line of FILE ("-": stdin): a prompt, or a JSON object setting prompt, negative,
    /// seed, size, steps, guidance, sampler, schedule, cache, guidance_window, out. The other
    /// flags give the defaults.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_file", "embeds", "out", "save_latents"])]
    pub prompts: Option<PathBuf>,
    /// Folder the batch's pictures go to (created if missing) [default: .].
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// File name template: {index}, {line}, {seed}, {shard}, {stem} ({index:05}: zero-padded; {stem:20}: at most 20 chars) [default: {index:05}-{seed}.png].
    #[arg(long, value_name = "TEMPLATE")]
    pub name: Option<String>,
    /// Render only the items whose output file does not exist yet (resume a killed job).
    #[arg(long)]
    pub skip_existing: bool,
    /// Let a list item's "out" be an absolute path (by default every item stays inside --out-dir).
    #[arg(long)]
    pub allow_absolute_out: bool,
    /// Render only the items with index % N == K (K counts from 0); N processes split a list.
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    pub shard: Option<moss::batch::Shard>,
    /// Pictures per chunk (encode a chunk, free the encoder, denoise, decode, repeat) [default: 1
    /// on cpu, from the host's available memory on cuda].
    #[arg(long, value_name = "N", value_parser = parse_chunk)]
    pub chunk: Option<u64>,
}

impl BatchArgs {
    /// The first batch flag given without `--prompts` (checked here rather than with clap's
    /// `requires`, which stays silent when `--prompt` is there and names no flag otherwise).
    pub fn stray_flag(&self) -> Option<&'static str> {
        if self.prompts.is_some() {
            return None;
        }
        [
            ("--out-dir", self.out_dir.is_some()),
            ("--name", self.name.is_some()),
            ("--skip-existing", self.skip_existing),
            ("--allow-absolute-out", self.allow_absolute_out),
            ("--shard", self.shard.is_some()),
            ("--chunk", self.chunk.is_some()),
        ]
        .into_iter()
        .find(|f| f.1)
        .map(|f| f.0)
    }
}

#[derive(Args, Debug, Clone)]
pub struct QuantizeArgs {
    /// Checkpoint folder (bf16) or repo id whose transformer is written.
    #[arg(long, env = "MOSS_MODEL", default_value = moss::checkpoint::DEFAULT_MODEL)]
    pub model: String,
    /// The format: q8_0, q4_0, q4_k, q5_k, q6_k (GGUF) or int8, int8-convrot, w4a8, w6a8 (comfy_quant
    /// safetensors; w4a8 is comfy-kitchen's asym_w4a8_int8, the W4A8 text encoders' layout).
    #[arg(long)]
    pub to: moss::checkpoint::quantize::Target,
    /// Which component: transformer, or text-encoder (int8, int8-convrot, w4a8 and w6a8 only).
    #[arg(long, default_value = "transformer", value_parser = ["transformer", "text-encoder"])]
    pub component: String,
    /// The file to write (replaced only once complete).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct EncodeArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Encode this picture (PNG, JPEG or WebP; width and height multiples of 16) with the VAE
    /// encoder instead of a prompt: --out gets its latents, a file `moss decode` reads.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["prompt", "prompt_file"])]
    pub image: Option<PathBuf>,
    /// Output safetensors file (hidden states, token ids and prompt in its metadata; with
    /// --image, the picture's latents).
    #[arg(long, short)]
    pub out: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    /// bf16: the hidden states rounded to bf16, as `generate` feeds them to the transformer;
    /// fp32: an fp32 encoder (on the GPU) and F32 hidden states, for `generate --precision fp32`;
    /// fp8, int8: the bf16 file (their runs' encoder is the bf16 one).
    #[arg(long, default_value_t = Precision::Bf16, value_parser = parse_precision)]
    pub precision: Precision,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct DecodeArgs {
    /// Raw little-endian f32 latents [1,128,H/16,W/16] (as --save-latents writes them).
    pub latents: PathBuf,
    /// Picture size WIDTHxHEIGHT; square is inferred from the file length when left out.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<(u32, u32)>,
    /// Output picture: .png, .jpg/.jpeg (--quality) or .webp (lossless); `-` writes PNG to stdout.
    #[arg(long, short)]
    pub out: PathBuf,
    /// JPEG quality, 1..100 [default: 90] (JPEG output only).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: Option<u8>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
    /// Decode in strips of N latent rows instead of what the memory plan picks (same bytes; tests).
    #[arg(long, value_name = "N", hide = true, value_parser = parse_strip_rows)]
    pub strip_rows: Option<usize>,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Checkpoint folder or repo id to check.
    #[arg(long, env = "MOSS_MODEL", default_value = moss::checkpoint::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub files: ComponentFileArgs,
    /// Also gate every GPU kernel on this device against the CPU reference (cuda or cuda:N).
    #[arg(long, value_parser = parse_device)]
    pub device: Option<Device>,
    /// The gates' random seed (default: a fresh one each run, printed), to repeat a run.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print each gate family's time on stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

/// `moss serve`: an OpenAI-compatible image server; the weights stay loaded between requests.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Compute precision on the GPU (bf16, fp32, fp8 or int8, as `generate`).
    #[arg(long, default_value_t = Precision::Bf16, value_parser = parse_precision)]
    pub precision: Precision,
    /// Address to listen on; one that is not loopback needs --api-key (or --allow-insecure-bind).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// Port to listen on (0: any free port, printed at start-up).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Clients must send `Authorization: Bearer KEY`.
    #[arg(long, env = "MOSS_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Allow a non-loopback --host without an API key (anyone who reaches it can use the GPU).
    #[arg(long)]
    pub allow_insecure_bind: bool,
    /// Let web pages of this origin (`http://localhost:3000`) call the API from a browser (CORS);
    /// requests from any other page are refused. Repeatable.
    #[arg(long, value_name = "ORIGIN")]
    pub allow_origin: Vec<String>,
    /// Requests that may wait behind the running one; more get 429 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,
    /// Largest picture a request may ask for (its area bounds WIDTHxHEIGHT).
    #[arg(long, default_value = "2048x2048", value_parser = parse_size)]
    pub max_size: (u32, u32),
    /// Most denoising steps a request may ask for (1..1000).
    #[arg(long, default_value_t = 100)]
    pub max_steps: u32,
    /// Most tokens in a prompt (and in the negative prompt); longer ones get 400.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Another name requests may give the model (repeatable), e.g. gpt-image-1 or dall-e-3;
    /// `GET /v1/models` lists the model's id (its repo id or folder name) and these.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Largest POST /v1/images/edits body (the pictures and the fields) in bytes; larger ones get 413.
    #[arg(long, default_value_t = 50 << 20)]
    pub max_upload: usize,
    /// Seconds a client has to send its request headers, and its body.
    #[arg(long, default_value_t = 10)]
    pub client_timeout: u64,
    /// A LoRA to merge into the transformer at start-up, PATH[:SCALE]; repeat to add several.
    #[arg(long, value_name = "PATH[:SCALE]", value_parser = moss::lora::LoraSpec::parse)]
    pub lora: Vec<moss::lora::LoraSpec>,
    /// A folder of LoRAs (NAME.safetensors, or NAME/adapter_model.safetensors) that each request
    /// may choose by name (`"lora": [{"name": NAME, "scale": S}]`, at most 4; GET /v1/loras).
    #[arg(long, value_name = "DIR", conflicts_with = "lora")]
    pub lora_dir: Option<PathBuf>,
    #[command(flatten)]
    pub c2pa: super::c2pa_args::C2paArgs,
    /// Render each picture over several GPUs, e.g. cuda:0,cuda:1 (as `generate --devices`): one
    /// picture at a time with lower latency; for throughput run one server per GPU behind a
    /// balancer (deploy/).
    #[arg(long, value_name = "DEV,DEV,...", value_delimiter = ',', value_parser = parse_device, conflicts_with_all = ["device", "lora_dir"])]
    pub devices: Option<Vec<Device>>,
    /// DiT blocks the unconditional pass skips (as `generate --uncond-skip`).
    #[arg(long, default_value = "22", value_parser = parse_skip)]
    pub uncond_skip: SkipList,
    /// Fraction of the steps in which the skip applies (as `generate --skip-window`).
    #[arg(long, default_value = "0:1", value_parser = parse_window)]
    pub skip_window: (f64, f64),
    /// GPU memory the server may use, in GiB [default: the device's free memory less 0.5 GiB].
    /// What does not fit stays on the host and streams (same pictures, slower): the transformer
    /// keeps as many blocks as fit, then the VAE, then the text encoder's layers; a cap above the
    /// device's memory is clamped, one below the smallest that works is refused naming it.
    #[arg(long, value_name = "GIB", value_parser = parse_max_vram)]
    pub max_vram: Option<f64>,
}

#[derive(Args, Debug, Clone)]
pub struct InfoArgs {
    /// A picture written by moss.
    pub picture: PathBuf,
    /// Print the settings as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `--seed`: a number, or `random`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    Fixed(u64),
    Random,
}

impl Seed {
    /// The seed to use: a random one is drawn from the OS.
    pub fn resolve(self) -> u64 {
        match self {
            Seed::Fixed(s) => s,
            Seed::Random => {
                let mut b = [0u8; 8];
                use std::io::Read;
                match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
                    Ok(()) => u64::from_le_bytes(b),
                    Err(_) => std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64 ^ (std::process::id() as u64) << 32),
                }
            }
        }
    }
}

pub(crate) fn parse_strip_rows(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a number of latent rows (1 or more)")),
    }
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a chunk size: give a whole number of pictures, 1 or more (1 writes each picture as soon as it is made)")),
    }
}

fn parse_seed(s: &str) -> Result<Seed, String> {
    if s == "random" || s == "rand" || s == "-1" {
        return Ok(Seed::Random);
    }
    s.parse().map(Seed::Fixed).map_err(|_| format!("seed `{s}` is not a number from 0 to 2^64-1, `random` or -1"))
}

/// A list of block indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkipList(pub Vec<usize>);

fn parse_shard(s: &str) -> Result<moss::batch::Shard, String> {
    s.parse()
}

pub(crate) fn parse_device(s: &str) -> Result<Device, String> {
    s.parse()
}

fn parse_max_vram(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(g) if g.is_finite() && g > 0.0 => Ok(g),
        _ => Err(format!("`{s}` is not a positive number of GiB")),
    }
}

pub(crate) fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
}

pub(crate) fn parse_skip(s: &str) -> Result<SkipList, String> {
    if s.trim().is_empty() || s.trim() == "none" {
        return Ok(SkipList(vec![]));
    }
    s.split(',').map(|v| v.trim().parse::<usize>().map_err(|_| format!("`{v}` is not a block index"))).collect::<Result<Vec<_>, _>>().map(SkipList)
}

pub fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s.split_once(':').ok_or_else(|| format!("window `{s}` is not START:STOP"))?;
    let p = |v: &str| v.trim().parse::<f64>().map_err(|_| format!("window `{s}` is not START:STOP"));
    let (a, b) = (p(a)?, p(b)?);
    if !(a.is_finite() && b.is_finite() && a <= b) {
        return Err(format!("window `{s}` must have finite START <= STOP"));
    }
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_and_windows() {
        assert_eq!(parse_skip("22"), Ok(SkipList(vec![22])));
        assert_eq!(parse_skip("none"), Ok(SkipList(vec![])));
        assert_eq!(parse_skip("1, 2"), Ok(SkipList(vec![1, 2])));
        assert_eq!(parse_window("0.01:1"), Ok((0.01, 1.0)));
        assert!(parse_window("1:0").is_err());
    }

    fn generate(argv: &[&str]) -> Result<GenerateArgs, clap::Error> {
        match Cli::try_parse_from([&["moss", "generate"], argv].concat())?.command {
            Command::Generate(a) => Ok(a),
            _ => unreachable!(),
        }
    }

    /// The spellings sd.cpp and A1111 users type parse to the long flags' values.
    #[test]
    fn short_forms_and_aliases() {
        let a = generate(&["-p", "a cat", "-n", "dog", "-s", "7", "-W", "512", "-H", "768", "--cfg-scale", "4.5", "-y"]).unwrap();
        assert_eq!((a.prompt.prompt.as_deref(), a.prompt.negative.as_str(), a.seed), (Some("a cat"), "dog", Seed::Fixed(7)));
        assert_eq!((a.width, a.height, a.guidance, a.force), (Some(512), Some(768), 4.5, true));
        assert_eq!(generate(&["-p", "x", "--seed", "-1"]).unwrap().seed, Seed::Random);
        assert_eq!(generate(&["-p", "x", "-s", "-1"]).unwrap().seed, Seed::Random);
        assert!(generate(&["-p", "x", "--seed", "-2"]).is_err());
        assert!(generate(&["-p", "x", "--negative-prompt", "dog"]).is_ok());
        let e = generate(&["-p", "x", "--size", "64x64", "-W", "32"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
    }
}
