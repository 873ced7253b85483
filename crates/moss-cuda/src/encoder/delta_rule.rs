//! The encoder's gated delta rule on the GPU (cuda/encoder/delta_rule*.cu{,h}): the
//! chunk-parallel kernels (prep on bf16 mma, then on Hopper the one-kernel TMA state pass +
//! output, elsewhere `gdr_seq_tc` + `gdr_out_tc`, or where those do not fit the 96 KiB compact
//! pair of `delta_rule_compact.rs`; fp32 the SIMT kernels, likewise), and the sequential
//! one-kernel version for inputs the chunked kernels do not take.

use super::delta_rule_compact::{pick_state_pass, state_launch, StatePass};
use super::dims3;
use crate::kernels::{self, Dev, Family};
use crate::launch;
use crate::ops::{tensor_map_2d, Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::ops::encoder::DELTA_CHUNK;
use moss_core::backend::Backend;

/// What [`Cuda::gdr_inputs`] hands both delta-rule kernels.
pub(super) struct GdrInputs {
    l: usize,
    hk: usize,
    dk: usize,
    hv: usize,
    dv: usize,
    dt: DType,
    k: CudaTensor,
    v: CudaTensor,
    g: CudaTensor,
    beta: CudaTensor,
    out: CudaTensor,
}

/// Where the delta rule reads q, k, v: device addresses of token 0's first head and the row
/// strides in elements (q and k share one).
pub(super) struct GdrRows {
    q: u64,
    k: u64,
    v: u64,
    rqk: usize,
    rv: usize,
}

// The launch constants (cuda/encoder/launch.h, one definition for the kernels and this code).
const _: () = assert!(DELTA_CHUNK == launch::ENC_GDR_CHUNK, "the kernels' chunk is the model's");
/// Value columns of the delta-rule state one block of the sequential kernel owns.
pub(super) const GDR_COLS: usize = launch::ENC_GDR_SEQ1_COLS;
/// Threads per block of the sequential kernel.
pub(super) const GDR_THREADS: u32 = launch::ENC_GDR_SEQ1_THREADS as u32;
/// Largest head dim of the chunk-parallel delta rule (smaller dims are zero-padded to it).
pub const GDR_MAX_DIM: usize = launch::ENC_GDR_MAX_DIM;
/// Value columns per block of `gdr_seq` / `gdr_seq_tc` / `gdr_out*`.
pub(super) const GDR_SEQ_COLS: usize = launch::ENC_GDR_SEQ_COLS;
pub(super) const GDR_OUT_COLS: usize = launch::ENC_GDR_OUT_COLS;
/// Shared memory (floats) of the fp32 SIMT kernels.
pub(super) const GDR_PREP_FLOATS: usize = launch::ENC_GDR_PREP_FLOATS;
pub(super) const GDR_SEQ_FLOATS: usize = launch::ENC_GDR_SEQ_FLOATS;
pub(super) const GDR_OUT_FLOATS: usize = launch::ENC_GDR_OUT_FLOATS;
/// The same for the bf16 path's `gdr_seq_tc`, `gdr_out_tc`.
pub(super) const GDR_SEQ_TC_FLOATS: usize = launch::ENC_GDR_SEQ_TC_FLOATS;
pub(super) const GDR_OUT_TC_FLOATS: usize = launch::ENC_GDR_OUT_TC_FLOATS;
/// `delta_rule_prep` (a block per chunk and pair of value heads of one key head): the K bf16
/// tile [64][136], the Q tile / T₀, T₁, A₀ / V₀, A₁ / V₁ as fp32 [64][72], fourteen vectors of
/// 64 (93 KiB: two blocks an SM).
pub(super) const GDR_PREP3P_FLOATS: usize = launch::ENC_GDR_PREP_BF16_FLOATS;

/// Which chunk-parallel delta-rule kernels a bf16 call takes (fp32 always takes the SIMT kernels
/// of `cuda/encoder/delta_rule.cu`). Every bf16 path starts with `delta_rule_prep` (`cuda/encoder/delta_rule_prep.cuh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GdrPath {
    /// What the model runs: [`GdrPath::Tma`] where the Hopper kernels are loaded, else
    /// [`GdrPath::Tc`]. q, k, v not 16-byte
    /// aligned (or head dims above [`GDR_MAX_DIM`], or Hv / Hk odd) take the one-kernel sequential
    /// version.
    Auto,
    /// The state pass + output in one kernel on TMA tensor copies (`moss_enc_gdr_tma_bf16`,
    /// `cuda/encoder/sm90a/delta_rule_tma.cu`, Hopper only); the planted control in it.
    Tma,
    /// `gdr_seq_tc` + `gdr_out_tc` (`cuda/encoder/delta_rule_tc.cuh`, any GPU whose opt-in shared
    /// memory a block holds 182 KiB); the planted control in the out kernel.
    Tc,
    /// `gdr_seq_compact` + `gdr_out_compact` (`cuda/encoder/delta_rule_compact.cuh`, ≤ 96 KiB a
    /// block, any GPU; bf16 on TF32 mma, fp32 on FMA): what [`GdrPath::Auto`] takes where the
    /// [`GdrPath::Tc`] kernels (fp32: the SIMT ones) do not fit; the planted control in the out kernel.
    Compact,
}

