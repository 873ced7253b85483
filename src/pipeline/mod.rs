//! The staged pipeline: encode (then free the encoder), denoise (then free the DiT), decode.
//! Every input is checked before any heavy work; each stage maps only the component it needs.

use crate::backend::cpu::Cpu;
use crate::backend::ops::{DitOps, EncoderOps, VaeEncodeOps, VaeOps};
use crate::backend::Device;
use crate::checkpoint::{self, Checkpoint};
use crate::embeds::Embeds;
use crate::model::{dit::Dit, dit::MainLinears, encoder::Encoder, vae::VaeDecoder};
use crate::options::Precision;
use crate::plan::run::RunPlan;
use crate::plan::Budget;
pub use crate::plan::MemoryOptions;
use crate::png;
pub use crate::prompt::Cut;
use crate::spec::PictureSpec;
use crate::tensor::Tensor;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

mod denoise;
mod encode_image;
mod files;
mod hires;
mod init;
mod preview;
mod report;
mod team;
mod text;
pub use denoise::*;
pub use encode_image::*;
pub use files::*;
pub use hires::*;
pub use init::*;
pub use preview::*;
pub use report::*;
pub use team::*;
pub use text::*;

/// Everything one picture needs: its settings, and where it goes.
#[derive(Clone, Debug)]
pub struct Request {
    pub spec: PictureSpec,
    pub out: PathBuf,
    pub save_latents: Option<PathBuf>,
    pub embeds: Option<PathBuf>,
    /// The file the prompt was read from (checked not to be an output).
    pub prompt_file: Option<PathBuf>,
    /// The picture the settings were read from (`--from`; checked not to be an output).
    pub from: Option<PathBuf>,
    /// Where it runs (recorded in the picture's metadata).
    pub device: Device,
    /// JPEG quality 1..100 (None: [`crate::picture::DEFAULT_QUALITY`]); only for a JPEG `out`.
    pub quality: Option<u8>,
    /// The texts cut at `max_tokens` (set where they are tokenized; recorded in the picture).
    pub cut: Cut,
    /// The pictures the run starts from, at its size (`spec.init_image` names them).
    pub init: Option<std::sync::Arc<Prepared>>,
    /// Whether an existing regular file at `out` (or `save_latents`) may be replaced (`--force`);
    /// when not, it is refused before any work and never replaced at the end.
    pub replace: bool,
    /// `--preview`: the file the decoded x0 prediction replaces every `preview_every` steps.
    pub preview: Option<PathBuf>,
    pub preview_every: usize,
    /// What the denoising loop computed (set when it ends; recorded in the picture).
    pub forwards: Option<Forwards>,
    /// `--c2pa-cert`/`--c2pa-key`: the picture also gets a signed C2PA manifest.
    pub c2pa: Option<std::sync::Arc<crate::c2pa_manifest::ManifestSigner>>,
}

impl Request {
    /// A request for `spec` written to `out` on `device`, with nothing else set.
    pub fn new(spec: PictureSpec, out: PathBuf, device: Device) -> Request {
        Request {
            spec,
            out,
            save_latents: None,
            embeds: None,
            prompt_file: None,
            from: None,
            device,
            quality: None,
            cut: Cut::default(),
            replace: true,
            preview: None,
            preview_every: DEFAULT_PREVIEW_EVERY,
            forwards: None,
            init: None,
            c2pa: None,
        }
    }
}

/// Progress callbacks (the CLI draws bars on a terminal; scripts get nothing).
pub trait Progress {
    fn stage(&mut self, _name: &str) {}
    fn step(&mut self, _done: usize, _total: usize) {}
    fn warn(&mut self, msg: &str) {
        eprintln!("moss: warning: {msg}");
    }
    /// The memory plan's line (`-v` prints it).
    fn plan(&mut self, _line: &str) {}
    /// Asked after every denoising step: true stops the loop there with [`Interrupted`].
    fn cancelled(&self) -> bool {
        false
    }
    /// Whether a preview is wanted after step `done` of `total` (asked once per step before the
    /// loop starts; never after the last step).
    fn preview_wanted(&self, _done: usize, _total: usize) -> bool {
        false
    }
    /// The preview after step `done`: the decoded x0 prediction (`x − σ·v` at the step's start),
    /// RGB8 in rows, `width` x `height`. An error stops the loop.
    fn preview(&mut self, _done: usize, _total: usize, _rgb: &[u8], _width: u32, _height: u32) -> Result<()> {
        Ok(())
    }
}

