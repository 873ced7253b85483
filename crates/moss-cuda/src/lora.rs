//! The LoRA merge on the GPU (`cuda/dit/lora_merge.cu`): a weight just uploaded as stored (bf16 or
//! f32) gets each update's delta computed on the device from its small factors, summed in fp32 and
//! added with one rounding, in place. The arithmetic is the host merge's ([`moss_core::lora::merge`]),
//! operation for operation, so the bytes are the same; `moss check` gates that.
//!
//! The factors go up as the adapter file stores them, straight from its mapping: bf16 and f32
//! bytes copied as they are into a pinned ring ([`super::ops::ring`]) and from there to the
//! device (bf16 then widened to f32 there, `moss_cast_bf16_f32`: exact, as on the host); f16,
//! f64 and the host's LoKr products converted to f32 as they are written into the ring. The host
//! waits for the device only when the ring wraps onto copies still running, so it prepares the
//! next tensors while the device merges. A factor too large for the ring (a full-weight
//! difference) goes through the staging chunks.

use super::kernels::{self, Dev};
use super::ops::ring::RING_MAX;
use super::ops::{Cuda, CudaTensor, DType};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::CudaEvent;
use moss_core::checkpoint::{Component, Dtype};
use moss_core::lora::merge::{operands, Operands, Part, Values, ALIGN};
use moss_core::lora::{plan::MergeClock, Plan, Term};
use std::sync::Arc;
use std::time::Instant;

/// A loaded weight's LoRA merge, waiting for its bytes (a batched load merges once the copies
/// are done, on the compute stream, before the cast to the compute dtype).
pub(crate) struct PendingMerge {
    /// The weight's rows as stored (a view into the stacked tensor of a `load_rows`).
    w: CudaTensor,
    plan: Arc<Plan>,
    /// Its full name.
    name: String,
    stored: Dtype,
}

impl PendingMerge {
    /// The merges of the tensors `names`, stacked in order in `raw` (as stored), that `c`'s
    /// adapters update.
    pub(crate) fn of(c: &Component, names: &[&str], raw: &CudaTensor) -> Result<Vec<PendingMerge>> {
        let mut out = vec![];
        let mut row0 = 0;
        for n in names {
            let info = c.info(n)?;
            let rows = info.shape.first().copied().unwrap_or(1);
            if !c.lora_terms(n).is_empty() {
                let w = Cuda::weight_rows(raw, row0, rows)?;
                out.push(PendingMerge { w, plan: c.loras.clone(), name: c.full_name(n), stored: info.dtype });
            }
            row0 += rows;
        }
        Ok(out)
    }

    /// The merge, in place, through [`moss_core::backend::merge_loras`] (its clock).
    pub(crate) fn run(self, cu: &Cuda) -> Result<()> {
        moss_core::backend::merge_loras(cu, &self.plan, &self.name, self.stored, self.w).map(|_| ())
    }
}

/// Rows and columns of a weight's tile in the low-rank kernels, and their threads.
const TILE: usize = 64;
const TILE_THREADS: u32 = 256;

/// One factor on its way to the device.
struct Upload<'p> {
    /// Its values as stored in the adapter, or in f32.
    part: &'p Part<'p>,
    /// Where its f32 values go.
    dst: u64,
    /// bf16 as stored: uploaded as it is to this address and widened to `dst` on the device.
    widen: Option<u64>,
    /// Its offset in the merge's ring region (`None`: too large for the ring, written through
    /// the staging chunks).
    at: Option<usize>,
}

impl Upload<'_> {
    fn len(&self) -> usize {
        upload_len(self.part)
    }
}

/// Whether a factor goes up as stored bf16 (widened on the device; exact, as on the host).
pub(crate) fn widens(p: &Part) -> bool {
    matches!(p.data, Values::Stored { dtype: Dtype::BF16, .. })
}

/// Bytes a factor uploads: stored bf16 as they are (2 a value), anything else as f32.
pub(crate) fn upload_len(p: &Part) -> usize {
    p.data.len() * if widens(p) { 2 } else { 4 }
}

