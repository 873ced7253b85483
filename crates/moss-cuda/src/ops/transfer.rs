//! Host <-> device copies: `load` through pinned staging chunks (two alternating buffers), the
//! pipelined download (chunks converted while the next copies), and the byte conversions.

use super::{de, Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use cudarc::driver::{result as dr, CudaEvent, PinnedHostSlice};
use moss_core::tensor::Tensor;

/// Host staging for `load`: two pinned chunks, filled and copied alternately.
/// The host <-> device machinery of one device, each part made on first use: the staging
/// buffers of uploads and downloads, the weight mover, the LoRA merge's upload ring.
#[derive(Default)]
pub(super) struct Transfers {
    pub(super) staging: std::sync::Mutex<Option<Staging>>,
    pub(super) mover: std::sync::Mutex<Option<super::mover::Mover>>,
    pub(super) ring: std::sync::Mutex<Option<super::ring::Ring>>,
}

pub(super) struct Staging {
    bufs: [PinnedHostSlice<u8>; 2],
    ptrs: [*mut u8; 2],
    done: [CudaEvent; 2],
    /// One event per download slot ([`DOWNLOAD_SLOTS`] slots of [`DOWNLOAD_CHUNK`] bytes carved
    /// out of the two buffers), recorded after the copy into the slot.
    dl_done: Vec<CudaEvent>,
}

impl Staging {
    /// Host address of download slot `k`: buffer `k % 2`, offset `(k / 2) · DOWNLOAD_CHUNK`.
    fn dl_slot(&self, k: usize) -> *mut u8 {
        // SAFETY: (k / 2 + 1) · DOWNLOAD_CHUNK <= STAGING_CHUNK (checked at compile time below).
        unsafe { self.ptrs[k % 2].add((k / 2) * DOWNLOAD_CHUNK) }
    }
}

// SAFETY: the raw pointers are the pinned chunks this struct owns; access is under a Mutex.
unsafe impl Send for Staging {}

impl Drop for Staging {
    fn drop(&mut self) {
        // The pinned chunks must outlive the copies reading them.
        for e in self.done.iter().chain(&self.dl_done) {
            let _ = e.synchronize();
        }
    }
}

/// Chunk size of the pinned staging buffers.
pub const STAGING_CHUNK: usize = 64 << 20;
/// Below this, host→device copies go straight from pageable memory.
const STAGING_MIN: usize = 1 << 20;
/// Chunk size of the pinned download path: small enough that a 32 MiB
/// tensor is several chunks, so the copy of one overlaps the conversion of the previous.
pub const DOWNLOAD_CHUNK: usize = 8 << 20;
/// Download chunks in flight at once (slots in the staging buffers).
pub const DOWNLOAD_SLOTS: usize = 4;
const _: () = assert!(DOWNLOAD_SLOTS.is_multiple_of(2) && DOWNLOAD_SLOTS / 2 * DOWNLOAD_CHUNK <= STAGING_CHUNK);

/// How [`Cuda::download_with`] brings a tensor to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Download {
    /// One `cuMemcpyDtoH` into a fresh pageable byte vector, then the conversion (tensors under
    /// 1 MiB; for large ones measured slower: ~36 ms for the 4096-token encoder output on the H200).
    Pageable,
    /// Through pinned staging chunks, each converted into the output while the next copies.
    Pinned,
}

/// Run `f(chunk_index, chunk)` over `out` in fixed chunks of `chunk` elements, on all cores
/// (the chunking, and so any per-chunk seeding, does not depend on the core count).
pub fn par_chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let n_chunks = out.len().div_ceil(chunk);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(n_chunks).max(1);
    if threads <= 1 {
        for (i, c) in out.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
        return;
    }
    let per = n_chunks.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, part) in out.chunks_mut(per * chunk).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (i, c) in part.chunks_mut(chunk).enumerate() {
                    f(t * per + i, c);
                }
            });
        }
    });
}

/// Elements per host conversion chunk.
const CONVERT_CHUNK: usize = 1 << 16;

/// `data` as little-endian bytes of `dtype` (bf16 and e4m3 round to nearest even, e4m3 saturates
/// to ±448; int8 codes round to nearest even and clamp to ±127), on all cores.
pub fn to_bytes(data: &[f32], dtype: DType) -> Vec<u8> {
    let es = dtype.size();
    let mut bytes = vec![0u8; data.len() * es];
    par_chunks(&mut bytes, CONVERT_CHUNK * es, |i, out| {
        let src = &data[i * CONVERT_CHUNK..][..out.len() / es];
        match dtype {
            DType::F32 => out.chunks_exact_mut(4).zip(src).for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes())),
            DType::BF16 => out.chunks_exact_mut(2).zip(src).for_each(|(o, &v)| o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
            DType::F8E4M3 => out.iter_mut().zip(src).for_each(|(o, &v)| *o = moss_core::fp8::e4m3_from_f32(v)),
            DType::I8 => out.iter_mut().zip(src).for_each(|(o, &v)| *o = moss_core::int8::code(v) as u8),
            DType::I32 => out.chunks_exact_mut(4).zip(src).for_each(|(o, &v)| o.copy_from_slice(&(v.round_ties_even() as i32).to_le_bytes())),
            // kept matrices are uploaded as their stored bytes (`Cuda::upload_kept`), never from values
            DType::Q => unreachable!("values converted to a quantized matrix's bytes"),
        }
    });
    bytes
}