/// The delta rule's prep kernels' parameter list (`delta_rule_prep_bf16`, `gdr_prep_f32`).
type Prep = fn(Dev, Dev, Dev, Dev, Dev, Dev, Dev, Dev, Dev, Dev, i32, i32, i32, i32, i32, i64, i64);

/// Dynamic shared memory and threads of `gdr_tma` (8 compute warps and a producer warp).
pub(crate) const GDR_TMA_BYTES: u32 = launch::ENC_GDR_TMA_BYTES as u32;
pub(super) const GDR_TMA_THREADS: u32 = launch::ENC_GDR_TMA_THREADS as u32;

/// Whether the chunk-parallel kernels take a delta rule of `dt` with q, k, v at `ptrs` (row strides
/// `(rqk, rv)` elements), hk key and hv value heads of dims dk, dv: dims up to [`GDR_MAX_DIM`]; for
/// bf16 (delta_rule_prep's 16-byte copies and pairs of value heads over one key head, the TMA
/// kernel's tensor map over q) 16-byte aligned addresses, strides and dims, and hv / hk even.
pub(super) fn gdr_chunked_fits(dt: DType, ptrs: [u64; 3], (rqk, rv): (usize, usize), (hk, hv): (usize, usize), dk: usize, dv: usize) -> bool {
    dk <= GDR_MAX_DIM
        && dv <= GDR_MAX_DIM
        && (dt == DType::F32 || (ptrs.iter().all(|p| p % 16 == 0) && [rqk, rv, dk, dv].iter().all(|x| x % 8 == 0) && hk > 0 && hv % (2 * hk) == 0))
}

/// The sequential one-kernel delta rule's value columns a block (GDR_COLS, or all of dv when it
/// is narrower or does not divide) and its dynamic shared memory in bytes (`gdr_impl` in
/// `cuda/encoder/encoder_ops.cu`): 130 KiB at dk = 128.
pub(crate) fn gdr_seq_smem(dk: usize, dv: usize) -> (usize, usize) {
    let cols = if dv.is_multiple_of(GDR_COLS) { GDR_COLS } else { dv };
    (cols, 4 * launch::ENC_GDR_SEQ1_SMEM_FLOATS(dk, cols))
}

