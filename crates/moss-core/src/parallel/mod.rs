//! One picture over several ranks (GPUs, or CPU threads in tests and CI).
//!
//! - **CFG-parallel**: a guided step's two transformer passes run on two groups of ranks, the
//!   prompt's on group 0 and the negative's on group 1 (its skipped blocks skipped there); the
//!   two velocities are exchanged over the CFG pair ([`exchange`]) and every rank combines them
//!   with the same kernel, so every rank holds the same latents, byte for byte those of one rank.
//! - **Ulysses sequence parallelism** ([`ulysses`]): within a group, each rank holds a contiguous
//!   slice of the joint stream's tokens; around attention an all-to-all turns the slices of q, k, v
//!   into whole sequences of `H/P` heads, attention runs on them, and an all-to-all turns its output
//!   back into the rank's rows. Every other op of the DiT works row by row.
//!
//! The collectives go through a [`Transport`]: [`host::HostTransport`] (threads of one process,
//! std channels; what CI runs) or the CUDA backend's NCCL transport. The loop itself runs on
//! every rank, the same sampler, noise and updates; only the transformer's passes are split.

use crate::backend::Backend;
use anyhow::{bail, ensure, Result};
use std::sync::{Arc, Condvar, Mutex};

pub mod host;
pub mod ulysses;

#[cfg(test)]
mod tests;

/// The collectives between the ranks of one group. Tensors keep their backend's dtype; every rank
/// knows every rank's shapes (they follow from the picture), so a receive needs no size message.
/// A collective is called by every rank of the group, in the same order.
pub trait Transport<B: Backend>: Send {
    /// This rank's index in the group (`0..ranks()`).
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;
    /// Every rank's `x`, in rank order (this rank's own included); `shapes[r]` is rank `r`'s.
    fn all_gather(&self, b: &B, x: &B::T, shapes: &[Vec<usize>]) -> Result<Vec<B::T>>;
    /// `parts[r]` goes to rank `r`; returns what each rank sent this one, in rank order
    /// (`shapes[r]`: the shape of the part rank `r` sends here).
    fn all_to_all(&self, b: &B, parts: Vec<B::T>, shapes: &[Vec<usize>]) -> Result<Vec<B::T>>;
    /// Stop every collective of the group, now and later, with an error (a rank failed: its
    /// peers must not wait for it).
    fn abort(&self);
}

/// The error of a collective or vote that stopped because a peer failed or went away: the peer's
/// own error is the one to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerFailed;

impl std::fmt::Display for PeerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "another rank failed")
    }
}

impl std::error::Error for PeerFailed {}

/// Whether `e` only says that a peer failed ([`PeerFailed`]).
pub fn is_echo(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<PeerFailed>())
}

/// How a picture's passes spread over the ranks: `groups` CFG groups (2: the prompt's pass and the
/// negative's apart; 1: both passes on every rank in turn) of `seq` ranks each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    pub groups: usize,
    pub seq: usize,
}

impl Layout {
    /// A guided picture on `ranks` ranks of a transformer with `heads` heads: an even count is two
    /// CFG groups of `ranks/2`, an odd one a single group; Ulysses splits the heads, so the group
    /// size must divide them.
    pub fn guided(ranks: usize, heads: usize) -> Result<Layout> {
        ensure!(ranks >= 1, "no ranks");
        let l = if ranks.is_multiple_of(2) { Layout { groups: 2, seq: ranks / 2 } } else { Layout { groups: 1, seq: ranks } };
        if !heads.is_multiple_of(l.seq) {
            bail!(
                "{ranks} devices split each pass over {} devices by attention heads (Ulysses), and the transformer's {heads} head(s) do not divide by {}",
                l.seq,
                l.seq
            );
        }
        Ok(l)
    }

    /// A picture with guidance exactly 1 (one pass a step): over all ranks where they divide the
    /// heads, else the guided layout with both groups running the prompt's pass.
    pub fn unguided(ranks: usize, heads: usize) -> Result<Layout> {
        match heads % ranks {
            0 => Ok(Layout { groups: 1, seq: ranks }),
            _ => Self::guided(ranks, heads),
        }
    }
}

/// The transport groups of `ranks` ranks, each a list of members in group-rank order: the world,
/// and with an even count the two halves (CFG group `g` is ranks `g·R/2 .. (g+1)·R/2`) and the
/// `R/2` CFG pairs (`s` and `R/2 + s`).
pub fn groups(ranks: usize) -> Vec<Vec<usize>> {
    let mut g = vec![(0..ranks).collect::<Vec<_>>()];
    if ranks.is_multiple_of(2) && ranks > 1 {
        let half = ranks / 2;
        g.extend((0..2).map(|h| (h * half..(h + 1) * half).collect()));
        g.extend((0..half).map(|s| vec![s, half + s]));
    }
    g
}

