//! The CUDA implementation of the generic [`Backend`] ops: device tensors with a dtype (bf16 or
//! f32) and a shape, one stream, cuBLASLt for `linear`, `cuda/common/tensor_ops.cu` for everything else.
//!
//! Dtype rules (every op computes in fp32 and rounds once into its output):
//! - `upload` gives the precision's activation dtype (bf16, or f32 with `--precision fp32`);
//!   [`Cuda::upload_as`] picks one explicitly.
//! - `load` keeps a bf16 checkpoint tensor bf16 (f32 with `--precision fp32`), an f32 one f32 and
//!   a float8 e4m3 one e4m3 (the codes, one byte each; `download` gives their values).
//! - `linear` computes in the weight's dtype (x and the bias are cast to it if they differ) and
//!   returns that dtype. Elementwise ops and `rms_norm` return the dtype of their first input,
//!   except the DiT's norms over its f32 residual stream, which write the activation dtype
//!   (`Cuda::normed_dtype`), and `DitOps::linear_f32`, which keeps its product in f32.
//! - `cat` needs one dtype; `reshape` shares the buffer; `narrow`, `cat`, `permute` copy.

use super::Gpu;
use crate::blas::Blas;
use crate::kernels;
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{result as dr, sys, CudaSlice, DevicePtr};
use moss_core::backend::Backend;
use moss_core::checkpoint::{Component, Dtype};
use moss_core::lora::{plan::MergeClock, Term};
use moss_core::options::Precision;
use moss_core::tensor::Tensor;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

mod fp8;
mod int8;
mod launch;
pub mod mover;
mod quant;
pub(crate) mod ring;
mod tensor_ops;
mod tma;
mod transfer;
mod weights;

pub use tma::tensor_map_2d;
use transfer::Transfers;
pub use transfer::{convert_into, from_bytes, par_chunks, pipelined, to_bytes, Download, DOWNLOAD_CHUNK, DOWNLOAD_SLOTS, STAGING_CHUNK};
pub use weights::DeviceMem;
use weights::Slots;

/// Element type of a device tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F32,
    /// float8 e4m3 codes ([`moss_core::fp8`]): the weights and activations of the fp8 linears.
    F8E4M3,
    /// A quantized matrix kept as stored (ggml blocks, int8 codes and scales, bf16 / f32 parts of
    /// its stack): its bytes laid out as [`CudaTensor::kept`] says; each product dequantizes it
    /// first ([`Cuda::dense`], `ops/quant.rs`).
    Q,
    /// int8 codes (one two's-complement byte; [`moss_core::int8`]): the weights and activations
    /// of the int8 linears.
    I8,
    /// int32: the exact sums of an int8 product (cuBLASLt's IMMA output).
    I32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F8E4M3 | DType::Q | DType::I8 => 1,
        }
    }
    /// The suffix of kernel names (`moss_add_bf16_f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F8E4M3 => "f8e4m3",
            DType::Q => "quantized",
            DType::I8 => "i8",
            DType::I32 => "i32",
        }
    }
    /// The activation dtype of a precision: f32 at fp32, else bf16 (the fp8 linears' activations too).
    pub fn of(p: Precision) -> DType {
        match p {
            Precision::Fp32 => DType::F32,
            _ => DType::BF16,
        }
    }
}

