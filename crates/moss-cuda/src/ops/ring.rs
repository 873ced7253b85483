//! A pinned ring for runs of small host-to-device uploads (the LoRA merge's factors, tensor after
//! tensor): the host writes each upload into the next free bytes of the ring (converting as it
//! writes, if need be) and the copies go on the compute stream; the host waits only when the ring
//! wraps onto bytes whose copies have not finished. The staging chunks of `write_bytes` instead
//! reuse one buffer per upload, so each upload there waits for the device to reach the previous.

use super::{de, Cuda};
use anyhow::{ensure, Result};
use cudarc::driver::{result as dr, CudaContext, CudaEvent, PinnedHostSlice};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Bytes of the ring: with rank-64 factors of the DiT's largest weight (2.5 MB in bf16), the host
/// runs about a dozen tensors ahead of the device.
pub const RING_BYTES: usize = 32 << 20;
/// The most one reservation takes.
pub const RING_MAX: usize = RING_BYTES / 2;
/// Alignment of a reservation in the ring.
const RING_ALIGN: usize = 256;

pub(crate) struct Ring {
    mem: PinnedHostSlice<u8>,
    base: *mut u8,
    /// The next free byte.
    head: usize,
    /// Reserved regions whose copies are issued, oldest first, with the event after the copies.
    busy: VecDeque<(usize, usize, CudaEvent)>,
}

// SAFETY: `base` points into `mem`, which this struct owns; it is used under the backend's Mutex.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // The pinned memory must outlive the copies reading it.
        for (_, _, e) in &self.busy {
            let _ = e.synchronize();
        }
        let _ = &self.mem;
    }
}

/// A reserved region of the ring: `len` bytes at `off`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    pub off: usize,
    pub len: usize,
}

impl Ring {
    fn new(ctx: &Arc<CudaContext>) -> Result<Ring> {
        // SAFETY: pinned host memory, written before any copy reads it.
        let mut mem = unsafe { ctx.alloc_pinned::<u8>(RING_BYTES) }.map_err(de("pinned alloc"))?;
        let base = mem.as_mut_ptr().map_err(de("pinned"))?;
        Ok(Ring { mem, base, head: 0, busy: VecDeque::new() })
    }

    /// `len` bytes (at most [`RING_MAX`]) no copy is reading any more, and the seconds spent
    /// waiting for the device to finish copies out of them.
    pub(crate) fn reserve(&mut self, len: usize) -> Result<(Region, f64)> {
        ensure!(len <= RING_MAX, "ring reservation of {len} bytes (at most {RING_MAX})");
        let (off, end) = next_region(self.head, len);
        let t = Instant::now();
        let mut waited = false;
        while let Some(i) = self.busy.iter().position(|&(s, e, _)| s < end && off < e) {
            let (_, _, ev) = self.busy.remove(i).expect("the position found");
            ev.synchronize().map_err(de("ring wait (a kernel failed?)"))?;
            waited = true;
        }
        self.head = end;
        Ok((Region { off, len }, if waited { t.elapsed().as_secs_f64() } else { 0.0 }))
    }

    /// The bytes of `r` (only the host writes them until [`Ring::copy`] is issued).
    pub(crate) fn bytes(&mut self, r: Region, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= r.len && r.off + r.len <= RING_BYTES, "ring bytes {at}+{len} of {r:?}");
        // SAFETY: inside the pinned buffer; `reserve` waited for every copy out of these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(r.off + at), len) }
    }

    /// Copy `len` bytes at `at` of `r` to device address `dst`, on the compute stream of `cu`.
    pub(crate) fn copy(&self, cu: &Cuda, r: Region, at: usize, len: usize, dst: u64) -> Result<()> {
        ensure!(at + len <= r.len, "ring copy {at}+{len} of {r:?}");
        let s = &cu.inner.gpu.stream;
        // SAFETY: pinned bytes written by the host; `issued` keeps them from being rewritten
        // before the copy has finished; dst holds `len` bytes.
        unsafe {
            let src = std::slice::from_raw_parts(self.base.add(r.off + at) as *const u8, len);
            dr::memcpy_htod_async(dst, src, s.cu_stream()).map_err(de("host to device copy"))
        }
    }

    /// The copies out of `r` are issued: its bytes are free once the compute stream is past them.
    pub(crate) fn issued(&mut self, cu: &Cuda, r: Region) -> Result<()> {
        let ev = cu.inner.gpu.stream.record_event(None).map_err(de("event record"))?;
        let end = r.off + r.len.next_multiple_of(RING_ALIGN);
        self.busy.push_back((r.off, end, ev));
        Ok(())
    }
}

/// Where a reservation of `len` bytes starts when the ring's next free byte is `head`: there, or
/// at 0 when it would run past the end; and where it ends (aligned).
fn next_region(head: usize, len: usize) -> (usize, usize) {
    let len = len.next_multiple_of(RING_ALIGN).max(RING_ALIGN);
    let off = if head + len > RING_BYTES { 0 } else { head };
    (off, off + len)
}

impl Cuda {
    /// The upload ring (allocated on first use; let go by `release_cached`).
    pub(crate) fn ring(&self) -> Result<std::sync::MutexGuard<'_, Option<Ring>>> {
        let mut g = self.inner.transfers.ring.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            self.inner.gpu.ctx.bind_to_thread().map_err(de("bind context"))?;
            *g = Some(Ring::new(&self.inner.gpu.ctx)?);
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reservations follow one another, aligned, and wrap to the start when the rest of the ring
    /// would not hold one.
    #[test]
    fn regions_follow_and_wrap() {
        assert_eq!(next_region(0, 100), (0, 256));
        assert_eq!(next_region(256, 256), (256, 512));
        assert_eq!(next_region(RING_BYTES - 256, 256), (RING_BYTES - 256, RING_BYTES));
        assert_eq!(next_region(RING_BYTES - 256, 257), (0, 512));
        assert_eq!(next_region(RING_BYTES, 1), (0, 256));
        assert_eq!(next_region(0, 0), (0, 256));
        let mut head = 0;
        for len in [RING_MAX, 1000, RING_MAX, RING_MAX - 5, 3 << 20, RING_MAX, 1, RING_MAX] {
            let (off, end) = next_region(head, len);
            assert!(off % 256 == 0 && end <= RING_BYTES && end - off >= len, "{len} at {off}..{end}");
            assert!(off == head || off == 0, "{len}: neither at the head {head} nor wrapped");
            head = end;
        }
    }
}
