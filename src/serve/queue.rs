//! The queue and the one worker thread that owns the engine (a std thread: the backends are not
//! async). One picture at a time; a request of `n` pictures renders them one after another with
//! seeds `seed`, `seed + 1`, ... (as batch mode numbers them). The HTTP side only pushes jobs and
//! reads their events, so it stays responsive while a picture runs.
//!
//! **Order.** First in, first out, but for per-request LoRAs: when the oldest waiting request
//! names another LoRA set than the one the transformer holds, a later request of the held set
//! may go first (the oldest such), at most [`GROUP`] of them in a row; then the oldest runs. So
//! requests of one set run together, and none waits behind more than [`GROUP`] requests that
//! came after it.
//!
//! **Draining.** A request that is running when the server starts draining renders all its
//! pictures (only a second signal stops it).

use super::api::{ApiError, Generation};
use super::engine::{Picture, Render};
use super::loras::LoraSet;
use super::metrics::{Gauges, Metrics};
use crate::pipeline::{Interrupted, Progress};
use axum::http::StatusCode;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What a job tells its HTTP handler, in order.
#[derive(Debug)]
pub enum Event {
    /// Waiting, with this many requests ahead (0: next).
    Queued {
        ahead: usize,
    },
    Step {
        index: usize,
        step: usize,
        steps: usize,
    },
    /// Picture `index`'s `partial`-th partial image (from 0): a PNG of the decoded x0 prediction
    /// after `step` of `steps`.
    Partial {
        index: usize,
        partial: usize,
        step: usize,
        steps: usize,
        png: Vec<u8>,
    },
    Image {
        index: usize,
        seed: u64,
        picture: Picture,
        queued_s: f64,
    },
    Failed(ApiError),
    Done,
}

/// One request in the queue.
pub struct Job {
    pub id: u64,
    pub gen: Generation,
    /// Prompt token ids ([`crate::pipeline::prompt_texts`]'s order).
    pub tokens: Vec<Vec<u32>>,
    pub tx: UnboundedSender<Event>,
    /// Set when the client went away: the worker stops between two steps.
    pub cancel: AtomicBool,
    pub enqueued: Instant,
    /// The LoRA set its pictures use.
    pub loras: LoraSet,
}

/// Most requests of the held LoRA set that may go before the oldest waiting one.
pub const GROUP: usize = 4;

#[derive(Default)]
struct State {
    waiting: VecDeque<Arc<Job>>,
    running: Option<Arc<Job>>,
    ready: bool,
    /// Shutting down: nothing new is accepted.
    draining: bool,
    /// A second signal: stop the running picture too.
    stop_now: bool,
    /// Joint-token budget of the loaded engine.
    joint_tokens: usize,
    /// The LoRA set of the last job taken (the one the engine holds next).
    held: LoraSet,
    /// Jobs taken ahead of the oldest waiting one since it became the oldest.
    passed: usize,
}

pub struct Queue {
    state: Mutex<State>,
    wake: Condvar,
    pub metrics: Metrics,
    pub max_queue: usize,
}