/// Dynamic shared memory (bytes) of the chunk-parallel delta rule's kernels that are not the
/// Hopper TMA one: `(kernel, bytes)`, bf16 (`tc`) or fp32 (the kernel contract lists them too).
pub(crate) fn gdr_portable_smem(tc: bool) -> [(&'static str, usize); 3] {
    if tc {
        [
            ("moss_enc_delta_rule_prep_bf16", GDR_PREP3P_FLOATS * 4),
            ("moss_enc_gdr_seq_tc", GDR_SEQ_TC_FLOATS * 4),
            ("moss_enc_gdr_out_tc_bf16", GDR_OUT_TC_FLOATS * 4),
        ]
    } else {
        [("moss_enc_gdr_prep_f32", GDR_PREP_FLOATS * 4), ("moss_enc_gdr_seq", GDR_SEQ_FLOATS * 4), ("moss_enc_gdr_out_f32", GDR_OUT_FLOATS * 4)]
    }
}

impl Cuda {
    /// Whether the chunk-parallel kernels' shared memory fits a block of this GPU (the Hopper
    /// TMA path always does; the wide portable kernels need up to 182 KiB, the compact ones 96
    /// KiB: every GPU the fatbin targets). Where none do, [`GdrPath::Auto`] takes the sequential
    /// one-kernel version.
    pub(crate) fn gdr_smem_fits(&self, dt: DType, path: GdrPath) -> bool {
        if path != GdrPath::Auto || (dt == DType::BF16 && self.has_sm90a()) {
            return true;
        }
        pick_state_pass(dt == DType::BF16, self.smem_optin()).is_some()
    }

    /// The shapes of a gated delta rule's inputs checked (`q`, `k [L, Hk, dk]`, `v [L, Hv, dv]`,
    /// `Hv % Hk == 0`, `g`, `beta [L, Hv]`), k and v in q's dtype, g and beta in f32, and the
    /// output buffer: what both delta-rule kernels start from.
    pub(super) fn gdr_inputs(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, g: &CudaTensor, beta: &CudaTensor) -> Result<GdrInputs> {
        let (l, hk, dk) = dims3(q, "gated_delta_rule q")?;
        ensure!(k.shape == q.shape, "gated_delta_rule: k {:?} vs q {:?}", k.shape, q.shape);
        let (lv, hv, dv) = dims3(v, "gated_delta_rule v")?;
        ensure!(lv == l && hk > 0 && hv % hk == 0, "gated_delta_rule: v {:?} for q {:?}", v.shape, q.shape);
        for (n, t) in [("g", g), ("beta", beta)] {
            ensure!(t.shape == [l, hv], "gated_delta_rule: {n} {:?}, expected [{l}, {hv}]", t.shape);
        }
        let dt = q.dtype;
        let (k, v) = (self.cast(k, dt)?, self.cast(v, dt)?);
        let (g, beta) = (self.f32v(g)?, self.f32v(beta)?);
        let out = self.alloc(dt, &v.shape)?;
        Ok(GdrInputs { l, hk, dk, hv, dv, dt, k, v, g, beta, out })
    }

    /// The gated delta rule, chunk-parallel (`cuda/encoder/delta_rule.cu`): a prep over all (chunk, value head)
    /// pairs, then the state pass in chunk order and the output (see [`GdrPath`]; fp32 takes the
    /// SIMT kernels). Head dims above [`GDR_MAX_DIM`], and bf16 q, k, v that are not 16-byte
    /// aligned (addresses, head dims) or have Hv / Hk odd, take [`Cuda::gated_delta_rule_seq`] (only with
    /// [`GdrPath::Auto`]; the explicit paths are an error there).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_rule_on(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        beta: &CudaTensor,
        path: GdrPath,
    ) -> Result<CudaTensor> {
        let (_, hk, dk) = dims3(q, "gated_delta_rule q")?;
        let (_, hv, dv) = dims3(v, "gated_delta_rule v")?;
        let ptrs = [q.ptr(), k.ptr(), v.ptr()];
        if !gdr_chunked_fits(q.dtype, ptrs, (hk * dk, hv * dv), (hk, hv), dk, dv) || !self.gdr_smem_fits(q.dtype, path) {
            ensure!(path == GdrPath::Auto, "gated_delta_rule: {path:?} needs dk, dv ≤ {GDR_MAX_DIM}, 16-byte aligned q k v and Hv / Hk even");
            return self.gated_delta_rule_seq(q, k, v, g, beta);
        }
        let GdrInputs { l, hk, dk, hv, dv, dt, k, v, g, beta, out } = self.gdr_inputs(q, k, v, g, beta)?;
        let rows = GdrRows { q: q.ptr(), k: k.ptr(), v: v.ptr(), rqk: hk * dk, rv: hv * dv };
        self.gdr_chunked(&rows, (l, hk, dk, hv, dv), dt, &g, &beta, out, path)
    }

    /// [`Cuda::gated_delta_rule_on`] reading q, k and v straight out of the conv output
    /// `qkv [L, 2·Hk·dk + Hv·dv]` (row stride: its width) instead of three narrowed copies.
    pub(crate) fn gated_delta_rule_qkv_on(
        &self,
        qkv: &CudaTensor,
        (hk, dk, hv, dv): (usize, usize, usize, usize),
        g: &CudaTensor,
        beta: &CudaTensor,
        path: GdrPath,
    ) -> Result<CudaTensor> {
        ensure!(qkv.shape.len() == 2, "gated_delta_rule_qkv: qkv must be [L, C], got {:?}", qkv.shape);
        let (l, c) = (qkv.shape[0], qkv.shape[1]);
        ensure!(c == 2 * hk * dk + hv * dv, "gated_delta_rule_qkv: width {c} for {hk}x{dk} key and {hv}x{dv} value heads");
        ensure!(hk > 0 && hv % hk == 0, "gated_delta_rule_qkv: {hv} value heads over {hk} key heads");
        let dt = qkv.dtype;
        let es = dt.size() as u64;
        let p = qkv.ptr();
        let rows = GdrRows { q: p, k: p + (hk * dk) as u64 * es, v: p + (2 * hk * dk) as u64 * es, rqk: c, rv: c };
        if !gdr_chunked_fits(dt, [rows.q, rows.k, rows.v], (c, c), (hk, hv), dk, dv) || !self.gdr_smem_fits(dt, path) {
            let q = Backend::reshape(self, &self.narrow_copy(qkv, 1, 0, hk * dk)?, &[l, hk, dk])?;
            let k = Backend::reshape(self, &self.narrow_copy(qkv, 1, hk * dk, hk * dk)?, &[l, hk, dk])?;
            let v = Backend::reshape(self, &self.narrow_copy(qkv, 1, 2 * hk * dk, hv * dv)?, &[l, hv, dv])?;
            return self.gated_delta_rule_on(&q, &k, &v, g, beta, path);
        }
        for (n, t) in [("g", g), ("beta", beta)] {
            ensure!(t.shape == [l, hv], "gated_delta_rule_qkv: {n} {:?}, expected [{l}, {hv}]", t.shape);
        }
        let (g, beta) = (self.f32v(g)?, self.f32v(beta)?);
        let out = self.alloc(dt, &[l, hv, dv])?;
        self.gdr_chunked(&rows, (l, hk, dk, hv, dv), dt, &g, &beta, out, path)
    }

    /// The chunk-parallel kernels over q, k, v rows at `rows` (see [`GdrRows`]; bf16 rows 16-byte
    /// aligned, [`gdr_chunked_fits`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gdr_chunked(
        &self,
        rows: &GdrRows,
        (l, hk, dk, hv, dv): (usize, usize, usize, usize, usize),
        dt: DType,
        g: &CudaTensor,
        beta: &CudaTensor,
        out: CudaTensor,
        path: GdrPath,
    ) -> Result<CudaTensor> {
        ensure!(
            dt == DType::BF16 || matches!(path, GdrPath::Auto | GdrPath::Compact),
            "gated_delta_rule: {path:?} is a bf16 path (fp32 takes the SIMT kernels or the compact ones)"
        );
        let tma = match path {
            GdrPath::Auto => dt == DType::BF16 && self.has_sm90a(),
            GdrPath::Tma => {
                ensure!(self.has_sm90a(), "gated_delta_rule: the TMA state pass needs an sm_90 GPU with the sm_90a kernels");
                true
            }
            GdrPath::Tc | GdrPath::Compact => false,
        };
        // off Hopper: the wide kernels where they fit the device, else the compact ones
        let pass = match path {
            GdrPath::Tc => StatePass::Wide,
            GdrPath::Compact => StatePass::Compact,
            GdrPath::Auto | GdrPath::Tma => pick_state_pass(dt == DType::BF16, self.smem_optin()).unwrap_or(StatePass::Compact),
        };
        if l == 0 {
            return Ok(out);
        }
        let (ch, d) = (DELTA_CHUNK, GDR_MAX_DIM);
        let nc = l.div_ceil(ch);
        let nb = nc * hv;
        let f32s = |n: usize| self.alloc(DType::F32, &[n]);
        let (kd, wk, u0) = (f32s(nb * ch * d)?, f32s(nb * ch * d)?, f32s(nb * ch * d)?);
        let (wqk, gam) = (f32s(nb * ch * ch)?, f32s(nb * ch)?);
        // the kernels' dims and row strides
        let [li, hki, hvi, dki, dvi] = [l, hk, hv, dk, dv].map(|v| v as i32);
        let (rqk, rv) = (rows.rqk as i64, rows.rv as i64);
        let [q, k, v] = [rows.q, rows.k, rows.v].map(|p| Dev::new(p, dt));
        // the prep's arguments (the bf16 and the fp32 prep take the same)
        let prep = |kernel: &Family<Prep>, cfg: (u32, u32, u32)| {
            kernel.launch(self, cfg, &kd, &wk, &u0, &wqk, &gam, q, k, v, g, beta, li, hki, hvi, dki, dvi, rqk, rv)
        };
        let (u, s) = if dt == DType::F32 {
            // fp32: the SIMT kernels, the control in gdr_out
            prep(&kernels::ENC_GDR_PREP, (nb as u32, launch::ENC_GDR_THREADS as u32, (GDR_PREP_FLOATS * 4) as u32))?;
            (f32s(nb * ch * d)?, f32s(nb * d * d)?)
        } else {
            // bf16: delta_rule_prep (16-byte copies of q, k, v rows; a block per chunk and pair of
            // value heads)
            ensure!(
                gdr_chunked_fits(dt, [rows.q, rows.k, rows.v], (rows.rqk, rows.rv), (hk, hv), dk, dv),
                "delta_rule_prep: q k v addresses, row strides and head dims must be 16-byte aligned, Hv / Hk even"
            );
            prep(&kernels::ENC_DELTA_RULE_PREP, ((nb / 2) as u32, launch::ENC_GDR_PREP_BF16_THREADS as u32, (GDR_PREP3P_FLOATS * 4) as u32))?;
            if tma {
                // `gdr_tma` (`cuda/encoder/sm90a/delta_rule_tma.cu`): per value head and 32 value columns, in chunk
                // order, U = U0 − Wk S, O = e^{γ} ⊙ Q̂ S + Wqk U straight to the output, S ← e^{γl} S +
                // Kdᵀ U; the 2 column blocks of a cluster share each chunk's tiles, loaded as boxes of
                // tensor maps over q (bf16, strided) and the prep's scratch (f32 rows of 128 / 64).
                let r = (ch / 2) as u32;
                let mq = tensor_map_2d(rows.q, DType::BF16, hk * dk, l, rows.rqk, 64, r)?;
                let mwk = tensor_map_2d(wk.ptr(), DType::F32, d, nb * ch, d, 32, r)?;
                let mkd = tensor_map_2d(kd.ptr(), DType::F32, d, nb * ch, d, 32, r)?;
                let mu0 = tensor_map_2d(u0.ptr(), DType::F32, d, nb * ch, d, 32, ch as u32)?;
                let mwq = tensor_map_2d(wqk.ptr(), DType::F32, ch, nb * ch, ch, 32, r)?;
                // grid: 4 column blocks of 32 per value head (dv ≤ 128; blocks past dv compute zeros)
                let ncb = GDR_MAX_DIM / launch::ENC_GDR_TMA_COLS;
                let cfg = ((ncb * hv) as u32, GDR_TMA_THREADS, GDR_TMA_BYTES);
                kernels::ENC_GDR_TMA.launch(self, cfg, &mq, &mwk, &mkd, &mu0, &mwq, &out, &gam, li, hki, hvi, dki, dvi)?;
                return Ok(out);
            }
            (f32s(nb * ch * d)?, f32s(nb * d * d)?)
        };
        let k = state_launch(pass, dt == DType::BF16);
        let ncb = dv.div_ceil(k.seq_cols);
        let cfg = ((hv * ncb) as u32, launch::ENC_GDR_THREADS as u32, k.seq_bytes);
        k.seq.launch(self, cfg, &s, &u, &wk, &kd, &u0, &gam, nc as i32, hvi, ncb as i32)?;
        let cfg = ((nb as u32, dv.div_ceil(k.out_cols) as u32), launch::ENC_GDR_THREADS as u32, k.out_bytes);
        k.out.launch(self, cfg, &out, q, &s, &u, &wqk, &gam, li, hki, hvi, dki, dvi, rqk, rv)?;
        Ok(out)
    }

    /// The gated delta rule in one kernel, sequential over chunks (`gdr` in `cuda/encoder/encoder_ops.cu`;
    /// kept for head dims above [`GDR_MAX_DIM`] and as a second implementation under the gates).
    pub(crate) fn gated_delta_rule_seq(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, g: &CudaTensor, beta: &CudaTensor) -> Result<CudaTensor> {
        let GdrInputs { l, hk, dk, hv, dv, k, v, g, beta, out, .. } = self.gdr_inputs(q, k, v, g, beta)?;
        if l == 0 {
            return Ok(out);
        }
        let (cols, bytes) = gdr_seq_smem(dk, dv);
        ensure!(cols <= GDR_THREADS as usize, "gated_delta_rule: value head dim {dv}");
        let optin = self.smem_optin();
        ensure!(
            bytes <= optin,
            "gated_delta_rule: the sequential kernel (taken for head dims above {GDR_MAX_DIM}, bf16 q k v not 16-byte aligned or Hv / Hk odd) needs {bytes} bytes of shared memory a block at dk {dk}; this GPU offers {optin}"
        );
        let cfg = ((hv * (dv / cols)) as u32, GDR_THREADS, bytes as u32);
        let [l, hk, hv, dk, dv, cols] = [l, hk, hv, dk, dv, cols].map(|v| v as i32);
        kernels::ENC_GDR.launch(self, cfg, &out, q, &k, &v, &g, &beta, l, hk, hv, dk, dv, cols)?;
        Ok(out)
    }
}