/// `p`'s upload bytes ([`upload_len`]) into `out`: stored bf16 or f32 bytes copied as they are,
/// anything else converted to f32 as it is written (the host's whole share of a factor's upload).
pub(crate) fn write_upload(p: &Part, out: &mut [u8]) {
    match &p.data {
        Values::Stored { dtype: Dtype::BF16 | Dtype::F32, bytes } => out.copy_from_slice(bytes),
        Values::Stored { dtype: Dtype::F16, bytes } => f16_to_f32_bytes(bytes, out),
        Values::Stored { .. } => write_f32(&p.data.f32(), out),
        Values::F32(v) => write_f32(v, out),
    }
}

/// Little-endian f16 `bytes` as f32 bytes into `out`: 8 at a time with the CPU's conversion
/// instructions where both are aligned (the usual case: a file's f16 tensor, the ring), else one
/// by one. Exact either way.
fn f16_to_f32_bytes(bytes: &[u8], out: &mut [u8]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    // SAFETY: u16 and f32 hold any bit pattern; only the aligned middles are reinterpreted.
    let ((p, src, q), (po, dst, qo)) = unsafe { (bytes.align_to::<u16>(), out.align_to_mut::<f32>()) };
    if cfg!(target_endian = "little") && p.is_empty() && q.is_empty() && po.is_empty() && qo.is_empty() && src.len() == dst.len() {
        src.reinterpret_cast::<half::f16>().convert_to_f32_slice(dst);
    } else {
        let v = bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32());
        out.chunks_exact_mut(4).zip(v).for_each(|(o, x)| o.copy_from_slice(&x.to_le_bytes()));
    }
}

fn write_f32(v: &[f32], out: &mut [u8]) {
    out.chunks_exact_mut(4).zip(v).for_each(|(o, x)| o.copy_from_slice(&x.to_le_bytes()));
}

/// A term's operands on the device: every factor in fp32 (the kernels' input) at `ptrs`, the
/// bf16 ones also as stored (`_raw`, widened into `_f32s`).
struct Operands32 {
    _f32s: CudaTensor,
    _raw: Option<CudaTensor>,
    ptrs: Vec<u64>,
}

impl Cuda {
    /// `w` plus every update of `terms`, rounded once into `w` (in place; `w` as stored: bf16 or
    /// f32).
    pub fn merge_lora_into(&self, w: &CudaTensor, terms: &[Term]) -> Result<()> {
        self.merge_in_two_phases(w, terms, None).map(|_| ())
    }