impl Queue {
    pub fn new(max_queue: usize) -> Queue {
        Queue { state: Mutex::new(State::default()), wake: Condvar::new(), metrics: Metrics::default(), max_queue }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn ready(&self) -> bool {
        self.lock().ready
    }

    pub fn draining(&self) -> bool {
        self.lock().draining
    }

    pub fn joint_tokens(&self) -> usize {
        self.lock().joint_tokens
    }

    pub fn gauges(&self) -> Gauges {
        let s = self.lock();
        Gauges {
            ready: s.ready,
            queued_requests: s.waiting.len(),
            queued_pictures: s.waiting.iter().map(|j| j.gen.n as usize).sum(),
            running: s.running.is_some(),
        }
    }

    /// Seconds until the queue as it is now has drained (the `Retry-After` of a 429).
    fn drain_estimate_s(&self, s: &State) -> u64 {
        let pictures = s.running.iter().chain(&s.waiting).map(|j| j.gen.n as f64 * self.metrics.picture_estimate_s(j.gen.req.spec.steps));
        pictures.sum::<f64>().ceil().max(1.0) as u64
    }

    /// Queue `job`: its place (requests ahead), or 503 (loading, shutting down) / 429 (full).
    pub fn push(&self, job: Arc<Job>) -> Result<usize, ApiError> {
        let mut s = self.lock();
        if s.draining {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        if !s.ready {
            let mut e = ApiError::unavailable("the model is loading; GET /health says 200 when it is ready");
            e.retry_after = Some(5);
            return Err(e);
        }
        if s.waiting.len() >= self.max_queue {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!("the queue is full ({} requests waiting, --max-queue {}); retry after the time in Retry-After", s.waiting.len(), self.max_queue),
            );
            e.retry_after = Some(self.drain_estimate_s(&s));
            return Err(e);
        }
        let ahead = s.waiting.len() + s.running.is_some() as usize;
        s.waiting.push_back(job);
        self.wake.notify_all();
        Ok(ahead)
    }

    /// The client of job `id` went away: a waiting job leaves the queue (true), a running one is
    /// stopped between two steps.
    pub fn cancel(&self, job: &Job) -> bool {
        job.cancel.store(true, Ordering::SeqCst);
        let mut s = self.lock();
        let before = s.waiting.len();
        s.waiting.retain(|j| j.id != job.id);
        let removed = s.waiting.len() != before;
        if removed {
            Self::tell_places(&s);
        }
        removed
    }

    fn tell_places(s: &State) {
        let base = s.running.is_some() as usize;
        for (i, j) in s.waiting.iter().enumerate() {
            let _ = j.tx.send(Event::Queued { ahead: base + i });
        }
    }

    /// Stop accepting; answer every waiting request with 503. `now`: stop the running picture
    /// too (a second signal). Returns the waiting requests answered and the running one's id.
    pub fn drain(&self, now: bool) -> (usize, Option<u64>) {
        let mut s = self.lock();
        s.draining = true;
        s.stop_now |= now;
        let waiting: Vec<_> = s.waiting.drain(..).collect();
        for j in &waiting {
            let _ = j.tx.send(Event::Failed(ApiError::unavailable("the server is shutting down; this request was not started")));
        }
        self.wake.notify_all();
        (waiting.len(), s.running.as_ref().map(|j| j.id))
    }

    /// The worker: the next job (None: shutting down and nothing is left).
    fn next(&self) -> Option<Arc<Job>> {
        let mut s = self.lock();
        loop {
            if s.draining {
                return None;
            }
            if let Some(i) = Self::pick(&s) {
                let j = s.waiting.remove(i).expect("a waiting job");
                s.passed = if i == 0 { 0 } else { s.passed + 1 };
                s.held = j.loras.clone();
                s.running = Some(j.clone());
                Self::tell_places(&s);
                return Some(j);
            }
            s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The waiting job to run next ([`GROUP`]'s rule): the oldest, unless it needs another LoRA
    /// set and fewer than [`GROUP`] jobs went before it: then the oldest of the held set.
    fn pick(s: &State) -> Option<usize> {
        let oldest = s.waiting.front()?;
        if oldest.loras == s.held || s.passed >= GROUP {
            return Some(0);
        }
        Some(s.waiting.iter().position(|j| j.loras == s.held).unwrap_or(0))
    }

    fn finished(&self) {
        self.lock().running = None;
    }

    fn stop_now(&self) -> bool {
        self.lock().stop_now
    }

    /// Mark the engine loaded with its joint-token budget.
    pub fn set_ready(&self, joint_tokens: usize) {
        let mut s = self.lock();
        s.ready = true;
        s.joint_tokens = joint_tokens;
    }
}

/// One picture's steps: events to the client, counts to the metrics, the stop question.
struct JobProgress<'a> {
    q: &'a Queue,
    job: &'a Job,
    index: usize,
    last: Instant,
    /// Partial images sent for this picture.
    partials: usize,
}

impl Progress for JobProgress<'_> {
    fn step(&mut self, done: usize, total: usize) {
        let dt = self.last.elapsed().as_secs_f64();
        self.last = Instant::now();
        self.q.metrics.with(|c| {
            c.steps += 1;
            c.step_seconds += dt;
        });
        let _ = self.job.tx.send(Event::Step { index: self.index, step: done, steps: total });
    }
    fn warn(&mut self, msg: &str) {
        super::log(&format!("request {}: warning: {msg}", self.job.id));
    }
    fn cancelled(&self) -> bool {
        self.job.cancel.load(Ordering::SeqCst) || self.q.stop_now()
    }
    fn preview_wanted(&self, done: usize, total: usize) -> bool {
        crate::pipeline::partial_image_steps(total, self.job.gen.partial_images).contains(&done)
    }
    fn preview(&mut self, done: usize, total: usize, rgb: &[u8], width: u32, height: u32) -> anyhow::Result<()> {
        let name = format!("partial.{}", self.job.gen.format);
        let png = crate::pipeline::preview_bytes(std::path::Path::new(&name), rgb, width, height, done, total)?;
        let _ = self.job.tx.send(Event::Partial { index: self.index, partial: self.partials, step: done, steps: total, png });
        self.partials += 1;
        Ok(())
    }
}

/// Run jobs until the queue drains. Owns the engine.
pub fn work(q: &Queue, engine: &mut dyn Render) {
    while let Some(job) = q.next() {
        run_job(q, engine, &job);
        q.finished();
    }
}

fn run_job(q: &Queue, engine: &mut dyn Render, job: &Job) {
    let g = &job.gen;
    let queued_s = job.enqueued.elapsed().as_secs_f64();
    let switch = match engine.use_loras(&job.loras) {
        Ok(s) => s,
        Err(e) => {
            q.metrics.with(|c| c.pictures_failed += g.n as u64);
            super::log(&format!("request {}: LoRA set {} could not be merged: {e:#}", job.id, job.loras.line()));
            let _ = job.tx.send(Event::Failed(ApiError::internal(format!("the LoRA set could not be merged: {e:#}"))));
            return;
        }
    };
    if let Some(sw) = &switch {
        q.metrics.with(|c| {
            c.lora_switches += 1;
            c.lora_switch_seconds += sw.seconds;
        });
        let r = sw.reloaded;
        super::log(&format!(
            "request {}: LoRA set {} in {:.3} s (merges {}; reloaded {} resident blocks, {} other weights, {} streamed blocks)",
            job.id,
            job.loras.line(),
            sw.seconds,
            sw.merge.line(),
            r.blocks,
            r.parts,
            r.streamed
        ));
    }
    for i in 0..g.n as usize {
        if job.cancel.load(Ordering::SeqCst) {
            return;
        }
        let seed = g.req.spec.seed.wrapping_add(i as u64);
        let mut req = g.req.clone();
        req.spec.seed = seed;
        let mut progress = JobProgress { q, job, index: i, last: Instant::now(), partials: 0 };
        // A panic in the engine fails this request alone (500); the worker goes on.
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.render(&req, &job.tokens, &mut progress))).unwrap_or_else(|p| {
            let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
            Err(anyhow::anyhow!("internal error: {}", what.unwrap_or_else(|| "a panic".into())))
        });
        match res {
            Ok(mut picture) => {
                if i == 0 {
                    picture.lora_switch_s = switch.map_or(0.0, |s| s.seconds);
                }
                q.metrics.with(|c| {
                    c.pictures += 1;
                    c.picture_seconds += picture.total_s;
                    c.overhead_seconds += picture.encode_s + picture.decode_s;
                });
                let _ = job.tx.send(Event::Image { index: i, seed, picture, queued_s });
            }
            Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                q.metrics.with(|c| c.pictures_cancelled += 1);
                let why = if job.cancel.load(Ordering::SeqCst) { "the client went away" } else { "shutdown" };
                super::log(&format!("request {}: picture {} of {} (seed {seed}) stopped between steps: {why}", job.id, i + 1, g.n));
                let _ = job.tx.send(Event::Failed(ApiError::unavailable("stopped: the server is shutting down")));
                return;
            }
            Err(e) => {
                q.metrics.with(|c| c.pictures_failed += 1);
                super::log(&format!("request {}: picture {} (seed {seed}) failed: {e:#}", job.id, i + 1));
                let _ = job.tx.send(Event::Failed(ApiError::internal(format!("picture {} (seed {seed}) failed: {e:#}", i + 1))));
                return;
            }
        }
    }
    let _ = job.tx.send(Event::Done);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::api::{base_request, Generation};

    /// Job `id` (its seed too) of `n` pictures.
    fn job(id: u64, n: u32, steps: u32) -> (Arc<Job>, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut req = base_request(vec![], (0.0, 1.0), 4096, crate::options::Precision::Bf16);
        (req.spec.steps, req.spec.seed) = (steps, id);
        let gen = Generation { req, n, stream: false, format: "png", partial_images: 0 };
        (Arc::new(Job { id, gen, tokens: vec![], tx, cancel: Default::default(), enqueued: Instant::now(), loras: LoraSet::default() }), rx)
    }

    #[test]
    fn loading_full_cancel_and_drain() {
        let q = Queue::new(2);
        let (a, _ra) = job(1, 1, 10);
        let e = q.push(a.clone()).unwrap_err();
        assert_eq!((e.status.as_u16(), e.retry_after.is_some()), (503, true), "loading: {e:?}");
        q.set_ready(usize::MAX);
        assert_eq!(q.push(a.clone()).unwrap(), 0);
        let (b, mut rb) = job(2, 3, 10);
        assert_eq!(q.push(b.clone()).unwrap(), 1);
        let (c, _rc) = job(3, 1, 10);
        let e = q.push(c).unwrap_err();
        // Nothing measured yet: 1 s a picture, 1 + 3 pictures queued.
        assert_eq!((e.status.as_u16(), e.retry_after), (429, Some(4)), "{e:?}");
        // Measured: 0.5 s a step and 1 s of encode + decode a picture: (10 * 0.5 + 1) * 4 = 24 s.
        q.metrics.with(|c| {
            c.steps = 10;
            c.step_seconds = 5.0;
            c.pictures = 1;
            c.overhead_seconds = 1.0;
        });
        let (c, _rc) = job(4, 1, 10);
        assert_eq!(q.push(c).unwrap_err().retry_after, Some(24));
        // The worker takes the first; the second moves up and is told so.
        assert_eq!(q.next().unwrap().id, 1);
        assert!(matches!(rb.try_recv(), Ok(Event::Queued { ahead: 1 })));
        assert!(q.cancel(&b), "a waiting job leaves the queue");
        assert!(!q.cancel(&a), "the running one is only flagged");
        assert!(a.cancel.load(Ordering::SeqCst));
        let (d, mut rd) = job(5, 1, 10);
        q.push(d).unwrap();
        assert_eq!(q.drain(false), (1, Some(1)));
        assert!(matches!(rd.try_recv(), Ok(Event::Failed(e)) if e.status.as_u16() == 503));
        assert!(q.next().is_none(), "draining: the worker stops");
        let (e, _re) = job(6, 1, 10);
        assert_eq!(q.push(e).unwrap_err().status.as_u16(), 503);
    }

    /// Requests of the held LoRA set go first, at most GROUP in a row ahead of the oldest.
    #[test]
    fn equal_lora_sets_run_together_without_starving_the_oldest() {
        let q = Queue::new(16);
        q.set_ready(usize::MAX);
        let x = LoraSet::named(&["x"]);
        let sets = [&x, &LoraSet::default(), &LoraSet::default(), &LoraSet::default(), &LoraSet::default(), &LoraSet::default(), &x];
        let mut rx = vec![];
        for (i, set) in sets.iter().enumerate() {
            let (j, r) = job(i as u64 + 1, 1, 1);
            let mut j = Arc::into_inner(j).unwrap();
            j.loras = (*set).clone();
            q.push(Arc::new(j)).unwrap();
            rx.push(r);
        }
        let order: Vec<u64> = (0..sets.len()).map(|_| q.next().unwrap().id).collect();
        assert_eq!(GROUP, 4);
        // Held: none. 1 (x) is oldest: 2..5 (none) pass it, then it runs; x is held: 7 passes 6.
        assert_eq!(order, [2, 3, 4, 5, 1, 7, 6]);
        assert!(LoraSet::named(&["x"]) == x && LoraSet::named(&["x", "y"]) != x);
    }

    /// Seed 1 fails, seed 2 panics, others render 3 steps (asking to stop after each).
    struct Fake;
    impl Render for Fake {
        fn render(&mut self, req: &crate::pipeline::Request, _t: &[Vec<u32>], p: &mut dyn Progress) -> anyhow::Result<Picture> {
            match req.spec.seed {
                1 => anyhow::bail!("out of memory"),
                2 => panic!("a bug"),
                _ => {}
            }
            for i in 1..=3 {
                p.step(i, 3);
                if p.cancelled() {
                    return Err(Interrupted.into());
                }
            }
            Ok(Picture { bytes: req.spec.seed.to_le_bytes().to_vec(), ..Default::default() })
        }
        fn max_joint_tokens(&self) -> usize {
            usize::MAX
        }
        fn use_loras(&mut self, _set: &LoraSet) -> anyhow::Result<Option<crate::serve::engine::LoraSwitch>> {
            Ok(None)
        }
    }

    fn last(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> Vec<Event> {
        let mut v = vec![];
        while let Some(e) = rx.blocking_recv() {
            let end = matches!(e, Event::Done | Event::Failed(_));
            v.push(e);
            if end {
                break;
            }
        }
        v
    }

    #[test]
    fn a_failing_picture_fails_its_request_alone() {
        let q = Arc::new(Queue::new(8));
        q.set_ready(usize::MAX);
        let worker = {
            let q = q.clone();
            std::thread::spawn(move || work(&q, &mut Fake))
        };
        for (seed, want) in [(1u64, 500u16), (2, 500), (7, 200)] {
            let (j, mut rx) = job(seed, 2, 3);
            q.push(j).unwrap();
            let ev = last(&mut rx);
            match (ev.last().unwrap(), want) {
                (Event::Failed(e), 500) => assert_eq!(e.status.as_u16(), 500, "{e:?}"),
                (Event::Done, 200) => {
                    let seeds: Vec<u64> = ev.iter().filter_map(|e| if let Event::Image { seed, .. } = e { Some(*seed) } else { None }).collect();
                    assert_eq!(seeds, [7, 8], "n = 2: seed, seed + 1");
                    let steps = ev.iter().filter(|e| matches!(e, Event::Step { .. })).count();
                    assert_eq!(steps, 6);
                }
                (e, _) => panic!("seed {seed}: {e:?}"),
            }
        }
        assert_eq!(q.metrics.snapshot().pictures_failed, 2);
        q.drain(false);
        worker.join().unwrap();
    }
}
