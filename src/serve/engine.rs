//! The resident engine behind `moss serve`: the text encoder, the DiT and the VAE loaded once on
//! one backend, rendering one request at a time to the exact bytes `moss generate` writes for the
//! same settings (the same [`pipeline::hidden_states`], [`pipeline::denoise_with`] and
//! [`pipeline::picture_bytes`] that `generate` and batch mode go through).
//!
//! On CUDA the start-up plan keeps all three networks resident when their weights and the
//! largest picture's activations fit in free memory; otherwise the text encoder is loaded for
//! each request (its load time is measured at start-up and logged) and only the DiT and the VAE
//! stay. Requests whose DiT activations do not fit next to the resident weights are refused
//! before any work ([`Engine::max_joint_tokens`]).

use crate::backend::cpu::Cpu;
use crate::backend::cuda::{plan::MemoryPlan, Cuda};
use crate::backend::ops::{DitOps, EncoderOps, VaeOps};
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::model::{dit::Dit, encoder::Encoder, vae::VaeDecoder};
use crate::options::Precision;
use crate::pipeline::{self, Progress, Request};
use crate::tensor::Tensor;
use anyhow::{bail, Result};
use std::time::Instant;

const GIB: f64 = (1u64 << 30) as f64;

/// One rendered picture and where its time went.
#[derive(Clone, Debug, Default)]
pub struct Picture {
    pub bytes: Vec<u8>,
    pub encode_s: f64,
    pub denoise_s: f64,
    pub decode_s: f64,
    pub total_s: f64,
}

/// What the server needs from an engine, whatever its backend.
pub trait Render {
    /// Render `req` from its prompt tokens (the ids of [`pipeline::prompt_texts`], in order).
    /// Stops with [`pipeline::Interrupted`] when `progress` says so between two steps.
    fn render(&mut self, req: &Request, tokens: &[Vec<u32>], progress: &mut dyn Progress) -> Result<Picture>;
    /// The largest count of joint tokens (`W/16 * H/16` + prompt tokens) one DiT forward may take
    /// next to the resident weights (`usize::MAX` where memory is not planned: the CPU).
    fn max_joint_tokens(&self) -> usize;
    /// Start-up plan, for the log: what is resident, what is swapped per request.
    fn plan(&self) -> &str;
}

/// Where the per-backend differences live: memory (CUDA) or none (CPU).
pub trait Residency: EncoderOps + DitOps + VaeOps + Sized {
    /// Decide what stays resident given the sizes the server accepts; the text says it.
    fn plan_residency(&self, ck: &Checkpoint, max_pixels: u64, max_tokens: usize) -> Result<(bool, String)>;
    /// See [`Render::max_joint_tokens`]; asked once, after the weights are loaded.
    fn joint_token_budget(&self, ck: &Checkpoint) -> Result<usize>;
}

impl Residency for Cpu {
    fn plan_residency(&self, _ck: &Checkpoint, _max_pixels: u64, _max_tokens: usize) -> Result<(bool, String)> {
        Ok((true, "cpu: the text encoder, the transformer and the VAE stay resident in host memory".into()))
    }
    fn joint_token_budget(&self, _ck: &Checkpoint) -> Result<usize> {
        Ok(usize::MAX)
    }
}

impl Residency for Cuda {
    fn plan_residency(&self, ck: &Checkpoint, max_pixels: u64, max_tokens: usize) -> Result<(bool, String)> {
        use crate::backend::cuda::plan::{encoder_activation_bytes, RESERVE_BYTES};
        let weights = |name: &'static str, p| -> Result<usize> { Ok(MemoryPlan::component(&ck.open_component_for_plan(name)?, p).weights) };
        let enc = weights("text_encoder", self.precision)?;
        let dit = weights("transformer", self.precision)?;
        let vae = weights("vae", crate::options::Precision::Fp32)?;
        let side = (max_pixels as f64).sqrt() as usize / 16;
        let dit_act = self.dit_plan(&ck.open_component_for_plan("transformer")?, &ck.dit, side * side + max_tokens).activations;
        let enc_act = encoder_activation_bytes(&ck.encoder, max_tokens, self.act_dtype());
        let (free, total) = self.gpu().mem_info()?;
        let gib = |b: usize| b as f64 / GIB;
        let name = &self.gpu().name;
        let all = enc + dit + vae + dit_act.max(enc_act) + RESERVE_BYTES;
        if all <= free {
            let msg = format!(
                "{name}: resident: text encoder {:.1} GiB, transformer {:.1} GiB, VAE {:.1} GiB \
                 ({:.1} GiB with the largest request's activations; {:.1} of {:.1} GiB free)",
                gib(enc), gib(dit), gib(vae), gib(all), gib(free), gib(total)
            );
            return Ok((true, msg));
        }
        let swapped = dit + vae + dit_act.max(enc + enc_act) + RESERVE_BYTES;
        if swapped <= free {
            let msg = format!(
                "{name}: resident: transformer {:.1} GiB, VAE {:.1} GiB; the text encoder ({:.1} GiB) does not fit \
                 next to them ({:.1} GiB needed, {:.1} of {:.1} GiB free) and is loaded for each request",
                gib(dit), gib(vae), gib(enc), gib(all), gib(free), gib(total)
            );
            return Ok((false, msg));
        }
        bail!(
            "{name}: the transformer ({:.1} GiB) and the VAE ({:.1} GiB) with the activations of a {}x{} picture \
             need {:.1} GiB, {:.1} of {:.1} GiB is free; lower --max-size or free GPU memory",
            gib(dit), gib(vae), side * 16, side * 16, gib(swapped), gib(free), gib(total)
        )
    }