/// What owns a tensor's device memory.
enum Mem {
    /// A stream-ordered allocation of the compute stream (activations).
    Pool(#[allow(dead_code)] CudaSlice<u8>),
    /// Weight memory (its own, or a streamed block slot it is part of).
    Device(#[allow(dead_code)] Arc<DeviceMem>),
}

/// One device allocation (freed on drop).
pub struct Buf {
    #[allow(dead_code)]
    mem: Mem,
    ptr: u64,
    bytes: usize,
}

/// A tensor resident on the GPU. Cloning shares the buffer.
#[derive(Clone)]
pub struct CudaTensor {
    buf: Arc<Buf>,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// [`DType::Q`]: how the bytes hold the matrix.
    pub kept: Option<Arc<moss_core::checkpoint::kept::Layout>>,
}

impl CudaTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        match &self.kept {
            Some(l) => l.bytes,
            None => self.numel() * self.dtype.size(),
        }
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

/// The backend's state on one device, shared by every view ([`Cuda`] clones, other precisions,
/// batches, images), in parts.
struct Inner {
    gpu: Gpu,
    blas: Blas,
    /// The kernels looked up so far.
    kernels: launch::Kernels,
    /// Host <-> device machinery made on first use: staging buffers, the weight mover, the
    /// LoRA merge's upload ring.
    transfers: Transfers,
    /// The streamed blocks' reusable device memory.
    slots: Slots,
    /// The VAE decode's state (`crate::vae::state`).
    vae: crate::vae::state::VaeState,
    /// Fill new allocations with 0xFF ([`Cuda::set_poison`]).
    poison: AtomicBool,
    /// Streaming multiprocessors (at least 1).
    sms: u32,
    /// Device bytes held outside our allocations: the context, the kernel modules, the cuBLASLt
    /// workspace (measured when the backend was made; see [`Cuda::process_overhead`]).
    overhead: u64,
}

/// The CUDA backend on one GPU. Clones share the device state; [`Cuda::with_precision`] gives a
/// view with another precision, [`Cuda::with_image`] one launching other kernels (`moss check`).
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
    pub precision: Precision,
    /// Loads recorded by a batch view ([`Cuda::batch`]), read at its end.
    batch: Option<Arc<Mutex<weights::Batch>>>,
    /// The kernels this view launches.
    image: Arc<crate::kernels::Image>,
}

fn de(what: &str) -> impl Fn(dr::DriverError) -> anyhow::Error + '_ {
    move |e| anyhow!("CUDA {what}: {e:?}")
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
                dr::mem_pool::set_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut keep as *mut u64 as *mut c_void)
                    .map_err(de("memory pool threshold"))?;
            }
        }
        let cc_attr = |a| gpu.ctx.attribute(a).map_err(de("attribute"));
        let cc = (
            cc_attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc_attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let blas = Blas::new(&gpu.stream, cc)?;
        // What the modules and the workspace took beyond the bare context (this process alone
        // allocates on this context, so the drop in free memory is ours).
        let (free_now, _) = gpu.mem_info()?;
        let overhead = gpu.context_bytes + gpu.free_at_open.saturating_sub(free_now as u64);
        let sms = gpu.ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(de("attribute"))?.max(1) as u32;
        let inner = Inner {
            gpu,
            blas,
            kernels: Default::default(),
            transfers: Default::default(),
            slots: Default::default(),
            vae: Default::default(),
            poison: AtomicBool::new(false),
            sms,
            overhead,
        };
        Ok(Cuda { inner: Arc::new(inner), precision, batch: None, image: Default::default() })
    }

    pub fn with_precision(&self, precision: Precision) -> Cuda {
        Cuda { precision, ..self.clone() }
    }

    /// The VAE decode's state.
    pub(crate) fn vae_state(&self) -> &crate::vae::state::VaeState {
        &self.inner.vae
    }

    /// Device bytes this process holds outside its allocations (context, kernel modules,
    /// cuBLASLt workspace): what `nvidia-smi` shows for a process that has allocated nothing,
    /// taken off the `--max-vram` cap before the networks are placed.
    pub fn process_overhead(&self) -> u64 {
        self.inner.overhead
    }

    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
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
            anyhow!("out of GPU memory allocating {:.2} GiB ({:.2} GiB free): {e:?}", bytes as f64 / GIB, free as f64 / GIB)
        })?;
        let ptr = slice.device_ptr(s).0;
        if self.inner.poison.load(Ordering::Relaxed) {
            // SAFETY: ptr/bytes is the allocation just made.
            unsafe { dr::memset_d8_async(ptr, 0xff, bytes, s.cu_stream()) }.map_err(de("memset"))?;
        }
        Ok(CudaTensor { buf: Arc::new(Buf { mem: Mem::Pool(slice), ptr, bytes }), shape: shape.to_vec(), dtype, kept: None })
    }

    /// The device's streaming multiprocessors (read when the device opened; at least 1).
    pub fn sm_count(&self) -> usize {
        self.inner.sms as usize
    }

    /// Blocks for a grid-stride loop over `work` items, 256 threads each.
    pub fn grid_for(&self, work: usize) -> u32 {
        (work.div_ceil(256)).clamp(1, self.sm_count() * 16) as u32
    }

    // ---- host <-> device ---------------------------------------------------------------------

    /// Device bytes a checkpoint tensor takes once loaded at this precision.
    pub fn loaded_bytes(&self, dtype: Dtype, numel: usize) -> usize {
        loaded_dtype(dtype, self.precision).size() * numel
    }
}

