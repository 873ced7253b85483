//! `moss serve`: an OpenAI-compatible image server over a loaded engine ([`engine`]). It opens the
//! device and makes its memory plan first ([`plan`]: refused there, before anything binds, when
//! even streaming cannot fit the cap), binds (so `/health` answers 503 while the weights load),
//! loads what the plan keeps on the worker thread ([`queue::work`]), then serves one picture at a
//! time from a FIFO queue.
//!
//! **Shutdown.** The first SIGTERM or SIGINT stops accepting connections, answers every queued
//! request with 503 and lets the running request finish (all its `n` pictures: its client gets
//! them); then the open connections are given up to [`GRACE`] to finish, and `run` returns Ok
//! (exit 0). A second signal stops the running picture between two steps.
//!
//! **Security.** Binding an address that is not loopback needs an API key (or
//! `allow_insecure_bind`); keys are compared in constant time; web pages cannot drive the server
//! through a browser ([`guard`]: Origin, Host, JSON only); the model's folder is not disclosed
//! ([`served_name`]); the body, `n`, the prompt tokens,
//! the size and the steps are bounded; a client has [`ServeOptions::client_timeout`] to send its
//! headers and its body; nothing in a request names a file on the server.

pub mod api;
pub mod edits;
pub mod engine;
pub mod guard;
pub mod loop_fields;
pub mod loras;
pub mod metrics;
pub mod queue;
pub mod routes;

use crate::backend::{cpu::Cpu, Device};
use crate::options::Precision;
use crate::pipeline;
use anyhow::{bail, Context, Result};
use engine::{Engine, Render, Serving};
use hyper_util::rt::{TokioIo, TokioTimer};
use queue::Queue;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// How long open connections get to finish after the worker stopped at shutdown.
pub const GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub model: String,
    pub device: Device,
    /// `--devices`: every picture spread over these (the first is `device`); empty or one:
    /// `device` alone.
    pub devices: Vec<Device>,
    pub precision: Precision,
    pub host: IpAddr,
    pub port: u16,
    pub api_key: Option<String>,
    pub allow_insecure_bind: bool,
    /// Web origins whose pages may call the API (`--allow-origin`; others' requests are refused).
    pub allow_origins: Vec<String>,
    pub max_queue: usize,
    /// Largest picture (its area bounds W x H).
    pub max_size: (u32, u32),
    pub max_steps: u32,
    pub max_tokens: usize,
    pub max_body: usize,
    /// Largest edits body (`POST /v1/images/edits`, multipart with the pictures).
    pub max_upload: usize,
    /// Time a client has to send its headers, and its body.
    pub client_timeout: Duration,
    pub uncond_skip: Vec<usize>,
    pub skip_window: (f64, f64),
    /// Further names requests may give the model (`--served-model-name`, e.g. `dall-e-3`).
    pub served_model_names: Vec<String>,
    /// LoRAs merged into the transformer at start-up (every picture carries them).
    pub loras: Vec<crate::lora::LoraSpec>,
    /// The folder of the adapters requests may choose by name ([`loras`]).
    pub lora_dir: Option<std::path::PathBuf>,
    /// The device memory the server may use (`--max-vram`).
    pub memory: crate::plan::MemoryOptions,
    /// `--c2pa-cert`/`--c2pa-key`: every picture served carries a signed C2PA manifest.
    pub c2pa: Option<Arc<crate::c2pa_manifest::ManifestSigner>>,
}

/// One line on stderr, prefixed like every server line.
pub fn log(msg: &str) {
    eprintln!("moss serve: {msg}");
}

/// The checks made before anything loads.
pub fn check(o: &ServeOptions) -> Result<()> {
    if o.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("the API key is empty (--api-key or MOSS_API_KEY)");
    }
    if !o.host.is_loopback() && o.api_key.is_none() && !o.allow_insecure_bind {
        bail!(
            "refusing to serve on {} without an API key: anyone who reaches that address could use the GPU; \
             set --api-key (or MOSS_API_KEY), bind 127.0.0.1, or pass --allow-insecure-bind",
            o.host
        );
    }
    for a in &o.allow_origins {
        guard::origin(a)?;
    }
    if o.max_queue == 0 {
        bail!("--max-queue must be at least 1");
    }
    if !(1..=1000).contains(&o.max_steps) {
        bail!("--max-steps must be in 1..=1000, got {}", o.max_steps);
    }
    if !(1..=crate::prompt::MAX_TOKENS).contains(&o.max_tokens) {
        bail!("--max-tokens must be in 1..={}, got {}", crate::prompt::MAX_TOKENS, o.max_tokens);
    }
    crate::options::check_size(o.max_size.0, o.max_size.1).map_err(|e| anyhow::anyhow!("--max-size: {e}"))?;
    if o.lora_dir.is_some() && !o.loras.is_empty() {
        bail!("--lora merges adapters into every picture, --lora-dir lets each request choose: give one of them");
    }
    if o.devices.len() > 1 {
        crate::pipeline::check_devices(&o.devices)?;
        if o.lora_dir.is_some() {
            bail!("--lora-dir's per-request LoRAs run on one device: give --device, or --lora for adapters every picture carries");
        }
    }
    Ok(())
}

