//! `--devices`: one picture's denoising over several devices ([`crate::parallel`]). The caller's
//! backend is rank 0: it encodes the prompts, runs its part of the loop and decodes. Every other
//! device is a helper: a thread of its own holding its backend (opened once), the transformer
//! (loaded once per device, as its own memory plan places it) and its endpoints, which runs the
//! same loop ([`super::denoise_loop_on`]) on each picture rank 0 hands it.
//!
//! A rank that fails aborts its transports and the crew's vote, so no peer waits for it; the team
//! is then broken and started again (devices opened, weights loaded) before the next picture. A
//! cancelled picture stops every rank at the same step and leaves the team as it was.

use super::{denoise_loop_on, Denoised, Interrupted, Pass, Progress, Request, Silent, Start};
use crate::backend::cpu::Cpu;
use crate::backend::cuda::Cuda;
use crate::backend::ops::{DitOps, VaeOps};
use crate::backend::Device;
use crate::checkpoint::Checkpoint;
use crate::model::dit::{Dit, MainLinears};
use crate::model::vae::VaeDecoder;
use crate::options::Precision;
use crate::parallel::{Endpoints, Transport};
use crate::plan::{Budget, MemoryOptions};
use crate::tensor::Tensor;
use anyhow::{anyhow, bail, Context, Result};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

/// What a backend needs to be a rank.
pub trait TeamBackend: DitOps + VaeOps + Sized + Send + 'static {
    /// Open `device` (a helper's; rank 0's is the caller's).
    fn open_rank(device: Device, precision: Precision) -> Result<Self>;
    /// Make the backend usable on the calling thread.
    fn bind(&self) -> Result<()>;
    /// The memory a helper's plan is made for.
    fn rank_budget(&self) -> Result<Budget>;
    /// One transport a member of the group `members` (indices into `ranks`, in group order).
    fn transports(ranks: &[&Self], members: &[usize]) -> Result<Vec<Box<dyn Transport<Self>>>>;
}

impl TeamBackend for Cpu {
    fn open_rank(_: Device, _: Precision) -> Result<Cpu> {
        Ok(Cpu)
    }
    fn bind(&self) -> Result<()> {
        Ok(())
    }
    fn rank_budget(&self) -> Result<Budget> {
        Ok(crate::backend::cpu_budget())
    }
    fn transports(_: &[&Cpu], members: &[usize]) -> Result<Vec<Box<dyn Transport<Cpu>>>> {
        crate::parallel::host::make::<Cpu>(members)
    }
}

impl TeamBackend for Cuda {
    fn open_rank(device: Device, precision: Precision) -> Result<Cuda> {
        match device {
            Device::Cuda(n) => super::cuda(n, precision),
            Device::Cpu => bail!("a CUDA team's helpers are GPUs, not the CPU"),
        }
    }
    fn bind(&self) -> Result<()> {
        self.gpu().ctx.bind_to_thread().map_err(|e| anyhow!("CUDA context: {e:?}"))
    }
    fn rank_budget(&self) -> Result<Budget> {
        Cuda::budget(self)
    }
    fn transports(ranks: &[&Cuda], members: &[usize]) -> Result<Vec<Box<dyn Transport<Cuda>>>> {
        let group: Vec<&Cuda> = members.iter().map(|&m| ranks[m]).collect();
        Ok(crate::backend::cuda::nccl::group(&group)?.into_iter().map(|t| Box::new(t) as Box<dyn Transport<Cuda>>).collect())
    }
}

/// A helper device's plan for pictures up to `size` with prompts of up to `tokens` tokens under
/// `mem`: the transformer blocks [`crate::plan::run::decide`] keeps resident on its budget (the
/// transformer's stage, counted for the whole joint stream).
pub fn helper_plan(
    ck: &Checkpoint,
    linears: MainLinears,
    tokens: usize,
    size: (u32, u32),
    mem: MemoryOptions,
) -> impl Fn(Budget) -> Result<usize> + Send + 'static {
    let ck = ck.clone();
    move |budget: Budget| {
        let budget = budget.with_linears(linears);
        Ok(crate::plan::run::decide(&crate::plan::run::networks(&ck, &budget, tokens, size)?, &budget, &mem)?.dit_resident)
    }
}

/// The `--devices` list checked: at least one, all CUDA GPUs (each once) or all `cpu` (CPU ranks,
/// threads of this process: the rank logic without GPUs, for tests).
pub fn check_devices(devices: &[Device]) -> Result<()> {
    let Some(first) = devices.first() else { bail!("--devices: no device given") };
    for (i, d) in devices.iter().enumerate() {
        if std::mem::discriminant(d) != std::mem::discriminant(first) {
            bail!("--devices: {first} and {d} mixed; give GPUs only (cuda:0,cuda:1,...) or CPU ranks only (cpu,cpu,...)");
        }
        if matches!(d, Device::Cuda(_)) && devices[..i].contains(d) {
            bail!("--devices: {d} is given twice");
        }
    }
    Ok(())
}