/// One rank's endpoints: its transports (one per group of [`groups`] it is in) and the crew's
/// step vote.
pub struct Endpoints<B: Backend> {
    pub rank: usize,
    pub ranks: usize,
    /// Every rank.
    world: Box<dyn Transport<B>>,
    /// This rank's CFG group (even counts).
    half: Option<Box<dyn Transport<B>>>,
    /// This rank and its peer in the other CFG group (even counts).
    pair: Option<Box<dyn Transport<B>>>,
    pub crew: Arc<Crew>,
}

/// What one rank does in a picture: its CFG group (0: the prompt's pass) of `groups`, the
/// transport of the CFG pair (two groups) and of its sequence group (`None`: one rank a pass).
pub struct Role<'a, B: Backend> {
    pub group: usize,
    pub groups: usize,
    pub cfg: Option<&'a dyn Transport<B>>,
    pub seq: Option<&'a dyn Transport<B>>,
}

impl<B: Backend> Endpoints<B> {
    /// Every rank's endpoints from `make`, which gives one transport per member of a group (in
    /// the group's order) for each group of [`groups`].
    pub fn make_all(ranks: usize, mut make: impl FnMut(&[usize]) -> Result<Vec<Box<dyn Transport<B>>>>) -> Result<Vec<Endpoints<B>>> {
        ensure!(ranks >= 2, "parallel ranks need at least two ranks");
        let crew = Arc::new(Crew::new(ranks));
        let mut slots: Vec<Vec<Option<Box<dyn Transport<B>>>>> = (0..ranks).map(|_| Vec::new()).collect();
        for members in groups(ranks) {
            let ts = make(&members)?;
            ensure!(ts.len() == members.len(), "a transport group of {} made {} endpoints", members.len(), ts.len());
            for (&m, t) in members.iter().zip(ts) {
                slots[m].push(Some(t));
            }
        }
        Ok(slots
            .into_iter()
            .enumerate()
            .map(|(rank, mut s)| {
                let mut take = |i: usize| s.get_mut(i).and_then(Option::take);
                let (world, half, pair) = (take(0), take(1), take(2));
                Endpoints { rank, ranks, world: world.expect("every rank is in the world"), half, pair, crew: crew.clone() }
            })
            .collect())
    }

    /// This rank's role in a picture laid out as `layout`.
    pub fn role(&self, layout: Layout) -> Role<'_, B> {
        match layout.groups {
            2 => Role { group: self.rank / layout.seq, groups: 2, cfg: self.pair.as_deref(), seq: if layout.seq > 1 { self.half.as_deref() } else { None } },
            _ => Role { group: 0, groups: 1, cfg: None, seq: Some(self.world.as_ref()) },
        }
    }

    /// Abort every transport of this rank and the crew: its peers stop waiting for it.
    pub fn abort(&self) {
        self.crew.fail();
        for t in [Some(&self.world), self.half.as_ref(), self.pair.as_ref()].into_iter().flatten() {
            t.abort();
        }
    }
}

/// CFG-parallel's exchange over the pair: group 0 computed the prompt's velocity, group 1 the
/// negative's; every rank of the pair gets both, `(v_c, v_u)`, as bytes.
pub fn exchange<B: Backend>(b: &B, cfg: &dyn Transport<B>, mine: &B::T) -> Result<(B::T, B::T)> {
    let shape = b.dims(mine);
    let mut v = cfg.all_gather(b, mine, &[shape.clone(), shape])?;
    ensure!(v.len() == 2, "the CFG pair gave {} velocities", v.len());
    let v_u = v.pop().expect("two");
    Ok((v.pop().expect("two"), v_u))
}

/// The ranks' vote after each step, on the host: all stop at the same step when any asks (the
/// first rank's progress says the picture is cancelled), and a failed rank wakes the others.
pub struct Crew {
    ranks: usize,
    state: Mutex<Round>,
    turn: Condvar,
}

#[derive(Default)]
struct Round {
    arrived: usize,
    number: u64,
    stop: bool,
    decided: bool,
    failed: bool,
}

impl Crew {
    pub fn new(ranks: usize) -> Crew {
        Crew { ranks, state: Mutex::new(Round::default()), turn: Condvar::new() }
    }

    /// Whether any rank wants to stop after this step: called by every rank once a step; all get
    /// the same answer. An error once a rank failed.
    pub fn any_stop(&self, stop: bool) -> Result<bool> {
        let mut r = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if r.failed {
            return Err(PeerFailed.into());
        }
        r.stop |= stop;
        r.arrived += 1;
        if r.arrived == self.ranks {
            (r.decided, r.stop, r.arrived) = (r.stop, false, 0);
            r.number += 1;
            self.turn.notify_all();
            return Ok(r.decided);
        }
        let number = r.number;
        while r.number == number && !r.failed {
            r = self.turn.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        if r.failed {
            return Err(PeerFailed.into());
        }
        Ok(r.decided)
    }

    /// A rank failed: every vote, now and later, is an error.
    pub fn fail(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).failed = true;
        self.turn.notify_all();
    }

    pub fn failed(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).failed
    }
}