/// The error a run stops with when [`Progress::cancelled`] said so (Ctrl-C in batch mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted")
    }
}

impl std::error::Error for Interrupted {}

pub struct Silent;
impl Progress for Silent {}

/// Check the cheap things first: numbers, then paths.
pub fn validate(req: &Request) -> Result<()> {
    if req.spec.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if req.spec.steps > 1000 {
        bail!("--steps {} is above the 1000 training timesteps", req.spec.steps);
    }
    if !req.spec.guidance.is_finite() {
        bail!("--guidance must be a finite number, got {}", req.spec.guidance);
    }
    crate::options::parse_size(&format!("{}x{}", req.spec.width, req.spec.height)).map_err(anyhow::Error::msg)?;
    crate::output::check(&req.out)?;
    if let Some(p) = &req.save_latents {
        crate::output::check(p)?;
        if crate::output::is_stdout(p) && crate::output::is_stdout(&req.out) {
            bail!("--out and --save-latents cannot both be stdout (-)");
        }
    }
    if let Some(p) = &req.embeds {
        std::fs::File::open(p).with_context(|| format!("cannot read embeds {}", p.display()))?;
    }
    req.spec.check().map_err(anyhow::Error::msg)?;
    if let Some(p) = &req.preview {
        check_preview(p, req.preview_every)?;
    }
    check_init(req)
}

/// The pictures in and the spec agree: the spec starts from a picture exactly when the request
/// brings one, at the spec's size; the spec's rules hold.
pub fn check_init(req: &Request) -> Result<()> {
    req.spec.check().map_err(anyhow::Error::msg)?;
    match (&req.spec.init_image, &req.init) {
        (None, None) => Ok(()),
        (Some(i), None) => bail!("the settings start from an init image (sha256 {}): give it (--init-image)", i.sha256),
        (None, Some(_)) => bail!("an init image was given to a run whose settings start from none"),
        (Some(_), Some(p)) if (p.width, p.height) != (req.spec.width, req.spec.height) => {
            bail!("the init image was prepared at {}x{}, the run is {}x{}", p.width, p.height, req.spec.width, req.spec.height)
        }
        (Some(_), Some(_)) => Ok(()),
    }
}

/// The files a run reads besides the checkpoint's: the LoRA files (and a PEFT `adapter_config.json`
/// beside one), and `req`'s prompt file, embeds file and `--from` picture.
pub fn input_files(req: Option<&Request>, loras: &[crate::lora::LoraSpec]) -> Vec<(&'static str, PathBuf)> {
    let mut ins = vec![];
    for l in loras {
        ins.push(("the LoRA", l.path.clone()));
        ins.push(("the LoRA's config", crate::lora::config_path(&l.path)));
    }
    if let Some(req) = req {
        if let Some(p) = &req.prompt_file {
            ins.push(("the prompt file", p.clone()));
        }
        if let Some(p) = &req.embeds {
            ins.push(("the embeds file", p.clone()));
        }
        if let Some(p) = &req.from {
            ins.push(("the --from picture", p.clone()));
        }
        if let Some(p) = &req.init {
            ins.extend(p.inputs.iter().cloned());
        }
    }
    ins
}