/// The `-v` line of a picture's spread over `devices`.
pub fn parallel_line(devices: &[Device], l: crate::parallel::Layout) -> String {
    let names = devices.iter().map(Device::to_string).collect::<Vec<_>>().join(",");
    let cfg = match l.groups {
        2 => "2 CFG groups (the prompt's pass, the negative's)",
        _ => "1 group (both passes in turn)",
    };
    let seq = match l.seq {
        1 => "1 rank a pass".to_string(),
        n => format!("{n} ranks splitting each pass's tokens (Ulysses)"),
    };
    format!("denoise over {names}: {cfg} x {seq}")
}

/// The `--json` `parallel` object: the devices and the layout.
pub fn parallel_json((devices, l): &(Vec<Device>, crate::parallel::Layout)) -> serde_json::Value {
    serde_json::json!({"devices": devices.iter().map(Device::to_string).collect::<Vec<_>>(), "cfg_groups": l.groups, "seq_ranks": l.seq})
}

/// [`Team::denoise`] with a team, [`super::denoise_loop`] without.
#[allow(clippy::too_many_arguments)]
pub fn denoise_on<B: TeamBackend>(
    team: Option<&mut Team<B>>,
    b: &B,
    dit: &Dit<B>,
    ck: &Checkpoint,
    req: &Request,
    pass: Pass,
    conds: (&Tensor, &Tensor),
    start: Option<&Start>,
    progress: &mut dyn Progress,
    vae: Option<&VaeDecoder<B>>,
) -> Result<Denoised> {
    match team {
        Some(t) => t.denoise(b, dit, ck, req, pass, conds, start, progress, vae),
        None => super::denoise_loop(b, dit, ck, req, pass, conds, start, progress, vae),
    }
}

/// A picture for the helpers: the request, its pass, its text conditions and where it starts.
struct Job {
    req: Request,
    ck: Checkpoint,
    pass: Pass,
    cond: Tensor,
    uncond: Tensor,
    start: Option<Start>,
}

struct Helper {
    jobs: Sender<Job>,
    done: Receiver<Result<()>>,
    thread: Option<JoinHandle<()>>,
}

/// How the team (re)starts: the devices and what each helper loads.
struct Setup {
    devices: Vec<Device>,
    precision: Precision,
    ck: Checkpoint,
    linears: MainLinears,
    /// Each helper's resident transformer blocks (its plan on its device).
    resident: Box<dyn Fn(Budget) -> Result<usize> + Send>,
}

/// Rank 0's endpoints and the helpers (ranks 1..).
pub struct Team<B: TeamBackend> {
    setup: Setup,
    rank0: Option<Endpoints<B>>,
    helpers: Vec<Helper>,
    /// The helpers' transformers are loading (their result not yet read).
    loading: bool,
}

impl<B: TeamBackend> Team<B> {
    /// Open `devices[1..]` (rank 0 is `b0`, on `devices[0]`), make every rank's endpoints, and
    /// start loading the transformer on each helper (its blocks placed by `resident` for the
    /// helper's memory); [`Team::denoise`] waits for the loads.
    pub fn start(
        b0: &B,
        devices: &[Device],
        precision: Precision,
        ck: &Checkpoint,
        linears: MainLinears,
        resident: impl Fn(Budget) -> Result<usize> + Send + 'static,
    ) -> Result<Team<B>> {
        check_devices(devices)?;
        let setup = Setup { devices: devices.to_vec(), precision, ck: ck.clone(), linears, resident: Box::new(resident) };
        let mut team = Team { setup, rank0: None, helpers: vec![], loading: false };
        team.launch(b0)?;
        Ok(team)
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.setup.devices.len()
    }

    /// The devices, rank 0's first.
    pub fn devices(&self) -> &[Device] {
        &self.setup.devices
    }

    /// The devices and how `req`'s passes spread over them.
    pub fn spread(&self, req: &Request, ck: &Checkpoint) -> Result<(Vec<Device>, crate::parallel::Layout)> {
        Ok((self.setup.devices.clone(), super::layout_for(req, ck, self.ranks())?))
    }

    fn launch(&mut self, b0: &B) -> Result<()> {
        let s = &self.setup;
        let others = s.devices[1..].iter().map(|&d| B::open_rank(d, s.precision).with_context(|| format!("--devices: {d}"))).collect::<Result<Vec<B>>>()?;
        b0.bind()?;
        let all: Vec<&B> = std::iter::once(b0).chain(others.iter()).collect();
        let mut eps = Endpoints::make_all(all.len(), |members| B::transports(&all, members))?.into_iter();
        self.rank0 = eps.next();
        let mut helpers = vec![];
        for (b, ep) in others.into_iter().zip(eps) {
            b.bind()?;
            let resident = (s.resident)(b.rank_budget()?)?;
            let (jobs, job_rx) = channel::<Job>();
            let (done_tx, done) = channel();
            let (ck, linears) = (s.ck.clone(), s.linears);
            let thread =
                std::thread::Builder::new().name(format!("moss-rank-{}", ep.rank)).spawn(move || helper(b, ck, linears, resident, ep, job_rx, done_tx))?;
            helpers.push(Helper { jobs, done, thread: Some(thread) });
        }
        b0.bind()?;
        self.helpers = helpers;
        self.loading = true;
        Ok(())
    }

