//! The GPUs' transport for `--devices` ([`moss_core::parallel::Transport`]) on NCCL, through
//! cudarc's bindings (loaded at run time: moss builds, and runs on one GPU, without NCCL
//! installed). cudarc looks for `libnccl.so` (and `.so.13`, ...), not `libnccl.so.2`, the only
//! name the `nvidia-nccl-cu13` wheel ships: a `libnccl.so` link to it on `LD_LIBRARY_PATH` does
//! (checked here with the wheel's 2.28.9 and `ncclGetVersion`; no collective was run). NCCL picks the path itself: NVLink or PCIe peer copies where the GPUs can reach
//! each other's memory, shared host memory where they cannot.
//!
//! All ranks are threads of one process, so a group's communicators are made together
//! (`ncclCommInitAll` over its devices) and each rank's thread uses its own. A collective is a
//! group of point-to-point calls (`ncclSend` / `ncclRecv` of the tensors' bytes, every peer at
//! once) on the rank's compute stream: it runs in stream order after the kernels that made its
//! inputs and before the ones that read its outputs, the host does not wait for it, and a tensor
//! it reads is freed (stream-ordered) only after it. The bytes move as they are, whatever the
//! dtype, so a velocity exchanged is the sender's to the bit.
//!
//! A failing rank aborts every communicator of the process (`ncclCommAbort`, allowed from any
//! thread): peers whose kernels wait for it return, and their next collective fails.
//!
//! Not run here: the machine that built this has no GPU; `bench/multi_gpu.sh` is the check.

use crate::ops::{Cuda, CudaTensor};
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::nccl::{result, sys};
use moss_core::parallel::{PeerFailed, Transport};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The communicators of one group, one a member, made together.
struct Clique {
    comms: Vec<sys::ncclComm_t>,
    aborted: AtomicBool,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time: each member's
// thread uses only its own, and `abort` (`ncclCommAbort`) is documented as callable from another
// thread to end a hang.
unsafe impl Send for Clique {}
unsafe impl Sync for Clique {}

impl Clique {
    fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            for &c in &self.comms {
                // SAFETY: a communicator made by `ncclCommInitAll`, aborted once.
                let _ = unsafe { result::comm_abort(c) };
            }
        }
    }
}

impl Drop for Clique {
    fn drop(&mut self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            for &c in &self.comms {
                // SAFETY: no member's transport is left (they hold the clique), so no call is in
                // flight on the host; the streams' work finished or was aborted.
                let _ = unsafe { result::comm_destroy(c) };
            }
        }
    }
}

/// Every live clique of the process: a failing rank aborts them all.
static CLIQUES: Mutex<Vec<Weak<Clique>>> = Mutex::new(Vec::new());

/// One rank's end of a group.
pub struct NcclTransport {
    rank: usize,
    clique: Arc<Clique>,
}

/// Whether the NCCL library can be loaded.
pub fn available() -> bool {
    // SAFETY: only probes whether libnccl can be loaded.
    unsafe { sys::is_culib_present() }
}

/// One transport a member of the group of `ranks` (group rank i = `ranks[i]`, each on its own GPU).
pub fn group(ranks: &[&Cuda]) -> Result<Vec<NcclTransport>> {
    if !available() {
        bail!(
            "--devices on GPUs needs NCCL, and libnccl.so could not be loaded: install NCCL, or link the libnccl.so.2 of the nvidia-nccl-cu13 wheel as libnccl.so in a folder on LD_LIBRARY_PATH"
        );
    }
    let ordinals: Vec<i32> = ranks.iter().map(|c| c.gpu().ctx.ordinal() as i32).collect();
    let mut comms = vec![std::ptr::null_mut(); ranks.len()];
    // SAFETY: `comms` has room for one communicator a device of `ordinals`.
    unsafe { result::comm_init_all(comms.as_mut_ptr(), ranks.len() as i32, ordinals.as_ptr()) }.map_err(|e| anyhow!("NCCL over cuda {ordinals:?}: {e:?}"))?;
    let clique = Arc::new(Clique { comms, aborted: AtomicBool::new(false) });
    let mut live = CLIQUES.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&clique));
    Ok((0..ranks.len()).map(|rank| NcclTransport { rank, clique: clique.clone() }).collect())
}

