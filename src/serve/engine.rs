//! The engine behind `moss serve`: the text encoder, the DiT and the VAE on one backend,
//! rendering one request at a time to the exact bytes `moss generate` writes for the same
//! settings (the same [`pipeline::hidden_states`], [`pipeline::denoise_with`] and
//! [`pipeline::picture_bytes`] that `generate` and batch mode go through).
//!
//! What stays loaded is the start-up plan's ([`super::plan`], made before anything loads under
//! `--max-vram` or the device's free memory): every network when they fit together; otherwise
//! the transformer with as many blocks as fit (the rest streamed each forward), the VAE, and the
//! text encoder's layers as room allows (the rest streamed), a network that cannot stay being
//! loaded for each request. Streaming moves the same values through the same kernels, so the
//! picture's bytes do not depend on the plan.
//!
//! Per-request LoRAs ([`Render::use_loras`]): before a request's pictures the transformer gets
//! its set: the weights the old set or the new one updates are read again from the checkpoint
//! and merged with the new set ([`crate::model::dit::loras`]), so they are those `generate
//! --lora` loads with the same files and scales; the set stays merged for the next request.

use super::loras::LoraSet;
use crate::backend::cpu::Cpu;
use crate::backend::cuda::Cuda;
use crate::backend::ops::{EncoderOps, VaeEncodeOps};
use crate::checkpoint::Checkpoint;
use crate::model::{dit::Dit, dit::MainLinears, encoder::Encoder, vae::VaeDecoder};
use crate::options::Precision;
use crate::pipeline::{self, Progress, Request};
use crate::plan::server::ServeRunPlan;
use crate::plan::{Budget, MemoryOptions};
use crate::tensor::Tensor;
use anyhow::Result;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

/// One rendered picture and where its time went.
#[derive(Clone, Debug, Default)]
pub struct Picture {
    pub bytes: Vec<u8>,
    /// What its denoising loop computed.
    pub forwards: crate::pipeline::Forwards,
    pub encode_s: f64,
    pub denoise_s: f64,
    pub decode_s: f64,
    pub total_s: f64,
    /// Changing the LoRA set before it (the first picture of a request; 0 otherwise).
    pub lora_switch_s: f64,
}

/// What the server needs from an engine, whatever its backend.
pub trait Render {
    /// Render `req` from its prompt tokens (the ids of [`pipeline::prompt_texts`], in order).
    /// Stops with [`pipeline::Interrupted`] when `progress` says so between two steps.
    fn render(&mut self, req: &Request, tokens: &[Vec<u32>], progress: &mut dyn Progress) -> Result<Picture>;
    /// The largest count of joint tokens (`W/16 * H/16` + prompt tokens) one DiT forward may take
    /// beside what stays loaded (`usize::MAX` where memory is not capped).
    fn max_joint_tokens(&self) -> usize;
    /// Give the transformer the LoRA set `set` before a request's pictures: what the change
    /// took, or `None` when it holds that set already.
    fn use_loras(&mut self, set: &LoraSet) -> Result<Option<LoraSwitch>>;
}

/// A change of the transformer's LoRA set.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoraSwitch {
    /// Wall seconds: the old set's weights restored and the new set's merged.
    pub seconds: f64,
    /// The merges' time within it (host and device apart).
    pub merge: crate::lora::plan::MergeTime,
    pub reloaded: crate::model::dit::loras::Reloaded,
}

/// Where the per-backend differences live: the device's memory and threads.
pub trait Serving: EncoderOps + pipeline::TeamBackend + VaeEncodeOps {
    /// The memory the plan is made for.
    fn budget(&self) -> Result<Budget>;
    /// Make the backend usable on the calling thread (the engine loads on its own thread).
    fn use_on_this_thread(&self) -> Result<()>;
}

impl Serving for Cpu {
    fn budget(&self) -> Result<Budget> {
        Ok(crate::backend::cpu_budget())
    }
    fn use_on_this_thread(&self) -> Result<()> {
        Ok(())
    }
}

impl Serving for Cuda {
    fn budget(&self) -> Result<Budget> {
        Cuda::budget(self)
    }
    fn use_on_this_thread(&self) -> Result<()> {
        self.gpu().ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("CUDA context: {e:?}"))
    }
}

/// A network kept loaded between requests, or loaded for each.
enum Held<N> {
    Kept(N),
    PerRequest,
}

impl<N> Held<N> {
    /// The kept network, or the one `load` gives for this request (held in `slot`).
    fn or_load<'a>(&'a self, slot: &'a mut Option<N>, load: impl FnOnce() -> Result<N>) -> Result<&'a N> {
        match self {
            Held::Kept(n) => Ok(n),
            Held::PerRequest => Ok(slot.insert(load()?)),
        }
    }
}

