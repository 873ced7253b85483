//! One chunk through the three stages: encode every distinct text, denoise every item, decode
//! and write every picture, each network loaded once.

use super::*;
use crate::backend::ops::{EncoderOps, VaeEncodeOps};
use crate::checkpoint::Checkpoint;
use crate::model::{dit::Dit, encoder::Encoder, vae::VaeDecoder};
use crate::pipeline::{self, Interrupted, Progress, Request};
use crate::tensor::Tensor;
use anyhow::Result;
use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

pub(super) struct Ctx<'a> {
    pub(super) ck: &'a Checkpoint,
    pub(super) o: &'a BatchOptions,
    pub(super) src: &'a str,
    pub(super) t0: Instant,
}

impl Ctx<'_> {
    fn request(&self, j: &Job, t: &Texts) -> Request {
        let it = &j.item;
        Request {
            // --quality is for the batch's JPEG pictures; its PNG and WebP ones have none.
            quality: self.o.quality.filter(|_| crate::picture::Format::of(&j.path).ok() == Some(crate::picture::Format::Jpeg)),
            cut: t.cut,
            init: it.init.clone(),
            c2pa: self.o.c2pa.clone(),
            ..Request::new(it.spec.clone(), j.path.clone(), self.o.device)
        }
    }
}

pub(super) fn check_stop() -> Result<()> {
    if stop_signal().is_some() {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// Steps of one picture go to the batch's progress; the stop request is asked after each.
pub(super) struct Steps<'a>(&'a mut dyn BatchProgress);

impl Progress for Steps<'_> {
    fn step(&mut self, done: usize, total: usize) {
        self.0.step(done, total);
    }
    fn warn(&mut self, msg: &str) {
        self.0.warn(msg);
    }
    fn cancelled(&self) -> bool {
        stop_signal().is_some()
    }
}

/// Per-picture state through the stages of a chunk.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) failed: bool,
    pub(super) encode_s: f64,
    pub(super) denoise_s: f64,
    /// The LoRA merges counted from the chunk's previous picture to the end of this one's denoise.
    pub(super) lora_merge: crate::lora::plan::MergeTime,
    pub(super) latents: Option<Tensor>,
    /// Where its denoising starts when it starts from a picture.
    pub(super) start: Option<pipeline::Start>,
    pub(super) forwards: pipeline::Forwards,
}