/// Every input ([`input_files`], the checkpoint's files) is no output of `req`, and its two outputs
/// are not one file. Then the picture's format (its extension, `req.quality`): a clash is the
/// graver mistake, said first.
pub fn check_outputs(req: &Request, ck: &Checkpoint, loras: &[crate::lora::LoraSpec]) -> Result<()> {
    let mut outs: Vec<(&str, &Path)> = vec![("--out", &req.out)];
    if let Some(p) = &req.save_latents {
        outs.push(("--save-latents", p));
    }
    if let Some(p) = &req.preview {
        outs.push(("--preview", p));
    }
    let files = crate::output::files_below(&ck.loc.root);
    let mut ins: Vec<(&str, &Path)> = files.iter().map(|f| ("a checkpoint file", f.as_path())).collect();
    let others = input_files(Some(req), loras);
    ins.extend(others.iter().map(|(w, p)| (*w, p.as_path())));
    crate::output::check_distinct(&outs, &ins)?;
    crate::picture::check(&req.out, req.quality).map(|_| ())
}

/// `out` is none of the checkpoint's files.
pub fn check_not_checkpoint(out: &Path, ck: &Checkpoint) -> Result<()> {
    let mut files = crate::output::files_below(&ck.loc.root);
    files.extend(["transformer", "text_encoder"].iter().filter_map(|c| ck.files.of(c).map(Path::to_path_buf)));
    let ins: Vec<(&str, &Path)> = files.iter().map(|f| ("a checkpoint file", f.as_path())).collect();
    crate::output::check_distinct(&[("--out", out)], &ins)
}

/// The components the command line gave as single files (`--transformer`, `--text-encoder`): every
/// checkpoint this process opens takes them. Set once, before any checkpoint is opened.
static COMPONENT_FILES: std::sync::OnceLock<checkpoint::ComponentFiles> = std::sync::OnceLock::new();

pub fn set_component_files(files: checkpoint::ComponentFiles) {
    let _ = COMPONENT_FILES.set(files);
}

/// Locate and open the checkpoint, checking the components agree with each other.
pub fn open_checkpoint(model: &str) -> Result<Checkpoint> {
    let files = COMPONENT_FILES.get().cloned().unwrap_or_default();
    let ck = Checkpoint::open_with(checkpoint::locate(model)?, files)?;
    if ck.vae.packed_channels() != ck.dit.latent_channels {
        bail!("{}: the VAE packs {} latent channels but the transformer takes {}", ck.loc.root.display(), ck.vae.packed_channels(), ck.dit.latent_channels);
    }
    if ck.encoder.hidden_size != ck.dit.text_dim {
        bail!("{}: the text encoder is {} wide but the transformer's text_dim is {}", ck.loc.root.display(), ck.encoder.hidden_size, ck.dit.text_dim);
    }
    Ok(ck)
}

/// The warning for `--uncond-skip` indices past the transformer's last block (they skip nothing).
pub fn skips_beyond(skip: &[usize], ck: &Checkpoint) -> Option<String> {
    let blocks = ck.dit.num_layers;
    let past: Vec<String> = skip.iter().filter(|&&i| i >= blocks).map(|i| i.to_string()).collect();
    (!past.is_empty())
        .then(|| format!("--uncond-skip {}: the transformer has {blocks} blocks (0..{}); an index past the last skips nothing", past.join(","), blocks - 1))
}

/// The CUDA backend on `cuda:n`, or a clear error naming the device. At `--precision fp8` a GPU
/// without float8 tensor cores (compute capability below 8.9), at `--precision int8` one below
/// 8.0, is refused here, before any weights load.
pub fn cuda(n: usize, precision: crate::options::Precision) -> Result<crate::backend::cuda::ops::Cuda> {
    let cu = crate::backend::cuda::ops::Cuda::new(n, precision).with_context(|| format!("cannot use cuda:{n}"))?;
    if precision == Precision::Fp8 {
        cu.check_fp8().with_context(|| format!("--precision fp8 on cuda:{n} ({})", cu.gpu().name))?;
    }
    if precision == Precision::Int8 {
        cu.check_int8().with_context(|| format!("--precision int8 on cuda:{n} ({})", cu.gpu().name))?;
    }
    Ok(cu)
}