/// The schedule of a chunked, slotted copy of `total` bytes: chunk `i` (bytes `i·chunk ..`,
/// the last one ragged) goes through slot `i % slots`. `issue(i, slot, off, len)` starts the
/// copy of chunk `i` into its slot (asynchronous: it may land any time before the matching
/// `take`); `take(i, slot, off, len)` waits for it and consumes the slot. A slot is issued again
/// only after its previous chunk was taken. Host-emulated in the tests (`pipelined_*`).
pub fn pipelined(
    total: usize,
    chunk: usize,
    slots: usize,
    mut issue: impl FnMut(usize, usize, usize, usize) -> Result<()>,
    mut take: impl FnMut(usize, usize, usize, usize) -> Result<()>,
) -> Result<()> {
    ensure!(chunk > 0 && slots > 0, "pipelined: chunk {chunk}, slots {slots}");
    let count = total.div_ceil(chunk);
    let span = |i: usize| (i * chunk, chunk.min(total - i * chunk));
    for i in 0..count.min(slots) {
        let (off, len) = span(i);
        issue(i, i % slots, off, len)?;
    }
    for i in 0..count {
        let (off, len) = span(i);
        take(i, i % slots, off, len)?;
        if i + slots < count {
            let (off, len) = span(i + slots);
            issue(i + slots, i % slots, off, len)?;
        }
    }
    Ok(())
}

/// Little-endian bytes of `dtype` as f32 values, on all cores.
pub fn from_bytes(bytes: &[u8], dtype: DType) -> Vec<f32> {
    let mut data = vec![0f32; bytes.len() / dtype.size()];
    convert_into(&mut data, bytes, dtype);
    data
}

