//! The run: the options, the summary, the progress callbacks, and the driver that plans and
//! renders this shard's chunks.

use super::*;
use crate::backend::cpu::Cpu;
use crate::backend::Device;
use crate::pipeline::{self, Interrupted};
use crate::prompt::PromptTokenizer;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub items: Items,
    /// Adapters merged into the transformer once, before the first picture.
    pub loras: Vec<crate::lora::LoraSpec>,
    /// The flags' settings, which a list line's own fields override; its seed is the base seed
    /// (item i without a seed of its own gets seed + i).
    pub defaults: PictureSpec,
    pub out_dir: PathBuf,
    pub name: String,
    pub skip_existing: bool,
    /// Replace pictures that exist already (`--force`); without it (nor `--skip-existing`) a
    /// batch whose files exist is refused before any work.
    pub replace: bool,
    /// Let a list item's `out` be an absolute path (off by default: a list is untrusted input).
    pub allow_absolute_out: bool,
    pub shard: Shard,
    pub chunk: Option<usize>,
    pub model: String,
    pub device: Device,
    /// `--devices`: every picture's denoising spread over these (the first is `device`); empty
    /// or one: `device` alone.
    pub devices: Vec<Device>,
    /// JPEG quality (`--quality`) for the items written as JPEG.
    pub quality: Option<u8>,
    /// `--c2pa-cert`/`--c2pa-key`: every picture carries a signed C2PA manifest.
    pub c2pa: Option<std::sync::Arc<crate::c2pa_manifest::ManifestSigner>>,
    /// `--max-vram`: the run is planned like `generate`'s (for the longest prompt and the
    /// largest picture), networks that do not fit stream.
    pub memory: crate::plan::MemoryOptions,
    /// Other files the run read (`--from`, `--prompt-file`), by what they are: no output may be one.
    pub other_inputs: Vec<(&'static str, PathBuf)>,
    /// The strength and mask blur of an item with `init_image` that sets none (`--strength`,
    /// `--mask-blur`).
    pub strength: f64,
    pub mask_blur: u32,
}

/// What a batch renders.
#[derive(Clone, Debug)]
pub enum Items {
    /// A list file (`--prompts`; `-` reads stdin), parsed against [`BatchOptions::defaults`].
    List(PathBuf),
    /// Items already made (`generate --count` / `--seeds`: one prompt, several seeds).
    Given(Vec<Item>),
}

/// A written picture.
#[derive(Clone, Debug)]
pub struct Finished {
    pub index: usize,
    pub line: usize,
    pub path: PathBuf,
    pub seed: u64,
    pub steps: u32,
    pub width: u32,
    pub height: u32,
    /// This picture's own compute: encoding its texts (0 when an earlier item of its chunk had
    /// the same ones), denoising, decoding and writing. Weight loading is not in them.
    pub encode_s: f64,
    pub denoise_s: f64,
    pub decode_s: f64,
    /// The LoRA merges since the chunk's previous picture: the transformer's load for the first
    /// picture of a chunk, and the streamed blocks' merges at each fetch of this picture's denoise
    /// (so over the lines they add up to the batch's merges; zero without LoRAs).
    pub lora_merge: crate::lora::plan::MergeTime,
    /// Seconds since the batch started.
    pub elapsed_s: f64,
    /// What its denoising loop computed.
    pub forwards: pipeline::Forwards,
}

impl Finished {
    pub fn json(&self) -> String {
        let mut j = serde_json::json!({
            "index": self.index,
            "line": self.line,
            "path": self.path.display().to_string(),
            "seed": self.seed,
            "steps": self.steps,
            "width": self.width,
            "height": self.height,
            "timings": {"encode_s": self.encode_s, "denoise_s": self.denoise_s, "decode_s": self.decode_s,
                        "total_s": self.encode_s + self.denoise_s + self.decode_s},
            "elapsed_s": self.elapsed_s,
            "forwards": self.forwards,
        });
        for (k, v) in self.lora_merge.json_entries() {
            j["timings"][k] = v.into();
        }
        j.to_string()
    }
}

