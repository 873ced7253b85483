//! The host transport: the ranks are threads of one process and a backend whose tensors are host
//! [`Tensor`]s (the CPU backend); every pair of ranks has a channel each way (std `mpsc`), so a
//! collective is "send to every peer, then receive from every peer in rank order" and never
//! deadlocks (sends do not block). What CI runs the rank logic over.

use super::{PeerFailed, Transport};
use crate::backend::Backend;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// One rank's end of a group.
pub struct HostTransport {
    rank: usize,
    /// `to[r]`: the channel to rank `r` (`None` for this rank).
    to: Vec<Option<Sender<Tensor>>>,
    /// `from[r]`: the channel from rank `r` (`None` for this rank).
    from: Vec<Option<Receiver<Tensor>>>,
    /// Set by [`Transport::abort`] of any member: every receive then fails.
    aborted: Arc<AtomicBool>,
}

/// How often a waiting receive looks at the group's abort flag.
const POLL: Duration = Duration::from_millis(20);

impl HostTransport {
    /// A group of `n` ranks: endpoint `r` for rank `r`.
    pub fn group(n: usize) -> Vec<HostTransport> {
        let aborted = Arc::new(AtomicBool::new(false));
        let mut to: Vec<Vec<Option<Sender<Tensor>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut from: Vec<Vec<Option<Receiver<Tensor>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for s in 0..n {
            for r in (0..n).filter(|&r| r != s) {
                let (tx, rx) = channel();
                to[s][r] = Some(tx);
                from[r][s] = Some(rx);
            }
        }
        to.into_iter().zip(from).enumerate().map(|(rank, (to, from))| HostTransport { rank, to, from, aborted: aborted.clone() }).collect()
    }

    fn send(&self, peer: usize, t: Tensor) -> Result<()> {
        let tx = self.to[peer].as_ref().expect("a peer, not this rank");
        tx.send(t).map_err(|_| anyhow::Error::new(PeerFailed).context(format!("rank {peer} stopped")))
    }

    fn recv(&self, peer: usize, shape: &[usize]) -> Result<Tensor> {
        let rx = self.from[peer].as_ref().expect("a peer, not this rank");
        let t = loop {
            if self.aborted.load(Ordering::Relaxed) {
                return Err(PeerFailed.into());
            }
            match rx.recv_timeout(POLL) {
                Ok(t) => break t,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err(anyhow::Error::new(PeerFailed).context(format!("rank {peer} stopped"))),
            }
        };
        ensure!(t.shape == shape, "rank {peer} sent {:?} where {shape:?} was expected", t.shape);
        Ok(t)
    }
}

impl<B: Backend<T = Tensor>> Transport<B> for HostTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn ranks(&self) -> usize {
        self.to.len()
    }
    fn all_gather(&self, _b: &B, x: &Tensor, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>> {
        let n = self.to.len();
        ensure!(shapes.len() == n && x.shape == shapes[self.rank], "all_gather of {:?} with shapes {shapes:?} on rank {}", x.shape, self.rank);
        for peer in (0..n).filter(|&p| p != self.rank) {
            self.send(peer, x.clone())?;
        }
        (0..n).map(|p| if p == self.rank { Ok(x.clone()) } else { self.recv(p, &shapes[p]) }).collect()
    }
    fn all_to_all(&self, _b: &B, parts: Vec<Tensor>, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>> {
        let n = self.to.len();
        ensure!(parts.len() == n && shapes.len() == n, "all_to_all of {} parts, {} shapes, over {n} ranks", parts.len(), shapes.len());
        let mut own = None;
        for (peer, p) in parts.into_iter().enumerate() {
            if peer == self.rank {
                ensure!(p.shape == shapes[peer], "all_to_all: this rank's own part is {:?}, not {:?}", p.shape, shapes[peer]);
                own = Some(p);
            } else {
                self.send(peer, p)?;
            }
        }
        (0..n).map(|p| if p == self.rank { Ok(own.take().expect("one own part")) } else { self.recv(p, &shapes[p]) }).collect()
    }
    fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
    }
}

/// Host transports for [`super::Endpoints::make_all`]: a [`HostTransport::group`] per group.
pub fn make<B: Backend<T = Tensor>>(members: &[usize]) -> Result<Vec<Box<dyn Transport<B>>>> {
    Ok(HostTransport::group(members.len()).into_iter().map(|t| Box::new(t) as Box<dyn Transport<B>>).collect())
}
