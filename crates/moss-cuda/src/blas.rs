//! cuBLASLt for `linear`: `out [M, N] = x [M, K] · wᵀ (+ b)`, row-major, in bf16 (fp32
//! accumulate, bf16 out, bias through the epilogue) or fp32 (CUBLAS_COMPUTE_32F: TF32 off); and
//! for `linear_fp8`: float8 e4m3 A and B (fp32 accumulate, fast accumulation off), bf16 or fp32
//! out, with or without one f32 scale per output row and column ([`Gemm::outer_scales`]); and for
//! `linear_int8`: int8 A and B through IMMA (`CUBLAS_COMPUTE_32I`, exact int32 sums, int32 out).
//!
//! In cuBLAS's column-major terms the row-major product is `Dᵀ [N, M] = op(W) · X` with W read
//! transposed (`TRANSA = T`, the "TN" layout the tensor-core kernels like best). Descriptors,
//! layouts and the heuristic's algorithm are built once per (dtype, M, N, K, bias) and cached.

use super::DType;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One cuBLASLt product in its own column-major terms: `D [m, n] = alpha · op(A) · op(B)
/// (+ bias [m])`, optionally strided-batched. Also the cache key of its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    /// Type of A and B.
    pub ab: DType,
    /// Type of D.
    pub d: DType,
    pub transa: bool,
    pub transb: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub lda: i64,
    pub ldb: i64,
    pub ldd: i64,
    pub batch: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_d: i64,
    pub bias: bool,
    /// fp32 inputs through TF32 tensor cores (production never sets it; `moss check`'s planted
    /// linear does).
    pub tf32: bool,
    /// `D = alpha · op(A) · op(B) + C` (beta 1), C of D's type and layout ([`Blas::gemm_acc`]).
    pub accumulate: bool,
    /// The alignment (bytes) of the C and D pointers when below cuBLASLt's assumed 256 (a
    /// column block of a wider output): the heuristic then excludes algorithms that need more.
    /// 0: 256-byte aligned.
    pub align_cd: u32,
    /// FP8 A and B (`ab` = e4m3) scaled by vectors: `D[i, j] = scale_a[i] · scale_b[j] · Σ_l
    /// op(A)[i, l] · op(B)[l, j]`, `scale_a` of length m and `scale_b` of n, f32
    /// (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`; [`Blas::gemm_fp8`]). Off: unit scales.
    pub outer_scales: bool,
}

impl Gemm {
    /// A plain (unbatched) product.
    #[allow(clippy::too_many_arguments)]
    pub fn plain(ab: DType, d: DType, transa: bool, transb: bool, m: usize, n: usize, k: usize, lda: usize, ldb: usize, ldd: usize) -> Gemm {
        Gemm {
            ab,
            d,
            transa,
            transb,
            m: m as u64,
            n: n as u64,
            k: k as u64,
            lda: lda as i64,
            ldb: ldb as i64,
            ldd: ldd as i64,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_d: 0,
            bias: false,
            tf32: false,
            accumulate: false,
            align_cd: 0,
            outer_scales: false,
        }
    }
    /// Strided batches: `batch` products, A, B, D advancing by their strides (elements).
    pub fn batched(mut self, batch: usize, stride_a: usize, stride_b: usize, stride_d: usize) -> Gemm {
        self.batch = batch as i32;
        self.stride_a = stride_a as i64;
        self.stride_b = stride_b as i64;
        self.stride_d = stride_d as i64;
        self
    }
}

fn mtype(d: DType) -> sys::cudaDataType {
    match d {
        DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
        DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
        DType::F8E4M3 => sys::cudaDataType_t::CUDA_R_8F_E4M3,
        DType::I8 => sys::cudaDataType_t::CUDA_R_8I,
        DType::I32 => sys::cudaDataType_t::CUDA_R_32I,
        // never reaches cuBLASLt: `Cuda::dense` dequantizes a kept matrix before every product
        DType::Q => unreachable!("a quantized matrix given to cuBLASLt"),
    }
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    la: sys::cublasLtMatrixLayout_t,
    lb: sys::cublasLtMatrixLayout_t,
    lc: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's candidates, searched once for a pinned configuration (then emptied).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

/// Heuristic candidates searched for a pinned configuration.
const PIN_CANDIDATES: i32 = 8;

/// The configuration of a cuBLASLt algorithm (`CUBLASLT_ALGO_CONFIG_*`): id, tile, stages,
/// split-k, reduction scheme, CTA swizzling, custom option, inner shape, cluster shape. Equal
/// configurations are the same kernel with the same launch: what [`crate::gemm_pins`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoConfig {
    pub id: u32,
    pub tile: u32,
    pub stages: u32,
    pub splitk: u32,
    pub reduction: u32,
    pub swizzle: u32,
    pub custom: u32,
    pub inner: u32,
    pub cluster: u32,
}