/// Denoise from the seed's noise; returns the final latents `[1, C, h, w]`. The text refiner
/// runs once per prompt (the negative only when guidance is not exactly 1); the unconditional
/// pass skips `req.uncond_skip` at the steps inside `req.skip_window`.
pub fn denoise<B: DitOps + VaeOps>(b: &B, ck: &Checkpoint, req: &Request, cond: &Tensor, uncond: &Tensor, progress: &mut dyn Progress) -> Result<Tensor> {
    let comp = ck.open_component("transformer")?;
    let image = (req.spec.height / 16) as usize * (req.spec.width / 16) as usize;
    b.plan_dit(&comp, &ck.dit, image, cond.shape[0].max(uncond.shape[0]))?;
    let dit = Dit::load(b, &comp, &ck.dit, MainLinears::of(req.spec.precision))?;
    denoise_with(b, &dit, ck, req, cond, uncond, progress)
}

/// [`denoise`] with a transformer already loaded (batch mode loads it once for many pictures):
/// [`denoise_loop`]'s latents.
pub fn denoise_with<B: DitOps + VaeOps>(
    b: &B,
    dit: &Dit<B>,
    ck: &Checkpoint,
    req: &Request,
    cond: &Tensor,
    uncond: &Tensor,
    progress: &mut dyn Progress,
) -> Result<Tensor> {
    Ok(denoise_loop(b, dit, ck, req, Pass::of(&req.spec), (cond, uncond), None, progress, None)?.latents)
}

/// Decode latents `[1, C, h, w]` to RGB8 (HWC); the clamp and rounding run on the backend.
pub fn decode_rgb<B: VaeOps>(b: &B, ck: &Checkpoint, z: &Tensor) -> Result<Vec<u8>> {
    anyhow::ensure!(z.shape.len() == 4, "VAE decode: latents {:?}", z.shape);
    load_vae(b, ck, z.shape[2], z.shape[3])?.decode_rgb8(b, z)
}

/// Plan (for latents `h` x `w`) and load the VAE decoder.
pub fn load_vae<B: VaeOps>(b: &B, ck: &Checkpoint, h: usize, w: usize) -> Result<VaeDecoder<B>> {
    let comp = ck.open_component("vae")?;
    b.plan_vae(&comp, &ck.vae, h, w)?;
    VaeDecoder::load(b, &comp, &ck.vae)
}

/// The picture file of `req` from its final latents `z` with a loaded VAE: decoded, then encoded
/// with the picture's metadata in the format of `req.out` (PNG for the server's empty path), and
/// signed last when `req.c2pa` is set. `generate`, batch mode and the server all write these bytes.
pub fn picture_bytes<B: VaeOps>(b: &B, vae: &VaeDecoder<B>, ck: &Checkpoint, req: &Request, z: &Tensor, progress: &mut dyn Progress) -> Result<Vec<u8>> {
    let mut rgb = vae.decode_rgb8(b, z)?;
    if let Some(p) = &req.init {
        p.composite(&mut rgb)?;
    }
    let (w, h) = req.spec.out_size();
    let pic = crate::picture::encode(&req.out, req.quality, &rgb, w, h, &metadata(req, ck))?;
    if let Some(w) = pic.warning(&req.out) {
        progress.warn(&w);
    }
    crate::c2pa_manifest::signed(req.c2pa.as_deref(), pic.bytes, &req.out)
}

/// The PNG text metadata of a picture rendered for `req` (`crate::metadata`).
pub fn metadata(req: &Request, ck: &Checkpoint) -> png::Metadata {
    crate::metadata::for_request(req, ck)
}

/// One picture, end to end.
pub fn generate(req: &Request, model: &str, device: Device, progress: &mut dyn Progress) -> Result<Report> {
    generate_with_loras(req, model, &[], device, progress)
}

/// [`generate`] with adapters merged into the transformer (checked before any heavy work).
pub fn generate_with_loras(req: &Request, model: &str, loras: &[crate::lora::LoraSpec], device: Device, progress: &mut dyn Progress) -> Result<Report> {
    generate_planned(req, model, loras, device, &MemoryOptions::default(), progress)
}