/// Serve until a signal; Ok after a clean drain.
pub fn run(o: ServeOptions) -> Result<()> {
    check(&o)?;
    let mut ck = pipeline::open_checkpoint(&o.model)?;
    ck.attach_loras(&o.loras)?; // a bad LoRA is refused before the server starts
    let registry = offered_loras(&mut ck, &o)?;
    ck.start_model_hash();
    let tokenizer = crate::prompt::PromptTokenizer::from_file(&ck.tokenizer_path())?;
    let model = served_name(&ck.loc);
    let dit_blocks = ck.dit.num_layers;
    if o.devices.len() > 1 {
        crate::parallel::Layout::guided(o.devices.len(), ck.dit.num_heads)?;
    }
    let t0 = Instant::now();
    let (plan, loader) = match o.device {
        Device::Cpu => planned(Cpu, ck, &o, t0)?,
        Device::Cuda(n) => planned(pipeline::cuda(n, o.precision)?, ck, &o, t0)?,
    };
    if let Some(w) = &plan.warning {
        log(&format!("warning: {w}"));
    }
    log(&plan.line());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let engine = EngineFacts { dit_blocks, previews: plan.keeps("vae") };
    rt.block_on(serve(o, model, tokenizer, plan.json(), loader, registry, engine))
}

/// What requests are checked against that only the checkpoint and the plan know.
struct EngineFacts {
    dit_blocks: usize,
    /// The VAE stays loaded (partial images can be decoded during the loop).
    previews: bool,
}

/// The adapters of `--lora-dir`, read and checked; `ck`'s (empty) LoRA plan then holds the
/// largest merge a request's set can make, for the memory plan.
fn offered_loras(ck: &mut crate::checkpoint::Checkpoint, o: &ServeOptions) -> Result<loras::Registry> {
    let Some(dir) = &o.lora_dir else { return Ok(loras::Registry::default()) };
    let t0 = Instant::now();
    let r = loras::Registry::open(dir, &crate::checkpoint::TensorStore::open(&ck.loc.root.join("transformer"))?)?;
    let mut plan = crate::lora::Plan::default();
    plan.scratch_floor = r.scratch_bound();
    ck.loras = Arc::new(plan);
    log(&format!(
        "{} LoRA(s) offered from {} (read and checked in {:.3} s; at most {} a request)",
        r.len(),
        dir.display(),
        t0.elapsed().as_secs_f64(),
        loras::MAX_PER_REQUEST
    ));
    Ok(r)
}

/// The id the server gives its model: the repo id of a Hugging Face cache's snapshot, the folder's
/// own name for a checkpoint folder (its path stays on the server).
pub fn served_name(loc: &crate::checkpoint::ModelLocation) -> String {
    loc.name()
}

/// Loads the planned engine (on the worker thread).
/// Its `ready in` line is said once the queue takes requests, not before.
type Loader = Box<dyn FnOnce() -> Result<(Box<dyn Render>, String)> + Send>;

/// The memory plan on the opened backend `b`, and what loads the engine it plans (`t0`: when
/// start-up began).
fn planned<B: Serving + Send + 'static>(
    b: B,
    ck: crate::checkpoint::Checkpoint,
    o: &ServeOptions,
    t0: Instant,
) -> Result<(crate::plan::server::ServeRunPlan, Loader)> {
    let linears = crate::model::dit::MainLinears::of(o.precision);
    let p = engine::plan(&b, &ck, &o.memory, o.max_size, o.max_tokens, linears)?;
    let (kept, max_size) = (p.clone(), o.max_size);
    let (devices, precision, memory, max_tokens) = (o.devices.clone(), o.precision, o.memory, o.max_tokens);
    let load = move || -> Result<(Box<dyn Render>, String)> {
        b.use_on_this_thread()?;
        // The other devices hold only the transformer, each as its own plan places it.
        let team = match devices.len() > 1 {
            true => {
                let resident = crate::pipeline::helper_plan(&ck, linears, max_tokens, max_size, memory);
                Some(crate::pipeline::Team::start(&b, &devices, precision, &ck, linears, resident)?)
            }
            false => None,
        };
        let e = Engine::load(b, ck, kept, max_size)?.with_team(team);
        Ok((Box::new(e), format!("ready in {:.1} s", t0.elapsed().as_secs_f64())))
    };
    Ok((p, Box::new(load)))
}

