//! The split decode's kept pictures on CUDA ([`VaeOps::picture`](moss_core::backend::ops::VaeOps)):
//! in device memory, or in pinned host memory with their rows copied on two copy streams of
//! their own, so that copies overlap the convolutions on the compute stream.
//!
//! - A device picture is one f32 buffer; a strip's rows come out and go in with `copy2d`.
//! - A host picture is a pinned block (reused across pictures, [`SplitIo`]). Reading rows:
//!   the compute stream allocates the strip and records an event, the upload stream waits for
//!   it (and for the picture's last download), copies the rows (one 2-D copy, pitch H·W) and
//!   records its own event, which the compute stream waits for just before the strip is used.
//!   Rows asked for as `next` are fetched at once, so their copy runs beside the current
//!   strip's convolutions. Writing rows: the download stream waits for the compute stream, copies
//!   the strip's valid rows, and the strip stays alive until its copy is done (the compute
//!   stream waits for that copy before the strip's memory can be reused).
//! - Row partials of every picture stay on the device (`[groups, H, 2]` f64, written strip by
//!   strip with `copy2d`) and come to the host once per picture, when a GroupNorm needs them.
//!
//! Nothing here waits on the host except reading the row partials and dropping a host picture
//! (its pinned block goes back to the pool once no copy uses it).