/// The three networks as the plan holds them.
pub struct Engine<B: Serving> {
    b: B,
    ck: Checkpoint,
    plan: ServeRunPlan,
    encoder: Held<Encoder<B>>,
    dit: Held<Dit<B>>,
    vae: Held<VaeDecoder<B>>,
    /// The per-request set the transformer holds (`ck.loras` is its plan).
    loaded: LoraSet,
    /// A change of set failed part way: the transformer is loaded again before the next picture.
    broken: bool,
    /// The last init picture's latents (a request's `n` pictures start from the same picture).
    encoded: Option<(Arc<pipeline::Prepared>, Tensor)>,
    /// `--devices`: the other devices, which denoise every picture with this one.
    team: Option<pipeline::Team<B>>,
}

/// The plan for requests up to `max_size` and `max_tokens` on `b` under `mem`, the transformer's
/// main blocks held as `linears` (the server's precision), made before any weights load
/// (refused, naming the smallest cap that works, when even streaming does not fit).
pub fn plan<B: Serving>(b: &B, ck: &Checkpoint, mem: &MemoryOptions, max_size: (u32, u32), max_tokens: usize, linears: MainLinears) -> Result<ServeRunPlan> {
    crate::plan::server::decide(ck, &b.budget()?.with_linears(linears), mem, max_size, max_tokens)
}

impl<B: Serving> Engine<B> {
    /// Load what `plan` keeps; `max_size` is the largest picture (W, H) the server accepts.
    pub fn load(b: B, ck: Checkpoint, plan: ServeRunPlan, max_size: (u32, u32)) -> Result<Engine<B>> {
        let encoder = match plan.keeps("text_encoder") {
            true => Held::Kept(Encoder::load_streamed(&b, ck.open_component("text_encoder")?, &ck.encoder, plan.resident_blocks("text_encoder"))?),
            false => Held::PerRequest,
        };
        let dit = match plan.keeps("transformer") {
            true => Held::Kept(Dit::load_streamed(&b, ck.open_component("transformer")?, &ck.dit, plan.resident_blocks("transformer"), plan.linears)?),
            false => Held::PerRequest,
        };
        if !ck.loras.is_empty() {
            let n = ck.loras.adapters().len();
            let merge = ck.loras.clock.total();
            super::log(&format!("{n} LoRA(s) read in {:.3} s, merged in {}", ck.loras.read_s, merge.line()));
        }
        b.limit_vae_activations(plan.vae_activations);
        let vae = match plan.keeps("vae") {
            true => Held::Kept(pipeline::load_vae(&b, &ck, (max_size.1 / 16) as usize, (max_size.0 / 16) as usize)?),
            false => Held::PerRequest,
        };
        Ok(Engine { b, ck, plan, encoder, dit, vae, loaded: LoraSet::default(), broken: false, team: None, encoded: None })
    }

    /// This engine with the other devices of `--devices` (`None`: one device).
    pub fn with_team(self, team: Option<pipeline::Team<B>>) -> Engine<B> {
        Engine { team, ..self }
    }

    /// [`Render::use_loras`]: `ck.loras` becomes `set`'s plan; a kept transformer reloads what
    /// either set updates (all of it after a failed change).
    fn switch_loras(&mut self, set: &LoraSet) -> Result<LoraSwitch> {
        let t0 = Instant::now();
        let mut plan = crate::lora::Plan::new(set.adapters());
        plan.scratch_floor = self.ck.loras.scratch_floor;
        let plan = Arc::new(plan);
        let touched: BTreeSet<String> = self.ck.loras.tensors().chain(plan.tensors()).map(String::from).collect();
        self.ck.loras = plan.clone();
        self.loaded = set.clone();
        let mut reloaded = Default::default();
        if let Held::Kept(dit) = &mut self.dit {
            let c = self.ck.open_component("transformer")?;
            if self.broken {
                self.dit = Held::PerRequest;
                self.b.release_cached()?;
                self.dit = Held::Kept(Dit::load_streamed(&self.b, c, &self.ck.dit, self.plan.resident_blocks("transformer"), self.plan.linears)?);
            } else {
                reloaded = dit.set_loras(&self.b, c, &touched)?;
            }
        }
        self.b.release_cached()?;
        self.broken = false;
        Ok(LoraSwitch { seconds: t0.elapsed().as_secs_f64(), merge: plan.clock.total(), reloaded })
    }