    fn joint_token_budget(&self, ck: &Checkpoint) -> Result<usize> {
        self.release_cached()?;
        let (free, _) = self.gpu().mem_info()?;
        let comp = ck.open_component("transformer")?;
        let need = |tokens: usize| {
            let p = self.dit_plan(&comp, &ck.dit, tokens);
            p.activations + p.reserve
        };
        // The activations grow with the tokens: the largest count that fits, by bisection.
        let (mut lo, mut hi) = (0usize, (crate::options::MAX_SIDE as usize / 16).pow(2) + crate::prompt::MAX_TOKENS);
        if need(hi) <= free {
            return Ok(hi);
        }
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if need(mid) <= free {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// The three networks, loaded once.
pub struct Engine<B: Residency> {
    b: B,
    ck: Checkpoint,
    /// None: loaded for each request (it does not fit next to the others).
    encoder: Option<Encoder<B>>,
    dit: Dit<B>,
    vae: VaeDecoder<B>,
    joint_tokens: usize,
    plan: String,
}

impl<B: Residency> Engine<B> {
    /// Load every network that stays resident. `max_pixels` and `max_tokens`: the largest picture
    /// (W x H) and prompt the server accepts, which the memory plan must hold.
    pub fn load(b: B, ck: Checkpoint, max_pixels: u64, max_tokens: usize) -> Result<Engine<B>> {
        let (keep_encoder, mut plan) = b.plan_residency(&ck, max_pixels, max_tokens)?;
        let t = Instant::now();
        let encoder = Some(Encoder::load(&b, &ck.open_component("text_encoder")?, &ck.encoder)?);
        let encoder_load_s = t.elapsed().as_secs_f64();
        let encoder = if keep_encoder {
            encoder
        } else {
            drop(encoder);
            b.release_cached()?;
            plan.push_str(&format!(" (about {encoder_load_s:.1} s more per request: its load at start-up)"));
            None
        };
        let dit = Dit::load(&b, &ck.open_component("transformer")?, &ck.dit)?;
        if !ck.loras.is_empty() {
            let n = ck.loras.adapters().len();
            let merge = ck.loras.clock.total();
            plan.push_str(&format!("; {n} LoRA(s) read in {:.3} s, merged in {}", ck.loras.read_s, merge.line()));
        }
        let side = (max_pixels as f64).sqrt() as usize / 16;
        let vae = pipeline::load_vae(&b, &ck, side.max(1), side.max(1))?;
        let joint_tokens = b.joint_token_budget(&ck)?;
        Ok(Engine { b, ck, encoder, dit, vae, joint_tokens, plan })
    }

    fn conditions(&self, tokens: &[Vec<u32>], precision: Precision) -> Result<(Tensor, Tensor)> {
        let swapped;
        let enc = match &self.encoder {
            Some(e) => e,
            None => {
                swapped = Encoder::load(&self.b, &self.ck.open_component("text_encoder")?, &self.ck.encoder)?;
                &swapped
            }
        };
        let mut hidden = tokens.iter().map(|ids| pipeline::hidden_states(&self.b, enc, ids, precision)).collect::<Result<Vec<_>>>()?;
        anyhow::ensure!(!hidden.is_empty(), "no prompt tokens");
        let cond = hidden.remove(0);
        let uncond = if hidden.is_empty() { cond.clone() } else { hidden.remove(0) };
        Ok((cond, uncond))
    }

    fn render_inner(&mut self, req: &Request, tokens: &[Vec<u32>], progress: &mut dyn Progress) -> Result<Picture> {
        let t0 = Instant::now();
        // The pool is trimmed between the stages as `generate` does, so each stage sees the free
        // memory it sees there, less the resident weights (the VAE's strip plan reads it).
        let (cond, uncond) = self.conditions(tokens, req.precision)?;
        self.b.release_cached()?;
        let encode_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let z = pipeline::denoise_with(&self.b, &self.dit, &self.ck, req, &cond, &uncond, progress)?;
        self.b.release_cached()?;
        let denoise_s = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let bytes = pipeline::picture_bytes(&self.b, &self.vae, &self.ck, req, &z, progress)?;
        let decode_s = t2.elapsed().as_secs_f64();
        Ok(Picture { bytes, encode_s, denoise_s, decode_s, total_s: t0.elapsed().as_secs_f64() })
    }
}

impl<B: Residency> Render for Engine<B> {
    fn render(&mut self, req: &Request, tokens: &[Vec<u32>], progress: &mut dyn Progress) -> Result<Picture> {
        let r = self.render_inner(req, tokens, progress);
        // A failed or stopped picture leaves nothing behind for the next one.
        let freed = self.b.release_cached();
        let pic = r?;
        freed?;
        Ok(pic)
    }
    fn max_joint_tokens(&self) -> usize {
        self.joint_tokens
    }
    fn plan(&self) -> &str {
        &self.plan
    }
}