    /// Wait for the helpers' transformers (once after a start).
    fn loaded(&mut self) -> Result<()> {
        if std::mem::take(&mut self.loading) {
            for h in &self.helpers {
                h.done.recv().map_err(|_| anyhow!("a device's thread stopped while loading"))??;
            }
        }
        Ok(())
    }

    /// Stop the helpers (their threads end when the job channel closes).
    fn stop(&mut self) {
        if let Some(e) = &self.rank0 {
            e.abort();
        }
        self.rank0 = None;
        for mut h in self.helpers.drain(..) {
            drop(h.jobs);
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// Denoise `req` on every rank, rank 0 being `b` with `dit` (and `progress`, `vae` for
    /// previews, as [`super::denoise_loop`]): rank 0's latents. A broken team starts again first.
    #[allow(clippy::too_many_arguments)]
    pub fn denoise(
        &mut self,
        b: &B,
        dit: &Dit<B>,
        ck: &Checkpoint,
        req: &Request,
        pass: Pass,
        (cond, uncond): (&Tensor, &Tensor),
        start: Option<&Start>,
        progress: &mut dyn Progress,
        vae: Option<&VaeDecoder<B>>,
    ) -> Result<Denoised> {
        // Refused here, before any rank starts: the request's own problems never break the team.
        super::check_for(req, ck)?;
        super::layout_for(req, ck, self.ranks())?;
        if self.rank0.as_ref().is_none_or(|e| e.crew.failed()) {
            self.stop();
            self.launch(b)?;
        }
        let started = self.loaded().and_then(|()| {
            for h in &self.helpers {
                let job = Job { req: req.clone(), ck: ck.clone(), pass, cond: cond.clone(), uncond: uncond.clone(), start: start.cloned() };
                h.jobs.send(job).map_err(|_| anyhow!("a device's thread stopped"))?;
            }
            Ok(())
        });
        if let Err(e) = started {
            self.stop();
            return Err(e);
        }
        let rank0 = self.rank0.as_ref().expect("started");
        let mine = denoise_loop_on(b, dit, ck, req, pass, (cond, uncond), start, progress, vae, Some(rank0));
        if mine.as_ref().is_err_and(|e| !e.is::<Interrupted>()) {
            rank0.abort();
        }
        let theirs: Vec<Result<()>> = self.helpers.iter().map(|h| h.done.recv().unwrap_or_else(|_| Err(anyhow!("a device's thread stopped")))).collect();
        // The failing rank's own error, not a peer's word that one failed.
        let theirs = theirs.into_iter().filter_map(Result::err).min_by_key(crate::parallel::is_echo);
        match (mine, theirs) {
            (Ok(d), None) => Ok(d),
            (Err(m), Some(e)) if crate::parallel::is_echo(&m) => Err(e),
            (Ok(_), Some(e)) => Err(e),
            (Err(m), _) => Err(m),
        }
    }
}

impl<B: TeamBackend> Drop for Team<B> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A helper's thread: load, say so, then run each picture's loop until the job channel closes.
fn helper<B: TeamBackend>(b: B, ck: Checkpoint, linears: MainLinears, resident: usize, ep: Endpoints<B>, jobs: Receiver<Job>, done: Sender<Result<()>>) {
    let load = || -> Result<Dit<B>> {
        b.bind()?;
        Dit::load_streamed(&b, ck.open_component("transformer")?, &ck.dit, resident, linears)
    };
    let dit = match load() {
        Ok(d) => {
            let _ = done.send(Ok(()));
            d
        }
        Err(e) => {
            ep.abort();
            let _ = done.send(Err(e.context(format!("loading the transformer on rank {}", ep.rank))));
            return;
        }
    };
    for job in jobs {
        let r = denoise_loop_on(&b, &dit, &job.ck, &job.req, job.pass, (&job.cond, &job.uncond), job.start.as_ref(), &mut Silent, None, Some(&ep));
        dit.end_stream();
        let _ = b.release_cached();
        let r = match r {
            Ok(_) => Ok(()),
            Err(e) if e.is::<Interrupted>() => Ok(()),
            Err(e) => {
                ep.abort();
                Err(e.context(format!("rank {}", ep.rank)))
            }
        };
        if done.send(r).is_err() {
            return;
        }
    }
}
