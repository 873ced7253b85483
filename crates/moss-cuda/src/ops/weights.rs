//! Weight loads through the [`Mover`]: device memory for weights, load batches and the streamed
//! block slots.
//!
//! - A load outside a batch is a batch of one tensor.
//! - [`Cuda::batch`]: the loads `f` asks for are only recorded (device memory allocated, the
//!   tensors handed back unfilled); at the end (or before the first kernel a batch view launches)
//!   the mover reads them all in parallel and copies them on its copy stream, then the compute
//!   stream waits on one event and the casts (bf16 stored, fp32 compute) run.
//! - [`Cuda::batch_behind`]: the same, but the compute stream does not wait yet: the returned
//!   `ready` does (a stage's weights load while the previous stage computes).
//! - [`Cuda::fetch_into_slot`]: a streamed block's tensors into reusable slot memory, the copy
//!   stream first waiting for the compute that read the slot's previous block; the bytes are
//!   read on a thread of its own, so the compute thread keeps enqueuing blocks meanwhile.
//!
//! Weights are plain `cuMemAlloc` memory, not the stream-ordered pool: the copy stream writes
//! them, so they must not depend on the compute stream's order; they are freed after a context
//! synchronisation (a stage's end).

use super::mover::{Moved, Mover, Piece};
use super::{de, held_dtype, loaded_dtype, Buf, Cuda, CudaTensor, DType, Mem};
use crate::kernels;
use crate::lora::PendingMerge;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{result as dr, CudaContext, CudaEvent};
use moss_core::backend::cpu::Cpu;
use moss_core::backend::Behind;
use moss_core::checkpoint::kept::Layout;
use moss_core::checkpoint::{Component, Dtype};
use moss_core::tensor::Tensor;
use std::sync::{Arc, Mutex};

/// The streamed blocks' reusable device memory, by slot, and for each slot the event after the
/// compute that last reads its tensors ([`Cuda::slot_read_until_now`]).
#[derive(Default)]
pub(super) struct Slots {
    mem: Mutex<Vec<Option<Arc<DeviceMem>>>>,
    free: Mutex<std::collections::HashMap<usize, CudaEvent>>,
}

/// Alignment of a tensor inside a slot.
const SLOT_ALIGN: usize = 256;

/// `cuMemAlloc` memory, freed after the context has finished every stream's work.
pub struct DeviceMem {
    ctx: Arc<CudaContext>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DeviceMem {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceMem> {
        ctx.bind_to_thread().map_err(de("bind context"))?;
        // SAFETY: a plain allocation; written by the copies before any kernel reads it.
        let ptr = unsafe { dr::malloc_sync(bytes.max(16)) }.map_err(|e| {
            let free = ctx.mem_get_info().map(|m| m.0).unwrap_or(0);
            anyhow!("out of GPU memory allocating {:.2} GiB of weights ({:.2} GiB free): {e:?}", bytes as f64 / super::GIB, free as f64 / super::GIB)
        })?;
        Ok(DeviceMem { ctx: ctx.clone(), ptr, bytes })
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // Kernels and copies may still use it: wait for every stream first.
        let _ = self.ctx.bind_to_thread();
        let _ = self.ctx.synchronize();
        // SAFETY: allocated by malloc_sync above, freed once.
        let _ = unsafe { dr::free_sync(self.ptr) };
    }
}

/// Loads recorded by a batch view, not yet read.
#[derive(Default)]
pub(crate) struct Batch {
    pub(super) pieces: Vec<Piece>,
    /// (raw stored bytes, the loaded tensor it is cast into once copied)
    casts: Vec<(CudaTensor, CudaTensor)>,
    /// Slot memory the batch places its tensors in, and the bytes used so far.
    slot: Option<(Arc<DeviceMem>, usize)>,
    /// Whether the destinations are slot memory (the copy stream first waits for the compute).
    reuses: bool,
    /// Slot memory: the event after the compute that last read it (`None`: all compute so far).
    free_after: Option<cudarc::driver::CudaEvent>,
    moved: Moved,
    /// LoRA updates of the loaded tensors, merged once their bytes are there, before the casts.
    merges: Vec<PendingMerge>,
}

/// Loads taken out of a batch to be read and issued.
struct Recorded {
    pieces: Vec<Piece>,
    casts: Vec<(CudaTensor, CudaTensor)>,
    merges: Vec<PendingMerge>,
    /// What the copy stream waits for first (slot memory).
    after: Option<CudaEvent>,
}

/// A background read ([`Cuda::flush_in_background`]): joined when finished or dropped.
struct Reading(Option<std::thread::JoinHandle<Result<CudaEvent>>>);

impl Reading {
    /// Wait for the read; the event after its copies.
    fn finish(mut self) -> Result<CudaEvent> {
        let t = self.0.take().expect("a reading is finished once");
        t.join().map_err(|_| anyhow!("a weight read thread panicked"))?
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

impl Cuda {
    fn mover(&self) -> Result<std::sync::MutexGuard<'_, Option<Mover>>> {
        let mut g = self.inner.transfers.mover.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(Mover::new(&self.inner.gpu.ctx)?);
        }
        Ok(g)
    }

