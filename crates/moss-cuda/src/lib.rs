//! The CUDA backend: device setup, the embedded kernels, the generic ops ([`Cuda`], in `ops`),
//! cuBLASLt (`blas`), the memory planner (`plan`) and the kernel gates of `moss check`
//! (`gates`), and the DiT's fused ops (`dit`). The encoder's and the VAE's follow.

pub mod blas;
pub mod check;
pub mod contract;
pub mod dit;
pub mod encoder;
pub mod gemm_pins;
pub mod kernels;
pub mod launch;
pub mod lora;
pub mod nccl;
pub mod ops;
pub mod plan;
pub mod profile;
pub mod select;
pub mod vae;

pub use ops::{Cuda, CudaTensor, DType};
pub use plan::MemoryPlan;

use anyhow::{anyhow, bail, Result};
use std::sync::Arc;

/// The fatbin of every `cuda/*.cu`, compiled by build.rs (absent when nvcc was not found).
#[cfg(moss_kernels)]
pub const FATBIN: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/moss_kernels.fatbin")));
#[cfg(not(moss_kernels))]
pub const FATBIN: Option<&[u8]> = None;

/// The Hopper-only kernels of `cuda/*/sm90a/*.cu` (wgmma), `sm_90a` machine code only; loaded on
/// compute capability 9.0 alone (absent when build.rs built no sm_90 code).
#[cfg(moss_sm90a)]
pub const FATBIN_SM90A: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/moss_kernels_sm90a.fatbin")));
#[cfg(not(moss_sm90a))]
pub const FATBIN_SM90A: Option<&[u8]> = None;

/// The check image (`moss check`'s planted controls, cuda/common/common.cuh `MOSS_CHECK_IMAGE`): the
/// portable one and the Hopper one. Loaded by [`Cuda::load_check_image`] only.
#[cfg(moss_kernels)]
pub const FATBIN_CHECK: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/moss_check.fatbin")));
#[cfg(not(moss_kernels))]
pub const FATBIN_CHECK: Option<&[u8]> = None;
#[cfg(moss_sm90a)]
pub const FATBIN_CHECK_SM90A: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/moss_check_sm90a.fatbin")));
#[cfg(not(moss_sm90a))]
pub const FATBIN_CHECK_SM90A: Option<&[u8]> = None;

/// The git revision the kernels (and the binary) were built from, or "unknown" outside a checkout
/// (set by the root build.rs, which builds this crate).
pub const GIT_REV: &str = env!("MOSS_GIT_REV");

/// The SMs the fatbin holds machine code for.
pub fn kernel_archs() -> Option<&'static str> {
    #[cfg(moss_kernels)]
    return Some(env!("MOSS_KERNEL_ARCHS"));
    #[cfg(not(moss_kernels))]
    None
}

/// One GPU: its context, the one stream we use, and our kernels.
pub struct Gpu {
    pub ctx: Arc<cudarc::driver::CudaContext>,
    pub stream: Arc<cudarc::driver::CudaStream>,
    pub module: Arc<cudarc::driver::CudaModule>,
    /// [`FATBIN_SM90A`], on a compute capability 9.0 device only.
    pub module_sm90a: Option<Arc<cudarc::driver::CudaModule>>,
    /// The check image's modules, once `moss check` loaded them ([`Cuda::load_check_image`]).
    pub check_modules: std::sync::Mutex<Vec<Arc<cudarc::driver::CudaModule>>>,
    pub name: String,
    pub compute_capability: (i32, i32),
    /// Device bytes the context took when made (total less free right after; at most
    /// [`CONTEXT_BOUND`], so another process's memory is not taken for ours).
    pub context_bytes: u64,
    /// Free device bytes right after the context was made (before our modules loaded).
    pub free_at_open: u64,
}

/// The most a CUDA context is taken to hold. Measured on an H200 (CUDA 13): ~0.5 GiB, what
/// `nvidia-smi` shows for a process that has allocated nothing. When other processes use the
/// device, total less free overstates our context, and this bounds it (a margin, not a measure).
pub const CONTEXT_BOUND: u64 = 768 << 20;

impl Gpu {
    /// Open `cuda:ordinal`: a clear error (never a panic) without a driver, a GPU or kernels.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let Some(fatbin) = FATBIN else {
            bail!("this moss was built without CUDA kernels (no nvcc at build time); rebuild with nvcc on PATH or NVCC set, or use --device cpu");
        };
        // SAFETY: only probes whether libcuda can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            bail!("no NVIDIA driver found (libcuda could not be loaded); use --device cpu");
        }
        let count = cudarc::driver::CudaContext::device_count().map_err(|e| anyhow!("the CUDA driver does not answer: {e:?}"))?;
        if ordinal >= count.max(0) as usize {
            bail!("cuda:{ordinal} does not exist: {count} CUDA device(s) visible");
        }
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| anyhow!("cannot open cuda:{ordinal}: {e:?}"))?;
        let (free_at_open, total) = ctx.mem_get_info().map_err(|e| anyhow!("cuda:{ordinal} memory info: {e:?}"))?;
        let context_bytes = (total.saturating_sub(free_at_open) as u64).min(CONTEXT_BOUND);
        let free_at_open = free_at_open as u64;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let compute_capability = ctx.compute_capability().map_err(|e| anyhow!("{e:?}"))?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(fatbin.to_vec())).map_err(|e| {
            anyhow!(
                "cannot load moss kernels on {name} (sm_{}{}; built for sm_{}): {e:?}",
                compute_capability.0,
                compute_capability.1,
                kernel_archs().unwrap_or("")
            )
        })?;
        // Optional: without them the portable kernels serve (a warning says why).
        // Not loaded when `MOSS_KERNELS=portable` forces the portable kernels (select.rs).
        let hopper = select::family()? == select::Family::Auto;
        let module_sm90a = match FATBIN_SM90A {
            Some(bin) if compute_capability == (9, 0) && hopper => match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin.to_vec())) {
                Ok(m) => Some(m),
                Err(e) => {
                    eprintln!("warning: cannot load the sm_90a kernels on {name} ({e:?}); using the portable ones");
                    None
                }
            },
            _ => None,
        };
        let stream = ctx.default_stream();
        Ok(Gpu { ctx, stream, module, module_sm90a, check_modules: Default::default(), name, compute_capability, context_bytes, free_at_open })
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(|e| anyhow!("{e:?}"))
    }
}
