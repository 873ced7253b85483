//! The weight mover: host bytes (the checkpoint's file mapping) to device memory, as fast as the
//! host and the link allow. Several host threads copy the bytes into a bounded pool of pinned
//! buffers ([`POOL_BUFFERS`] x [`POOL_CHUNK`]), each part's pages first mapped in one
//! `MADV_POPULATE_READ` call ([`populate`]); the calling thread issues each filled buffer's
//! host-to-device copies on the mover's own copy stream (not the compute stream) as soon as it is
//! filled, and the buffer is refilled only after an event says its copies finished. A job returns
//! once every byte is read and every copy issued, with an event the compute stream can wait on:
//! the compute never waits on the host, only on that event (`cuStreamWaitEvent`).
//!
//! The chunking (which bytes share a buffer) is [`chunks`], pure and unit-tested.

use super::de;
use anyhow::{anyhow, Result};
use cudarc::driver::{result as dr, CudaContext, CudaEvent, CudaStream, PinnedHostSlice};
use std::collections::VecDeque;
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// Bytes of one pinned pool buffer: small enough that one streamed DiT block (~226 MB bf16)
/// spans ~14 buffers, so all the readers work on it at once (at 64 MiB it spanned 4, and 4
/// threads read it while the rest idled).
pub const POOL_CHUNK: usize = 16 << 20;
/// Pinned buffers in the pool: the pinned host memory a load holds is at most
/// `POOL_BUFFERS · POOL_CHUNK` (512 MiB), whatever the size of the weights.
pub const POOL_BUFFERS: usize = 32;
/// Host threads reading into the pool at most (an H200 host has 16 cores: two stay with the
/// thread issuing the copies and the one enqueuing compute).
pub const MAX_READERS: usize = 14;

/// One contiguous copy: `len` host bytes at `src` to device address `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub src: *const u8,
    pub len: usize,
    pub dst: u64,
}

// SAFETY: a piece (a part) names bytes of a read-only mapping that the job's caller keeps alive
// until the job returns; readers only read them.
unsafe impl Send for Piece {}
unsafe impl Sync for Piece {}
unsafe impl Send for Part {}
unsafe impl Sync for Part {}

/// A part of a piece placed in a pool buffer: bytes `src .. src + len` go to buffer offset `off`
/// and from there to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub src: *const u8,
    pub len: usize,
    pub off: usize,
    pub dst: u64,
}

/// `pieces` split and packed in order into chunks of at most `chunk` bytes each (a piece larger
/// than a chunk spans several; small pieces share one), every byte exactly once.
pub fn chunks(pieces: &[Piece], chunk: usize) -> Vec<Vec<Part>> {
    assert!(chunk > 0);
    let mut out: Vec<Vec<Part>> = vec![];
    let mut fill = chunk; // bytes used in the last chunk (full: start a new one)
    for p in pieces {
        let mut done = 0;
        while done < p.len {
            if fill == chunk {
                out.push(vec![]);
                fill = 0;
            }
            let n = (p.len - done).min(chunk - fill);
            // SAFETY: done + n <= p.len, inside the piece.
            let src = unsafe { p.src.add(done) };
            out.last_mut().unwrap().push(Part { src, len: n, off: fill, dst: p.dst + done as u64 });
            fill += n;
            done += n;
        }
    }
    out
}

/// One pinned buffer and the event recorded after the last copies out of it.
struct Buffer {
    mem: Option<(PinnedHostSlice<u8>, *mut u8)>,
    done: CudaEvent,
}

// SAFETY: the raw pointer is the pinned allocation this buffer owns; one thread uses a buffer at
// a time (it is taken from the free list and given back).
unsafe impl Send for Buffer {}

/// The mover of one device: its copy stream and pinned pool.
pub struct Mover {
    ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    /// Free buffers (allocated on first use, so a small load pins little).
    free: Mutex<VecDeque<Buffer>>,
    returned: Condvar,
    readers: usize,
}

/// What a finished job reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct Moved {
    pub bytes: usize,
    /// Host seconds until every byte was read and every copy issued.
    pub issue_s: f64,
}

