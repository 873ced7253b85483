//! The CUDA implementation of the generic [`Backend`] ops: device tensors with a dtype (bf16 or
//! f32) and a shape, one stream, cuBLASLt for `linear`, `cuda/common/tensor_ops.cu` for everything else.
//!
//! Dtype rules (every op computes in fp32 and rounds once into its output):
//! - `upload` gives the precision's activation dtype (bf16, or f32 with `--precision fp32`);
//!   [`Cuda::upload_as`] picks one explicitly.
//! - `load` keeps a bf16 checkpoint tensor bf16 (f32 with `--precision fp32`) and an f32 one f32.
//! - `linear` computes in the weight's dtype (x and the bias are cast to it if they differ) and
//!   returns that dtype. Elementwise ops and `rms_norm` return the dtype of their first input.
//! - `cat` needs one dtype; `reshape` shares the buffer; `narrow`, `cat`, `permute` copy.

use crate::backend::cuda::blas::{Blas, LinearBug};
use super::Gpu;
use crate::backend::Backend;
use crate::checkpoint::{Component, Dtype};
use crate::options::Precision;
use crate::tensor::Tensor;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{result as dr, sys, CudaEvent, CudaFunction, CudaSlice, DevicePtr, PinnedHostSlice};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Element type of a device tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::BF16 => 2,
            DType::F32 => 4,
        }
    }
    /// The suffix of kernel names (`moss_add_bf16_f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }
    /// The activation dtype of a precision.
    pub fn of(p: Precision) -> DType {
        match p {
            Precision::Bf16 => DType::BF16,
            Precision::Fp32 => DType::F32,
        }
    }
}

/// One device allocation (stream-ordered; freed on drop).
pub struct Buf {
    _slice: CudaSlice<u8>,
    ptr: u64,
    bytes: usize,
}

/// A tensor resident on the GPU. Cloning shares the buffer.
#[derive(Clone)]
pub struct CudaTensor {
    buf: Arc<Buf>,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl CudaTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// The device address of element 0.
    pub fn ptr(&self) -> u64 {
        self.buf.ptr
    }
    pub fn last_dim(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }
    pub fn rows(&self) -> usize {
        self.numel() / self.last_dim().max(1)
    }
    /// Whether no other tensor (a clone or a reshape) shares this one's buffer, so an op that
    /// takes it by value may write into it.
    pub(crate) fn is_unique(&self) -> bool {
        Arc::strong_count(&self.buf) == 1
    }
}

/// The argument struct of `moss_permute_*` (must match `MossPerm` in cuda/common/tensor_ops.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PermArgs {
    pub out_dims: [i64; 6],
    pub src_strides: [i64; 6],
    pub nd: i32,
}

/// One kernel argument.
pub enum Arg {
    /// A device pointer.
    P(u64),
    L(i64),
    I(i32),
    F(f32),
    Perm(PermArgs),
    /// A TMA tensor map passed by value (a kernel's `const __grid_constant__ CUtensorMap`).
    Map(Box<sys::CUtensorMap>),
}

/// Host staging for `load`: two pinned chunks, filled and copied alternately.
struct Staging {
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
const _: () = assert!(DOWNLOAD_SLOTS % 2 == 0 && DOWNLOAD_SLOTS / 2 * DOWNLOAD_CHUNK <= STAGING_CHUNK);

/// How [`Cuda::download_with`] brings a tensor to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Download {
    /// One `cuMemcpyDtoH` into a fresh pageable byte vector, then the conversion (tensors under
    /// 1 MiB; for large ones measured slower: ~36 ms for the 4096-token encoder output on the H200).
    Pageable,
    /// Through pinned staging chunks, each converted into the output while the next copies.
    /// `drop_tail` is the planted bug of the gate (the last chunk is never copied).
    Pinned { drop_tail: bool },
}


struct Inner {
    gpu: Gpu,
    blas: Blas,
    funcs: Mutex<HashMap<String, CudaFunction>>,
    staging: Mutex<Option<Staging>>,
    poison: AtomicBool,
    sms: u32,
    /// The fp16-split VAE conv's overflow flag (one device int, allocated on first use) and
    /// whether the decoder is re-running on the TF32 path after it was set (src/backend/cuda/vae.rs).
    vae_flag: Mutex<Option<CudaTensor>>,
    vae_tf32_fallback: AtomicBool,
}