/// `out[i]` = value `i` of the little-endian `dtype` bytes, on all cores.
pub fn convert_into(data: &mut [f32], bytes: &[u8], dtype: DType) {
    let es = dtype.size();
    assert_eq!(data.len() * es, bytes.len(), "convert_into: {} values from {} bytes", data.len(), bytes.len());
    par_chunks(data, CONVERT_CHUNK, |i, out| {
        let src = &bytes[i * CONVERT_CHUNK * es..][..out.len() * es];
        match dtype {
            DType::F32 => out.iter_mut().zip(src.chunks_exact(4)).for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::BF16 => out.iter_mut().zip(src.chunks_exact(2)).for_each(|(o, c)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::F8E4M3 => out.iter_mut().zip(src).for_each(|(o, &c)| *o = moss_core::fp8::e4m3_to_f32(c)),
            DType::I8 => out.iter_mut().zip(src).for_each(|(o, &c)| *o = c as i8 as f32),
            DType::I32 => out.iter_mut().zip(src.chunks_exact(4)).for_each(|(o, c)| *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32),
            // `download` dequantizes a kept matrix first
            DType::Q => unreachable!("a quantized matrix's bytes read as values"),
        }
    });
}

impl Cuda {
    /// Copy `src` to device address `dst`: straight for small copies, else through two pinned
    /// chunks of [`STAGING_CHUNK`] bytes, alternating, each reused only after its copy finished.
    pub fn write_bytes(&self, dst: u64, src: &[u8]) -> Result<()> {
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        if src.len() < STAGING_MIN {
            // SAFETY: dst holds at least src.len() bytes; a pageable copy is staged by the
            // driver before this returns.
            return unsafe { dr::memcpy_htod_async(dst, src, s.cu_stream()) }.map_err(de("host to device copy"));
        }
        let mut guard = self.staging()?;
        let st = guard.as_mut().unwrap();
        for (i, c) in src.chunks(STAGING_CHUNK).enumerate() {
            let j = i % 2;
            st.done[j].synchronize().map_err(de("staging wait"))?;
            // SAFETY: the chunk's previous copy has finished; the buffer holds STAGING_CHUNK bytes.
            let pinned = unsafe {
                std::ptr::copy_nonoverlapping(c.as_ptr(), st.ptrs[j], c.len());
                std::slice::from_raw_parts(st.ptrs[j] as *const u8, c.len())
            };
            let off = (i * STAGING_CHUNK) as u64;
            // SAFETY: dst + off .. + c.len() lies inside the destination allocation.
            unsafe { dr::memcpy_htod_async(dst + off, pinned, s.cu_stream()) }.map_err(de("host to device copy"))?;
            st.done[j].record(s).map_err(de("event record"))?;
        }
        let _ = &st.bufs;
        Ok(())
    }

    /// The staging buffers, allocated on first use.
    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>> {
        let mut guard = self.inner.transfers.staging.lock().unwrap();
        if guard.is_none() {
            let ctx = &self.inner.gpu.ctx;
            // SAFETY: pinned host memory, written before it is read.
            let mut a = unsafe { ctx.alloc_pinned::<u8>(STAGING_CHUNK) }.map_err(de("pinned alloc"))?;
            let mut b = unsafe { ctx.alloc_pinned::<u8>(STAGING_CHUNK) }.map_err(de("pinned alloc"))?;
            let ptrs = [a.as_mut_ptr().map_err(de("pinned"))?, b.as_mut_ptr().map_err(de("pinned"))?];
            let done = [ctx.new_event(None).map_err(de("event"))?, ctx.new_event(None).map_err(de("event"))?];
            let dl_done = (0..DOWNLOAD_SLOTS).map(|_| ctx.new_event(None).map_err(de("event"))).collect::<Result<_>>()?;
            *guard = Some(Staging { bufs: [a, b], ptrs, done, dl_done });
        }
        Ok(guard)
    }

    /// Upload with an explicit dtype (bf16 rounds to nearest even).
    pub fn upload_as(&self, t: &Tensor, dtype: DType) -> Result<CudaTensor> {
        let out = self.alloc(dtype, &t.shape)?;
        self.write_bytes(out.ptr(), &to_bytes(&t.data, dtype))?;
        Ok(out)
    }

    /// The raw bytes of a tensor (waits for the stream).
    pub fn download_bytes(&self, x: &CudaTensor) -> Result<Vec<u8>> {
        let mut host = vec![0u8; x.bytes()];
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        // SAFETY: the buffer holds x.bytes() bytes; we synchronize before reading `host`.
        unsafe { dr::memcpy_dtoh_async(&mut host[..], x.ptr(), s.cu_stream()) }.map_err(de("device to host copy"))?;
        self.sync()?;
        Ok(host)
    }

    /// `x` as f32 values on the host (waits for the stream), the way `mode` says. Tensors under
    /// 1 MiB always take the pageable copy.
    pub fn download_with(&self, x: &CudaTensor, mode: Download) -> Result<Tensor> {
        if mode == Download::Pageable || x.bytes() < STAGING_MIN {
            let b = self.download_bytes(x)?;
            return Tensor::new(x.shape.clone(), from_bytes(&b, x.dtype));
        }
        self.download_pinned(x, x.bytes())
    }

    /// The pinned download of `x`'s first `copied` bytes (whole elements; the values past them
    /// read 0): chunks of [`DOWNLOAD_CHUNK`] bytes through [`DOWNLOAD_SLOTS`] staging slots.
    pub(crate) fn download_pinned(&self, x: &CudaTensor, copied: usize) -> Result<Tensor> {
        let es = x.dtype.size();
        ensure!(copied <= x.bytes() && copied.is_multiple_of(es), "download of {copied} bytes out of {}", x.bytes());
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        let total = x.bytes();
        let mut guard = self.staging()?;
        let st = guard.as_mut().unwrap();
        let st = &*st;
        // The uploads' copies out of the same buffers are earlier on this stream, so the device
        // orders them before these copies.
        let mut out = vec![0f32; total / es];
        let issue = |_i: usize, k: usize, off: usize, len: usize| -> Result<()> {
            // SAFETY: the slot holds DOWNLOAD_CHUNK >= len bytes and nothing reads it until its
            // event has completed; x.ptr() + off .. + len lies inside x.
            unsafe {
                let slot = std::slice::from_raw_parts_mut(st.dl_slot(k), len);
                dr::memcpy_dtoh_async(slot, x.ptr() + off as u64, s.cu_stream()).map_err(de("device to host copy"))?;
            }
            st.dl_done[k].record(s).map_err(de("event record"))
        };
        let take = |_i: usize, k: usize, off: usize, len: usize| -> Result<()> {
            st.dl_done[k].synchronize().map_err(de("download wait (a kernel failed?)"))?;
            // SAFETY: the slot's copy has completed; it is not written again until re-issued.
            let bytes = unsafe { std::slice::from_raw_parts(st.dl_slot(k) as *const u8, len) };
            convert_into(&mut out[off / es..][..len / es], bytes, x.dtype);
            Ok(())
        };
        pipelined(copied, DOWNLOAD_CHUNK, DOWNLOAD_SLOTS, issue, take)?;
        drop(guard);
        Tensor::new(x.shape.clone(), out)
    }
}