impl AlgoConfig {
    pub fn of(a: &sys::cublasLtMatmulAlgo_t) -> Option<AlgoConfig> {
        use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        let get = |attr: A| -> Option<u32> {
            let mut size = 0usize;
            // SAFETY: a size query (no buffer), then a read of at most 8 bytes into `buf`.
            unsafe {
                sys::cublasLtMatmulAlgoConfigGetAttribute(a, attr, std::ptr::null_mut(), 0, &mut size);
                if size == 0 || size > 8 {
                    return None;
                }
                let mut buf = [0u8; 8];
                let st = sys::cublasLtMatmulAlgoConfigGetAttribute(a, attr, buf.as_mut_ptr() as *mut _, size, &mut size);
                (st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then(|| u64::from_le_bytes(buf) as u32)
            }
        };
        Some(AlgoConfig {
            id: get(A::CUBLASLT_ALGO_CONFIG_ID)?,
            tile: get(A::CUBLASLT_ALGO_CONFIG_TILE_ID)?,
            stages: get(A::CUBLASLT_ALGO_CONFIG_STAGES_ID)?,
            splitk: get(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM)?,
            reduction: get(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)?,
            swizzle: get(A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)?,
            custom: get(A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)?,
            inner: get(A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)?,
            cluster: get(A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)?,
        })
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by us and is destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.la);
            let _ = lt::destroy_matrix_layout(self.lb);
            let _ = lt::destroy_matrix_layout(self.lc);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

pub struct Blas {
    handle: sys::cublasLtHandle_t,
    _workspace: CudaSlice<u8>,
    ws_ptr: u64,
    ws_size: usize,
    plans: Mutex<HashMap<Gemm, Plan>>,
    cc: (i32, i32),
    /// The device's FP8 product path, picked at the first `linear_fp8` (`Cuda::fp8_gemm`).
    pub(crate) fp8_path: std::sync::OnceLock<std::result::Result<super::select::Fp8Gemm, String>>,
}

// SAFETY: the handle and plans are only used under the `plans` mutex or through `&self` calls
// that cuBLASLt allows from any thread for one handle used by one stream at a time.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        self.plans.lock().unwrap().clear();
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> anyhow::Error + '_ {
    move |e| anyhow!("cuBLASLt {what}: {e:?}")
}

unsafe fn set_desc<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    lt::set_matmul_desc_attribute(desc, attr, v as *const T as *const _, std::mem::size_of::<T>()).map_err(lt_err("set matmul attribute"))
}

impl Blas {
    /// `cc`: the device's compute capability (major, minor), for the pinned algorithms.
    pub fn new(stream: &Arc<CudaStream>, cc: (i32, i32)) -> Result<Blas> {
        // SAFETY: only probes whether libcublasLt can be loaded.
        if !unsafe { sys::is_culib_present() } {
            bail!("libcublasLt (CUDA 13) could not be loaded: install the CUDA 13 cuBLAS runtime, or use --device cpu");
        }
        let handle = lt::create_handle().map_err(lt_err("create handle"))?;
        // 32 MiB: NVIDIA's recommendation for Hopper (4 MiB suffices elsewhere).
        let ws_size = 32 << 20;
        // SAFETY: the workspace is scratch memory cuBLASLt writes before it reads.
        let ws = unsafe { stream.alloc::<u8>(ws_size) }.map_err(|e| anyhow!("cuBLASLt workspace: {e:?}"))?;
        let ws_ptr = ws.device_ptr(stream).0;
        Ok(Blas { handle, _workspace: ws, ws_ptr, ws_size, plans: Mutex::new(HashMap::new()), cc, fp8_path: Default::default() })
    }