/// [`generate_with_loras`] under the memory options `mem` (`--max-vram`): the plan is made
/// before any weights load (refused when even streaming does not fit), shown through
/// [`Progress::plan`], and followed: networks resident, streamed, or loaded behind the encoder.
pub fn generate_planned(
    req: &Request,
    model: &str,
    loras: &[crate::lora::LoraSpec],
    device: Device,
    mem: &MemoryOptions,
    progress: &mut dyn Progress,
) -> Result<Report> {
    generate_devices(req, model, loras, &[device], mem, progress)
}

/// [`generate_planned`] on `devices` (`--devices`): the first encodes and decodes, the others
/// join its denoising ([`Team`]).
pub fn generate_devices(
    req: &Request,
    model: &str,
    loras: &[crate::lora::LoraSpec],
    devices: &[Device],
    mem: &MemoryOptions,
    progress: &mut dyn Progress,
) -> Result<Report> {
    let t0 = Instant::now();
    validate(req)?;
    check_devices(devices)?;
    let device = devices[0];
    std::thread::scope(|s| {
        // The device opens (driver, CUDA context, kernel modules, cuBLASLt) while the checkpoint
        // opens and the prompts tokenize: neither waits for the other.
        let opening = match device {
            Device::Cuda(n) => Some(s.spawn(move || cuda(n, req.spec.precision))),
            Device::Cpu => None,
        };
        let mut ck = open_checkpoint(model)?;
        check_outputs(req, &ck, loras)?;
        check_for(req, &ck)?;
        if devices.len() > 1 {
            layout_for(req, &ck, devices.len())?;
        }
        ck.attach_loras(loras)?;
        if !req.replace {
            // After the graver problems: an input as output (check_outputs), a bad LoRA.
            crate::output::refuse_existing(&req.out)?;
            if let Some(p) = &req.save_latents {
                crate::output::refuse_existing(p)?;
            }
            // The preview's first write: its later ones replace its own.
            if let Some(p) = &req.preview {
                crate::output::refuse_existing(p)?;
            }
        }
        ck.start_model_hash();
        // Tokenized once: the CUDA planner needs the lengths, the encoder the ids.
        let (tokens, cut) = match &req.embeds {
            Some(_) => (None, Cut::default()),
            None => {
                let (t, cut) = tokenize_prompts(&ck, &prompt_texts(req), req.spec.max_tokens, progress)?;
                (Some(t), cut)
            }
        };
        let req = &Request { cut, ..req.clone() };
        let longest = tokens.as_ref().map_or(0, |t| t.iter().map(Vec::len).max().unwrap_or(0));
        let plan = |budget: Budget, progress: &mut dyn Progress| -> Result<RunPlan> {
            let mut nets = crate::plan::run::networks(&ck, &budget, longest, req.spec.out_size())?;
            crate::plan::run::with_pictures_in(&mut nets, &ck, &budget, &req.spec);
            if req.preview.is_some() {
                // The previews decode beside the transformer: its stage holds the VAE and a
                // decode in the narrowest strips too.
                let vae = &nets[2];
                nets[1].activations += vae.weights + vae.strip_activations.unwrap_or(vae.activations);
            }
            let p = crate::plan::run::decide(&nets, &budget, mem)?;
            if let Some(w) = &p.warning {
                progress.warn(w);
            }
            progress.plan(&p.line());
            Ok(p)
        };
        // With --devices, the team (its transports' buffers) first: this device's plan sees them.
        let linears = MainLinears::of(req.spec.precision);
        let helper_plan = helper_plan(&ck, linears, longest, req.spec.out_size(), *mem);
        match opening {
            None => {
                let team = if devices.len() > 1 { Some(Team::start(&Cpu, devices, req.spec.precision, &ck, linears, helper_plan)?) } else { None };
                let p = plan(crate::backend::cpu_budget().with_linears(linears), progress)?;
                generate_on(&Cpu, &ck, req, tokens, progress, t0, &p, team)
            }
            Some(opening) => {
                let cu = opening.join().map_err(|_| anyhow::anyhow!("the thread opening the GPU panicked"))??;
                // Made on the opening thread: current on this one from here on.
                cu.gpu().ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("CUDA context: {e:?}"))?;
                let team = if devices.len() > 1 { Some(Team::start(&cu, devices, req.spec.precision, &ck, linears, helper_plan)?) } else { None };
                let p = plan(cu.budget()?, progress)?;
                generate_on(&cu, &ck, req, tokens, progress, t0, &p, team)
            }
        }
    })
}