    fn conditions(&self, tokens: &[Vec<u32>], precision: Precision) -> Result<(Tensor, Tensor)> {
        let mut per_request = None;
        let enc = self.encoder.or_load(&mut per_request, || {
            Encoder::load_streamed(&self.b, self.ck.open_component("text_encoder")?, &self.ck.encoder, self.plan.resident_blocks("text_encoder"))
        })?;
        let hidden = pipeline::hidden_states_all(&self.b, enc, tokens, precision);
        enc.end_stream();
        let mut hidden = hidden?;
        anyhow::ensure!(!hidden.is_empty(), "no prompt tokens");
        let cond = hidden.remove(0);
        let uncond = if hidden.is_empty() { cond.clone() } else { hidden.remove(0) };
        Ok((cond, uncond))
    }

    /// The run's start from its init picture (None from text): the VAE encoder loaded for the
    /// request (its weights are the VAE stage's), the latents kept for the request's next picture.
    fn start(&mut self, req: &Request) -> Result<Option<pipeline::Start>> {
        let Some(p) = &req.init else { return Ok(None) };
        let z0 = match &self.encoded {
            Some((q, z0)) if Arc::ptr_eq(p, q) => z0.clone(),
            _ => {
                self.encoded = None;
                self.b.limit_vae_activations(self.plan.vae_activations);
                let z0 = pipeline::encode_picture(&self.b, &self.ck, p)?;
                self.b.release_cached()?;
                self.encoded = Some((p.clone(), z0.clone()));
                z0
            }
        };
        Ok(Some(pipeline::Start::of(p, z0)?))
    }

    fn latents(
        &mut self,
        req: &Request,
        cond: &Tensor,
        uncond: &Tensor,
        start: Option<&pipeline::Start>,
        progress: &mut dyn Progress,
    ) -> Result<pipeline::Denoised> {
        let mut per_request = None;
        let dit = self.dit.or_load(&mut per_request, || {
            Dit::load_streamed(&self.b, self.ck.open_component("transformer")?, &self.ck.dit, self.plan.resident_blocks("transformer"), self.plan.linears)
        })?;
        // Partial images decode with the kept VAE (a request asks for them only where it is kept).
        let vae = match &self.vae {
            Held::Kept(v) => Some(v),
            Held::PerRequest => None,
        };
        let d = pipeline::denoise_on(self.team.as_mut(), &self.b, dit, &self.ck, req, pipeline::Pass::of(&req.spec), (cond, uncond), start, progress, vae);
        dit.end_stream();
        d
    }

    fn picture(&self, req: &Request, z: &Tensor, progress: &mut dyn Progress) -> Result<Vec<u8>> {
        anyhow::ensure!(z.shape.len() == 4, "VAE decode: latents {:?}", z.shape);
        self.b.limit_vae_activations(self.plan.vae_activations);
        let mut per_request = None;
        let vae = self.vae.or_load(&mut per_request, || pipeline::load_vae(&self.b, &self.ck, z.shape[2], z.shape[3]))?;
        pipeline::picture_bytes(&self.b, vae, &self.ck, req, z, progress)
    }

    fn render_inner(&mut self, req: &Request, tokens: &[Vec<u32>], progress: &mut dyn Progress) -> Result<Picture> {
        let t0 = Instant::now();
        let start = self.start(req)?;
        // The pool is trimmed between the stages as `generate` does, so each stage has the
        // memory its plan gives it (the streamed layers' slots go too).
        let (cond, uncond) = self.conditions(tokens, req.spec.precision)?;
        self.b.release_cached()?;
        let encode_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let d = self.latents(req, &cond, &uncond, start.as_ref(), progress)?;
        self.b.release_cached()?;
        let denoise_s = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let req = &Request { forwards: Some(d.forwards), ..req.clone() };
        let bytes = self.picture(req, &d.latents, progress)?;
        let decode_s = t2.elapsed().as_secs_f64();
        Ok(Picture { bytes, forwards: d.forwards, encode_s, denoise_s, decode_s, total_s: t0.elapsed().as_secs_f64(), lora_switch_s: 0.0 })
    }
}

impl<B: Serving> Render for Engine<B> {
    fn render(&mut self, req: &Request, tokens: &[Vec<u32>], progress: &mut dyn Progress) -> Result<Picture> {
        let r = self.render_inner(req, tokens, progress);
        // A failed or stopped picture leaves nothing behind for the next one.
        let freed = self.b.release_cached();
        let pic = r?;
        freed?;
        Ok(pic)
    }
    fn max_joint_tokens(&self) -> usize {
        self.plan.joint_tokens
    }
    fn use_loras(&mut self, set: &LoraSet) -> Result<Option<LoraSwitch>> {
        if !self.broken && self.loaded == *set {
            return Ok(None);
        }
        let r = self.switch_loras(set);
        // Failed part way, the transformer may hold neither set.
        self.broken = r.is_err();
        r.map(Some)
    }
}