/// The CUDA backend on one GPU. Clones share the device state; [`Cuda::with_precision`] gives a
/// view with another precision.
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
    pub precision: Precision,
}

fn de(what: &str) -> impl Fn(dr::DriverError) -> anyhow::Error + '_ {
    move |e| anyhow!("CUDA {what}: {e:?}")
}

fn kernel_ptr(t: &CudaTensor) -> Arg {
    Arg::P(t.ptr())
}

impl Cuda {
    /// Open `cuda:ordinal` with cuBLASLt and our kernels; a clear error without a driver, a GPU,
    /// cuBLASLt or kernels.
    pub fn new(ordinal: usize, precision: Precision) -> Result<Cuda> {
        let gpu = Gpu::open(ordinal)?;
        // SAFETY: one stream only, so no cross-stream events are needed; no CudaSlice exists yet.
        unsafe { gpu.ctx.disable_event_tracking() };
        if gpu.ctx.has_async_alloc() {
            // Keep freed memory in the stream-ordered pool instead of returning it to the driver
            // at every synchronisation (which makes the next allocation map pages again).
            // SAFETY: the device's default pool, a u64 attribute.
            unsafe {
                let pool = dr::device::get_default_mem_pool(gpu.ctx.cu_device()).map_err(de("memory pool"))?;
                let mut keep = u64::MAX;
                dr::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut keep as *mut u64 as *mut c_void,
                )
                .map_err(de("memory pool threshold"))?;
            }
        }
        let cc_attr = |a| gpu.ctx.attribute(a).map_err(de("attribute"));
        let cc = (
            cc_attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc_attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let blas = Blas::new(&gpu.stream, cc)?;
        let sms = gpu
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(de("attribute"))? as u32;
        let inner = Inner {
            gpu,
            blas,
            funcs: Mutex::new(HashMap::new()),
            staging: Mutex::new(None),
            poison: AtomicBool::new(false),
            sms,
            vae_flag: Mutex::new(None),
            vae_tf32_fallback: AtomicBool::new(false),
        };
        Ok(Cuda { inner: Arc::new(inner), precision })
    }

    pub fn with_precision(&self, precision: Precision) -> Cuda {
        Cuda { inner: self.inner.clone(), precision }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
    }

    /// Device address of the fp16-split VAE conv's overflow flag (one int, zero until a kernel
    /// sets it; allocated and zeroed on first use).
    pub(crate) fn vae_flag_ptr(&self) -> Result<u64> {
        let mut g = self.inner.vae_flag.lock().unwrap();
        if g.is_none() {
            let t = self.alloc(DType::F32, &[4])?;
            self.write_bytes(t.ptr(), &[0u8; 16], false)?;
            *g = Some(t);
        }
        Ok(g.as_ref().unwrap().ptr())
    }

    /// Whether the overflow flag is set (waits for the stream), and clears it.
    pub(crate) fn vae_flag_take(&self) -> Result<bool> {
        let g = self.inner.vae_flag.lock().unwrap();
        let Some(t) = g.as_ref() else { return Ok(false) };
        let b = self.download_bytes(t)?;
        let set = b[..4] != [0u8; 4];
        if set {
            self.write_bytes(t.ptr(), &[0u8; 16], false)?;
        }
        Ok(set)
    }

    /// Whether the VAE convolutions run on the TF32 halo kernel in place of the fp16 one (the
    /// decoder's re-run after an overflow).
    pub(crate) fn vae_tf32_fallback(&self) -> bool {
        self.inner.vae_tf32_fallback.load(Ordering::Relaxed)
    }

    pub(crate) fn set_vae_tf32_fallback(&self, on: bool) {
        self.inner.vae_tf32_fallback.store(on, Ordering::Relaxed)
    }

    pub(crate) fn blas(&self) -> &Blas {
        &self.inner.blas
    }