/// The texts `req` encodes: the prompt, and the negative unless guidance is exactly 1.
pub fn prompt_texts(req: &Request) -> Vec<&str> {
    if req.spec.guidance != 1.0 {
        vec![&req.spec.prompt, &req.spec.negative]
    } else {
        vec![&req.spec.prompt]
    }
}

/// `tokens`: the ids of [`prompt_texts`] (None with `req.embeds`); `plan`: what to load how;
/// `team`: the other devices of `--devices` (they denoise with this one).
#[allow(clippy::too_many_arguments)]
fn generate_on<B: EncoderOps + TeamBackend + VaeEncodeOps + Sync>(
    b: &B,
    ck: &Checkpoint,
    req: &Request,
    tokens: Option<Vec<Vec<u32>>>,
    progress: &mut dyn Progress,
    t0: Instant,
    plan: &RunPlan,
    mut team: Option<Team<B>>,
) -> Result<Report>
where
    B::T: Send,
{
    let mut rep = Report {
        path: req.out.clone(),
        seed: req.spec.seed,
        steps: req.spec.steps,
        width: req.spec.out_size().0,
        height: req.spec.out_size().1,
        plan: Some(plan.json()),
        ..Default::default()
    };
    rep.parallel = team.as_ref().map(|t| t.spread(req, ck)).transpose()?;
    if let Some((d, l)) = &rep.parallel {
        progress.plan(&parallel_line(d, *l));
    }
    // The init image first, while nothing else is loaded: its latents are a small host tensor.
    let start = match &req.init {
        Some(p) => {
            progress.stage("encode picture");
            let t = Instant::now();
            b.limit_vae_activations(plan.vae_activations);
            let z0 = encode_picture(b, ck, p)?;
            b.release_cached()?;
            rep.image_encode_s = t.elapsed().as_secs_f64();
            Some(Start::of(p, z0)?)
        }
        None => None,
    };
    let mut dit_comp = Some(ck.open_component("transformer")?);
    // With embeds, the texts the picture records are the ones the file was encoded from.
    let mut from_embeds = None;
    let (cond, uncond, dit) = match (&req.embeds, tokens) {
        (Some(p), _) => {
            let e: Embeds = crate::embeds::read(p)?;
            if e.cond.hidden.shape[1] != ck.dit.text_dim {
                bail!("{}: hidden states are {} wide, the transformer takes {}", p.display(), e.cond.hidden.shape[1], ck.dit.text_dim);
            }
            let spec = PictureSpec { prompt: e.cond.text.clone(), negative: e.uncond.text.clone(), max_tokens: e.max_tokens, ..req.spec.clone() };
            from_embeds = Some(Request { spec, cut: e.cut, ..req.clone() });
            (stage_boundary(e.cond.hidden, req.spec.precision), stage_boundary(e.uncond.hidden, req.spec.precision), None)
        }
        (None, None) => bail!("generate: neither embeds nor prompt tokens"),
        (None, Some(tokens)) => {
            progress.stage("encode");
            let t = Instant::now();
            let comp = ck.open_component("text_encoder")?;
            let enc = Encoder::load_streamed(b, comp, &ck.encoder, plan.encoder_resident)?;
            rep.encode_load_s = t.elapsed().as_secs_f64();
            let encode = |enc: &Encoder<B>| -> Result<Vec<Tensor>> { hidden_states_all(b, enc, &tokens, req.spec.precision) };
            // On a device with room for both, the transformer loads on another thread (its copies
            // behind the encoder's compute on the copy stream) while the encoder runs.
            let (mut hidden, dit) = if plan.overlap && b.loads_behind() {
                std::thread::scope(|s| -> Result<_> {
                    let comp = dit_comp.take().expect("the transformer is opened once");
                    let behind = s.spawn(move || -> Result<_> {
                        let t = Instant::now();
                        let d = Dit::load_behind(b, comp, &ck.dit, ck.dit.num_layers, MainLinears::of(req.spec.precision))?;
                        Ok((d, t.elapsed().as_secs_f64()))
                    });
                    let hidden = encode(&enc);
                    let dit = behind.join().map_err(|_| anyhow::anyhow!("the transformer's load thread panicked"))?;
                    Ok((hidden?, Some(dit?)))
                })?
            } else {
                (encode(&enc)?, None)
            };
            drop(enc);
            let cond = hidden.remove(0);
            let uncond = if hidden.is_empty() { cond.clone() } else { hidden.remove(0) };
            (cond, uncond, dit)
        }
    };
    let req = from_embeds.as_ref().unwrap_or(req);
    rep.encode_s = t0.elapsed().as_secs_f64() - rep.image_encode_s;
    let t1 = Instant::now();
    b.release_cached()?; // the encoder is gone: its memory is free for the DiT
    let dit = match dit {
        Some((d, behind_s)) => {
            rep.denoise_load_behind_s = behind_s;
            d.ready()?
        }
        None => {
            let comp = dit_comp.take().expect("the transformer is opened once");
            Dit::load_streamed(b, comp, &ck.dit, plan.dit_resident, MainLinears::of(req.spec.precision))?
        }
    };
    rep.denoise_load_s = t1.elapsed().as_secs_f64();
    let (z, forwards) = {
        let mut previews;
        let steps: &mut dyn Progress = match &req.preview {
            Some(p) => {
                previews = FilePreview { inner: &mut *progress, path: p.clone(), every: req.preview_every };
                &mut previews
            }
            None => &mut *progress,
        };
        if req.preview.is_some() || req.spec.hires.is_some() {
            b.limit_vae_activations(plan.vae_activations);
        }
        let d = denoise_on(team.as_mut(), b, &dit, ck, req, Pass::of(&req.spec), (&cond, &uncond), start.as_ref(), steps, None)?;
        match &req.spec.hires {
            Some(hr) => {
                let reload = || Dit::load_streamed(b, ck.open_component("transformer")?, &ck.dit, plan.dit_resident, MainLinears::of(req.spec.precision));
                let d2 = second_pass(b, ck, req, hr, (dit, reload), &d.latents, (&cond, &uncond), team.as_mut(), steps)?;
                (d2.latents, d.forwards + d2.forwards)
            }
            None => {
                drop(dit);
                (d.latents, d.forwards)
            }
        }
    };
    drop(team); // the other devices' transformers go
    rep.forwards = forwards;
    let req = &Request { forwards: Some(forwards), ..req.clone() };
    b.release_cached()?;
    rep.denoise_s = t1.elapsed().as_secs_f64();
    rep.lora_merge = ck.loras.clock.total();
    rep.lora_read_s = ck.loras.read_s;
    if let Some(p) = &req.save_latents {
        write_latents(p, req, ck, &z)?;
    }
    progress.stage("decode");
    let t2 = Instant::now();
    anyhow::ensure!(z.shape.len() == 4, "VAE decode: latents {:?}", z.shape);
    b.limit_vae_activations(plan.vae_activations);
    let vae = load_vae(b, ck, z.shape[2], z.shape[3])?;
    rep.decode_load_s = t2.elapsed().as_secs_f64();
    let bytes = picture_bytes(b, &vae, ck, req, &z, progress)?;
    crate::output::write_as(&req.out, &bytes, req.replace)?;
    rep.decode_s = t2.elapsed().as_secs_f64();
    rep.total_s = t0.elapsed().as_secs_f64();
    Ok(rep)
}