/// The device dtype a checkpoint tensor is loaded as (a quantized one dequantized: as bf16 would be;
/// kept quantized, a matrix is [`DType::Q`] and dequantizes to this dtype).
pub fn loaded_dtype(stored: Dtype, p: Precision) -> DType {
    match (stored, p) {
        (Dtype::F8E4M3, _) => DType::F8E4M3,
        (Dtype::BF16 | Dtype::Ggml(_) | Dtype::I8 | Dtype::W4a8 { .. }, p) if p != Precision::Fp32 => DType::BF16,
        _ => DType::F32,
    }
}

/// The device dtype a tensor of `c` stored as `stored` is held in: [`loaded_dtype`], but a
/// single-file component's floats load as the folder's bf16 would (GGUF converters store 1-D
/// tensors f32 and some matrices f16 where the MOSS-Image folder has bf16; held wider they would
/// meet bf16 neighbours in one op, and the picture would differ from the folder's).
pub fn held_dtype(c: &Component, stored: Dtype, p: Precision) -> DType {
    match stored {
        Dtype::BF16 | Dtype::F16 | Dtype::F32 if c.store.single_file => loaded_dtype(Dtype::BF16, p),
        d => loaded_dtype(d, p),
    }
}

pub const GIB: f64 = (1u64 << 30) as f64;

impl Backend for Cuda {
    fn release_cached(&self) -> Result<()> {
        // A finished stage's streamed-block slots go too (the next stream allocates them again),
        // and the VAE split decode's pinned host memory once no kept picture holds it.
        self.release_slots();
        self.vae_state().io.lock().unwrap().take();
        self.inner.transfers.ring.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.trim_pool()
    }

    type T = CudaTensor;

    fn name(&self) -> String {
        let g = &self.inner.gpu;
        format!("cuda:{} {} ({:?})", g.ctx.ordinal(), g.name, self.precision)
    }

    fn upload(&self, t: &Tensor) -> Result<CudaTensor> {
        self.prof("upload", || self.upload_as(t, self.act_dtype()))
    }
    fn upload_f32(&self, t: &Tensor) -> Result<CudaTensor> {
        self.prof("upload", || self.upload_as(t, DType::F32))
    }

    fn download(&self, x: &CudaTensor) -> Result<Tensor> {
        if x.kept.is_some() {
            return self.download(&self.dequantize(x, DType::F32)?);
        }
        self.prof("download", || self.download_with(x, Download::Pinned))
    }

    fn dims(&self, x: &CudaTensor) -> Vec<usize> {
        x.shape.clone()
    }