    /// The activation dtype of this backend's precision.
    pub fn act_dtype(&self) -> DType {
        DType::of(self.precision)
    }

    /// Fill every new allocation with 0xFF bytes (NaN in bf16 and f32), so an element a kernel
    /// fails to write shows up as NaN. `moss check` turns this on.
    pub fn set_poison(&self, on: bool) {
        self.inner.poison.store(on, Ordering::Relaxed);
    }

    /// Wait for all queued work; report any asynchronous kernel error.
    pub fn sync(&self) -> Result<()> {
        self.inner.gpu.stream.synchronize().map_err(de("synchronize (a kernel failed)"))
    }

    /// Give the memory the stream-ordered pool holds (freed tensors) back to the driver, so
    /// `cuMemGetInfo` sees it as free again.
    pub fn trim_pool(&self) -> Result<()> {
        self.sync()?;
        if self.inner.gpu.ctx.has_async_alloc() {
            // SAFETY: the device's default pool; nothing is in flight after the sync.
            unsafe {
                let pool = dr::device::get_default_mem_pool(self.inner.gpu.ctx.cu_device()).map_err(de("memory pool"))?;
                dr::mem_pool::trim_to(pool, 0).map_err(de("memory pool trim"))?;
            }
        }
        Ok(())
    }

    /// A new (uninitialised, or poisoned) tensor.
    pub fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<CudaTensor> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        // SAFETY: the memory is written by the op that asked for it (or poisoned below).
        let slice = unsafe { s.alloc::<u8>(bytes.max(16)) }.map_err(|e| {
            let free = self.inner.gpu.mem_info().map(|m| m.0).unwrap_or(0);
            anyhow!(
                "out of GPU memory allocating {:.2} GiB ({:.2} GiB free): {e:?}",
                bytes as f64 / GIB,
                free as f64 / GIB
            )
        })?;
        let ptr = slice.device_ptr(s).0;
        if self.inner.poison.load(Ordering::Relaxed) {
            // SAFETY: ptr/bytes is the allocation just made.
            unsafe { dr::memset_d8_async(ptr, 0xff, bytes, s.cu_stream()) }.map_err(de("memset"))?;
        }
        Ok(CudaTensor { buf: Arc::new(Buf { _slice: slice, ptr, bytes }), shape: shape.to_vec(), dtype })
    }

    fn func(&self, name: &str) -> Result<CudaFunction> {
        let mut f = self.inner.funcs.lock().unwrap();
        if let Some(k) = f.get(name) {
            return Ok(k.clone());
        }
        let gpu = &self.inner.gpu;
        let checks = gpu.check_modules.lock().unwrap().clone();
        let k = std::iter::once(&gpu.module)
            .chain(gpu.module_sm90a.as_ref())
            .chain(checks.iter())
            .find_map(|m| m.load_function(name).ok())
            .ok_or_else(|| anyhow!("kernel `{name}` is in no loaded image (production{})", if checks.is_empty() { "" } else { ", check" }))?;
        f.insert(name.to_string(), k.clone());
        Ok(k)
    }

    /// Load the check image (the planted controls of `moss check`; its Hopper part where the
    /// `sm_90a` production kernels are loaded). Production never calls this.
    pub fn load_check_image(&self) -> Result<()> {
        let gpu = &self.inner.gpu;
        let mut mods = gpu.check_modules.lock().unwrap();
        if !mods.is_empty() {
            return Ok(());
        }
        let bins = super::FATBIN_CHECK.into_iter().chain(super::FATBIN_CHECK_SM90A.filter(|_| self.has_sm90a()));
        for bin in bins {
            let m = gpu
                .ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(bin.to_vec()))
                .map_err(|e| anyhow!("cannot load the check image on {}: {e:?}", gpu.name))?;
            mods.push(m);
        }
        Ok(())
    }

    /// Whether the Hopper-only kernels (`cuda/sm90a`) are loaded: a compute capability 9.0
    /// device and a build with them.
    pub fn has_sm90a(&self) -> bool {
        self.inner.gpu.module_sm90a.is_some()
    }

    /// Launch `name` on the stream with a 1-D grid.
    pub fn launch(&self, name: &str, grid: u32, block: u32, shmem: u32, args: &[Arg]) -> Result<()> {
        self.launch_2d(name, (grid, 1), block, shmem, args)
    }

    /// Launch `name` on the stream with a 2-D grid `(x, y)`; more than 48 KiB of dynamic shared
    /// memory is opted into per function.
    pub fn launch_2d(&self, name: &str, grid: (u32, u32), block: u32, shmem: u32, args: &[Arg]) -> Result<()> {
        let f = self.func(name)?;
        if shmem > 48 * 1024 {
            f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shmem as i32)
                .map_err(|e| anyhow!("{name}: {shmem} bytes of shared memory: {e:?}"))?;
        }
        let mut slots: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::P(v) => v as *const u64 as *mut c_void,
                Arg::L(v) => v as *const i64 as *mut c_void,
                Arg::I(v) => v as *const i32 as *mut c_void,
                Arg::F(v) => v as *const f32 as *mut c_void,
                Arg::Perm(v) => v as *const PermArgs as *mut c_void,
                Arg::Map(v) => &**v as *const sys::CUtensorMap as *mut c_void,
            })
            .collect();
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        // SAFETY: the kernel's C signature matches `args` (each call site is written against its
        // kernel in cuda/); every pointer is a live allocation of the size the kernel reads.
        unsafe {
            dr::launch_kernel(f.cu_function(), (grid.0.max(1), grid.1.max(1), 1), (block, 1, 1), shmem, s.cu_stream(), &mut slots)
        }
        .map_err(|e| anyhow!("launching {name}: {e:?}"))
    }

    /// Blocks for a grid-stride loop over `work` items, 256 threads each.
    pub fn grid_for(&self, work: usize) -> u32 {
        (work.div_ceil(256)).clamp(1, self.inner.sms as usize * 16) as u32
    }

    // ---- host <-> device ---------------------------------------------------------------------

    /// Copy `src` to device address `dst`: straight for small copies, else through two pinned
    /// chunks of [`STAGING_CHUNK`] bytes, alternating, each reused only after its copy finished.
    /// `drop_tail` is the planted bug of the staging gate (the last chunk is never copied).
    pub fn write_bytes(&self, dst: u64, src: &[u8], drop_tail: bool) -> Result<()> {
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        if src.len() < STAGING_MIN {
            // SAFETY: dst holds at least src.len() bytes; a pageable copy is staged by the
            // driver before this returns.
            return unsafe { dr::memcpy_htod_async(dst, src, s.cu_stream()) }.map_err(de("host to device copy"));
        }
        let mut guard = self.staging()?;
        let st = guard.as_mut().unwrap();
        let chunks: Vec<&[u8]> = src.chunks(STAGING_CHUNK).collect();
        let count = if drop_tail { chunks.len() - 1 } else { chunks.len() };
        for (i, c) in chunks.iter().take(count).enumerate() {
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
        let mut guard = self.inner.staging.lock().unwrap();
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
        self.write_bytes(out.ptr(), &to_bytes(&t.data, dtype), false)?;
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
        let drop_tail = match mode {
            Download::Pinned { drop_tail } if x.bytes() >= STAGING_MIN => drop_tail,
            _ => {
                let b = self.download_bytes(x)?;
                return Tensor::new(x.shape.clone(), from_bytes(&b, x.dtype));
            }
        };
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        let es = x.dtype.size();
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
        pipelined(total, DOWNLOAD_CHUNK, DOWNLOAD_SLOTS, drop_tail, issue, take)?;
        drop(guard);
        Tensor::new(x.shape.clone(), out)
    }

    // ---- casts and the parametrised op bodies (the gates call these with planted bugs) ---------

    /// `x` in `dtype` (shares the buffer when it already is).
    pub fn cast(&self, x: &CudaTensor, dtype: DType) -> Result<CudaTensor> {
        if x.dtype == dtype {
            return Ok(x.clone());
        }
        self.cast_with(x, dtype, "moss")
    }

    pub(crate) fn cast_with(&self, x: &CudaTensor, dtype: DType, prefix: &str) -> Result<CudaTensor> {
        let out = self.alloc(dtype, &x.shape)?;
        let n = x.numel();
        let name = format!("{prefix}_cast_{}_{}", x.dtype.name(), dtype.name());
        self.launch(&name, self.grid_for(n / 8 + 1), 256, 0, &[kernel_ptr(&out), kernel_ptr(x), Arg::L(n as i64)])?;
        Ok(out)
    }

    pub(crate) fn linear_with(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        b: Option<&CudaTensor>,
        bug: LinearBug,
    ) -> Result<CudaTensor> {
        ensure!(w.shape.len() == 2, "linear: weight must be 2-D, got {:?}", w.shape);
        let (n, k) = (w.shape[0], w.shape[1]);
        ensure!(x.last_dim() == k, "linear: input {:?} does not match weight {:?}", x.shape, w.shape);
        if let Some(b) = b {
            ensure!(b.numel() == n, "linear: bias {:?} for {n} outputs", b.shape);
        }
        let dt = w.dtype;
        let x = self.cast(x, dt)?;
        let b = b.map(|b| self.cast(b, dt)).transpose()?;
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = n;
        let out = self.alloc(dt, &shape)?;
        let rows = x.rows();
        if rows > 0 && n > 0 {
            self.inner.blas.linear(
                &self.inner.gpu.stream,
                dt,
                rows,
                n,
                k,
                x.ptr(),
                w.ptr(),
                b.as_ref().map(|b| b.ptr()),
                out.ptr(),
                bug,
            )?;
        }
        Ok(out)
    }

    pub(crate) fn binary_with(&self, op: &str, a: &CudaTensor, b: &CudaTensor, prefix: &str) -> Result<CudaTensor> {
        ensure!(
            a.shape.ends_with(&b.shape) && b.numel() > 0,
            "{op}: cannot broadcast {:?} onto {:?}",
            b.shape,
            a.shape
        );
        let out = self.alloc(a.dtype, &a.shape)?;
        let (n, nb) = (a.numel(), b.numel());
        let vec = n % 8 == 0 && nb % 8 == 0;
        let name = format!("{prefix}_{op}_{}_{}", a.dtype.name(), b.dtype.name());
        let work = if vec { n / 8 } else { n };
        self.launch(
            &name,
            self.grid_for(work),
            256,
            0,
            &[kernel_ptr(&out), kernel_ptr(a), kernel_ptr(b), Arg::L(n as i64), Arg::L(nb as i64), Arg::I(vec as i32)],
        )?;
        Ok(out)
    }

    pub(crate) fn unary_with(&self, op: &str, x: &CudaTensor, prefix: &str) -> Result<CudaTensor> {
        let out = self.alloc(x.dtype, &x.shape)?;
        let n = x.numel();
        let name = format!("{prefix}_{op}_{}", x.dtype.name());
        self.launch(&name, self.grid_for(n / 8 + 1), 256, 0, &[kernel_ptr(&out), kernel_ptr(x), Arg::L(n as i64)])?;
        Ok(out)
    }

    /// `kernel` is `moss_rms_norm` or one of its planted variants.
    pub(crate) fn rms_norm_with(
        &self,
        x: &CudaTensor,
        w: Option<&CudaTensor>,
        eps: f64,
        one_plus: bool,
        kernel: &str,
    ) -> Result<CudaTensor> {
        let d = x.last_dim();
        if let Some(w) = w {
            ensure!(w.numel() == d, "rms_norm: weight {:?} for width {d}", w.shape);
        }
        ensure!(d > 0 && d < i32::MAX as usize, "rms_norm: width {d}");
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = x.rows();
        let wt = w.map_or(x.dtype, |w| w.dtype);
        let name = format!("{kernel}_{}_{}", x.dtype.name(), wt.name());
        let warps = 8;
        self.launch(
            &name,
            rows.div_ceil(warps) as u32,
            (warps * 32) as u32,
            0,
            &[
                kernel_ptr(&out),
                kernel_ptr(x),
                Arg::P(w.map_or(0, |w| w.ptr())),
                Arg::L(rows as i64),
                Arg::I(d as i32),
                Arg::F(eps as f32),
                Arg::I(one_plus as i32),
            ],
        )?;
        Ok(out)
    }

    /// Strided 2-D copy between tensors of one dtype, in elements (see `moss_copy2d_*`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy2d(
        &self,
        dst: &CudaTensor,
        src: &CudaTensor,
        rows: usize,
        width: usize,
        src_stride: usize,
        src_off: usize,
        dst_stride: usize,
        dst_off: usize,
        prefix: &str,
    ) -> Result<()> {
        if rows == 0 || width == 0 {
            return Ok(());
        }
        let es = src.dtype.size();
        let all = [width, src_stride, src_off, dst_stride, dst_off].map(|v| v * es);
        let unit = [16usize, 8, 4, 2].into_iter().find(|u| all.iter().all(|v| v % u == 0)).unwrap_or(2);
        let [w, ss, so, ds, dof] = all.map(|v| (v / unit) as i64);
        let name = format!("{prefix}_copy2d_u{unit}");
        self.launch(
            &name,
            self.grid_for(rows * w as usize),
            256,
            0,
            &[
                kernel_ptr(dst),
                kernel_ptr(src),
                Arg::L(rows as i64),
                Arg::L(w),
                Arg::L(ss),
                Arg::L(so),
                Arg::L(ds),
                Arg::L(dof),
            ],
        )
    }

    pub(crate) fn cat_with(&self, xs: &[&CudaTensor], dim: usize, prefix: &str) -> Result<CudaTensor> {
        let Some(first) = xs.first() else { bail!("cat of nothing") };
        let mut shape = first.shape.clone();
        ensure!(dim < shape.len(), "cat: dim {dim} of {:?}", shape);
        for x in &xs[1..] {
            ensure!(
                x.shape.len() == shape.len() && x.shape.iter().enumerate().all(|(i, &s)| i == dim || s == shape[i]),
                "cat: {:?} and {:?}",
                first.shape,
                x.shape
            );
            ensure!(x.dtype == first.dtype, "cat: {:?} and {:?} tensors", first.dtype, x.dtype);
        }
        shape[dim] = xs.iter().map(|x| x.shape[dim]).sum();
        let out = self.alloc(first.dtype, &shape)?;
        let outer: usize = shape[..dim].iter().product();
        let inner: usize = shape[dim + 1..].iter().product();
        let total = shape[dim] * inner;
        let mut off = 0;
        for x in xs {
            let w = x.shape[dim] * inner;
            self.copy2d(&out, x, outer, w, w, 0, total, off, prefix)?;
            off += w;
        }
        Ok(out)
    }

    pub(crate) fn permute_with(&self, x: &CudaTensor, perm: &[usize], prefix: &str) -> Result<CudaTensor> {
        let nd = x.shape.len();
        ensure!(perm.len() == nd && (0..nd).all(|i| perm.contains(&i)), "permute {perm:?} of {:?}", x.shape);
        ensure!(nd <= 6, "permute: at most 6 dims, got {nd}");
        let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
        let out = self.alloc(x.dtype, &shape)?;
        if x.numel() == 0 {
            return Ok(out);
        }
        // Units: a last dim that stays last moves as whole 16/8/4-byte pieces where it can.
        let es = x.dtype.size();
        let mut dims = x.shape.clone();
        let mut unit = es;
        if nd > 0 && perm[nd - 1] == nd - 1 {
            let row = dims[nd - 1] * es;
            if let Some(u) = [16usize, 8, 4].into_iter().find(|u| row.is_multiple_of(*u) && *u >= es) {
                unit = u;
                dims[nd - 1] = row / u;
            }
        }
        let mut strides = vec![1i64; nd];
        for i in (0..nd.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * dims[i + 1] as i64;
        }
        let mut p = PermArgs { out_dims: [1; 6], src_strides: [0; 6], nd: nd as i32 };
        for k in 0..nd {
            p.out_dims[k] = dims[perm[k]] as i64;
            p.src_strides[k] = strides[perm[k]];
        }
        let n: usize = dims.iter().product();
        let name = format!("{prefix}_permute_u{unit}");
        self.launch(&name, self.grid_for(n), 256, 0, &[kernel_ptr(&out), kernel_ptr(x), Arg::Perm(p), Arg::L(n as i64)])?;
        Ok(out)
    }

    /// Device bytes a checkpoint tensor takes once loaded at this precision.
    pub fn loaded_bytes(&self, dtype: Dtype, numel: usize) -> usize {
        loaded_dtype(dtype, self.precision).size() * numel
    }
}