    fn plan(&self, g: Gemm, bias_ptr: u64, scales: Option<(u64, u64)>) -> Result<Plan> {
        let (compute, scale_type) = match (g.ab, g.tf32) {
            (DType::F32, true) => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, sys::cudaDataType_t::CUDA_R_32F),
            // IMMA: int8 A and B, exact int32 sums, int32 alpha and beta
            (DType::I8, _) => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32I, sys::cudaDataType_t::CUDA_R_32I),
            _ => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F),
        };
        let (ta, td) = (mtype(g.ab), mtype(g.d));
        // SAFETY: plain descriptor construction; every handle goes into `Plan`, which frees it.
        unsafe {
            let desc = lt::create_matmul_desc(compute, scale_type).map_err(lt_err("matmul desc"))?;
            let (ar, ac) = if g.transa { (g.k, g.m) } else { (g.m, g.k) };
            let (br, bc) = if g.transb { (g.n, g.k) } else { (g.k, g.n) };
            let la = lt::create_matrix_layout(ta, ar, ac, g.lda);
            let lb = lt::create_matrix_layout(ta, br, bc, g.ldb);
            let lc = lt::create_matrix_layout(td, g.m, g.n, g.ldd);
            let (la, lb, lc) = match (la, lb, lc) {
                (Ok(a), Ok(b), Ok(c)) => (a, b, c),
                _ => {
                    let _ = lt::destroy_matmul_desc(desc);
                    bail!("cuBLASLt: cannot create matrix layouts for {g:?}")
                }
            };
            let mut plan = Plan { desc, la, lb, lc, algo: std::mem::zeroed(), candidates: vec![] };
            if g.batch > 1 {
                for (l, stride) in [(la, g.stride_a), (lb, g.stride_b), (lc, g.stride_d)] {
                    lt::set_matrix_layout_attribute(
                        l,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        &g.batch as *const i32 as *const _,
                        std::mem::size_of::<i32>(),
                    )
                    .map_err(lt_err("batch count"))?;
                    lt::set_matrix_layout_attribute(
                        l,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &stride as *const i64 as *const _,
                        std::mem::size_of::<i64>(),
                    )
                    .map_err(lt_err("batch stride"))?;
                }
            }
            let t: i32 = g.transa as i32;
            let tb: i32 = g.transb as i32;
            set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &t)?;
            set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &tb)?;
            let epi = if g.bias {
                set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr)?;
                sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
            } else {
                sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
            };
            set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
            if g.ab == DType::F8E4M3 {
                // The tensor cores' partial sums go to fp32 at intervals (the default, said here so
                // a reader sees the choice): fast accumulation keeps them in the narrower accumulator.
                set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &0i8)?;
            }
            if g.outer_scales {
                use sys::cublasLtMatmulDescAttributes_t as D;
                let mode = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode)?;
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode)?;
                let (sa, sb) = scales.ok_or_else(|| anyhow!("cuBLASLt: {g:?} without its scale vectors"))?;
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa)?;
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb)?;
            }
            let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
            let ws = self.ws_size;
            let r = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const _,
                std::mem::size_of::<usize>(),
            );
            let r = r.and_then(|_| {
                if g.align_cd == 0 {
                    return Ok(());
                }
                for a in [
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ] {
                    lt::set_matmul_pref_attribute(pref, a, &g.align_cd as *const u32 as *const _, std::mem::size_of::<u32>())?;
                }
                Ok(())
            });
            let h = r.and_then(|_| lt::get_matmul_algo_heuristic(self.handle, desc, la, lb, lc, lc, pref));
            let pin = crate::gemm_pins::pin(self.cc, &g);
            if h.is_ok() && pin.is_some() {
                let mut res: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); PIN_CANDIDATES as usize];
                let mut count = 0i32;
                let st = sys::cublasLtMatmulAlgoGetHeuristic(self.handle, desc, la, lb, lc, lc, pref, PIN_CANDIDATES, res.as_mut_ptr(), &mut count);
                if st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    plan.candidates =
                        res[..count.max(0) as usize].iter().filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).map(|r| r.algo).collect();
                }
            }
            let _ = lt::destroy_matmul_pref(pref);
            plan.algo = h.map_err(|e| anyhow!("cuBLASLt has no algorithm for {g:?}: {e:?}"))?.algo;
            if let Some(want) = pin {
                // The pinned configuration when the heuristic offers it, else its first choice.
                if let Some(a) = plan.candidates.iter().find(|a| AlgoConfig::of(a) == Some(want)) {
                    plan.algo = *a;
                }
                plan.candidates.clear();
            }
            Ok(plan)
        }
    }

    /// Run one product on `stream`: `d = alpha · op(a) · op(b) (+ bias)`. Pointers are device
    /// addresses of buffers at least as large as the layouts describe.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(&self, stream: &CudaStream, g: Gemm, a: u64, b: u64, d: u64, bias: Option<u64>, alpha: f32) -> Result<()> {
        self.gemm_acc(stream, g, a, b, None, d, bias, alpha)
    }

    /// [`Blas::gemm`] plus `c` (when given): `d = alpha · op(a) · op(b) + c (+ bias)`, `c` of `d`'s
    /// type and layout (it may be `d` itself).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_acc(&self, stream: &CudaStream, g: Gemm, a: u64, b: u64, c: Option<u64>, d: u64, bias: Option<u64>, alpha: f32) -> Result<()> {
        self.matmul(stream, g, a, b, c, d, bias, None, alpha)
    }

    /// An FP8 product (`g.ab` e4m3): `d = op(a) · op(b)`, scaled by the f32 vectors `scales` =
    /// (`scale_a` [m], `scale_b` [n]) when given ([`Gemm::outer_scales`]), else by 1.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8(&self, stream: &CudaStream, g: Gemm, a: u64, b: u64, d: u64, scales: Option<(u64, u64)>) -> Result<()> {
        ensure!(g.ab == DType::F8E4M3, "gemm_fp8 of {:?} inputs", g.ab);
        let g = Gemm { outer_scales: scales.is_some(), ..g };
        self.matmul(stream, g, a, b, None, d, None, scales, 1.0)
    }

    /// An int8 product through IMMA (`g.ab` int8, `g.d` int32): `d = op(a) · op(b)`, the sums
    /// exact in int32 (`CUBLAS_COMPUTE_32I`).
    pub fn gemm_int8(&self, stream: &CudaStream, g: Gemm, a: u64, b: u64, d: u64) -> Result<()> {
        ensure!(g.ab == DType::I8 && g.d == DType::I32, "gemm_int8 of {:?} into {:?}", g.ab, g.d);
        self.matmul(stream, g, a, b, None, d, None, None, 1.0)
    }

    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        stream: &CudaStream,
        g: Gemm,
        a: u64,
        b: u64,
        c: Option<u64>,
        d: u64,
        bias: Option<u64>,
        scales: Option<(u64, u64)>,
        alpha: f32,
    ) -> Result<()> {
        let g = Gemm { bias: bias.is_some(), accumulate: c.is_some(), ..g };
        let mut plans = self.plans.lock().unwrap();
        let p = match plans.entry(g) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(g, bias.unwrap_or(0), scales)?),
        };
        let beta = if c.is_some() { 1f32 } else { 0f32 };
        // an int8 product's scale type is int32 (`Blas::gemm_int8`: alpha 1, beta 0)
        let (alpha_i, beta_i) = (alpha as i32, beta as i32);
        let int = g.ab == DType::I8;
        let (alpha_p, beta_p): (*const std::ffi::c_void, *const std::ffi::c_void) = if int {
            (&alpha_i as *const i32 as *const _, &beta_i as *const i32 as *const _)
        } else {
            (&alpha as *const f32 as *const _, &beta as *const f32 as *const _)
        };
        let c = c.unwrap_or(d);
        // SAFETY: see above; the plan's handles are valid while the lock is held.
        unsafe {
            if let Some(b) = bias {
                set_desc(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b)?;
            }
            if let Some((sa, sb)) = scales {
                set_desc(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa)?;
                set_desc(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb)?;
            }
            let (desc, la, lb, lc) = (p.desc, p.la, p.lb, p.lc);
            let run_into = |algo: &sys::cublasLtMatmulAlgo_t, d: u64| {
                lt::matmul(
                    self.handle,
                    desc,
                    alpha_p,
                    beta_p,
                    a as *const _,
                    la,
                    b as *const _,
                    lb,
                    c as *const _,
                    lc,
                    d as *mut _,
                    lc,
                    algo,
                    self.ws_ptr as *mut _,
                    self.ws_size,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            };
            run_into(&p.algo, d).map_err(|e| anyhow!("cuBLASLt matmul {g:?}: {e:?}"))
        }
    }

    /// `out [rows, n] = x [rows, k] · w [n, k]ᵀ (+ bias [n])`, x and w of `dtype`, the bias and
    /// `out` of `out_dtype` (the fp32 product rounded once into it), on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        stream: &CudaStream,
        (dtype, out_dtype): (DType, DType),
        rows: usize,
        n: usize,
        k: usize,
        x: u64,
        w: u64,
        bias: Option<u64>,
        out: u64,
    ) -> Result<()> {
        // cuBLAS's m is our n (rows of the column-major result), its n is our rows.
        let g = Gemm::plain(dtype, out_dtype, true, false, n, rows, k, k, k, n);
        self.gemm(stream, g, w, x, out, bias, 1.0)
    }

    /// `out [rows, n] (row stride ldo) = x [rows, k] · w [n, k]ᵀ (+ res)`, all of `dtype`: a
    /// linear writing a column block of a wider output (`ldo ≥ n`), and/or adding `res` (same
    /// layout as `out`; may be `out`) in the epilogue, the fp32 product rounded once.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_into(
        &self,
        stream: &CudaStream,
        dtype: DType,
        (rows, n, k): (usize, usize, usize),
        x: u64,
        w: u64,
        res: Option<u64>,
        out: u64,
        ldo: usize,
    ) -> Result<()> {
        let mut g = Gemm::plain(dtype, dtype, true, false, n, rows, k, k, k, ldo);
        // the largest power of two up to 256 that divides the C and D addresses
        let addr = out | res.unwrap_or(out) | 256;
        let align = 1u64 << addr.trailing_zeros();
        if align < 256 {
            g.align_cd = align as u32;
        }
        self.gemm_acc(stream, g, w, x, res, out, None, 1.0)
    }
}