/// How a batch ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub written: usize,
    /// Items of this shard that were not rendered: bad lines and failed renders.
    pub failed: usize,
    pub skipped: usize,
    pub elsewhere: usize,
    /// The signal that stopped the run early.
    pub stopped_by: Option<i32>,
}

/// What the batch tells the user (the CLI draws bars on a terminal; the default says nothing).
pub trait BatchProgress {
    /// The work ahead: `pictures` to render, with `steps` denoising steps in all.
    fn begin(&mut self, _pictures: usize, _steps: u64) {}
    /// Stage `name` ("encode", "denoise", "decode") of chunk `chunk` of `chunks` (from 0) starts.
    fn stage(&mut self, _name: &str, _chunk: usize, _chunks: usize) {}
    /// Work on `job` starts in the current stage: `i` of the `n` in it (from 0).
    fn item(&mut self, _job: &Job, _i: usize, _n: usize) {}
    /// A denoising step of the current picture ended.
    fn step(&mut self, _done: usize, _total: usize) {}
    fn finished(&mut self, _f: &Finished) {}
    /// An item failed; `msg` starts with `FILE:LINE:`.
    fn failed(&mut self, msg: &str) {
        eprintln!("moss: error: {msg}");
    }
    fn warn(&mut self, msg: &str) {
        eprintln!("moss: warning: {msg}");
    }
}

pub struct Quiet;
impl BatchProgress for Quiet {}

/// Read the list: a file, or stdin for `-`.
pub(super) fn read_list(p: &Path) -> Result<(Vec<u8>, String)> {
    if p.as_os_str() == "-" {
        let b = crate::bounded::read_stdin_bounded(crate::bounded::MAX_PROMPT_LIST, "the prompts")?;
        Ok((b, "<stdin>".to_string()))
    } else {
        let b = crate::bounded::read_bounded(p, crate::bounded::MAX_PROMPT_LIST, "the prompts list")?;
        Ok((b, p.display().to_string()))
    }
}

/// Token ids of a job's texts (the negative only with guidance != 1).
pub(super) struct Texts {
    pub(super) prompt: Vec<u32>,
    pub(super) negative: Option<Vec<u32>>,
    pub(super) cut: pipeline::Cut,
}

