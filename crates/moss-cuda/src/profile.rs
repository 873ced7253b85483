//! The one op profiler of the three networks (`moss bench-dit`, `bench-encode`, `bench-vae`):
//! while on, every op the backend runs for the model code (the generic ops of `Backend`, the
//! DiT's, the encoder's and the VAE's ops, each under its own name: [`Cuda::timed_op`]) adds a
//! row; the model code has no timing calls. An op called inside a timed op is part of the outer
//! op's row (only the outermost call is timed). Two modes:
//! [`Mode::Events`] brackets each op with CUDA events and does not synchronise (the forward runs
//! as it does unprofiled; an op's GPU time is between its events); [`Mode::Synced`] synchronises
//! before and after each op and takes the wall time between.

use super::ops::Cuda;
use anyhow::{anyhow, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

thread_local! {
    /// Timed ops running on this thread (only the outermost one records).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Marks a timed op running on this thread until dropped.
struct Nested;

impl Nested {
    fn enter() -> Nested {
        DEPTH.with(|d| d.set(d.get() + 1));
        Nested
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// How ops are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Events,
    Synced,
}

/// One timed call: its op, CUDA events (events mode) or the synced GPU time, the host time.
struct Call {
    op: String,
    events: Option<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>,
    synced_ms: f64,
    host_ms: f64,
}

static ON: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<Option<(Mode, Vec<Call>)>> = Mutex::new(None);

/// Turn the profile on with a fresh table.
pub fn start(mode: Mode) {
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some((mode, vec![]));
    ON.store(true, Ordering::Relaxed);
}

/// Turn the profile off, dropping what was gathered.
pub fn stop() {
    ON.store(false, Ordering::Relaxed);
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Whether ops are being timed (callers build profile keys only then).
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// One profiled op, summed over its calls.
pub struct OpTime {
    pub op: String,
    /// GPU time (between its events, or synchronised wall time).
    pub gpu_ms: f64,
    /// Host time of the calls (launching, allocating, host work).
    pub host_ms: f64,
    pub calls: usize,
}

/// What [`take`] returns: the ops in first-call order, and (events mode) the span from the first
/// op's start to the last op's end: the span less the ops' sum is the GPU's time between ops.
pub struct Profile {
    pub ops: Vec<OpTime>,
    pub span_ms: f64,
}

/// The ops gathered since [`start`] (waits for the last event); the profile stays on with an
/// empty table.
pub fn take() -> Result<Profile> {
    let calls = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut().map(|s| std::mem::take(&mut s.1)).unwrap_or_default();
    let de = |e: cudarc::driver::DriverError| anyhow!("profile event: {e:?}");
    let mut ops: Vec<OpTime> = vec![];
    for c in &calls {
        let ms = match &c.events {
            Some((a, b)) => {
                b.synchronize().map_err(de)?;
                a.elapsed_ms(b).map_err(de)? as f64
            }
            None => c.synced_ms,
        };
        match ops.iter_mut().find(|o| o.op == c.op) {
            Some(o) => {
                o.gpu_ms += ms;
                o.host_ms += c.host_ms;
                o.calls += 1;
            }
            None => ops.push(OpTime { op: c.op.clone(), gpu_ms: ms, host_ms: c.host_ms, calls: 1 }),
        }
    }
    let span_ms = match (calls.first().and_then(|c| c.events.as_ref()), calls.last().and_then(|c| c.events.as_ref())) {
        (Some(f), Some(l)) => f.0.elapsed_ms(&l.1).map_err(de)? as f64,
        _ => 0.0,
    };
    Ok(Profile { ops, span_ms })
}

impl Cuda {
    /// Run `f`, one op, timed under the name `op` while the profile is on.
    pub(crate) fn prof<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.timed_op(|| op.to_string(), f)
    }

    /// Run `f`, timed as `op()` while the profile is on (and no timed op encloses this one).
    pub(crate) fn timed_op<T>(&self, op: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !is_on() || DEPTH.with(|d| d.get()) > 0 {
            return f();
        }
        let _nested = Nested::enter();
        let mode = match STATE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some((m, _)) => *m,
            None => return f(),
        };
        let de = |e: cudarc::driver::DriverError| anyhow!("profile event: {e:?}");
        let stream = &self.gpu().stream;
        let call = match mode {
            Mode::Events => {
                let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                let a = stream.record_event(flags).map_err(de)?;
                let t = std::time::Instant::now();
                let r = f()?;
                let host_ms = t.elapsed().as_secs_f64() * 1e3;
                let b = stream.record_event(flags).map_err(de)?;
                (r, Call { op: op(), events: Some((a, b)), synced_ms: 0.0, host_ms })
            }
            Mode::Synced => {
                self.sync()?;
                let t = std::time::Instant::now();
                let r = f()?;
                self.sync()?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                (r, Call { op: op(), events: None, synced_ms: ms, host_ms: ms })
            }
        };
        if let Some(s) = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            s.1.push(call.1);
        }
        Ok(call.0)
    }
}

/// The device memory pool's high-water mark of used bytes since the last reset (weights
/// included: they live in the same pool), reset to the current use when `reset`.
impl Cuda {
    pub fn pool_high_water(&self, reset: bool) -> anyhow::Result<u64> {
        let cuda = self;
        use cudarc::driver::{result as dr, sys};
        cuda.sync()?;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
        let mut v = 0u64;
        // SAFETY: the device's default pool; the attribute is a u64 (set to 0 resets it).
        unsafe {
            let pool = dr::device::get_default_mem_pool(cuda.gpu().ctx.cu_device()).map_err(|e| anyhow::anyhow!("memory pool: {e:?}"))?;
            dr::mem_pool::get_attribute(pool, attr, &mut v as *mut u64 as *mut std::ffi::c_void).map_err(|e| anyhow::anyhow!("pool attribute: {e:?}"))?;
            if reset {
                let mut z = 0u64;
                dr::mem_pool::set_attribute(pool, attr, &mut z as *mut u64 as *mut std::ffi::c_void).map_err(|e| anyhow::anyhow!("pool attribute: {e:?}"))?;
            }
        }
        Ok(v)
    }
}
