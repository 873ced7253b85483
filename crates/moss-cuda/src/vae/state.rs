//! The VAE decode's state on one device, shared by every view of the backend: the fp16-split
//! conv's overflow flag and whether the decoder re-runs on the TF32 path after it was set
//! (`conv.rs`), the split decode's copy streams and pinned host memory (`picture.rs`), and the
//! run plan's limit on the decode's activations (`VaeOps::limit_vae_activations`).

use super::picture::SplitIo;
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub(crate) struct VaeState {
    /// One device int (allocated on first use), zero until a kernel sets it.
    flag: Mutex<Option<CudaTensor>>,
    tf32_fallback: AtomicBool,
    pub(crate) io: Mutex<Option<Arc<SplitIo>>>,
    limit: Mutex<Option<u64>>,
}

impl Cuda {
    pub(crate) fn vae_limit(&self) -> Option<u64> {
        *self.vae_state().limit.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_vae_limit(&self, bytes: Option<u64>) {
        *self.vae_state().limit.lock().unwrap_or_else(|e| e.into_inner()) = bytes;
    }

    /// Device address of the fp16-split VAE conv's overflow flag (one int, zero until a kernel
    /// sets it; allocated and zeroed on first use).
    pub(crate) fn vae_flag_ptr(&self) -> Result<u64> {
        let mut g = self.vae_state().flag.lock().unwrap();
        if g.is_none() {
            let t = self.alloc(DType::F32, &[4])?;
            self.write_bytes(t.ptr(), &[0u8; 16])?;
            *g = Some(t);
        }
        Ok(g.as_ref().unwrap().ptr())
    }

    /// Whether the overflow flag is set (waits for the stream), and clears it.
    pub(crate) fn vae_flag_take(&self) -> Result<bool> {
        let g = self.vae_state().flag.lock().unwrap();
        let Some(t) = g.as_ref() else { return Ok(false) };
        let b = self.download_bytes(t)?;
        let set = b[..4] != [0u8; 4];
        if set {
            self.write_bytes(t.ptr(), &[0u8; 16])?;
        }
        Ok(set)
    }

    /// Whether the VAE convolutions run on the TF32 halo kernel in place of the fp16 one (the
    /// decoder's re-run after an overflow).
    pub(crate) fn vae_tf32_fallback(&self) -> bool {
        self.vae_state().tf32_fallback.load(Ordering::Relaxed)
    }

    pub(crate) fn set_vae_tf32_fallback(&self, on: bool) {
        self.vae_state().tf32_fallback.store(on, Ordering::Relaxed)
    }

    /// The VAE split decode's copy streams and pinned host memory, made on first use and let go
    /// by `release_cached` (between stages).
    pub(crate) fn vae_io(&self) -> &Mutex<Option<Arc<SplitIo>>> {
        &self.vae_state().io
    }
}