    fn load(&self, c: &Component, name: &str) -> Result<CudaTensor> {
        self.prof("load", || self.load_stacked(c, &[name]))
    }
    fn merge_lora(&self, w: CudaTensor, stored: Dtype, terms: &[Term], clock: &MergeClock) -> Result<CudaTensor> {
        let want = match stored {
            Dtype::BF16 => DType::BF16,
            Dtype::F32 => DType::F32,
            d => anyhow::bail!("the GPU merges LoRAs into bf16 and f32 weights only, this one is stored as {}", d.name()),
        };
        ensure!(w.kept.is_none(), "LoRA merge into a quantized matrix kept as stored (those merge on the host)");
        ensure!(w.dtype == want, "LoRA merge: the weight is {} on the device, stored as {}", w.dtype.name(), stored.name());
        self.merge_lora_timed(w, terms, clock)
    }
    fn load_rows(&self, c: &Component, names: &[&str]) -> Result<CudaTensor> {
        self.prof("load", || self.load_stacked(c, names))
    }
    fn load_batch<R>(&self, f: impl FnOnce(&Self) -> Result<R>) -> Result<R> {
        Ok(self.batch(f)?.0)
    }
    fn load_behind<R>(&self, f: impl FnOnce(&Self) -> Result<R>) -> Result<moss_core::backend::Behind<R>> {
        Ok(self.batch_behind(f)?.0)
    }
    fn loads_behind(&self) -> bool {
        true
    }
    fn fetch(&self, c: &Component, slot: usize, groups: &[Vec<String>]) -> Result<moss_core::backend::Behind<Vec<CudaTensor>>> {
        self.prof("fetch block weights", || self.fetch_into_slot(c, slot, groups))
    }
    fn free_slot(&self, slot: usize) -> Result<()> {
        self.slot_read_until_now(slot)
    }

    fn linear(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>) -> Result<CudaTensor> {
        // named by its shape (rows x in x out): the DiT's linears tell apart by it
        let name = || format!("linear {}x{}x{}", x.rows(), w.shape.get(1).unwrap_or(&0), w.shape.first().unwrap_or(&0));
        self.timed_op(name, || self.linear_dense(x, &*self.dense(w)?, b))
    }
    fn quantize_rows(&self, w: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        ensure!(w.shape.len() == 2, "quantize_rows: weight must be 2-D, got {:?}", w.shape);
        self.prof("quantize_rows", || self.quantize_fp8(&*self.dense(w)?))
    }
    fn linear_fp8(&self, x: &CudaTensor, q: &CudaTensor, scale: &CudaTensor) -> Result<CudaTensor> {
        self.linear_fp8_timed(x, q, scale)
    }
    fn linear_fp8_quantized(&self, xq: &CudaTensor, xs: &CudaTensor, q: &CudaTensor, s: &CudaTensor) -> Result<CudaTensor> {
        self.linear_fp8_quantized_timed(xq, xs, q, s)
    }
    fn quantize_rows_int8(&self, x: &CudaTensor, convrot: Option<usize>) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("quantize_rows_int8", || self.quantize_int8(x, convrot))
    }
    fn upload_int8(&self, shape: &[usize], codes: &[u8]) -> Result<CudaTensor> {
        ensure!(shape.iter().product::<usize>() == codes.len(), "upload_int8: {} codes for {shape:?}", codes.len());
        self.prof("upload", || {
            let t = self.alloc(DType::I8, shape)?;
            self.write_bytes(t.ptr(), codes)?;
            Ok(t)
        })
    }
    fn keeps_quantized(&self) -> bool {
        true
    }
    fn kept_int8_codes(&self, w: &CudaTensor) -> Result<CudaTensor> {
        let l = w.layout().ok_or_else(|| anyhow::anyhow!("kept_int8_codes: {w:?} is not a kept matrix"))?;
        ensure!(l.int8_codes().is_some(), "kept_int8_codes: a stack of {} is not one int8 matrix", l.formats());
        Ok(CudaTensor { buf: w.buf.clone(), shape: vec![l.rows(), l.k], dtype: DType::I8, kept: None })
    }
    fn linear_int8_quantized(&self, xq: &CudaTensor, xs: &CudaTensor, q: &CudaTensor, s: &CudaTensor) -> Result<CudaTensor> {
        self.linear_int8_quantized_timed(xq, xs, q, s)
    }
    fn linear_int8(&self, x: &CudaTensor, q: &CudaTensor, s: &CudaTensor, convrot: Option<usize>) -> Result<CudaTensor> {
        self.linear_int8_timed(x, q, s, convrot)
    }
    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.prof("add", || self.binary(&kernels::ADD, "add", a, b))
    }
    fn mul(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.prof("mul", || self.binary(&kernels::MUL, "mul", a, b))
    }
    fn silu(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.prof("silu", || self.unary(&kernels::SILU, x))
    }
    fn sigmoid(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.prof("sigmoid", || self.unary(&kernels::SIGMOID, x))
    }
    fn rms_norm(&self, x: &CudaTensor, w: Option<&CudaTensor>, eps: f64, one_plus: bool) -> Result<CudaTensor> {
        self.prof("rms_norm", || self.rms_norm_rows(x, w, eps, one_plus))
    }
    fn reshape(&self, x: &CudaTensor, shape: &[usize]) -> Result<CudaTensor> {
        ensure!(shape.iter().product::<usize>() == x.numel(), "reshape {:?} to {shape:?}: {} values", x.shape, x.numel());
        ensure!(x.kept.is_none() || shape == x.shape, "reshape of a quantized matrix {:?} to {shape:?}", x.shape);
        Ok(CudaTensor { buf: x.buf.clone(), shape: shape.to_vec(), dtype: x.dtype, kept: x.kept.clone() })
    }
    fn narrow(&self, x: &CudaTensor, dim: usize, start: usize, len: usize) -> Result<CudaTensor> {
        self.prof("narrow", || self.narrow_copy(x, dim, start, len))
    }
    fn cat(&self, xs: &[&CudaTensor], dim: usize) -> Result<CudaTensor> {
        self.prof("cat", || self.cat_copies(xs, dim))
    }
    fn permute(&self, x: &CudaTensor, perm: &[usize]) -> Result<CudaTensor> {
        self.prof("permute", || self.permute_copy(x, perm))
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaTensor({:?} {:?}, {} bytes)", self.dtype, self.shape, self.buf.bytes)
    }
}