    /// The merge: first the host prepares every term's factors (their bytes into the upload ring,
    /// device memory for them), then the copies, the bf16 factors' widening and the merge kernels
    /// go on the stream. Returns the host's seconds of preparation (waits for the ring's earlier
    /// copies left out). With `timed` (an event pair), the events bracket the device part.
    fn merge_in_two_phases(&self, w: &CudaTensor, terms: &[Term], timed: Option<(&CudaEvent, &CudaEvent)>) -> Result<f64> {
        let t0 = Instant::now();
        ensure!(!w.shape.is_empty() && w.shape.len() <= 2, "LoRA merge into a tensor of shape {:?}", w.shape);
        let rows = w.shape[0];
        let cols = w.numel() / rows.max(1);
        let ops = terms.iter().map(|t| operands(t, rows)).collect::<Result<Vec<_>>>()?;
        for (t, (o, _)) in terms.iter().zip(&ops) {
            check_shapes(o, rows, cols, &t.module.key)?;
        }
        let sum = if terms.len() > 1 { Some(self.alloc(DType::F32, &[rows, cols])?) } else { None };
        // Device memory for every term's factors, and where each factor's bytes go.
        let mut devs = vec![];
        let mut uploads = vec![];
        for (o, _) in &ops {
            let parts = parts_of(o);
            let n32: usize = parts.iter().map(|p| aligned(4 * p.data.len())).sum();
            let n16: usize = parts.iter().filter(|p| widens(p)).map(|p| aligned(2 * p.data.len())).sum();
            let f32s = self.alloc(DType::F32, &[n32 / 4])?;
            let raw = if n16 > 0 { Some(self.alloc(DType::BF16, &[n16 / 2])?) } else { None };
            let (mut at32, mut at16, mut ptrs) = (0, 0, vec![]);
            for p in parts {
                let dst = f32s.ptr() + at32 as u64;
                let widen = widens(p).then(|| raw.as_ref().map_or(0, |r| r.ptr()) + at16 as u64);
                at32 += aligned(4 * p.data.len());
                if widen.is_some() {
                    at16 += aligned(2 * p.data.len());
                }
                ptrs.push(dst);
                uploads.push(Upload { part: p, dst, widen, at: None });
            }
            devs.push(Operands32 { _f32s: f32s, _raw: raw, ptrs });
        }
        // The ring takes the factors in order while they fit in one reservation; the rest (a
        // full-weight difference) go through the staging chunks.
        let mut ring_len = 0;
        for u in &mut uploads {
            let len = aligned(u.len());
            if ring_len + len <= RING_MAX {
                u.at = Some(ring_len);
                ring_len += len;
            }
        }
        let mut guard = self.ring()?;
        let ring = guard.as_mut().expect("the ring is made by ring()");
        let (region, waited) = ring.reserve(ring_len)?;
        for u in &uploads {
            if let Some(at) = u.at {
                write_upload(u.part, ring.bytes(region, at, u.len()));
            }
        }
        let staged: Vec<Option<Vec<u8>>> = uploads
            .iter()
            .map(|u| {
                u.at.is_none().then(|| {
                    let mut b = vec![0u8; u.len()];
                    write_upload(u.part, &mut b);
                    b
                })
            })
            .collect();
        let prep = t0.elapsed().as_secs_f64() - waited;

        // The device part.
        if let Some((a, _)) = timed {
            a.record(&self.gpu().stream).map_err(|e| anyhow!("CUDA event record: {e:?}"))?;
        }
        for (u, host) in uploads.iter().zip(&staged) {
            let to = u.widen.unwrap_or(u.dst);
            match (u.at, host) {
                (Some(at), _) => ring.copy(self, region, at, u.len(), to)?,
                (None, Some(b)) => self.write_bytes(to, b)?,
                (None, None) => unreachable!("a factor off the ring has its bytes"),
            }
        }
        ring.issued(self, region)?;
        drop(guard);
        for u in &uploads {
            if let Some(src) = u.widen {
                let n = u.part.data.len();
                let (dst, src) = (Dev::new(u.dst, DType::F32), Dev::new(src, DType::BF16));
                kernels::CAST.launch(self, (self.grid_for(n / 8 + 1), 256, 0), dst, src, n as i64)?;
            }
        }
        let acc = sum.as_ref().map_or(Dev::null(DType::F32), Dev::from);
        for (k, ((o, fs), dev)) in ops.iter().zip(&devs).enumerate() {
            let mode = (k > 0) as i32 | (((k + 1 == terms.len()) as i32) << 1);
            let scale = terms[k].scale;
            let p = |i: usize| Dev::new(dev.ptrs[i], DType::F32);
            let (rl, cl) = (rows as i64, cols as i64);
            let tiles = (((cols.div_ceil(TILE)) as u32, (rows.div_ceil(TILE)) as u32), TILE_THREADS, 0);
            match o {
                Operands::LowRank { up, .. } => kernels::LORA_LOWRANK.launch(self, tiles, w, acc, p(0), p(1), rl, cl, up.cols as i32, *fs, scale, mode)?,
                Operands::LoHa { w1a, w2a, .. } => {
                    let (r1, r2) = (w1a.cols as i32, w2a.cols as i32);
                    kernels::LORA_LOHA.launch(self, tiles, w, acc, p(0), p(1), p(2), p(3), rl, cl, r1, r2, *fs, scale, mode)?
                }
                Operands::Kron { a, b, row0 } => {
                    let cfg = (self.grid_for(rows * cols), 256, 0);
                    let (ac, br, bc) = (a.cols as i32, b.rows as i32, b.cols as i32);
                    kernels::LORA_KRON.launch(self, cfg, w, acc, p(0), p(1), rl, cl, *row0 as i64, ac, br, bc, *fs, scale, mode)?
                }
            }
        }
        if let Some((_, b)) = timed {
            b.record(&self.gpu().stream).map_err(|e| anyhow!("CUDA event record: {e:?}"))?;
        }
        Ok(prep)
    }