    /// Device memory for a weight of `bytes`: the batch's slot, or its own allocation.
    pub(super) fn weight_mem(&self, batch: Option<&mut Batch>, bytes: usize) -> Result<(Mem, u64)> {
        if let Some(Batch { slot: Some((mem, used)), .. }) = batch {
            let off = used.next_multiple_of(SLOT_ALIGN);
            ensure!(off + bytes <= mem.bytes, "weight slot of {} bytes overflows at {}", mem.bytes, off + bytes);
            *used = off + bytes;
            return Ok((Mem::Device(mem.clone()), mem.ptr + off as u64));
        }
        let mem = Arc::new(DeviceMem::new(&self.inner.gpu.ctx, bytes)?);
        if self.inner.poison.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: the allocation just made; nothing uses it yet.
            unsafe { dr::memset_d8_sync(mem.ptr, 0xff, bytes.max(16)) }.map_err(de("memset"))?;
        }
        let ptr = mem.ptr;
        Ok((Mem::Device(mem), ptr))
    }

    /// The dim-0 concatenation of the checkpoint tensors `names` (one dtype, the same trailing
    /// shape), loaded at this precision: the bytes of `cat(load(n) for n in names, 0)`.
    pub(crate) fn load_stacked(&self, c: &Component, names: &[&str]) -> Result<CudaTensor> {
        ensure!(!names.is_empty(), "load of no tensors");
        let infos = names.iter().map(|n| c.info(n)).collect::<Result<Vec<_>>>()?;
        if let Some(layout) = Layout::of(c, names)? {
            return self.load_kept(c, &infos, layout);
        }
        let first = infos[0];
        let mut shape = first.shape.clone();
        // a stack holding a quantized tensor loads dequantized on the host, each part in its own dtype
        let quantized = infos.iter().any(|i| i.dtype.is_block_or_int8());
        for (n, i) in names.iter().zip(&infos).skip(1) {
            ensure!(
                (i.dtype == first.dtype || quantized) && i.shape.len() == shape.len() && i.shape[1..] == shape[1..],
                "cannot stack `{n}` {:?} {} under `{}` {:?} {}",
                i.shape,
                i.dtype.name(),
                names[0],
                first.shape,
                first.dtype.name()
            );
            shape[0] += i.shape[0];
        }
        let stored = match first.dtype {
            Dtype::BF16 if !quantized => DType::BF16,
            Dtype::F32 if !quantized => DType::F32,
            // the codes as stored (their scales are tensors of their own)
            Dtype::F8E4M3 if !quantized => DType::F8E4M3,
            _ => {
                // Other stored dtypes convert on the host (exact to f32), merge there, and upload.
                let merged = |n: &&str| -> Result<Vec<f32>> {
                    let (s, d) = c.f32(n)?;
                    Ok(moss_core::backend::merge_loras(&Cpu, &c.loras, &c.full_name(n), c.info(n)?.dtype, Tensor::new(s, d)?)?.data)
                };
                // A quantized stack with a LoRA update (or not a stack of matrices): dequantized and
                // merged in f32 here, uploaded in the activation dtype. Other stored floats: f32
                // (a single file's: as the folder's bf16, [`held_dtype`]).
                let dtype = if quantized { loaded_dtype(Dtype::BF16, self.precision) } else { held_dtype(c, first.dtype, self.precision) };
                let parts = names.iter().map(merged).collect::<Result<Vec<_>>>()?;
                return self.upload_as(&Tensor::new(shape, parts.concat())?, dtype);
            }
        };
        let target = held_dtype(c, first.dtype, self.precision);
        let own = self.batch.is_none();
        let view = if own { self.batch_view(None) } else { self.clone() };
        let bytes: usize = infos.iter().map(|i| i.end - i.start).sum();
        let raw = {
            let mut g = view.batch.as_ref().unwrap().lock().unwrap_or_else(|e| e.into_inner());
            let (mem, ptr) = view.weight_mem(Some(&mut g), bytes)?;
            let raw = CudaTensor { buf: Arc::new(Buf { mem, ptr, bytes }), shape: shape.clone(), dtype: stored, kept: None };
            let mut dst = ptr;
            for i in &infos {
                let src = c.store.bytes(i);
                g.pieces.push(Piece { src: src.as_ptr(), len: src.len(), dst });
                dst += src.len() as u64;
            }
            g.merges.extend(PendingMerge::of(c, names, &raw)?);
            raw
        };
        let out = if target == stored {
            raw
        } else {
            let out = self.alloc(target, &shape)?;
            view.batch.as_ref().unwrap().lock().unwrap_or_else(|e| e.into_inner()).casts.push((raw, out.clone()));
            out
        };
        if own {
            view.settle()?;
        }
        Ok(out)
    }