/// The device dtype a checkpoint tensor is loaded as.
pub fn loaded_dtype(stored: Dtype, p: Precision) -> DType {
    match (stored, p) {
        (Dtype::BF16, Precision::Bf16) => DType::BF16,
        _ => DType::F32,
    }
}

pub const GIB: f64 = (1u64 << 30) as f64;

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

/// `data` as little-endian bytes of `dtype` (bf16 rounds to nearest even), on all cores.
pub fn to_bytes(data: &[f32], dtype: DType) -> Vec<u8> {
    let es = dtype.size();
    let mut bytes = vec![0u8; data.len() * es];
    par_chunks(&mut bytes, CONVERT_CHUNK * es, |i, out| {
        let src = &data[i * CONVERT_CHUNK..][..out.len() / es];
        match dtype {
            DType::F32 => out.chunks_exact_mut(4).zip(src).for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes())),
            DType::BF16 => out
                .chunks_exact_mut(2)
                .zip(src)
                .for_each(|(o, &v)| o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
        }
    });
    bytes
}

/// The schedule of a chunked, slotted copy of `total` bytes: chunk `i` (bytes `i·chunk ..`,
/// the last one ragged) goes through slot `i % slots`. `issue(i, slot, off, len)` starts the
/// copy of chunk `i` into its slot (asynchronous: it may land any time before the matching
/// `take`); `take(i, slot, off, len)` waits for it and consumes the slot. A slot is issued again
/// only after its previous chunk was taken. `drop_tail` (the planted bug) never copies the last
/// chunk. Host-emulated in the tests (`pipelined_*`).
pub fn pipelined(
    total: usize,
    chunk: usize,
    slots: usize,
    drop_tail: bool,
    mut issue: impl FnMut(usize, usize, usize, usize) -> Result<()>,
    mut take: impl FnMut(usize, usize, usize, usize) -> Result<()>,
) -> Result<()> {
    ensure!(chunk > 0 && slots > 0, "pipelined: chunk {chunk}, slots {slots}");
    let chunks = total.div_ceil(chunk);
    let count = if drop_tail { chunks.saturating_sub(1) } else { chunks };
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
            DType::F32 => out
                .iter_mut()
                .zip(src.chunks_exact(4))
                .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::BF16 => out
                .iter_mut()
                .zip(src.chunks_exact(2))
                .for_each(|(o, c)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        }
    });
}