    /// [`moss_core::backend::Backend::merge_lora`]: the merge, its host preparation and its device
    /// time (two events, read when the clock's total is asked for) recorded on `clock`.
    pub(crate) fn merge_lora_timed(&self, w: CudaTensor, terms: &[Term], clock: &MergeClock) -> Result<CudaTensor> {
        let ctx = &self.gpu().ctx;
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = || ctx.new_event(timed).map_err(|e| anyhow!("CUDA event: {e:?}"));
        let (a, b) = (ev()?, ev()?);
        let prep = self.merge_in_two_phases(&w, terms, Some((&a, &b)))?;
        clock.add_host(prep);
        clock.add_device(Box::new(move || b.synchronize().ok().and_then(|_| a.elapsed_ms(&b).ok()).map_or(f64::NAN, |ms| ms as f64 * 1e-3)));
        Ok(w)
    }
}

/// A term's factors in the order its kernel takes them.
pub(crate) fn parts_of<'o>(o: &'o Operands<'o>) -> Vec<&'o Part<'o>> {
    match o {
        Operands::LowRank { up, down } => vec![up, down],
        Operands::LoHa { w1a, w1b, w2a, w2b } => vec![w1a, w1b, w2a, w2b],
        Operands::Kron { a, b, .. } => vec![a, b],
    }
}

fn aligned(bytes: usize) -> usize {
    bytes.next_multiple_of(ALIGN)
}

/// The factors' shapes give a `rows` x `cols` update.
fn check_shapes(o: &Operands, rows: usize, cols: usize, what: &str) -> Result<()> {
    match o {
        Operands::LowRank { up, down } => {
            rank(up, down, what)?;
            fits(up, down, rows, cols, what)
        }
        Operands::LoHa { w1a, w1b, w2a, w2b } => {
            rank(w1a, w1b, what)?;
            rank(w2a, w2b, what)?;
            fits(w1a, w1b, rows, cols, what)?;
            fits(w2a, w2b, rows, cols, what)
        }
        Operands::Kron { a, b, .. } => {
            ensure!(a.cols * b.cols == cols, "`{what}`: kron of {} and {} columns for {cols}", a.cols, b.cols);
            Ok(())
        }
    }
}

/// The inner dimension of `a · b`, checked.
fn rank(a: &Part, b: &Part, what: &str) -> Result<i32> {
    ensure!(a.cols == b.rows, "{what}: inner dimensions {} and {} differ", a.cols, b.rows);
    Ok(a.cols as i32)
}

/// `a · b` gives `rows` x `cols`.
fn fits(a: &Part, b: &Part, rows: usize, cols: usize, what: &str) -> Result<()> {
    ensure!(a.rows == rows && b.cols == cols, "{what}: a [{}, {}] update for a [{rows}, {cols}] weight", a.rows, b.cols);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 bit pattern converts to the f32 the host merge reads (NaNs aside: any NaN),
    /// on the aligned fast path and on the one-by-one path (bytes at an odd address).
    #[test]
    fn f16_bytes_widen_exactly_aligned_or_not() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        let want: Vec<f32> = (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).collect();
        let shifted: Vec<u8> = [&[0u8][..], &all].concat();
        for (what, src) in [("aligned", &all[..]), ("odd address", &shifted[1..])] {
            // f32 storage viewed as bytes: aligned as the ring is.
            let mut out = vec![0f32; want.len()];
            // SAFETY: the vector's own bytes, any pattern valid for f32.
            let o = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, 4 * want.len()) };
            f16_to_f32_bytes(src, o);
            for (i, (c, w)) in o.chunks_exact(4).zip(&want).enumerate() {
                let g = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what}: f16 bits {i:#06x}: {g} vs {w}");
            }
        }
    }
}