    /// Rows `row0 .. row0 + rows` (dim 0) of a loaded weight, sharing its memory.
    pub(crate) fn weight_rows(w: &CudaTensor, row0: usize, rows: usize) -> Result<CudaTensor> {
        let Mem::Device(mem) = &w.buf.mem else { bail!("rows of a weight: {:?} is not weight memory", w) };
        ensure!(row0 + rows <= w.shape[0], "rows {row0}..{} of {:?}", row0 + rows, w.shape);
        let row = w.numel() / w.shape[0].max(1) * w.dtype.size();
        let mut shape = w.shape.clone();
        shape[0] = rows;
        let buf = Buf { mem: Mem::Device(mem.clone()), ptr: w.ptr() + (row0 * row) as u64, bytes: rows * row };
        ensure!(w.kept.is_none(), "rows of a quantized matrix");
        Ok(CudaTensor { buf: Arc::new(buf), shape, dtype: w.dtype, kept: None })
    }

    /// A view of this backend whose loads are recorded into a new batch (in `slot` memory).
    pub(super) fn batch_view(&self, slot: Option<Arc<DeviceMem>>) -> Cuda {
        let reuses = slot.is_some();
        let b = Batch { slot: slot.map(|m| (m, 0)), reuses, ..Default::default() };
        Cuda { batch: Some(Arc::new(Mutex::new(b))), ..self.clone() }
    }

    /// The plain backend a batch's recorded loads finish on: no batch, the production kernels
    /// (the loads' casts and merges are production's in every view).
    fn loader(&self) -> Cuda {
        Cuda { batch: None, image: Default::default(), ..self.clone() }
    }

    /// Read and issue the recorded loads (if any); the compute stream waits for them and the
    /// casts run. Called at a batch's end and before any kernel a batch view launches.
    pub(crate) fn settle(&self) -> Result<()> {
        if let Some(ready) = self.flush()? {
            ready()?;
        }
        Ok(())
    }

