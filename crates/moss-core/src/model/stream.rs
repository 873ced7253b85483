//! The weight provider of a network whose repeated layers do not all stay resident: a layer that
//! streams is fetched from the checkpoint (kept open: a file mapping) when a forward needs it,
//! through [`Backend::fetch`] into one of `PREFETCH + 1` reused slots, up to [`PREFETCH`] layers
//! ahead of the one computing, so the copies run behind the compute of the layers before. The
//! DiT's blocks and the text encoder's layers both go through it; the model code asks for a
//! layer's weights ([`weights`]) and hands them back when its compute is enqueued
//! ([`Fetched::done`]).

use crate::backend::{Backend, Behind};
use crate::checkpoint::Component;
use crate::plan::PREFETCH;
use anyhow::{anyhow, bail, Result};
use std::collections::VecDeque;
use std::sync::Mutex;

/// The slots fetches cycle through: the layer computing and the ones in flight.
const SLOTS: usize = PREFETCH as usize + 1;

/// A fetch in flight: the tensors once the copies land, and the slot they land in.
type Fetch<B> = (Behind<Vec<<B as Backend>::T>>, usize);

/// The streamed layers' source and the fetches in flight.
pub struct Streamer<B: Backend> {
    /// Declared first, so dropped first: a fetch still reading finishes before `source` unmaps.
    queue: Mutex<Queue<B>>,
    source: Component,
    /// Per layer: the checkpoint tensors a fetch stacks into each of its tensors (each a dim-0
    /// stack of its names, as [`Backend::load_rows`]); `None`: the layer is resident.
    names: Vec<Option<Vec<Vec<String>>>>,
}

struct Queue<B: Backend> {
    /// (layer, fetch), in the order the layers will be used.
    in_flight: VecDeque<(usize, Fetch<B>)>,
    next_slot: usize,
}

/// A layer's weights as the provider hands them out: resident, or fetched for this use.
pub enum Fetched<'a, R> {
    Resident(&'a R),
    /// The weights and the slot they were fetched into.
    Streamed(R, usize),
}

impl<R> std::ops::Deref for Fetched<'_, R> {
    type Target = R;
    fn deref(&self) -> &R {
        match self {
            Fetched::Resident(r) => r,
            Fetched::Streamed(r, _) => r,
        }
    }
}

impl<R> Fetched<'_, R> {
    /// The layer's compute is enqueued: a streamed layer's slot may be refilled once it is done.
    pub fn done<B: Backend>(self, b: &B) -> Result<()> {
        match self {
            Fetched::Resident(_) => Ok(()),
            Fetched::Streamed(r, slot) => {
                drop(r);
                b.free_slot(slot)
            }
        }
    }
}

/// A fetch's tensors as the `N` a layer's weights are made of.
pub fn parts<T, const N: usize>(m: Vec<T>) -> Result<[T; N]> {
    m.try_into().map_err(|m: Vec<T>| anyhow!("a layer's fetch gave {} tensors, not {N}", m.len()))
}

/// Layer `i`'s weights: `resident` ones as they are, else fetched through `stream` (ahead, or now)
/// and built by `build` from the fetched tensors once their copies are waited for.
pub fn weights<'a, B: Backend, R>(
    b: &B,
    stream: Option<&Streamer<B>>,
    i: usize,
    resident: Option<&'a R>,
    build: impl FnOnce(Vec<B::T>) -> Result<R>,
) -> Result<Fetched<'a, R>> {
    match (resident, stream) {
        (Some(r), _) => Ok(Fetched::Resident(r)),
        (None, Some(s)) => {
            let (fetched, slot) = s.take(b, i)?;
            Ok(Fetched::Streamed(build(fetched.ready()?)?, slot))
        }
        (None, None) => bail!("layer {i} is neither resident nor streamed"),
    }
}

impl<B: Backend> Streamer<B> {
    /// Layers whose `names` are given stream from `source`; `None` when every layer is resident.
    pub fn new(source: Component, names: Vec<Option<Vec<Vec<String>>>>) -> Option<Self> {
        if names.iter().all(Option::is_none) {
            return None;
        }
        Some(Streamer { queue: Mutex::new(Queue { in_flight: VecDeque::new(), next_slot: 0 }), source, names })
    }

    /// The checkpoint the layers stream from.
    pub fn source(&self) -> &Component {
        &self.source
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<B>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Layer `i`'s fetch: the one in flight, or one started now. Fetches queued before it (for
    /// layers this forward skips) are dropped, their slots reused.
    fn take(&self, b: &B, i: usize) -> Result<Fetch<B>> {
        let ahead = {
            let mut q = self.lock();
            while q.in_flight.front().is_some_and(|(k, _)| *k != i) {
                q.in_flight.pop_front();
            }
            q.in_flight.pop_front().map(|(_, f)| f)
        };
        match ahead {
            Some(f) => Ok(f),
            None => self.issue(b, i),
        }
    }

    /// Start fetching layer `i` into the next slot.
    fn issue(&self, b: &B, i: usize) -> Result<Fetch<B>> {
        let Some(names) = &self.names[i] else { bail!("layer {i} is resident, not streamed") };
        let slot = {
            let mut q = self.lock();
            let slot = q.next_slot;
            q.next_slot = (slot + 1) % SLOTS;
            slot
        };
        Ok((b.fetch(&self.source, slot, names)?, slot))
    }

    /// After a layer's compute is enqueued: fetch the next streamed layers of this forward
    /// (`rest`, in order), then those the next forward starts with, up to [`PREFETCH`] in flight.
    pub fn prefetch(&self, b: &B, rest: impl Iterator<Item = usize>) -> Result<()> {
        let streamed = |k: &usize| self.names[*k].is_some();
        let wrap = (0..self.names.len()).filter(streamed);
        for k in rest.filter(streamed).chain(wrap).take(PREFETCH as usize) {
            let queued = {
                let q = self.lock();
                if q.in_flight.len() >= PREFETCH as usize {
                    return Ok(());
                }
                q.in_flight.iter().any(|(j, _)| *j == k)
            };
            if !queued {
                let f = self.issue(b, k)?;
                self.lock().in_flight.push_back((k, f));
            }
        }
        Ok(())
    }

    /// Drop the fetches in flight (the stage is over: nothing holds slot memory past it).
    pub fn cancel(&self) {
        self.lock().in_flight.clear();
    }
}