use super::dims4;
use super::plan::copy2d_desc;
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{result as dr, sys, CudaEvent, CudaStream};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Strips on their way to a host picture that are kept alive at once (the oldest is let go,
/// after its copy, when another comes).
const DOWNLOADS_IN_FLIGHT: usize = 2;

/// One pinned host allocation (`cuMemHostAlloc`), freed on drop.
struct PinnedBlock {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the block is plain host memory owned by this value; the copies that use it are
// ordered by events and waited for before the block is reused or freed.
unsafe impl Send for PinnedBlock {}
unsafe impl Sync for PinnedBlock {}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc; no copy uses it any more (see SplitIo's drop).
        let _ = unsafe { dr::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// The copy streams of host pictures and the pinned blocks no picture holds (handed out again
/// to pictures of about their size).
pub struct SplitIo {
    up: Arc<CudaStream>,
    down: Arc<CudaStream>,
    free: Mutex<Vec<PinnedBlock>>,
}

impl Drop for SplitIo {
    fn drop(&mut self) {
        let _ = self.up.synchronize();
        let _ = self.down.synchronize();
    }
}

/// Where a picture's values are.
enum Place {
    Device(CudaTensor),
    Host(HostSide),
}

/// A host picture's pinned block and the copies in flight.
struct HostSide {
    io: Arc<SplitIo>,
    main: Arc<CudaStream>,
    block: Option<PinnedBlock>,
    /// Rows fetched ahead (`next`): their span, the strip, the copy's event.
    ahead: RefCell<Option<((usize, usize), CudaTensor, CudaEvent)>>,
    /// Strips being copied into the block, alive until their copy is done.
    downs: RefCell<VecDeque<(CudaTensor, CudaEvent)>>,
    /// The last copy into the block (reads of the block wait for it).
    last_down: Option<CudaEvent>,
}

impl HostSide {
    fn ptr(&self) -> *mut u8 {
        self.block.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr)
    }

    /// Let go of the strips on their way here, all but the last `keep`: each freed on the
    /// compute stream after its copy.
    fn release_downs(&self, keep: usize) -> Result<()> {
        let mut downs = self.downs.borrow_mut();
        while downs.len() > keep {
            let (t, e) = downs.pop_front().unwrap();
            self.main.wait(&e).map_err(|e| anyhow!("stream wait: {e:?}"))?;
            drop(t);
        }
        Ok(())
    }
}

impl Drop for HostSide {
    fn drop(&mut self) {
        // Strips still in flight are freed on the compute stream after their copies.
        if let Some((_, t, e)) = self.ahead.get_mut().take() {
            let _ = self.main.wait(&e);
            drop(t);
        }
        let _ = self.release_downs(0);
        // The block may be handed out again only when no copy reads or writes it.
        let _ = self.io.up.synchronize();
        let _ = self.io.down.synchronize();
        if let Some(b) = self.block.take() {
            self.io.free.lock().unwrap().push(b);
        }
    }
}

/// A kept picture `[1, C, H, W]` (fp32, channel planes of H·W, room for `cap` values) and its
/// row partials `[groups, H, 2]` (f64, as an f32 buffer of `groups·H·4` words) on the device.
pub struct CudaPicture {
    c: usize,
    h: usize,
    w: usize,
    cap: usize,
    groups: usize,
    stats: CudaTensor,
    place: Place,
}

impl Cuda {
    fn event(&self) -> Result<CudaEvent> {
        self.gpu().ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(|e| anyhow!("CUDA event: {e:?}"))
    }

    /// The split decode's copy streams and pinned pool ([`Cuda::vae_io`]), made on first use.
    fn split_io(&self) -> Result<Arc<SplitIo>> {
        let mut g = self.vae_io().lock().unwrap();
        if g.is_none() {
            let ctx = &self.gpu().ctx;
            let s = |what| ctx.new_stream().map_err(|e| anyhow!("CUDA {what} stream: {e:?}"));
            *g = Some(Arc::new(SplitIo { up: s("upload")?, down: s("download")?, free: Mutex::new(vec![]) }));
        }
        Ok(g.as_ref().unwrap().clone())
    }

    /// A pinned block of at least `bytes`: the smallest free one of `bytes` to twice that, else
    /// a new one. Pictures come in a few sizes (one per layer width and resolution), so a second
    /// decode of the same size pins nothing new; the pool goes with `release_cached`.
    fn pinned(&self, io: &SplitIo, bytes: usize) -> Result<PinnedBlock> {
        let mut free = io.free.lock().unwrap();
        let fits = |b: &PinnedBlock| b.bytes >= bytes && b.bytes <= 2 * bytes;
        if let Some(i) = (0..free.len()).filter(|&i| fits(&free[i])).min_by_key(|&i| free[i].bytes) {
            return Ok(free.swap_remove(i));
        }
        drop(free);
        self.gpu().ctx.bind_to_thread().map_err(|e| anyhow!("bind context: {e:?}"))?;
        // SAFETY: a plain pinned allocation; its contents are written before they are read.
        let ptr = unsafe { dr::malloc_host(bytes.max(16), 0) }
            .map_err(|e| anyhow!("the VAE's split decode could not pin {:.2} GiB of host memory for a picture: {e:?}", bytes as f64 / crate::ops::GIB))?;
        Ok(PinnedBlock { ptr: ptr as *mut u8, bytes })
    }

    /// [`VaeOps::picture`](moss_core::backend::ops::VaeOps::picture).
    pub(crate) fn picture_new(&self, c: usize, h: usize, w: usize, groups: usize, on_device: bool) -> Result<CudaPicture> {
        ensure!(groups > 0 && h > 0 && w > 0 && c > 0, "picture [{c}, {h}, {w}] in {groups} groups");
        let cap = c * h * w;
        let stats = self.alloc(DType::F32, &[groups * h * 4])?;
        let place = if on_device {
            Place::Device(self.alloc(DType::F32, &[cap])?)
        } else {
            let io = self.split_io()?;
            let block = self.pinned(&io, 4 * cap)?;
            let main = self.gpu().stream.clone();
            Place::Host(HostSide { io, main, block: Some(block), ahead: RefCell::new(None), downs: RefCell::new(VecDeque::new()), last_down: None })
        };
        Ok(CudaPicture { c, h, w, cap, groups, stats, place })
    }

    /// Start copying rows `y0..y1` of a host picture into a new strip on the upload stream; the
    /// event marks the copy done.
    fn fetch(&self, p: &CudaPicture, hs: &HostSide, y0: usize, y1: usize) -> Result<(CudaTensor, CudaEvent)> {
        ensure!(y0 < y1 && y1 <= p.h, "rows {y0}..{y1} of a picture of {} rows", p.h);
        let (c, h, w, r) = (p.c, p.h, p.w, y1 - y0);
        let t = self.alloc(DType::F32, &[1, c, r, w])?;
        let ready = self.event()?;
        ready.record(&self.gpu().stream).map_err(|e| anyhow!("event record: {e:?}"))?;
        let up = &hs.io.up;
        up.wait(&ready).map_err(|e| anyhow!("stream wait: {e:?}"))?;
        if let Some(d) = &hs.last_down {
            up.wait(d).map_err(|e| anyhow!("stream wait: {e:?}"))?;
        }
        // SAFETY: rows y0..y1 of every channel plane lie inside the block (c·h·w <= cap floats).
        let src = unsafe { hs.ptr().add(4 * y0 * w) };
        let cp = copy2d_desc(
            sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            src as *mut std::ffi::c_void,
            0,
            4 * h * w,
            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            std::ptr::null_mut(),
            t.ptr(),
            4 * r * w,
            4 * r * w,
            c,
        );
        up.context().bind_to_thread().map_err(|e| anyhow!("bind context: {e:?}"))?;
        // SAFETY: source rows inside the pinned block, destination the strip just allocated;
        // the block outlives the copy (HostSide's drop waits for the stream).
        unsafe { sys::cuMemcpy2DAsync_v2(&cp, up.cu_stream()) }.result().map_err(|e| anyhow!("CUDA row upload: {e:?}"))?;
        let done = self.event()?;
        done.record(up).map_err(|e| anyhow!("event record: {e:?}"))?;
        Ok((t, done))
    }

    /// [`VaeOps::picture_rows`](moss_core::backend::ops::VaeOps::picture_rows).
    pub(crate) fn picture_rows_of(&self, p: &CudaPicture, y0: usize, y1: usize, next: Option<(usize, usize)>) -> Result<CudaTensor> {
        ensure!(y0 < y1 && y1 <= p.h, "rows {y0}..{y1} of a picture of {} rows", p.h);
        let (c, h, w, r) = (p.c, p.h, p.w, y1 - y0);
        let hs = match &p.place {
            Place::Device(data) => {
                let t = self.alloc(DType::F32, &[1, c, r, w])?;
                self.copy2d(&t, data, c, r * w, h * w, y0 * w, r * w, 0)?;
                return Ok(t);
            }
            Place::Host(hs) => hs,
        };
        let main = &self.gpu().stream;
        let wait = |e: &CudaEvent| main.wait(e).map_err(|e| anyhow!("stream wait: {e:?}"));
        let ahead = hs.ahead.borrow_mut().take();
        let t = match ahead {
            Some((span, t, e)) if span == (y0, y1) => {
                wait(&e)?;
                t
            }
            other => {
                if let Some((_, t, e)) = other {
                    wait(&e)?;
                    drop(t);
                }
                let (t, e) = self.fetch(p, hs, y0, y1)?;
                wait(&e)?;
                t
            }
        };
        if let Some((a, b)) = next {
            let f = self.fetch(p, hs, a, b)?;
            *hs.ahead.borrow_mut() = Some(((a, b), f.0, f.1));
        }
        Ok(t)
    }

    /// [`VaeOps::picture_put`](moss_core::backend::ops::VaeOps::picture_put).
    pub(crate) fn picture_put_in(&self, p: &mut CudaPicture, y0: usize, y1: usize, t: &CudaTensor, skip: usize) -> Result<()> {
        let (n, tc, r, tw) = dims4(t, "picture_put")?;
        let (h, w, rows) = (p.h, p.w, y1.saturating_sub(y0));
        ensure!(n == 1 && tw == w && tc * h * w <= p.cap, "picture_put: strip {:?} into a picture [{}, {h}, {w}]", t.shape, p.c);
        ensure!(y0 < y1 && y1 <= h && skip + rows <= r, "picture_put: rows {skip}..{} of {r} into rows {y0}..{y1} of {h}", skip + rows);
        let t = self.cast(t, DType::F32)?;
        // The strip's row partials (all its rows), the valid ones into the picture's.
        let part = self.group_norm_row_partials(&t, p.groups)?;
        self.copy2d(&p.stats, &part, p.groups, 4 * rows, 4 * r, 4 * skip, 4 * h, 4 * y0)?;
        let hs = match &mut p.place {
            Place::Device(data) => return self.copy2d(data, &t, tc, rows * w, r * w, skip * w, h * w, y0 * w),
            Place::Host(hs) => hs,
        };
        let main = &self.gpu().stream;
        let ready = self.event()?;
        ready.record(main).map_err(|e| anyhow!("event record: {e:?}"))?;
        let down = &hs.io.down;
        down.wait(&ready).map_err(|e| anyhow!("stream wait: {e:?}"))?;
        // SAFETY: rows y0..y1 of the first tc channel planes lie inside the block.
        let dst = unsafe { hs.ptr().add(4 * y0 * w) };
        let cp = copy2d_desc(
            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            std::ptr::null_mut(),
            t.ptr() + (4 * skip * w) as u64,
            4 * r * w,
            sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            dst as *mut std::ffi::c_void,
            0,
            4 * h * w,
            4 * rows * w,
            tc,
        );
        down.context().bind_to_thread().map_err(|e| anyhow!("bind context: {e:?}"))?;
        // SAFETY: source rows inside the strip, which stays alive (in `downs`) until the copy is
        // done; destination rows inside the pinned block, which outlives the copy.
        unsafe { sys::cuMemcpy2DAsync_v2(&cp, down.cu_stream()) }.result().map_err(|e| anyhow!("CUDA row download: {e:?}"))?;
        // Two events for the one point: the strip's (it goes when its copy is done) and the
        // block's last write (reads wait for it).
        let (done, last) = (self.event()?, self.event()?);
        done.record(down).map_err(|e| anyhow!("event record: {e:?}"))?;
        last.record(down).map_err(|e| anyhow!("event record: {e:?}"))?;
        hs.downs.borrow_mut().push_back((t, done));
        hs.last_down = Some(last);
        hs.release_downs(DOWNLOADS_IN_FLIGHT)
    }

    /// [`VaeOps::picture_row_stats`](moss_core::backend::ops::VaeOps::picture_row_stats). The
    /// picture is then read, not written: the strips still on their way to it go (after their
    /// copies) rather than wait for the picture's drop.
    pub(crate) fn picture_partials(&self, p: &CudaPicture) -> Result<Vec<f64>> {
        if let Place::Host(hs) = &p.place {
            hs.release_downs(0)?;
        }
        let bytes = self.download_bytes(&p.stats)?;
        Ok(bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect())
    }

    /// [`VaeOps::picture_set_channels`](moss_core::backend::ops::VaeOps::picture_set_channels).
    pub(crate) fn picture_channels(&self, p: &mut CudaPicture, c: usize) -> Result<()> {
        ensure!(c > 0 && c * p.h * p.w <= p.cap, "a picture of {} values set to {c} channels of {}x{}", p.cap, p.h, p.w);
        // Rows fetched ahead had the old channel count.
        if let Place::Host(hs) = &p.place {
            if let Some((_, t, e)) = hs.ahead.borrow_mut().take() {
                self.gpu().stream.wait(&e).map_err(|e| anyhow!("stream wait: {e:?}"))?;
                drop(t);
            }
        }
        p.c = c;
        Ok(())
    }
}