    /// Read and issue the recorded loads; returns what makes the compute stream wait for them
    /// (`None`: nothing was recorded).
    #[allow(clippy::type_complexity)]
    fn flush(&self) -> Result<Option<Box<dyn FnOnce() -> Result<()> + Send>>> {
        let Some(Recorded { pieces, casts, merges, after }) = self.take_recorded()? else { return Ok(None) };
        let (done, moved) = self.mover()?.as_ref().unwrap().run(&pieces, after.as_ref())?;
        if let Some(batch) = &self.batch {
            let mut g = batch.lock().unwrap_or_else(|e| e.into_inner());
            g.moved.bytes += moved.bytes;
            g.moved.issue_s += moved.issue_s;
        }
        let cu = self.loader();
        Ok(Some(Box::new(move || cu.wait_and_cast(&done, merges, &casts))))
    }

    /// [`Cuda::flush`] with the reading on a thread of its own, so the calling thread goes on
    /// enqueuing compute while the bytes are read: the returned closure waits for that thread
    /// (every copy issued), then makes the compute stream wait. Dropped without being called, it
    /// still waits for the thread (the bytes it reads must stay mapped until then).
    #[allow(clippy::type_complexity)]
    fn flush_in_background(&self) -> Result<Option<Box<dyn FnOnce() -> Result<()> + Send>>> {
        let Some(Recorded { pieces, casts, merges, after }) = self.take_recorded()? else { return Ok(None) };
        let cu = self.loader();
        let reader = {
            let cu = cu.clone();
            std::thread::spawn(move || -> Result<CudaEvent> { Ok(cu.mover()?.as_ref().unwrap().run(&pieces, after.as_ref())?.0) })
        };
        let reader = Reading(Some(reader));
        Ok(Some(Box::new(move || {
            let done = reader.finish()?;
            cu.wait_and_cast(&done, merges, &casts)
        })))
    }

    /// The recorded loads, taken out of the batch, and the event the copy stream first waits for
    /// (slot memory: the compute that read it last). `None`: nothing was recorded.
    fn take_recorded(&self) -> Result<Option<Recorded>> {
        let Some(batch) = &self.batch else { return Ok(None) };
        let (pieces, casts, reuses, free_after, merges) = {
            let mut g = batch.lock().unwrap_or_else(|e| e.into_inner());
            (std::mem::take(&mut g.pieces), std::mem::take(&mut g.casts), g.reuses, g.free_after.take(), std::mem::take(&mut g.merges))
        };
        if pieces.is_empty() && casts.is_empty() {
            return Ok(None);
        }
        // Slot memory is free once the compute that read the slot's last block is done: up to its
        // `free_slot` event, or (without one) all compute enqueued so far.
        let after = match (reuses, free_after) {
            (true, Some(e)) => Some(e),
            (true, None) => Some(self.inner.gpu.stream.record_event(None).map_err(de("event record"))?),
            (false, _) => None,
        };
        Ok(Some(Recorded { pieces, casts, merges, after }))
    }

    /// The compute stream waits for `done` (the copies), then the LoRA merges and the casts run.
    fn wait_and_cast(&self, done: &CudaEvent, merges: Vec<PendingMerge>, casts: &[(CudaTensor, CudaTensor)]) -> Result<()> {
        self.inner.gpu.stream.wait(done).map_err(de("stream wait"))?;
        for m in merges {
            m.run(self)?;
        }
        for (raw, out) in casts {
            self.cast_into(raw, out)?;
        }
        Ok(())
    }

    /// `out` = `x` cast to `out`'s dtype (same shape).
    fn cast_into(&self, x: &CudaTensor, out: &CudaTensor) -> Result<()> {
        ensure!(x.shape == out.shape, "cast {:?} into {:?}", x.shape, out.shape);
        let n = x.numel();
        kernels::CAST.launch(self, (self.grid_for(n / 8 + 1), 256, 0), out, x, n as i64)
    }