impl NcclTransport {
    /// Send `send[j]` to and receive `recv[j]` from every peer `j` in one NCCL group, on `b`'s
    /// compute stream.
    fn exchange(&self, b: &Cuda, send: &[&CudaTensor], recv: &[&CudaTensor]) -> Result<()> {
        if self.clique.aborted.load(Ordering::SeqCst) {
            return Err(PeerFailed.into());
        }
        let comm = self.clique.comms[self.rank];
        let stream = b.gpu().stream.cu_stream() as sys::cudaStream_t;
        let failed = |what: &str, e: result::NcclError| match self.clique.aborted.load(Ordering::SeqCst) {
            true => anyhow::Error::new(PeerFailed),
            false => anyhow!("NCCL {what} on rank {}: {e:?}", self.rank),
        };
        result::group_start().map_err(|e| failed("group start", e))?;
        let mut issued = Ok(());
        for peer in (0..self.clique.comms.len()).filter(|&p| p != self.rank) {
            let (s, r) = (send[peer], recv[peer]);
            // SAFETY: device buffers of this rank's GPU, alive until the stream passes this
            // point (their memory is freed in stream order); bytes as the tensors hold them.
            let call = unsafe {
                result::send(s.ptr() as *const c_void, s.bytes(), sys::ncclDataType_t::ncclUint8, peer as i32, comm, stream)
                    .and_then(|_| result::recv(r.ptr() as *mut c_void, r.bytes(), sys::ncclDataType_t::ncclUint8, peer as i32, comm, stream))
            };
            if let Err(e) = call {
                issued = Err(failed("send/recv", e));
                break;
            }
        }
        // The group is always closed, even after a failed call.
        let ended = result::group_end().map_err(|e| failed("group end", e));
        issued.and(ended.map(|_| ()))
    }
}

impl Transport<Cuda> for NcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn ranks(&self) -> usize {
        self.clique.comms.len()
    }
    fn all_gather(&self, b: &Cuda, x: &CudaTensor, shapes: &[Vec<usize>]) -> Result<Vec<CudaTensor>> {
        let n = self.clique.comms.len();
        ensure!(shapes.len() == n && x.shape == shapes[self.rank], "all_gather of {:?} with shapes {shapes:?} on rank {}", x.shape, self.rank);
        let got = (0..n).map(|j| if j == self.rank { Ok(x.clone()) } else { b.alloc(x.dtype, &shapes[j]) }).collect::<Result<Vec<_>>>()?;
        self.exchange(b, &vec![x; n], &got.iter().collect::<Vec<_>>())?;
        Ok(got)
    }
    fn all_to_all(&self, b: &Cuda, parts: Vec<CudaTensor>, shapes: &[Vec<usize>]) -> Result<Vec<CudaTensor>> {
        let n = self.clique.comms.len();
        ensure!(parts.len() == n && shapes.len() == n, "all_to_all of {} parts, {} shapes, over {n} ranks", parts.len(), shapes.len());
        let own = &parts[self.rank];
        ensure!(own.shape == shapes[self.rank], "all_to_all: this rank's own part is {:?}, not {:?}", own.shape, shapes[self.rank]);
        ensure!(parts.iter().all(|p| p.dtype == own.dtype), "all_to_all of mixed dtypes");
        let got = (0..n).map(|j| if j == self.rank { Ok(own.clone()) } else { b.alloc(own.dtype, &shapes[j]) }).collect::<Result<Vec<_>>>()?;
        self.exchange(b, &parts.iter().collect::<Vec<_>>(), &got.iter().collect::<Vec<_>>())?;
        Ok(got)
    }
    fn abort(&self) {
        let live = CLIQUES.lock().unwrap_or_else(|e| e.into_inner());
        for c in live.iter().filter_map(Weak::upgrade) {
            c.abort();
        }
        self.clique.abort();
    }
}
