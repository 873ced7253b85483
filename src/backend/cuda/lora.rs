//! The LoRA merge on the GPU (`cuda/dit/lora_merge.cu`): a weight just uploaded as stored (bf16 or
//! f32) gets each update's delta computed on the device from its small factors, summed in fp32 and
//! added with one rounding, in place. The arithmetic is the host merge's ([`crate::lora::merge`]),
//! operation for operation, so the bytes are the same; `moss check` gates that.

use super::ops::{to_bytes, Arg, Cuda, CudaTensor, DType};
use crate::lora::merge::{operands, Operands, Part};
use crate::checkpoint::{Component, Dtype};
use crate::lora::{plan::MergeClock, Plan, Term};
use anyhow::{anyhow, ensure, Result};
use std::sync::Arc;

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

    /// The merge, in place, through [`crate::backend::merge_loras`] (its clock).
    pub(crate) fn run(self, cu: &Cuda) -> Result<()> {
        crate::backend::merge_loras(cu, &self.plan, &self.name, self.stored, self.w).map(|_| ())
    }
}

/// Rows and columns of a weight's tile in the low-rank kernels, and their threads.
const TILE: usize = 64;
const TILE_THREADS: u32 = 256;

impl Cuda {
    /// `w` plus every update of `terms`, rounded once into `w` (in place; `w` as stored: bf16 or
    /// f32). `prefix`: `moss`, or `moss_ctl` for the planted control of the gate.
    pub fn merge_lora_with(&self, w: &CudaTensor, terms: &[Term], prefix: &str) -> Result<()> {
        ensure!(!w.shape.is_empty() && w.shape.len() <= 2, "LoRA merge into a tensor of shape {:?}", w.shape);
        let rows = w.shape[0];
        let cols = w.numel() / rows.max(1);
        let sum = if terms.len() > 1 { Some(self.alloc(DType::F32, &[rows, cols])?) } else { None };
        let sum_ptr = sum.as_ref().map_or(0, |s| s.ptr());
        let suffix = w.dtype.name();
        for (k, t) in terms.iter().enumerate() {
            let mode = (k > 0) as i32 | (((k + 1 == terms.len()) as i32) << 1);
            let (ops, fs) = operands(t, rows)?;
            let common = [Arg::P(w.ptr()), Arg::P(sum_ptr)];
            let tail = [Arg::F(fs), Arg::F(t.scale), Arg::I(mode)];
            let grid = ((cols.div_ceil(TILE)) as u32, (rows.div_ceil(TILE)) as u32);
            match &ops {
                Operands::LowRank { up, down } => {
                    let r = rank(up, down, &t.module.key)?;
                    fits(up, down, rows, cols, &t.module.key)?;
                    let (u, d) = (self.upload_part(up)?, self.upload_part(down)?);
                    let args = [Arg::P(u.ptr()), Arg::P(d.ptr()), Arg::L(rows as i64), Arg::L(cols as i64), Arg::I(r)];
                    let args: Vec<Arg> = common.into_iter().chain(args).chain(tail).collect();
                    self.launch_2d(&format!("{prefix}_lora_lowrank_{suffix}"), grid, TILE_THREADS, 0, &args)?;
                }
                Operands::LoHa { w1a, w1b, w2a, w2b } => {
                    let (r1, r2) = (rank(w1a, w1b, &t.module.key)?, rank(w2a, w2b, &t.module.key)?);
                    fits(w1a, w1b, rows, cols, &t.module.key)?;
                    fits(w2a, w2b, rows, cols, &t.module.key)?;
                    let m = [self.upload_part(w1a)?, self.upload_part(w1b)?, self.upload_part(w2a)?, self.upload_part(w2b)?];
                    let mut args: Vec<Arg> = common.into_iter().chain(m.iter().map(|x| Arg::P(x.ptr()))).collect();
                    args.extend([Arg::L(rows as i64), Arg::L(cols as i64), Arg::I(r1), Arg::I(r2)]);
                    args.extend(tail);
                    self.launch_2d(&format!("{prefix}_lora_loha_{suffix}"), grid, TILE_THREADS, 0, &args)?;
                }
                Operands::Kron { a, b, row0 } => {
                    let (ac, br, bc) = (a.cols, b.rows, b.cols);
                    ensure!(ac * bc == cols, "`{}`: kron of {ac} and {bc} columns for {cols}", t.module.key);
                    let (ga, gb) = (self.upload_part(a)?, self.upload_part(b)?);
                    let mut args: Vec<Arg> = common.into_iter().chain([Arg::P(ga.ptr()), Arg::P(gb.ptr())]).collect();
                    args.extend([Arg::L(rows as i64), Arg::L(cols as i64), Arg::L(*row0 as i64)]);
                    args.extend([Arg::I(ac as i32), Arg::I(br as i32), Arg::I(bc as i32)]);
                    args.extend(tail);
                    self.launch(&format!("{prefix}_lora_kron_{suffix}"), self.grid_for(rows * cols), 256, 0, &args)?;
                }
            }
        }
        Ok(())
    }

    /// A factor in fp32 on the device (the factors are small: rank x width).
    fn upload_part(&self, p: &Part) -> Result<CudaTensor> {
        let t = self.alloc(DType::F32, &[p.rows, p.cols])?;
        self.write_bytes(t.ptr(), &to_bytes(&p.data.f32(), DType::F32))?;
        Ok(t)
    }

    /// [`crate::backend::Backend::merge_lora`]: the merge, its device time recorded on `clock` by
    /// two events (read when the clock's total is asked for).
    pub(crate) fn merge_lora_timed(&self, w: CudaTensor, terms: &[Term], clock: &MergeClock) -> Result<CudaTensor> {
        let ctx = &self.gpu().ctx;
        let stream = &self.gpu().stream;
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = || ctx.new_event(timed).map_err(|e| anyhow!("CUDA event: {e:?}"));
        let (a, b) = (ev()?, ev()?);
        a.record(stream).map_err(|e| anyhow!("CUDA event record: {e:?}"))?;
        self.merge_lora_with(&w, terms, "moss")?;
        b.record(stream).map_err(|e| anyhow!("CUDA event record: {e:?}"))?;
        clock.add_device(Box::new(move || {
            b.synchronize().ok().and_then(|_| a.elapsed_ms(&b).ok()).map_or(f64::NAN, |ms| ms as f64 * 1e-3)
        }));
        Ok(w)
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