    fn moved(&self) -> Moved {
        self.batch.as_ref().map(|b| b.lock().unwrap_or_else(|e| e.into_inner()).moved).unwrap_or_default()
    }

    /// Run `f`'s loads as one batch; the compute stream waits for them before anything after.
    /// Returns `f`'s value and what the mover moved.
    pub fn batch<R>(&self, f: impl FnOnce(&Cuda) -> Result<R>) -> Result<(R, Moved)> {
        if self.batch.is_some() {
            // Inside a batch: part of it.
            return Ok((f(self)?, Moved::default()));
        }
        let view = self.batch_view(None);
        let r = f(&view)?;
        view.settle()?;
        Ok((r, view.moved()))
    }

    /// [`Cuda::batch`] whose copies the compute stream waits for only when the result's
    /// [`Behind::ready`] is called (on any thread).
    pub fn batch_behind<R>(&self, f: impl FnOnce(&Cuda) -> Result<R>) -> Result<(Behind<R>, Moved)> {
        if self.batch.is_some() {
            return Ok((Behind::new(f(self)?, None), Moved::default()));
        }
        let view = self.batch_view(None);
        let r = f(&view)?;
        let ready = view.flush()?;
        Ok((Behind::new(r, ready), view.moved()))
    }

    /// The tensors `groups` (each the dim-0 concatenation of its names, as [`Cuda::load_stacked`])
    /// into slot `slot`'s memory, reused from the slot's previous fetch: the copy stream first waits
    /// for the compute enqueued so far (which read the slot's previous tensors). The compute
    /// stream waits for the copies at [`Behind::ready`].
    pub fn fetch_into_slot(&self, c: &Component, slot: usize, groups: &[Vec<String>]) -> Result<Behind<Vec<CudaTensor>>> {
        let mut need = 0usize;
        for g in groups {
            let names: Vec<&str> = g.iter().map(String::as_str).collect();
            let bytes = match Layout::of(c, &names)? {
                Some(l) => l.bytes,
                None => g.iter().map(|n| c.info(n).map(|i| i.end - i.start)).sum::<Result<usize>>()?,
            };
            need = need.next_multiple_of(SLOT_ALIGN) + bytes;
        }
        let mem = {
            let mut slots = self.inner.slots.mem.lock().unwrap_or_else(|e| e.into_inner());
            if slots.len() <= slot {
                slots.resize(slot + 1, None);
            }
            match &slots[slot] {
                Some(m) if m.bytes >= need => m.clone(),
                _ => {
                    // A bigger one (the old one lives on while tensors still use it).
                    slots[slot] = None;
                    let m = Arc::new(DeviceMem::new(&self.inner.gpu.ctx, need)?);
                    slots[slot] = Some(m.clone());
                    m
                }
            }
        };
        let view = self.batch_view(Some(mem));
        let free_after = self.inner.slots.free.lock().unwrap_or_else(|e| e.into_inner()).remove(&slot);
        view.batch.as_ref().unwrap().lock().unwrap_or_else(|e| e.into_inner()).free_after = free_after;
        let mut out = vec![];
        for g in groups {
            let names: Vec<&str> = g.iter().map(String::as_str).collect();
            out.push(view.load_stacked(c, &names)?);
        }
        Ok(Behind::new(out, view.flush_in_background()?))
    }

    /// The compute enqueued so far is the last to read `slot`'s tensors: its next fetch's copies
    /// wait for just that (an event recorded now on the compute stream), not for later compute.
    pub fn slot_read_until_now(&self, slot: usize) -> Result<()> {
        let e = self.inner.gpu.stream.record_event(None).map_err(de("event record"))?;
        self.inner.slots.free.lock().unwrap_or_else(|e| e.into_inner()).insert(slot, e);
        Ok(())
    }

    /// Drop the streamed blocks' slot memory (the next fetch allocates it again).
    pub fn release_slots(&self) {
        self.inner.slots.mem.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.inner.slots.free.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