/// Render the chunks; a failing item is reported and the rest go on; a failing component load
/// ends the run (Err), as does a stop request (Err(Interrupted)).
#[allow(clippy::too_many_arguments)]
pub(super) fn render<B: EncoderOps + pipeline::TeamBackend + VaeEncodeOps>(
    b: &B,
    cx: &Ctx,
    plan: Option<&crate::plan::run::RunPlan>,
    mut team: Option<pipeline::Team<B>>,
    jobs: &[Job],
    texts: &[Texts],
    chunks: &[Range<usize>],
    progress: &mut dyn BatchProgress,
    sum: &mut Summary,
) -> Result<()> {
    let ck = cx.ck;
    for (ci, range) in chunks.iter().enumerate() {
        let jobs = &jobs[range.clone()];
        let texts = &texts[range.clone()];
        let mut slots: Vec<Slot> = jobs.iter().map(|_| Slot::default()).collect();
        let fail = |slot: &mut Slot, j: &Job, e: &anyhow::Error, progress: &mut dyn BatchProgress, sum: &mut Summary| {
            progress.failed(&format!("{}:{}: {e:#}", cx.src, j.item.line));
            slot.failed = true;
            sum.failed += 1;
        };

        // 1. Encode every distinct text once; then the encoder is freed.
        progress.stage("encode", ci, chunks.len());
        let mut hidden: HashMap<&[u32], Tensor> = HashMap::new();
        {
            let comp = ck.open_component("text_encoder")?;
            let enc = Encoder::load_streamed(b, comp, &ck.encoder, plan.map_or(usize::MAX, |p| p.encoder_resident))?;
            for (i, (j, t)) in jobs.iter().zip(texts).enumerate() {
                progress.item(j, i, jobs.len());
                let t1 = Instant::now();
                for ids in std::iter::once(&t.prompt).chain(t.negative.as_ref()) {
                    if hidden.contains_key(ids.as_slice()) {
                        continue;
                    }
                    check_stop()?;
                    match pipeline::hidden_states(b, &enc, ids, cx.o.defaults.precision) {
                        Ok(h) => {
                            hidden.insert(ids.as_slice(), h);
                        }
                        Err(e) => {
                            fail(&mut slots[i], j, &e, progress, sum);
                            break;
                        }
                    }
                }
                slots[i].encode_s = t1.elapsed().as_secs_f64();
            }
        }

        if slots.iter().all(|s| s.failed) {
            continue;
        }

        // 1b. Encode the pictures the items start from (each once), with the VAE encoder.
        if jobs.iter().zip(&slots).any(|(j, s)| j.item.init.is_some() && !s.failed) {
            progress.stage("encode pictures", ci, chunks.len());
            b.release_cached()?; // the text encoder is gone
            b.limit_vae_activations(plan.and_then(|p| p.vae_activations));
            let mut done: Vec<(&std::sync::Arc<pipeline::Prepared>, Tensor)> = vec![];
            for (i, j) in jobs.iter().enumerate() {
                let Some(p) = j.item.init.as_ref().filter(|_| !slots[i].failed) else { continue };
                check_stop()?;
                progress.item(j, i, jobs.len());
                let t1 = Instant::now();
                let z0 = match done.iter().find(|(q, _)| std::sync::Arc::ptr_eq(p, q)) {
                    Some((_, z)) => Ok(z.clone()),
                    None => pipeline::encode_picture(b, ck, p),
                };
                match z0.and_then(|z| {
                    done.push((p, z.clone()));
                    pipeline::Start::of(p, z)
                }) {
                    Ok(s) => slots[i].start = Some(s),
                    Err(e) => fail(&mut slots[i], j, &e, progress, sum),
                }
                slots[i].encode_s += t1.elapsed().as_secs_f64();
            }
        }

        // 2. Denoise every picture with the DiT loaded once; then it is freed.
        progress.stage("denoise", ci, chunks.len());
        b.release_cached()?; // the encoder is gone
        {
            // The merge clock read before the load and after each picture (it waits for the
            // merges' device time: only with LoRAs attached).
            let merged = || if ck.loras.is_empty() { Default::default() } else { ck.loras.clock.total() };
            let mut seen = merged();
            let comp = ck.open_component("transformer")?;
            let linears = crate::model::dit::MainLinears::of(cx.o.defaults.precision);
            let dit = Dit::load_streamed(b, comp, &ck.dit, plan.map_or(usize::MAX, |p| p.dit_resident), linears)?;
            for (i, (j, t)) in jobs.iter().zip(texts).enumerate() {
                if slots[i].failed {
                    continue;
                }
                check_stop()?;
                progress.item(j, i, jobs.len());
                let cond = &hidden[t.prompt.as_slice()];
                let uncond = t.negative.as_ref().map_or(cond, |n| &hidden[n.as_slice()]);
                let t1 = Instant::now();
                let req = cx.request(j, t);
                let pass = pipeline::Pass::of(&req.spec);
                match pipeline::denoise_on(team.as_mut(), b, &dit, ck, &req, pass, (cond, uncond), slots[i].start.as_ref(), &mut Steps(&mut *progress), None) {
                    Ok(d) => (slots[i].latents, slots[i].forwards) = (Some(d.latents), d.forwards),
                    Err(e) if e.downcast_ref::<Interrupted>().is_some() => return Err(e),
                    Err(e) => fail(&mut slots[i], j, &e, progress, sum),
                }
                slots[i].denoise_s = t1.elapsed().as_secs_f64();
                let now = merged();
                slots[i].lora_merge = now.since(&seen);
                seen = now;
            }
        }
        drop(hidden);
        b.release_cached()?; // the DiT is gone
        if slots.iter().all(|s| s.latents.is_none()) {
            continue;
        }

        // 3. Decode and write every picture with the VAE loaded once.
        progress.stage("decode", ci, chunks.len());
        let comp = ck.open_component("vae")?;
        b.limit_vae_activations(plan.and_then(|p| p.vae_activations));
        let vae = VaeDecoder::load(b, &comp, &ck.vae)?;
        for (i, j) in jobs.iter().enumerate() {
            let Some(z) = slots[i].latents.take() else { continue };
            check_stop()?;
            progress.item(j, i, jobs.len());
            let t1 = Instant::now();
            let req = Request { forwards: Some(slots[i].forwards), ..cx.request(j, &texts[i]) };
            let res = pipeline::picture_bytes(b, &vae, ck, &req, &z, &mut Steps(&mut *progress)).and_then(|bytes| crate::output::write(&j.path, &bytes));
            match res {
                Ok(()) => {
                    sum.written += 1;
                    progress.finished(&Finished {
                        index: j.item.index,
                        line: j.item.line,
                        path: j.path.clone(),
                        seed: j.item.spec.seed,
                        steps: j.item.spec.steps,
                        width: j.item.spec.width,
                        height: j.item.spec.height,
                        encode_s: slots[i].encode_s,
                        denoise_s: slots[i].denoise_s,
                        decode_s: t1.elapsed().as_secs_f64(),
                        lora_merge: slots[i].lora_merge,
                        elapsed_s: cx.t0.elapsed().as_secs_f64(),
                        forwards: slots[i].forwards,
                    });
                }
                Err(e) => fail(&mut slots[i], j, &e, progress, sum),
            }
        }
    }
    Ok(())
}