impl Mover {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Mover> {
        let stream = ctx.new_stream().map_err(de("copy stream"))?;
        let free = (0..POOL_BUFFERS).map(|_| Ok(Buffer { mem: None, done: ctx.new_event(None).map_err(de("event"))? })).collect::<Result<VecDeque<_>>>()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // One core stays with the thread issuing the copies, one with the compute thread.
        let readers = cores.saturating_sub(2).clamp(1, MAX_READERS).min(POOL_BUFFERS - 1);
        Ok(Mover { ctx: ctx.clone(), stream, free: Mutex::new(free), returned: Condvar::new(), readers })
    }

    fn take_buffer(&self) -> Buffer {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(b) = free.pop_front() {
                return b;
            }
            free = self.returned.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn give_back(&self, b: Buffer) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push_back(b);
        self.returned.notify_one();
    }

    /// Copy `pieces` to the device on the copy stream, which first waits for `after` (an event
    /// of the compute stream: the destinations are free to overwrite from there on). Returns
    /// when every byte is read and every copy issued, with the event that completes when all
    /// have landed. The pieces' host bytes must stay valid until this returns.
    pub fn run(&self, pieces: &[Piece], after: Option<&CudaEvent>) -> Result<(CudaEvent, Moved)> {
        let t0 = std::time::Instant::now();
        self.ctx.bind_to_thread().map_err(de("bind context"))?;
        if let Some(e) = after {
            self.stream.wait(e).map_err(de("copy stream wait"))?;
        }
        let work = chunks(pieces, POOL_CHUNK);
        let bytes = pieces.iter().map(|p| p.len).sum();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let readers = self.readers.min(work.len());
        let (tx, rx) = mpsc::channel::<Result<(usize, Buffer)>>();
        let issued = std::thread::scope(|s| -> Result<()> {
            for _ in 0..readers {
                let (tx, work, next) = (tx.clone(), &work, &next);
                s.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= work.len() {
                        return;
                    }
                    let r = self.fill(&work[i]).map(|b| (i, b));
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                });
            }
            drop(tx);
            let mut first_err = None;
            for _ in 0..work.len() {
                let Ok(r) = rx.recv() else { break };
                match r.and_then(|(i, b)| self.issue(&work[i], b)) {
                    Ok(()) => {}
                    Err(e) => {
                        first_err.get_or_insert(e);
                        // Stop the readers: no chunk is handed out any more.
                        next.store(work.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(()),
            }
        });
        issued?;
        let done = self.ctx.new_event(None).map_err(de("event"))?;
        done.record(&self.stream).map_err(de("event record"))?;
        Ok((done, Moved { bytes, issue_s: t0.elapsed().as_secs_f64() }))
    }

    /// A free buffer (allocated now if it never was) filled with `parts`' bytes.
    fn fill(&self, parts: &[Part]) -> Result<Buffer> {
        let mut b = self.take_buffer();
        let filled = (|| -> Result<()> {
            // Its last copies must have finished before it is written again.
            b.done.synchronize().map_err(de("pool buffer wait"))?;
            if b.mem.is_none() {
                self.ctx.bind_to_thread().map_err(de("bind context"))?;
                // SAFETY: pinned host memory, written below before any copy reads it.
                let mut m = unsafe { self.ctx.alloc_pinned::<u8>(POOL_CHUNK) }.map_err(de("pinned alloc"))?;
                let p = m.as_mut_ptr().map_err(de("pinned"))?;
                b.mem = Some((m, p));
            }
            let dst = b.mem.as_ref().unwrap().1;
            for p in parts {
                populate(p.src, p.len);
                // SAFETY: p.off + p.len <= POOL_CHUNK (chunks); p.src..+len is mapped (the job's
                // caller keeps the mapping); the buffer is ours until given back.
                unsafe { std::ptr::copy_nonoverlapping(p.src, dst.add(p.off), p.len) };
            }
            Ok(())
        })();
        match filled {
            Ok(()) => Ok(b),
            Err(e) => {
                self.give_back(b);
                Err(e)
            }
        }
    }

    /// Issue the copies of a filled buffer on the copy stream, record its event, give it back.
    fn issue(&self, parts: &[Part], b: Buffer) -> Result<()> {
        let base = b.mem.as_ref().ok_or_else(|| anyhow!("mover: an unfilled buffer"))?.1;
        let r = (|| -> Result<()> {
            for p in parts {
                // SAFETY: the part lies inside the pinned buffer, which is not written again
                // before `done` (recorded below) completes; dst..+len is inside its allocation.
                unsafe {
                    let src = std::slice::from_raw_parts(base.add(p.off) as *const u8, p.len);
                    dr::memcpy_htod_async(p.dst, src, self.stream.cu_stream()).map_err(de("host to device copy"))?;
                }
            }
            b.done.record(&self.stream).map_err(de("event record"))
        })();
        self.give_back(b);
        r
    }
}

/// Map the pages of `len` bytes at `src` (a file mapping) before they are copied:
/// `MADV_POPULATE_READ` sets up the page tables of the whole range in one call, where the copy
/// would otherwise fault them in 64 KiB at a time (one exception and one mmap-lock round trip
/// each, from every reader at once). A hint: on a kernel without it (before 5.14) the copy faults
/// the pages in as before. (Reasoned, not measured on its own.)
fn populate(src: *const u8, len: usize) {
    const PAGE: usize = 4096;
    let start = src as usize & !(PAGE - 1);
    let end = src as usize + len;
    // SAFETY: the range lies in a live mapping (the job's caller keeps it); madvise only reads
    // the pages in, it changes no contents.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_READ) };
}

impl Drop for Mover {
    fn drop(&mut self) {
        // The pinned buffers must outlive the copies reading them.
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(bytes: &[u8], dst: u64) -> Piece {
        Piece { src: bytes.as_ptr(), len: bytes.len(), dst }
    }

    /// Replays the chunks on the host: every destination byte written once, with its source byte.
    fn replay(pieces: &[Piece], chunk: usize) -> Vec<u8> {
        let total: usize = pieces.iter().map(|p| p.dst as usize + p.len).max().unwrap_or(0);
        let mut dev = vec![0u8; total];
        let mut written = vec![0u8; total];
        for c in chunks(pieces, chunk) {
            let used: usize = c.iter().map(|p| p.len).sum();
            assert!(used <= chunk, "a chunk holds {used} > {chunk} bytes");
            let mut buf = vec![0u8; chunk];
            for p in &c {
                let src = unsafe { std::slice::from_raw_parts(p.src, p.len) };
                buf[p.off..p.off + p.len].copy_from_slice(src);
            }
            for p in &c {
                let d = p.dst as usize;
                dev[d..d + p.len].copy_from_slice(&buf[p.off..p.off + p.len]);
                written[d..d + p.len].iter_mut().for_each(|w| *w += 1);
            }
        }
        assert!(written.iter().all(|&w| w == 1), "a byte copied {:?} times", written.iter().find(|&&w| w != 1));
        dev
    }

    #[test]
    fn chunks_copy_every_byte_once_and_pack_small_pieces() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let b: Vec<u8> = (0..10u32).map(|i| (i + 100) as u8).collect();
        let c: Vec<u8> = (0..333u32).map(|i| (i * 3 + 1) as u8).collect();
        let pieces = [piece(&a, 0), piece(&b, 1000), piece(&c, 1010)];
        let want: Vec<u8> = a.iter().chain(&b).chain(&c).copied().collect();
        for chunk in [1, 7, 64, 1000, 1010, 4096] {
            assert_eq!(replay(&pieces, chunk), want, "chunk {chunk}");
        }
        // Small pieces share a chunk; a big one spans several.
        assert_eq!(chunks(&pieces, 4096).len(), 1);
        assert_eq!(chunks(&pieces, 100).len(), 14);
        assert!(chunks(&[], 64).is_empty());
    }

    #[test]
    fn chunks_can_fail_the_replay() {
        // The replay notices a byte copied to the wrong place (the check is not vacuous).
        let a = [1u8, 2, 3, 4];
        let mut parts = chunks(&[piece(&a, 0)], 2);
        parts[1][0].dst = 0;
        let mut dev = [0u8; 4];
        for c in &parts {
            for p in c {
                let src = unsafe { std::slice::from_raw_parts(p.src, p.len) };
                dev[p.dst as usize..p.dst as usize + p.len].copy_from_slice(src);
            }
        }
        assert_ne!(dev, a);
    }
}