/// The worker thread: load, say so, then render until the queue drains.
fn spawn_worker(q: Arc<Queue>, load: Loader) -> tokio::sync::oneshot::Receiver<Result<(), String>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("moss-engine".into())
        .spawn(move || {
            let (mut engine, ready) = match load() {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(Err(format!("{e:#}")));
                    return;
                }
            };
            q.set_ready(engine.max_joint_tokens());
            log(&ready);
            queue::work(&q, engine.as_mut());
            let _ = tx.send(Ok(()));
        })
        .expect("spawn the engine thread");
    rx
}

async fn serve(
    o: ServeOptions,
    model: String,
    tokenizer: crate::prompt::PromptTokenizer,
    plan: serde_json::Value,
    load: Loader,
    registry: loras::Registry,
    engine: EngineFacts,
) -> Result<()> {
    let addr = SocketAddr::new(o.host, o.port);
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let q = Arc::new(Queue::new(o.max_queue));
    let st = Arc::new(routes::AppState {
        queue: q.clone(),
        tokenizer,
        models: std::iter::once(model.clone()).chain(o.served_model_names.iter().filter(|n| **n != model).cloned()).collect(),
        model_spec: o.model.clone(),
        base: crate::pipeline::Request {
            device: o.device,
            c2pa: o.c2pa.clone(),
            ..api::base_request(o.uncond_skip.clone(), o.skip_window, o.max_tokens, o.precision)
        },
        limits: api::Limits {
            max_steps: o.max_steps,
            max_pixels: o.max_size.0 as u64 * o.max_size.1 as u64,
            max_tokens: o.max_tokens,
            dit_blocks: engine.dit_blocks,
            previews: engine.previews,
            devices: o.devices.len().max(1),
        },
        api_key: o.api_key.clone(),
        plan,
        max_body: o.max_body,
        max_upload: o.max_upload,
        next_id: AtomicU64::new(1),
        started: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        loras: Arc::new(registry),
    });
    let g = guard::Guard {
        origins: o.allow_origins.iter().map(|a| guard::origin(a)).collect::<Result<_>>()?,
        loopback_hosts_only: o.host.is_loopback() && o.api_key.is_none(),
    };
    let app = routes::router(st, o.client_timeout, g.clone());
    let auth = match (&o.api_key, g.loopback_hosts_only) {
        (Some(_), _) => "API key required",
        (None, true) => "no API key: loopback host names only",
        (None, false) => "no API key",
    };
    let on = match o.devices.len() > 1 {
        true => o.devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","),
        false => o.device.to_string(),
    };
    log(&format!("listening on http://{bound} ({auth}); loading {} on {on} ...", o.model));
    let mut worker = spawn_worker(q.clone(), load);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let signame = loop {
        tokio::select! {
            acc = listener.accept() => {
                let Ok((stream, _)) = acc else { continue };
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(o.client_timeout)
                    .serve_connection(TokioIo::new(stream), hyper_util::service::TowerToHyperService::new(app.clone()));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            // Completes only when loading failed (the worker runs until the drain).
            r = &mut worker => {
                match r {
                    Ok(Err(e)) => bail!("{e}"),
                    Ok(Ok(())) | Err(_) => bail!("the engine thread stopped"),
                }
            }
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
        }
    };
    drop(listener);
    let (answered, running) = q.drain(false);
    let what = match running {
        Some(id) => format!("finishing the running request {id} (all its pictures; a second signal stops it between steps)"),
        None => "nothing is running".into(),
    };
    log(&format!("{signame}: stopped accepting; {answered} queued requests answered 503; {what}"));
    let second = tokio::select! {
        _ = &mut worker => false,
        _ = term.recv() => true,
        _ = int.recv() => true,
    };
    if second {
        q.drain(true);
        log("second signal: stopping the running picture between steps");
        let _ = worker.await;
    }
    if tokio::time::timeout(GRACE, graceful.shutdown()).await.is_err() {
        log(&format!("connections still open after {} s: closing them", GRACE.as_secs()));
    }
    log("stopped");
    Ok(())
}
