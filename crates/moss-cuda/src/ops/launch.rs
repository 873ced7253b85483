//! Kernel launches: the loaded kernels by name, the image a view launches from
//! ([`Cuda::with_image`]), and the one launch path every generated launcher
//! (`crate::kernels`) ends in.

use super::{de, Cuda};
use crate::kernels::{Cfg, FamilyInfo, Image};
use anyhow::{anyhow, Result};
use cudarc::driver::{result as dr, sys, CudaFunction};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The kernels looked up so far, by name (in the production modules, then the check image's).
#[derive(Default)]
pub(super) struct Kernels {
    funcs: Mutex<HashMap<String, CudaFunction>>,
}

impl Cuda {
    /// A view of this backend whose launches take `image`'s kernels: production's, or (`moss
    /// check`) some families replaced by their planted twins. Everything else is shared.
    pub fn with_image(&self, image: Image) -> Cuda {
        Cuda { image: Arc::new(image), ..self.clone() }
    }

    fn func(&self, name: &str) -> Result<CudaFunction> {
        let mut f = self.inner.kernels.funcs.lock().unwrap();
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
        let bins = crate::FATBIN_CHECK.into_iter().chain(crate::FATBIN_CHECK_SM90A.filter(|_| self.has_sm90a()));
        for bin in bins {
            let m = gpu
                .ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(bin.to_vec()))
                .map_err(|e| anyhow!("cannot load the check image on {}: {e:?}", gpu.name))?;
            mods.push(m);
        }
        Ok(())
    }

    /// Whether the Hopper-only kernels (`cuda/*/sm90a`) are loaded: a compute capability 9.0
    /// device and a build with them.
    pub fn has_sm90a(&self) -> bool {
        self.inner.gpu.module_sm90a.is_some()
    }

    /// Launch the member of `family` (or of its twin in this view's image) whose pointer types
    /// are `elems`, with the argument values at `slots` (generated launchers only: `slots` holds
    /// the kernel's parameters in order, typed by its C signature).
    pub(crate) fn launch_family(&self, family: &FamilyInfo, cfg: Cfg, elems: &[crate::kernels::Elem], slots: &mut [*mut c_void]) -> Result<()> {
        let name = self.image.resolve(family).member(elems)?;
        // A batch view's loads land before any kernel it launches (which may read them).
        self.settle()?;
        let f = self.func(name)?;
        let Cfg { grid, block, shmem } = cfg;
        if shmem > 48 * 1024 {
            f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shmem as i32)
                .map_err(|e| anyhow!("{name}: {shmem} bytes of shared memory: {e:?}"))?;
        }
        let s = &self.inner.gpu.stream;
        s.context().bind_to_thread().map_err(de("bind context"))?;
        // SAFETY: `slots` are the kernel's parameters as its C signature types them (the launcher
        // was generated from it); every pointer is a live allocation of the size the kernel reads.
        unsafe { dr::launch_kernel(f.cu_function(), (grid.0.max(1), grid.1.max(1), 1), (block, 1, 1), shmem, s.cu_stream(), slots) }
            .map_err(|e| anyhow!("launching {name}: {e:?}"))
    }
}