#[cfg(test)]
mod held_dtype_tests {
    use super::{held_dtype, DType};
    use moss_core::checkpoint::{single_file, Component, Dtype, TensorStore};
    use moss_core::options::Precision;
    use std::path::Path;

    fn component(store: TensorStore) -> Component {
        Component { name: "transformer", store, prefix: String::new(), loras: Default::default() }
    }

    /// The golden mixed GGUF stores the biases and norms f32 and `text_embedder.proj.weight` f16
    /// where the folder has bf16: held as the folder's tensors are, so no op meets two widths.
    #[test]
    fn a_single_files_floats_are_held_as_the_folders_bf16() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let gguf = component(single_file::open(&root.join("golden/quant/tiny-b-mixed.gguf"), "transformer").unwrap());
        let folder = component(TensorStore::open(&root.join("golden/tiny-b/transformer")).unwrap());
        for (name, stored) in [("video_embedder.bias", Dtype::F32), ("text_embedder.proj.weight", Dtype::F16)] {
            let info = gguf.store.tensors.get(name).unwrap();
            assert_eq!(info.dtype, stored, "{name}");
            let there = folder.store.tensors.get(name).unwrap().dtype;
            for p in [Precision::Bf16, Precision::Fp8, Precision::Int8, Precision::Fp32] {
                assert_eq!(held_dtype(&gguf, info.dtype, p), held_dtype(&folder, there, p), "{name} at {p:?}");
            }
        }
        assert_eq!(held_dtype(&gguf, Dtype::F32, Precision::Bf16), DType::BF16);
        // a folder's own f32 tensors stay f32 (the VAE, fp32 norms)
        assert_eq!(held_dtype(&folder, Dtype::F32, Precision::Bf16), DType::F32);
    }
}