/// `moss generate --prompts`: plan, then render this shard's items chunk by chunk.
pub fn run(o: &BatchOptions, progress: &mut dyn BatchProgress) -> Result<Summary> {
    let t0 = Instant::now();
    check_defaults(&o.defaults)?;
    let name = Template::parse(&o.name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let example = name.render(&NameVars { index: 0, line: 1, seed: o.defaults.seed, shard: 0, prompt: "" });
    crate::picture::Format::of(Path::new(&example)).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let (entries, src) = match &o.items {
        Items::List(p) => {
            let (bytes, src) = read_list(p)?;
            (parse_list(&bytes, &o.defaults), src)
        }
        Items::Given(items) => (items.iter().cloned().map(Ok).collect(), "picture".to_string()),
    };
    std::fs::create_dir_all(&o.out_dir).with_context(|| format!("cannot create --out-dir {}", o.out_dir.display()))?;
    crate::output::check(&o.out_dir.join(".moss-batch-probe.png"))?;
    let mut ck = pipeline::open_checkpoint(&o.model)?;
    if o.devices.len() > 1 {
        pipeline::check_devices(&o.devices)?;
        crate::parallel::Layout::guided(o.devices.len(), ck.dit.num_heads)?;
    }
    ck.attach_loras(&o.loras)?;
    ck.start_model_hash();

    let plan = plan(entries, &o.out_dir, &name, o.shard, o.skip_existing, o.allow_absolute_out);
    if let Some(q) = o.quality {
        let jpeg = |j: &Job| crate::picture::Format::of(&j.path).ok() == Some(crate::picture::Format::Jpeg);
        if !plan.jobs.iter().chain(&plan.skipped).any(jpeg) {
            anyhow::bail!("--quality {q} applies to JPEG pictures (.jpg, .jpeg), and this batch writes none");
        }
        crate::picture::check(Path::new("x.jpg"), Some(q))?;
    }
    let mut sum = Summary { skipped: plan.skipped.len(), elsewhere: plan.elsewhere, ..Default::default() };
    for b in &plan.bad {
        progress.failed(&format!("{src}:{}: {}", b.line, b.error));
        sum.failed += 1;
    }

    // Folders and tokens, still before any weights are read. No output may be an input.
    let ck_files = crate::output::files_below(&ck.loc.root);
    let mut inputs: Vec<(&str, &Path)> = ck_files.iter().map(|f| ("a checkpoint file", f.as_path())).collect();
    if let Items::List(p) = &o.items {
        if !crate::output::is_stdout(p) {
            inputs.push(("the prompts list", p));
        }
    }
    let others = pipeline::input_files(None, &o.loras);
    inputs.extend(others.iter().chain(&o.other_inputs).map(|(w, p)| (*w, p.as_path())));
    let inputs = crate::output::Inputs::new(&inputs);
    let tok = PromptTokenizer::from_file(&ck.tokenizer_path())?;
    let list_dir = match &o.items {
        Items::List(p) if !crate::output::is_stdout(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
        _ => PathBuf::new(),
    };
    let mut pictures = super::pictures::Cache::default();
    let mut folders: HashMap<PathBuf, Result<(), String>> = HashMap::new();
    let mut jobs = vec![];
    let mut texts = vec![];
    for j in plan.jobs {
        let at = format!("{src}:{}", j.item.line);
        let dir = j.path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        let ok = folders
            .entry(dir.clone())
            .or_insert_with(|| {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create folder {}", dir.display()))
                    .and_then(|_| crate::output::check(&j.path))
                    .map_err(|e| format!("{e:#}"))
            })
            .clone();
        let mut j = j;
        let tk = ok.map_err(anyhow::Error::msg).and_then(|_| {
            crate::output::target(&j.path)?;
            crate::output::check_against(&[("the output", &j.path)], &inputs)?;
            pictures.attach(&mut j, &list_dir, o)?;
            let mut enc = |t: &str, what: &str| -> Result<(Vec<u32>, Option<usize>)> {
                let tk = tok.encode(t, o.defaults.max_tokens)?;
                if let (Some(n), false) = (tk.truncated_from, crate::prompt::trim(t).is_empty()) {
                    progress.warn(&format!("{at}: {what} has {n} tokens; keeping the first {}", o.defaults.max_tokens));
                }
                Ok((tk.ids, tk.truncated_from))
            };
            let (prompt, prompt_cut) = enc(&j.item.spec.prompt, "prompt")?;
            let (negative, negative_cut) = match j.item.spec.guidance != 1.0 {
                true => enc(&j.item.spec.negative, "negative prompt").map(|(ids, cut)| (Some(ids), cut))?,
                false => (None, None),
            };
            Ok(Texts { prompt, negative, cut: pipeline::Cut { prompt: prompt_cut, negative: negative_cut } })
        });
        match tk {
            Ok(t) => {
                jobs.push(j);
                texts.push(t);
            }
            Err(e) => {
                progress.failed(&format!("{at}: {e:#}"));
                sum.failed += 1;
            }
        }
    }
    // Existing pictures, once every item's graver problems (an input as output, ...) are said.
    if !o.replace && !o.skip_existing {
        let there: Vec<&Job> = jobs.iter().filter(|j| crate::output::refuse_existing(&j.path).is_err()).collect();
        if let Some(first) = there.first() {
            let more = if there.len() > 1 { format!(" (and {} more)", there.len() - 1) } else { String::new() };
            anyhow::bail!(
                "{}{more} exists; moss does not replace pictures: --skip-existing renders only the missing ones, --force (-y) replaces them",
                first.path.display()
            );
        }
    }
    if jobs.is_empty() {
        return Ok(sum);
    }

    let hidden = ck.encoder.hidden_size;
    let c = ck.dit.latent_channels;
    let costs: Vec<u64> = jobs
        .iter()
        .zip(&texts)
        .map(|(j, t)| {
            let n = t.prompt.len() + t.negative.as_ref().map_or(0, |v| v.len());
            job_bytes(n, hidden, c, j.item.spec.width, j.item.spec.height)
        })
        .collect();
    // On the CPU a picture takes minutes or hours and a weight load well under its time: chunks
    // of one write every picture as soon as it is decoded, so a stopped list keeps its work.
    let max_items = o.chunk.or(match o.device {
        Device::Cpu => Some(1),
        Device::Cuda(_) => None,
    });
    let chunks = plan_chunks(&costs, chunk_budget_bytes(o.device), max_items);
    progress.begin(jobs.len(), jobs.iter().map(|j| j.item.spec.steps as u64).sum());
    let ctx = Ctx { ck: &ck, o, src: &src, t0 };
    // One memory plan for the whole list (the longest prompt, the largest picture), made before
    // any weights load: what stays resident, what streams; refused naming the smallest cap.
    let tokens = texts.iter().map(|t| t.prompt.len().max(t.negative.as_ref().map_or(0, |v| v.len()))).max();
    let largest = jobs.iter().map(|j| (j.item.spec.width, j.item.spec.height)).max_by_key(|&(w, h)| w as u64 * h as u64);
    let encodes = jobs.iter().any(|j| j.item.init.is_some());
    drop(pictures);
    let plan_for = |budget: crate::plan::Budget, progress: &mut dyn BatchProgress| -> Result<Option<crate::plan::run::RunPlan>> {
        let (Some(l), Some(size)) = (tokens, largest) else { return Ok(None) };
        let mut nets = crate::plan::run::networks(&ck, &budget, l, size)?;
        if encodes {
            crate::plan::run::with_vae_encode(&mut nets, &ck, &budget, size);
        }
        let p = crate::plan::run::decide(&nets, &budget, &o.memory)?;
        if let Some(w) = &p.warning {
            progress.warn(w);
        }
        Ok(Some(p))
    };
    // With --devices, the other devices' transformers load once for the whole list, each as its
    // own plan places it.
    let linears = crate::model::dit::MainLinears::of(o.defaults.precision);
    let helper_plan = pipeline::helper_plan(&ck, linears, tokens.unwrap_or(1), largest.unwrap_or((16, 16)), o.memory);
    let r = match o.device {
        Device::Cpu => {
            let team = team(&Cpu, o, &ck, helper_plan)?;
            let plan = plan_for(crate::backend::cpu_budget().with_linears(linears), progress)?;
            render(&Cpu, &ctx, plan.as_ref(), team, &jobs, &texts, &chunks, progress, &mut sum)
        }
        Device::Cuda(n) => {
            let cu = pipeline::cuda(n, o.defaults.precision)?;
            // The team (its transports' buffers) first: this device's plan sees them.
            let team = team(&cu, o, &ck, helper_plan)?;
            let plan = plan_for(cu.budget()?, progress)?;
            render(&cu, &ctx, plan.as_ref(), team, &jobs, &texts, &chunks, progress, &mut sum)
        }
    };
    match r {
        Ok(()) => Ok(sum),
        Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
            sum.stopped_by = Some(stop_signal().unwrap_or(2));
            Ok(sum)
        }
        Err(e) => Err(e),
    }
}

/// The other devices of `--devices` (`None` with one), their transformers loading as `plan` places
/// them.
fn team<B: pipeline::TeamBackend>(
    b: &B,
    o: &BatchOptions,
    ck: &crate::checkpoint::Checkpoint,
    plan: impl Fn(crate::plan::Budget) -> Result<usize> + Send + 'static,
) -> Result<Option<pipeline::Team<B>>> {
    match o.devices.len() > 1 {
        true => Ok(Some(pipeline::Team::start(b, &o.devices, o.defaults.precision, ck, crate::model::dit::MainLinears::of(o.defaults.precision), plan)?)),
        false => Ok(None),
    }
}