impl Backend for Cuda {
    fn release_cached(&self) -> Result<()> {
        self.trim_pool()
    }

    type T = CudaTensor;

    fn name(&self) -> String {
        let g = &self.inner.gpu;
        format!("cuda:{} {} ({:?})", g.ctx.ordinal(), g.name, self.precision)
    }

    fn upload(&self, t: &Tensor) -> Result<CudaTensor> {
        self.upload_as(t, self.act_dtype())
    }

    fn download(&self, x: &CudaTensor) -> Result<Tensor> {
        self.download_with(x, Download::Pinned { drop_tail: false })
    }

    fn dims(&self, x: &CudaTensor) -> Vec<usize> {
        x.shape.clone()
    }

    fn load(&self, c: &Component, name: &str) -> Result<CudaTensor> {
        self.load_with(c, name, false)
    }

    fn linear(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>) -> Result<CudaTensor> {
        self.linear_with(x, w, b, LinearBug::None)
    }
    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.binary_with("add", a, b, "moss")
    }
    fn mul(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.binary_with("mul", a, b, "moss")
    }
    fn silu(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.unary_with("silu", x, "moss")
    }
    fn sigmoid(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.unary_with("sigmoid", x, "moss")
    }
    fn rms_norm(&self, x: &CudaTensor, w: Option<&CudaTensor>, eps: f64, one_plus: bool) -> Result<CudaTensor> {
        self.rms_norm_with(x, w, eps, one_plus, "moss_rms_norm")
    }
    fn reshape(&self, x: &CudaTensor, shape: &[usize]) -> Result<CudaTensor> {
        ensure!(
            shape.iter().product::<usize>() == x.numel(),
            "reshape {:?} to {shape:?}: {} values",
            x.shape,
            x.numel()
        );
        Ok(CudaTensor { buf: x.buf.clone(), shape: shape.to_vec(), dtype: x.dtype })
    }
    fn narrow(&self, x: &CudaTensor, dim: usize, start: usize, len: usize) -> Result<CudaTensor> {
        self.narrow_with(x, dim, start, len, "moss")
    }
    fn cat(&self, xs: &[&CudaTensor], dim: usize) -> Result<CudaTensor> {
        self.cat_with(xs, dim, "moss")
    }
    fn permute(&self, x: &CudaTensor, perm: &[usize]) -> Result<CudaTensor> {
        self.permute_with(x, perm, "moss")
    }
}

