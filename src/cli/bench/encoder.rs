//! `moss bench-encode` (hidden): run the prompt encoder on given token ids straight from a
//! `text_encoder/` folder (config.json + safetensors with `language_model.` keys), time the
//! forward and write the hidden states. For the full-size side-by-side against transformers
//! (bench/encoder.sh), where no tokenizer or other component exists.

use anyhow::{bail, Context, Result};
use moss::backend::cpu::Cpu;
use moss::backend::ops::EncoderOps;
use moss::backend::Device;
use moss::checkpoint::{config::EncoderConfig, expected, tensors::TensorStore, Component};
use moss::model::encoder::Encoder;
use moss::options::Precision;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub struct BenchEncode {
    pub model: PathBuf,
    /// Token id files (one forward set each, the model loaded once); empty: `count`
    /// pseudo-random ids.
    pub ids_files: Vec<PathBuf>,
    pub count: usize,
    pub seed: u64,
    pub reps: usize,
    pub device: Device,
    pub precision: Precision,
    /// Hidden-state files, one per ids file (or one for the random ids).
    pub outs: Vec<PathBuf>,
}

/// The ids of a file of whitespace- or comma-separated integers (a JSON list works).
fn read_ids(path: &Path) -> Result<Vec<u32>> {
    let s = moss::bounded::read_text_bounded(path, moss::bounded::MAX_PROMPT_LIST, "ids file")?;
    s.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("{}: `{t}` is not a token id", path.display())))
        .collect()
}

fn open(dir: &Path) -> Result<(EncoderConfig, Component)> {
    let cfg = EncoderConfig::from_file(&dir.join("config.json"))?;
    let store = TensorStore::open(dir)?;
    let prefix = ["language_model.", "model.language_model."]
        .into_iter()
        .find(|p| store.tensors.keys().any(|k| k.starts_with(p)))
        .with_context(|| format!("{}: no tensor under `language_model.`", dir.display()))?;
    let comp = Component { name: "text_encoder", store, prefix: prefix.to_string(), loras: Default::default() };
    comp.validate(&expected::encoder(&cfg))?;
    Ok((cfg, comp))
}

/// `sync` waits for the backend's queued work (CUDA), so a timing ends when the GPU is done.
fn bench<B: EncoderOps>(b: &B, a: &BenchEncode, cfg: &EncoderConfig, comp: &Component, inputs: &[Vec<u32>], sync: &dyn Fn() -> Result<()>) -> Result<()> {
    let t0 = Instant::now();
    let enc = Encoder::load(b, comp, cfg)?;
    let load_s = t0.elapsed().as_secs_f64();
    for (i, ids) in inputs.iter().enumerate() {
        let warm = Instant::now();
        let mut hidden = enc.forward(b, ids)?; // the first call (kernel loading, pool growth)
        let first_ms = warm.elapsed().as_secs_f64() * 1e3;
        let mut times = vec![];
        for _ in 0..a.reps {
            let t = Instant::now();
            hidden = enc.forward(b, ids)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(first_ms);
        // The same forwards with the hidden states left on the device (no copy to the host): what
        // a PyTorch timing of `model(ids).last_hidden_state` on the GPU measures.
        let mut device_ms = vec![];
        for _ in 0..a.reps {
            sync()?;
            let t = Instant::now();
            let h = enc.hidden(b, ids)?;
            sync()?;
            device_ms.push(t.elapsed().as_secs_f64() * 1e3);
            drop(h);
        }
        let mut dsorted = device_ms.clone();
        dsorted.sort_by(f64::total_cmp);
        // The download of the hidden states alone (the way `download` takes).
        let h = enc.hidden(b, ids)?;
        sync()?;
        let mut download_ms = vec![];
        for _ in 0..a.reps {
            let t = Instant::now();
            let host = b.download(&h)?;
            download_ms.push(t.elapsed().as_secs_f64() * 1e3);
            drop(host);
        }
        drop(h);
        let mut dlsorted = download_ms.clone();
        dlsorted.sort_by(f64::total_cmp);
        // One more forward with every encoder op synchronised and timed (CUDA only); the rest of
        // the forward is the linears and the generic ops.
        use moss::backend::cuda::profile;
        let table = |ops: Vec<profile::OpTime>| -> serde_json::Map<String, serde_json::Value> {
            ops.into_iter().map(|o| (o.op, serde_json::json!({"ms": o.gpu_ms, "calls": o.calls}))).collect()
        };
        profile::start(profile::Mode::Synced);
        let tp = Instant::now();
        let profiled = enc.forward(b, ids);
        let prof_total = tp.elapsed().as_secs_f64() * 1e3;
        let synced = profile::take();
        profile::stop();
        profiled?;
        let prof = table(synced?.ops);
        // And one with each op bracketed by CUDA events, unsynchronised (CUDA only).
        profile::start(profile::Mode::Events);
        let evd = enc.hidden(b, ids);
        let synced = sync();
        let ev = profile::take();
        profile::stop();
        drop(evd?);
        synced?;
        let ev = ev?;
        let ev_sum: f64 = ev.ops.iter().map(|o| o.gpu_ms).sum();
        let ev_span = ev.span_ms;
        let ev_prof = table(ev.ops);
        let j = serde_json::json!({
            "profile_forward_ms": prof_total,
            "profile_ms": prof,
            "events_ms": ev_prof,
            "events_sum_ms": ev_sum,
            "events_span_ms": ev_span,
            "tokens": ids.len(),
            "device": b.name(),
            "load_s": load_s,
            "first_ms": first_ms,
            "forward_ms": times,
            "median_ms": median,
            "device_forward_ms": device_ms,
            "device_median_ms": dsorted.get(dsorted.len() / 2).copied(),
            "download_ms": download_ms,
            "download_median_ms": dlsorted.get(dlsorted.len() / 2).copied(),
            "download_mode": "pinned",
            "min_ms": sorted.first().copied().unwrap_or(first_ms),
        });
        if let Some(out) = a.outs.get(i) {
            let bytes: Vec<u8> = hidden.data.iter().flat_map(|v| v.to_le_bytes()).collect();
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, hidden.shape.clone(), &bytes)?;
            let st = safetensors::tensor::serialize([("hidden".to_string(), view)], None)?;
            std::fs::write(out, st).with_context(|| format!("cannot write {}", out.display()))?;
        }
        println!("{j}");
    }
    Ok(())
}

pub fn run(a: &BenchEncode) -> Result<()> {
    let (cfg, comp) = open(&a.model)?;
    let inputs: Vec<Vec<u32>> = if a.ids_files.is_empty() {
        let mut r = moss::backend::cuda::check::gates::Rng::new(a.seed);
        vec![(0..a.count).map(|_| (r.next_u64() % cfg.vocab_size as u64) as u32).collect()]
    } else {
        a.ids_files.iter().map(|p| read_ids(p)).collect::<Result<_>>()?
    };
    if inputs.iter().any(|i| i.is_empty()) {
        bail!("no token ids");
    }
    if !a.outs.is_empty() && a.outs.len() != inputs.len() {
        bail!("{} --out files for {} inputs", a.outs.len(), inputs.len());
    }
    match a.device {
        Device::Cpu => bench(&Cpu, a, &cfg, &comp, &inputs, &|| Ok(())),
        Device::Cuda(n) => {
            let b = moss::pipeline::cuda(n, a.precision.encoder())?;
            bench(&b, a, &cfg, &comp, &inputs, &|| b.sync())
        }
    }
}