impl Cuda {
    /// `load`; `shift` is the planted bug of the load gate (bytes written one element late).
    pub(crate) fn load_with(&self, c: &Component, name: &str, shift: bool) -> Result<CudaTensor> {
        let info = c.info(name)?;
        let shape = info.shape.clone();
        match info.dtype {
            Dtype::BF16 | Dtype::F32 => {
                let stored = if info.dtype == Dtype::BF16 { DType::BF16 } else { DType::F32 };
                let t = self.alloc(stored, &shape)?;
                let bytes = c.store.bytes(info);
                if shift {
                    let es = stored.size().min(bytes.len());
                    self.write_bytes(t.ptr() + es as u64, &bytes[..bytes.len() - es], false)?;
                } else {
                    self.write_bytes(t.ptr(), bytes, false)?;
                }
                self.cast(&t, loaded_dtype(info.dtype, self.precision))
            }
            _ => {
                let (shape, data) = c.f32(name)?;
                self.upload_as(&Tensor::new(shape, data)?, DType::F32)
            }
        }
    }

    pub(crate) fn narrow_with(&self, x: &CudaTensor, dim: usize, start: usize, len: usize, prefix: &str) -> Result<CudaTensor> {
        ensure!(dim < x.shape.len() && start + len <= x.shape[dim], "narrow {dim}:{start}+{len} of {:?}", x.shape);
        let outer: usize = x.shape[..dim].iter().product();
        let inner: usize = x.shape[dim + 1..].iter().product();
        let mut shape = x.shape.clone();
        shape[dim] = len;
        let out = self.alloc(x.dtype, &shape)?;
        let w = len * inner;
        self.copy2d(&out, x, outer, w, x.shape[dim] * inner, start * inner, w, 0, prefix)?;
        Ok(out)
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaTensor({:?} {:?}, {} bytes)", self.dtype, self.shape, self.buf.bytes)
    }
}

/// A 2-D TMA tensor map (the Hopper kernels: DiT flash attention, the delta rule's state pass):
/// `cols` x `rows` elements of `dt` at `ptr`, row stride `ld` elements, boxes of `bx` elements
/// (128 bytes) x `by` rows, 128-byte swizzle, zeros past the edges.
pub fn tensor_map_2d(ptr: u64, dt: DType, cols: usize, rows: usize, ld: usize, bx: u32, by: u32) -> Result<sys::CUtensorMap> {
    let (ty, es) = match dt {
        DType::BF16 => (sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2),
        DType::F32 => (sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4),
    };
    ensure!(ptr % 16 == 0 && (ld * es) % 16 == 0 && cols <= ld && bx as usize * es == 128, "tensor map: address / stride {ld} / {cols} columns / box {bx}");
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [(ld * es) as u64];
    let boxes: [u32; 2] = [bx, by];
    let elem: [u32; 2] = [1, 1];
    // SAFETY: every pointer is to a local array of the rank the call is told; the map is written only.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            ty,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuTensorMapEncodeTiled: {r:?}");
    Ok(map)
}
