//! [`EncoderOps`] on the GPU: the kernels of `cuda/encoder/encoder_ops.cu` (the linears are the generic
//! cuBLASLt `linear`).
//!
//! Dtypes: activations (q, k, v, x, z, gate, up) keep their dtype (bf16, or f32 with
//! `--precision fp32`) and the output takes it; the small per-channel vectors (norm weights, the
//! conv taps, `A_log`, `dt_bias`) are read as f32 (cast first where the checkpoint holds bf16; the
//! kernels of `enc_floor.rs`, the default for the DeltaNet / MLP row ops, read them as loaded);
//! the DeltaNet gates `g`, `beta` are f32 and the delta rule keeps its state and decays in f32.
//! Every `*_with` takes the kernel prefix: `moss_enc`, or `moss_ctl_enc` for the planted
//! controls of `moss check` (src/backend/cuda/gates_encoder.rs).

pub mod attention_qkv_gate;
pub mod row_ops;
pub mod strided_row_ops;

use crate::backend::cuda::blas::Gemm;
use crate::backend::cuda::encoder::row_ops::{GRMS, SILU_V_MIN_ROWS};
use crate::backend::cuda::ops::{tensor_map_2d, Arg, Cuda, CudaTensor, DType};
use crate::backend::cpu::encoder::rope_angles;
use crate::backend::ops::encoder::DELTA_CHUNK;
use crate::backend::ops::EncoderOps;
use crate::backend::Backend;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// What [`Cuda::gdr_inputs`] hands both delta-rule kernels.
struct GdrInputs {
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
struct GdrRows {
    q: u64,
    k: u64,
    v: u64,
    rqk: usize,
    rv: usize,
}

fn dims3(x: &CudaTensor, what: &str) -> Result<(usize, usize, usize)> {
    ensure!(x.shape.len() == 3, "{what}: expected [L, heads, dim], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2]))
}

/// Query rows / key rows per attention tile and its threads (must match `cuda/encoder/encoder_ops.cu`).
const ATTN_Q: usize = 32;
const ATTN_K: usize = 32;
const ATTN_THREADS: u32 = 256;
/// Prompts longer than this take the cuBLASLt attention path (tensor cores), shorter ones the
/// tiled kernel.
pub const ATTN_TILED_MAX: usize = 256;
/// Query rows per chunk of the cuBLASLt path (keys only up to the chunk's end are scored).
const ATTN_GEMM_CHUNK: usize = 1024;
/// Largest head dim the attention kernel takes (one output dim per thread).
pub const ATTN_MAX_HD: usize = 256;
/// Head dim of the flash causal kernel and its dynamic shared memory (`cuda/encoder/causal_flash_attention.cu`).
pub const FLASH_HD: usize = 256;
const FLASH_SMEM: u32 = 96 * 1024;
/// Dynamic shared memory of the Hopper kernel (`cuda/encoder/sm90a/causal_flash_attention_wgmma.cu`).
const FLASH_WG_SMEM: u32 = 197632;

/// The long-prompt causal attention path (bf16, head dim [`FLASH_HD`], `L > ATTN_TILED_MAX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncAttn {
    /// cuBLASLt scores + causal softmax + cuBLASLt P V (also every fp32 prompt).
    Gemm,
    /// `cuda/encoder/causal_flash_attention.cu`: mma.sync flash kernel, 64 query rows a block, any GPU.
    Flash,
    /// `cuda/encoder/sm90a/causal_flash_attention_wgmma.cu`: Hopper wgmma, 128 query rows a block.
    Wgmma,
}

/// The long-prompt bf16 attention path on a device with (`sm90a`) or without the Hopper kernels:
/// `Wgmma` where they are loaded, else `Flash`. Measured on the H200 at L = 4096 (16 / 4 heads,
/// hd 256): wgmma 0.328 ms a layer vs flash 0.954 ms (torch SDPA 0.289). `Gemm` is the fp32 path.
pub fn pick_enc_attn(sm90a: bool) -> EncAttn {
    if sm90a {
        EncAttn::Wgmma
    } else {
        EncAttn::Flash
    }
}

/// The kernels the encoder's ops use on a device with (`hopper`) or without the Hopper kernels
/// ([`crate::backend::cuda::select::choices`]).
pub fn kernel_choices(hopper: bool) -> Vec<crate::backend::cuda::select::Choice> {
    use crate::backend::cuda::select::Choice;
    let (attn, gdr) = if hopper {
        ("moss_enc_fattn_wg_bf16 (wgmma)", "moss_enc_gdr_prep_tc3p_bf16 + moss_enc_gdr_tma_bf16 (TMA, clusters of 2)")
    } else {
        ("moss_enc_fattn_bf16 (mma.sync)", "moss_enc_gdr_prep_tc3p_bf16 + moss_enc_gdr_seq_tc + moss_enc_gdr_out_tc_bf16")
    };
    vec![
        Choice { op: "enc causal_attention (bf16, L > 256, hd 256)", kernel: attn.into() },
        Choice { op: "enc causal_attention (L <= 256, or fp32)", kernel: "moss_enc_attn_* (tiled) / cuBLASLt + moss_enc_csoftmax_*".into() },
        Choice { op: "enc gated_delta_rule (bf16)", kernel: gdr.into() },
        Choice { op: "enc gated_delta_rule (fp32)", kernel: "moss_enc_gdr_prep_f32 + moss_enc_gdr_seq + moss_enc_gdr_out_f32".into() },
    ]
}

/// Value columns of the delta-rule state one block owns.
const GDR_COLS: usize = 32;
/// Threads per delta-rule block (must match `DTHREADS` in `cuda/encoder/encoder_ops.cu`).
const GDR_THREADS: u32 = 512;
/// Largest head dim of the chunk-parallel delta rule (`GD` in `cuda/encoder/delta_rule.cu`; smaller dims are
/// zero-padded to it).
pub const GDR_MAX_DIM: usize = 128;
/// Value columns per block of `gdr_seq` / `gdr_seq_tc` / `gdr_out*` (`SQ_CB`, `OC` in `cuda/encoder/delta_rule.cu`).
const GDR_SEQ_COLS: usize = 32;
const GDR_OUT_COLS: usize = 64;
/// Shared memory (floats) of the fp32 SIMT kernels, as laid out in `cuda/encoder/delta_rule.cu`.
const GDR_PREP_FLOATS: usize = 2 * 64 * 132 + 64 * 68 + 4 * 64;
const GDR_SEQ_FLOATS: usize = 2 * (2 * 64 * 132 + 64 * 36) + 128 * 36 + 64 * 36;
const GDR_OUT_FLOATS: usize = 64 * 132 + 128 * 68 + 2 * 64 * 68 + 64;
/// The same for the bf16 path's `gdr_seq_tc`, `gdr_out_tc` (`TQ_FLOATS`, `TO_FLOATS` in
/// `cuda/encoder/delta_rule_tc.cuh`).
const GDR_SEQ_TC_FLOATS: usize = 2 * (64 * 132 + 64 * 136 + 64 * 36) + 128 * 40 + 64 * 40;
const GDR_OUT_TC_FLOATS: usize = 64 * 132 + 128 * 72 + 64 * 68 + 64 * 72 + 64;
/// `gdr_prep_tc3p` (`P3P_FLOATS` in `cuda/encoder/delta_rule_prep.cuh`; a block of 512 threads per chunk and
/// pair of value heads of one key head): the K bf16 tile [64][136], the Q tile / T₀, T₁, A₀ / V₀,
/// A₁ / V₁ as fp32 [64][72], fourteen vectors of 64 (93 KiB: two blocks an SM).
const GDR_PREP3P_FLOATS: usize = (64 * 136 * 2 + 4 * 64 * 72 * 4 + 14 * 64 * 4) / 4;

/// Which chunk-parallel delta-rule kernels a bf16 call takes (fp32 always takes the SIMT kernels
/// of `cuda/encoder/delta_rule.cu`). Every bf16 path starts with `gdr_prep_tc3p` (`cuda/encoder/delta_rule_prep.cuh`).
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
    /// `gdr_seq_tc` + `gdr_out_tc` (`cuda/encoder/delta_rule_tc.cuh`, any GPU); the planted control in the out kernel.
    Tc,
    /// [`GdrPath::Tc`] with the planted control in the prep (`moss_ctl_enc_gdr_prep_tc3p_bf16`)
    /// and the correct out kernel (the gates).
    PrepCtl,
}

/// Dynamic shared memory and threads of `gdr_tma` (`TLay<bf16>::BYTES`, `THREADS` in
/// `cuda/encoder/sm90a/delta_rule_tma.cu`: 8 compute warps and a producer warp).
const GDR_TMA_BYTES: u32 = 201_776;
const GDR_TMA_THREADS: u32 = 288;


/// Whether the chunk-parallel kernels take a delta rule of `dt` with q, k, v at `ptrs` (row strides
/// `(rqk, rv)` elements), hk key and hv value heads of dims dk, dv: dims up to [`GDR_MAX_DIM`]; for
/// bf16 (gdr_prep_tc3p's 16-byte copies and pairs of value heads over one key head, the TMA
/// kernel's tensor map over q) 16-byte aligned addresses, strides and dims, and hv / hk even.
fn gdr_chunked_fits(dt: DType, ptrs: [u64; 3], (rqk, rv): (usize, usize), (hk, hv): (usize, usize), dk: usize, dv: usize) -> bool {
    dk <= GDR_MAX_DIM
        && dv <= GDR_MAX_DIM
        && (dt == DType::F32
            || (ptrs.iter().all(|p| p % 16 == 0)
                && [rqk, rv, dk, dv].iter().all(|x| x % 8 == 0)
                && hk > 0
                && hv % (2 * hk) == 0))
}

impl Cuda {
    /// The long-prompt attention path of this device ([`pick_enc_attn`]).
    pub fn enc_attn(&self) -> EncAttn {
        pick_enc_attn(self.has_sm90a())
    }

    fn f32v(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.cast(x, DType::F32)
    }

    pub(crate) fn embed_with(&self, table: &CudaTensor, ids: &[u32], prefix: &str) -> Result<CudaTensor> {
        ensure!(table.shape.len() == 2, "embed: table must be [vocab, hidden], got {:?}", table.shape);
        let (vocab, h) = (table.shape[0], table.shape[1]);
        for &id in ids {
            ensure!((id as usize) < vocab, "token id {id} is outside the embedding table of {vocab}");
        }
        ensure!(vocab < (1 << 24), "embed: a vocabulary of {vocab} does not fit exact f32 ids");
        let idt = self.upload_as(&Tensor::new(vec![ids.len()], ids.iter().map(|&i| i as f32).collect())?, DType::F32)?;
        let out = self.alloc(table.dtype, &[ids.len(), h])?;
        self.launch(
            &format!("{prefix}_embed_{}", table.dtype.name()),
            self.grid_for(ids.len() * h),
            256,
            0,
            &[Arg::P(out.ptr()), Arg::P(table.ptr()), Arg::P(idt.ptr()), Arg::L(ids.len() as i64), Arg::L(h as i64)],
        )?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn head_norm_rope_with(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f64,
        rot: usize,
        theta: f64,
        prefix: &str,
    ) -> Result<CudaTensor> {
        let (l, nh, hd) = dims3(x, "head_norm_rope")?;
        ensure!(w.numel() == hd, "head_norm_rope: weight {:?} for head_dim {hd}", w.shape);
        ensure!(rot % 2 == 0 && rot <= hd, "head_norm_rope: rotary dim {rot} of head_dim {hd}");
        // The inverse frequencies exactly as the CPU twin makes them (angle of position 1).
        let inv = rope_angles(1, rot, theta);
        let inv = self.upload_as(&Tensor::new(vec![inv.len().max(1)], if inv.is_empty() { vec![0.0] } else { inv })?, DType::F32)?;
        let w = self.f32v(w)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = l * nh;
        self.launch(
            &format!("{prefix}_head_rope_{}", x.dtype.name()),
            rows.div_ceil(8) as u32,
            256,
            0,
            &[
                Arg::P(out.ptr()),
                Arg::P(x.ptr()),
                Arg::P(w.ptr()),
                Arg::P(inv.ptr()),
                Arg::L(rows as i64),
                Arg::I(nh as i32),
                Arg::I(hd as i32),
                Arg::F(eps as f32),
                Arg::I(rot as i32),
            ],
        )?;
        Ok(out)
    }

    /// Causal GQA attention. Prompts up to [`ATTN_TILED_MAX`] take the tiled kernel; longer ones
    /// the flash kernel `path` ([`EncAttn::Flash`] / [`EncAttn::Wgmma`]) when the data are bf16
    /// with head dim [`FLASH_HD`], else the cuBLASLt path.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn causal_attention_with(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        scale: f64,
        prefix: &str,
        path: EncAttn,
    ) -> Result<CudaTensor> {
        let (l, nh, hd) = dims3(q, "causal_attention q")?;
        let (lk, nkv, hdk) = dims3(k, "causal_attention k")?;
        ensure!(lk == l && hdk == hd && v.shape == k.shape, "causal_attention: q {:?} k {:?} v {:?}", q.shape, k.shape, v.shape);
        ensure!(nkv > 0 && nh % nkv == 0, "causal_attention: {nh} query heads over {nkv} KV heads");
        ensure!(hd <= ATTN_MAX_HD, "causal_attention: head dim {hd} above {ATTN_MAX_HD}");
        let (k, v) = (self.cast(k, q.dtype)?, self.cast(v, q.dtype)?);
        let out = self.alloc(q.dtype, &q.shape)?;
        if l == 0 {
            return Ok(out);
        }
        if l > ATTN_TILED_MAX && path != EncAttn::Gemm && q.dtype == DType::BF16 && hd == FLASH_HD {
            self.launch_enc_flash(path, prefix, false, l, nh, &[
                Arg::P(out.ptr()),
                Arg::P(q.ptr()),
                Arg::P(k.ptr()),
                Arg::P(v.ptr()),
                Arg::I(l as i32),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::F((scale * std::f64::consts::LOG2_E) as f32),
            ])?;
            return Ok(out);
        }
        if l > ATTN_TILED_MAX {
            return self.causal_attention_gemm(q, &k, &v, scale, prefix, out);
        }
        let floats = ATTN_Q * (hd + 1) + ATTN_K * (hd + 1) + ATTN_K * hd + ATTN_Q * (ATTN_K + 1) + 3 * ATTN_Q;
        let blocks = l.div_ceil(ATTN_Q) * nh;
        self.launch(
            &format!("{prefix}_attn_{}", q.dtype.name()),
            blocks as u32,
            ATTN_THREADS,
            (floats * 4) as u32,
            &[
                Arg::P(out.ptr()),
                Arg::P(q.ptr()),
                Arg::P(k.ptr()),
                Arg::P(v.ptr()),
                Arg::I(l as i32),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::I(hd as i32),
                Arg::F(scale as f32),
            ],
        )?;
        Ok(out)
    }


    /// Launch the encoder's flash attention kernel of `path` (same arguments for both):
    /// `{prefix}_fattn[_gated]_bf16`, grid (L/64, H), 128 threads, or on Hopper
    /// `{prefix}_fattn_wg[_gated]_bf16`, grid (H, L/128) (heads of one row block together), 256.
    pub(crate) fn launch_enc_flash(&self, path: EncAttn, prefix: &str, gated: bool, l: usize, nh: usize, args: &[Arg]) -> Result<()> {
        let g = if gated { "_gated" } else { "" };
        match path {
            EncAttn::Wgmma => {
                ensure!(self.has_sm90a(), "the wgmma attention needs an sm_90 (Hopper) GPU and a build with cuda/sm90a");
                self.launch_2d(&format!("{prefix}_fattn_wg{g}_bf16"), (nh as u32, l.div_ceil(128) as u32), 256, FLASH_WG_SMEM, args)
            }
            EncAttn::Flash => self.launch_2d(&format!("{prefix}_fattn{g}_bf16"), (l.div_ceil(64) as u32, nh as u32), 128, FLASH_SMEM, args),
            EncAttn::Gemm => Err(anyhow::anyhow!("launch_enc_flash: the cuBLASLt path has no flash kernel")),
        }
    }

    /// The long-prompt path of [`Cuda::causal_attention_with`]: per query chunk and per query
    /// head within a KV group (`r < H/Hkv`), `S = scale · Q Kᵀ` for all KV groups at once
    /// (cuBLASLt strided-batched straight out of the `[L, heads, hd]` layouts, fp32 scores, keys
    /// only up to the chunk's last query), the causal softmax (fp32, `P` in the activation
    /// dtype), `O = P V` written straight into `[L, H, hd]`.
    fn causal_attention_gemm(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        scale: f64,
        prefix: &str,
        out: CudaTensor,
    ) -> Result<CudaTensor> {
        let (l, nh, hd) = dims3(q, "causal_attention q")?;
        let nkv = k.shape[1];
        let rep = nh / nkv;
        let dt = q.dtype;
        let es = dt.size() as u64;
        let qc = ATTN_GEMM_CHUNK.min(l).min((crate::backend::cuda::dit::ATTN_SCORE_BUDGET / (nkv * l * 4)).max(1));
        let s = self.alloc(DType::F32, &[nkv * qc * l])?;
        let p = self.alloc(dt, &[nkv * qc * l])?;
        let (ldq, ldk) = (nh * hd, nkv * hd);
        let stream = &self.gpu().stream;
        for i0 in (0..l).step_by(qc) {
            let qn = qc.min(l - i0);
            let nk = i0 + qn;
            for r in 0..rep {
                // S (column-major nk × qn per KV group) = K read transposed · Q: S[j][s] row-major.
                let g1 = Gemm::plain(dt, DType::F32, true, false, nk, qn, hd, ldk, ldq, nk).batched(nkv, hd, rep * hd, qn * nk);
                let off_q = (i0 * ldq + r * hd) as u64 * es;
                self.blas().gemm(stream, g1, k.ptr(), q.ptr() + off_q, s.ptr(), None, scale as f32)?;
                self.launch(
                    &format!("{prefix}_csoftmax_{}", dt.name()),
                    (nkv * qn) as u32,
                    256,
                    0,
                    &[Arg::P(p.ptr()), Arg::P(s.ptr()), Arg::I(qn as i32), Arg::I(nk as i32), Arg::I(i0 as i32)],
                )?;
                // O (column-major hd × qn per group, ld H·hd) = V · P, into heads g·rep + r.
                let g2 = Gemm::plain(dt, dt, false, false, hd, qn, nk, ldk, nk, ldq).batched(nkv, hd, qn * nk, rep * hd);
                self.blas().gemm(stream, g2, v.ptr(), p.ptr(), out.ptr() + off_q, None, 1.0)?;
            }
        }
        Ok(out)
    }

    pub(crate) fn silu_mul_with(&self, gate: &CudaTensor, up: &CudaTensor, prefix: &str) -> Result<CudaTensor> {
        ensure!(gate.shape == up.shape, "silu_mul: {:?} vs {:?}", gate.shape, up.shape);
        let up = self.cast(up, gate.dtype)?;
        let out = self.alloc(gate.dtype, &gate.shape)?;
        let n = gate.numel();
        // 8 elements per thread where the size and the addresses allow 16-byte vectors.
        let vec = n % 8 == 0 && [gate.ptr(), up.ptr(), out.ptr()].iter().all(|p| p % 16 == 0);
        let (name, n) = if vec { ("silu_mul8", n / 8) } else { ("silu_mul", n) };
        self.launch(
            &format!("{prefix}_{name}_{}", gate.dtype.name()),
            self.grid_for(n),
            256,
            0,
            &[Arg::P(out.ptr()), Arg::P(gate.ptr()), Arg::P(up.ptr()), Arg::L(n as i64)],
        )?;
        Ok(out)
    }

    /// Causal conv + SiLU of a contiguous `x [L, C]` (see [`Cuda::conv_cols_with`]).
    pub(crate) fn causal_conv1d_silu_with(&self, x: &CudaTensor, w: &CudaTensor, prefix: &str) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 2, "causal_conv1d_silu: x must be [L, C], got {:?}", x.shape);
        self.conv_cols_with(x, 0, x.shape[1], w, prefix)
    }

    pub(crate) fn gdn_gates_with(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
        prefix: &str,
    ) -> Result<(CudaTensor, CudaTensor)> {
        let hv = a.last_dim();
        ensure!(a.shape == b.shape, "gdn_gates: a {:?} vs b {:?}", a.shape, b.shape);
        ensure!(a_log.numel() == hv && dt_bias.numel() == hv, "gdn_gates: A_log {:?} / dt_bias {:?} for {hv} heads", a_log.shape, dt_bias.shape);
        let b = self.cast(b, a.dtype)?;
        let (al, dt) = (self.f32v(a_log)?, self.f32v(dt_bias)?);
        let g = self.alloc(DType::F32, &a.shape)?;
        let beta = self.alloc(DType::F32, &a.shape)?;
        let n = a.numel();
        self.launch(
            &format!("{prefix}_gates_{}", a.dtype.name()),
            self.grid_for(n),
            256,
            0,
            &[
                Arg::P(g.ptr()),
                Arg::P(beta.ptr()),
                Arg::P(a.ptr()),
                Arg::P(b.ptr()),
                Arg::P(al.ptr()),
                Arg::P(dt.ptr()),
                Arg::L(n as i64),
                Arg::I(hv as i32),
            ],
        )?;
        Ok((g, beta))
    }

    /// The shapes of a gated delta rule's inputs checked (`q`, `k [L, Hk, dk]`, `v [L, Hv, dv]`,
    /// `Hv % Hk == 0`, `g`, `beta [L, Hv]`), k and v in q's dtype, g and beta in f32, and the
    /// output buffer: what both delta-rule kernels start from.
    fn gdr_inputs(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, g: &CudaTensor, beta: &CudaTensor) -> Result<GdrInputs> {
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
    /// aligned (addresses, head dims) or have Hv / Hk odd, take [`Cuda::gated_delta_rule_seq_with`] (only with
    /// [`GdrPath::Auto`]; the explicit paths are an error there). The planted control
    /// (`prefix` = `moss_ctl_enc`) lives in the state pass / output kernel ([`GdrPath::PrepCtl`]:
    /// in the prep).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_rule_with(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        beta: &CudaTensor,
        prefix: &str,
        path: GdrPath,
    ) -> Result<CudaTensor> {
        let (_, hk, dk) = dims3(q, "gated_delta_rule q")?;
        let (_, hv, dv) = dims3(v, "gated_delta_rule v")?;
        let ptrs = [q.ptr(), k.ptr(), v.ptr()];
        if !gdr_chunked_fits(q.dtype, ptrs, (hk * dk, hv * dv), (hk, hv), dk, dv) {
            ensure!(path == GdrPath::Auto, "gated_delta_rule: {path:?} needs dk, dv ≤ {GDR_MAX_DIM}, 16-byte aligned q k v and Hv / Hk even");
            return self.gated_delta_rule_seq_with(q, k, v, g, beta, prefix);
        }
        let GdrInputs { l, hk, dk, hv, dv, dt, k, v, g, beta, out } = self.gdr_inputs(q, k, v, g, beta)?;
        let rows = GdrRows { q: q.ptr(), k: k.ptr(), v: v.ptr(), rqk: hk * dk, rv: hv * dv };
        self.gdr_chunked(&rows, (l, hk, dk, hv, dv), dt, &g, &beta, out, prefix, path)
    }

    /// [`Cuda::gated_delta_rule_with`] reading q, k and v straight out of the conv output
    /// `qkv [L, 2·Hk·dk + Hv·dv]` (row stride: its width) instead of three narrowed copies.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_rule_qkv_with(
        &self,
        qkv: &CudaTensor,
        (hk, dk, hv, dv): (usize, usize, usize, usize),
        g: &CudaTensor,
        beta: &CudaTensor,
        prefix: &str,
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
        if !gdr_chunked_fits(dt, [rows.q, rows.k, rows.v], (c, c), (hk, hv), dk, dv) {
            let q = Backend::reshape(self, &self.narrow_with(qkv, 1, 0, hk * dk, "moss")?, &[l, hk, dk])?;
            let k = Backend::reshape(self, &self.narrow_with(qkv, 1, hk * dk, hk * dk, "moss")?, &[l, hk, dk])?;
            let v = Backend::reshape(self, &self.narrow_with(qkv, 1, 2 * hk * dk, hv * dv, "moss")?, &[l, hv, dv])?;
            return self.gated_delta_rule_with(&q, &k, &v, g, beta, prefix, path);
        }
        for (n, t) in [("g", g), ("beta", beta)] {
            ensure!(t.shape == [l, hv], "gated_delta_rule_qkv: {n} {:?}, expected [{l}, {hv}]", t.shape);
        }
        let (g, beta) = (self.f32v(g)?, self.f32v(beta)?);
        let out = self.alloc(dt, &[l, hv, dv])?;
        self.gdr_chunked(&rows, (l, hk, dk, hv, dv), dt, &g, &beta, out, prefix, path)
    }

    /// The chunk-parallel kernels over q, k, v rows at `rows` (see [`GdrRows`]; bf16 rows 16-byte
    /// aligned, [`gdr_chunked_fits`]).
    #[allow(clippy::too_many_arguments)]
    fn gdr_chunked(
        &self,
        rows: &GdrRows,
        (l, hk, dk, hv, dv): (usize, usize, usize, usize, usize),
        dt: DType,
        g: &CudaTensor,
        beta: &CudaTensor,
        out: CudaTensor,
        prefix: &str,
        path: GdrPath,
    ) -> Result<CudaTensor> {
        ensure!(dt == DType::BF16 || path == GdrPath::Auto, "gated_delta_rule: {path:?} is a bf16 path (fp32 takes the SIMT kernels)");
        let tma = match path {
            GdrPath::Auto => dt == DType::BF16 && self.has_sm90a(),
            GdrPath::Tma => {
                ensure!(self.has_sm90a(), "gated_delta_rule: the TMA state pass needs an sm_90 GPU with the cuda/sm90a kernels");
                true
            }
            GdrPath::Tc | GdrPath::PrepCtl => false,
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
        let dims = || {
            [Arg::I(l as i32), Arg::I(hk as i32), Arg::I(hv as i32), Arg::I(dk as i32), Arg::I(dv as i32)]
                .into_iter()
                .chain([Arg::L(rows.rqk as i64), Arg::L(rows.rv as i64)])
        };
        let mut args = vec![Arg::P(kd.ptr()), Arg::P(wk.ptr()), Arg::P(u0.ptr()), Arg::P(wqk.ptr()), Arg::P(gam.ptr())];
        args.extend([rows.q, rows.k, rows.v, g.ptr(), beta.ptr()].map(Arg::P));
        args.extend(dims());
        let (u, s) = if dt == DType::F32 {
            // fp32: the SIMT kernels, the control in gdr_out
            self.launch("moss_enc_gdr_prep_f32", nb as u32, 256, (GDR_PREP_FLOATS * 4) as u32, &args)?;
            (f32s(nb * ch * d)?, f32s(nb * d * d)?)
        } else {
            // bf16: gdr_prep_tc3p (16-byte copies of q, k, v rows; a block per chunk and pair of
            // value heads), its control only with PrepCtl
            ensure!(
                gdr_chunked_fits(dt, [rows.q, rows.k, rows.v], (rows.rqk, rows.rv), (hk, hv), dk, dv),
                "gdr_prep_tc3p: q k v addresses, row strides and head dims must be 16-byte aligned, Hv / Hk even"
            );
            let pp = if path == GdrPath::PrepCtl { prefix } else { "moss_enc" };
            self.launch(&format!("{pp}_gdr_prep_tc3p_bf16"), (nb / 2) as u32, 512, (GDR_PREP3P_FLOATS * 4) as u32, &args)?;
            if tma {
                // `gdr_tma` (`cuda/encoder/sm90a/delta_rule_tma.cu`): per value head and 32 value columns, in chunk
                // order, U = U0 − Wk S, O = e^{γ} ⊙ Q̂ S + Wqk U straight to the output, S ← e^{γl} S +
                // Kdᵀ U; the 2 column blocks of a cluster share each chunk's tiles, loaded as boxes of
                // tensor maps over q (bf16, strided) and the prep's scratch (f32 rows of 128 / 64).
                let r = (ch / 2) as u32;
                let map = |p: u64, t: DType, cols: usize, rows: usize, ld: usize, bx: u32, by: u32| {
                    tensor_map_2d(p, t, cols, rows, ld, bx, by).map(|m| Arg::Map(Box::new(m)))
                };
                let mut args = vec![
                    map(rows.q, DType::BF16, hk * dk, l, rows.rqk, 64, r)?,
                    map(wk.ptr(), DType::F32, d, nb * ch, d, 32, r)?,
                    map(kd.ptr(), DType::F32, d, nb * ch, d, 32, r)?,
                    map(u0.ptr(), DType::F32, d, nb * ch, d, 32, ch as u32)?,
                    map(wqk.ptr(), DType::F32, ch, nb * ch, ch, 32, r)?,
                    Arg::P(out.ptr()),
                    Arg::P(gam.ptr()),
                ];
                args.extend(dims().take(5));
                // grid: 4 column blocks of 32 per value head (dv ≤ 128; blocks past dv compute zeros)
                self.launch(&format!("{prefix}_gdr_tma_bf16"), (4 * hv) as u32, GDR_TMA_THREADS, GDR_TMA_BYTES, &args)?;
                return Ok(out);
            }
            (f32s(nb * ch * d)?, f32s(nb * d * d)?)
        };
        let tc = dt == DType::BF16;
        let ncb = dv.div_ceil(GDR_SEQ_COLS);
        self.launch(
            if tc { "moss_enc_gdr_seq_tc" } else { "moss_enc_gdr_seq" },
            (hv * ncb) as u32,
            256,
            ((if tc { GDR_SEQ_TC_FLOATS } else { GDR_SEQ_FLOATS }) * 4) as u32,
            &[
                Arg::P(s.ptr()),
                Arg::P(u.ptr()),
                Arg::P(wk.ptr()),
                Arg::P(kd.ptr()),
                Arg::P(u0.ptr()),
                Arg::P(gam.ptr()),
                Arg::I(nc as i32),
                Arg::I(hv as i32),
                Arg::I(ncb as i32),
            ],
        )?;
        let mut args = vec![Arg::P(out.ptr()), Arg::P(rows.q), Arg::P(s.ptr()), Arg::P(u.ptr()), Arg::P(wqk.ptr()), Arg::P(gam.ptr())];
        args.extend(dims());
        let op = if path == GdrPath::PrepCtl { "moss_enc" } else { prefix };
        self.launch_2d(
            &format!("{op}_gdr_out_{}", if tc { "tc_bf16" } else { "f32" }),
            (nb as u32, dv.div_ceil(GDR_OUT_COLS) as u32),
            256,
            ((if tc { GDR_OUT_TC_FLOATS } else { GDR_OUT_FLOATS }) * 4) as u32,
            &args,
        )?;
        Ok(out)
    }

    /// The gated delta rule in one kernel, sequential over chunks (`gdr` in `cuda/encoder/encoder_ops.cu`;
    /// kept for head dims above [`GDR_MAX_DIM`] and as a second implementation under the gates).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_rule_seq_with(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        beta: &CudaTensor,
        prefix: &str,
    ) -> Result<CudaTensor> {
        let GdrInputs { l, hk, dk, hv, dv, dt, k, v, g, beta, out } = self.gdr_inputs(q, k, v, g, beta)?;
        if l == 0 {
            return Ok(out);
        }
        // Columns per block: GDR_COLS, or all of dv when it is narrower or does not divide.
        let cols = if dv % GDR_COLS == 0 { GDR_COLS } else { dv };
        ensure!(cols <= GDR_THREADS as usize, "gated_delta_rule: value head dim {dv}");
        let ch = DELTA_CHUNK;
        let floats = dk * cols + 2 * ch * (dk + 1) + 2 * ch * cols + 2 * ch * (ch + 1) + 4 * ch;
        let bytes = floats * 4;
        ensure!(bytes <= 227 * 1024, "gated_delta_rule: dk {dk} needs {bytes} bytes of shared memory");
        self.launch(
            &format!("{prefix}_gdr_{}", dt.name()),
            (hv * (dv / cols)) as u32,
            GDR_THREADS,
            bytes as u32,
            &[
                Arg::P(out.ptr()),
                Arg::P(q.ptr()),
                Arg::P(k.ptr()),
                Arg::P(v.ptr()),
                Arg::P(g.ptr()),
                Arg::P(beta.ptr()),
                Arg::I(l as i32),
                Arg::I(hk as i32),
                Arg::I(hv as i32),
                Arg::I(dk as i32),
                Arg::I(dv as i32),
                Arg::I(cols as i32),
            ],
        )?;
        Ok(out)
    }

    /// The residual add and the next RMSNorm in one kernel (`cuda/encoder/add_rms_norm.cu`): block per row,
    /// rows of a width that is a multiple of 8 up to 8192; other widths take the generic add and
    /// rms_norm (the same rounding points). Planted control (`moss_ctl_enc`): the weight without its
    /// `1 +`.
    pub(crate) fn add_rms_norm_with(
        &self,
        x: &CudaTensor,
        h: &CudaTensor,
        w: &CudaTensor,
        eps: f64,
        prefix: &str,
    ) -> Result<(CudaTensor, CudaTensor)> {
        ensure!(x.shape == h.shape, "add_rms_norm: x {:?} vs h {:?}", x.shape, h.shape);
        let d = x.last_dim();
        ensure!(w.numel() == d, "add_rms_norm: weight {:?} for width {d}", w.shape);
        let h = self.cast(h, x.dtype)?;
        if d % 8 != 0 || d > 8192 || d == 0 || x.ptr() % 16 != 0 || h.ptr() % 16 != 0 {
            let xo = self.binary_with("add", x, &h, "moss")?;
            // the planted control there: the generic kernel's variant with the same bug (no 1 +)
            let kernel = if prefix == P { "moss_rms_norm" } else { "moss_ctl_rms_noplus" };
            let n = self.rms_norm_with(&xo, Some(w), eps, true, kernel)?;
            return Ok((xo, n));
        }
        let w = self.f32v(w)?;
        let xo = self.alloc(x.dtype, &x.shape)?;
        let n = self.alloc(x.dtype, &x.shape)?;
        self.launch(
            &format!("{prefix}_add_rms_{}", x.dtype.name()),
            x.rows() as u32,
            256,
            0,
            &[
                Arg::P(xo.ptr()),
                Arg::P(n.ptr()),
                Arg::P(x.ptr()),
                Arg::P(h.ptr()),
                Arg::P(w.ptr()),
                Arg::I(d as i32),
                Arg::F(eps as f32),
            ],
        )?;
        Ok((xo, n))
    }

    pub(crate) fn gated_rms_norm_with(
        &self,
        x: &CudaTensor,
        z: &CudaTensor,
        w: &CudaTensor,
        eps: f64,
        prefix: &str,
    ) -> Result<CudaTensor> {
        ensure!(x.shape == z.shape, "gated_rms_norm: x {:?} vs z {:?}", x.shape, z.shape);
        let d = x.last_dim();
        ensure!(w.numel() == d, "gated_rms_norm: weight {:?} for width {d}", w.shape);
        let z = self.cast(z, x.dtype)?;
        let w = self.f32v(w)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = x.rows();
        // 16 lanes per row with 16-byte vectors where the width and the addresses allow, else a
        // warp per row.
        let vec = d % 8 == 0 && [x.ptr(), z.ptr(), out.ptr()].iter().all(|p| p % 16 == 0);
        let (name, per_block) = if vec { ("grms8", 16) } else { ("grms", 8) };
        self.launch(
            &format!("{prefix}_{name}_{}", x.dtype.name()),
            rows.div_ceil(per_block) as u32,
            256,
            0,
            &[
                Arg::P(out.ptr()),
                Arg::P(x.ptr()),
                Arg::P(z.ptr()),
                Arg::P(w.ptr()),
                Arg::L(rows as i64),
                Arg::I(d as i32),
                Arg::F(eps as f32),
            ],
        )?;
        Ok(out)
    }
}

const P: &str = "moss_enc";

impl Cuda {
    /// Run `f`, timed as `op` while the profile ([`crate::backend::cuda::profile`]) is on.
    pub(crate) fn prof<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.timed_op(|| op.to_string(), f)
    }
}

impl EncoderOps for Cuda {
    fn embed(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor> {
        self.prof("embed", || {
            if let Some(out) = self.embed8_with(table, ids, P)? {
                return Ok(out);
            }
            self.embed_with(table, ids, P)
        })
    }
    fn head_norm_rope(&self, x: &CudaTensor, w: &CudaTensor, eps: f64, rot: usize, theta: f64) -> Result<CudaTensor> {
        self.prof("head_norm_rope", || self.head_norm_rope_with(x, w, eps, rot, theta, P))
    }
    fn causal_attention(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        let path = self.enc_attn();
        self.prof("causal_attention", || self.causal_attention_with(q, k, v, scale, P, path))
    }
    fn causal_attention_gated(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, qg: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        if qg.shape.len() == 3 && qg.shape[2] % 16 == 0 {
            let o = self.causal_attention(q, k, v, scale)?;
            if let Some(out) = self.prof("attn_gate", || self.attn_gate_with(&o, qg, P))? {
                return Ok(out);
            }
        }
        crate::backend::ops::encoder::causal_attention_gated_unfused(self, q, k, v, qg, scale)
    }
    #[allow(clippy::too_many_arguments)]
    fn attn_qkv_norm_rope(
        &self,
        y: &CudaTensor,
        heads: (usize, usize, usize),
        wq: &CudaTensor,
        wk: &CudaTensor,
        eps: f64,
        rot: usize,
        theta: f64,
    ) -> Result<(CudaTensor, CudaTensor, CudaTensor)> {
        if let Some(r) = self.prof("head_norm_rope", || self.attn_qkv_rope_with(y, heads, wq, wk, eps, rot, theta, P))? {
            return Ok(r);
        }
        crate::backend::ops::encoder::attn_qkv_split(self, y, heads, wq, wk, eps, rot, theta)
    }
    fn causal_attention_gated_y(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, y: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        if q.shape.len() == 3 {
            let (nh, hd) = (q.shape[1], q.shape[2]);
            let o = self.causal_attention(q, k, v, scale)?;
            if let Some(out) = self.prof("attn_gate", || self.attn_gate_y_with(&o, y, (nh, hd), P))? {
                return Ok(out);
            }
        }
        let d = &q.shape;
        ensure!(d.len() == 3, "causal_attention_gated_y: q {d:?} is not [L, H, hd]");
        let qg = Backend::reshape(self, &self.prof("narrow", || self.narrow(y, 1, 0, d[1] * 2 * d[2]))?, &[d[0], d[1], 2 * d[2]])?;
        self.causal_attention_gated(q, k, v, &qg, scale)
    }
    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.prof("silu_mul", || self.silu_mul_with(gate, up, P))
    }
    fn causal_conv1d_silu(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        self.prof("causal_conv1d_silu", || self.causal_conv1d_silu_with(x, w, P))
    }
    fn causal_conv1d_silu_cols(&self, y: &CudaTensor, start: usize, c: usize, w: &CudaTensor) -> Result<CudaTensor> {
        self.prof("causal_conv1d_silu", || {
            if let Some((out, _)) = self.convg_cols_with(y, (start, c), w, None, P)? {
                return Ok(out);
            }
            self.conv_cols_with(y, start, c, w, P)
        })
    }
    fn conv_gates_cols(
        &self,
        y: &CudaTensor,
        (start, c): (usize, usize),
        w: &CudaTensor,
        gates: (usize, usize, usize),
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor, CudaTensor)> {
        let r = self.prof("causal_conv1d_silu", || self.convg_cols_with(y, (start, c), w, Some((gates, a_log, dt_bias)), P))?;
        if let Some((conv, Some((g, beta)))) = r {
            return Ok((conv, g, beta));
        }
        let conv = self.causal_conv1d_silu_cols(y, start, c, w)?;
        let (g, beta) = self.gdn_gates_cols(y, gates, a_log, dt_bias)?;
        Ok((conv, g, beta))
    }
    fn cat_weights(&self, group: &'static str, ws: Vec<CudaTensor>) -> Result<Vec<CudaTensor>> {
        self.cat_weights_with(group, ws)
    }
    fn linear_cat(&self, x: &CudaTensor, ws: &[CudaTensor]) -> Result<CudaTensor> {
        self.linear_cat_with(x, ws)
    }
    fn gdn_gates_cols(
        &self,
        y: &CudaTensor,
        cols: (usize, usize, usize),
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("gdn_gates", || self.gdn_gates_cols_with(y, cols, a_log, dt_bias, P))
    }
    fn gated_rms_norm_cols(&self, x: &CudaTensor, y: &CudaTensor, z0: usize, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        self.prof("gated_rms_norm", || {
            // grmsf1, then grms8r for heads wider than 128
            for k in GRMS {
                if let Some(out) = self.grms_cols_with(x, y, z0, w, eps, k, P)? {
                    return Ok(out);
                }
            }
            self.gated_rms_norm_cols_with(x, y, z0, w, eps, P)
        })
    }
    fn silu_mul_cols(&self, y: &CudaTensor, f: usize) -> Result<CudaTensor> {
        self.prof("silu_mul", || {
            if y.rows() >= SILU_V_MIN_ROWS {
                if let Some(out) = self.silu_mul8v_with(y, f, P)? {
                    return Ok(out);
                }
            }
            self.silu_mul_cols_with(y, f, P)
        })
    }
    fn linear_add_rms_norm(&self, a: &CudaTensor, w: &CudaTensor, res: &CudaTensor, w_norm: &CudaTensor, eps: f64) -> Result<(CudaTensor, CudaTensor)> {
        self.linear_add_rms_norm_with(a, w, res, w_norm, eps, P, false)
    }
    fn gdn_gates(&self, a: &CudaTensor, b: &CudaTensor, a_log: &CudaTensor, dt_bias: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("gdn_gates", || self.gdn_gates_with(a, b, a_log, dt_bias, P))
    }
    fn gated_delta_rule(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, g: &CudaTensor, beta: &CudaTensor) -> Result<CudaTensor> {
        self.prof("gated_delta_rule", || self.gated_delta_rule_with(q, k, v, g, beta, P, GdrPath::Auto))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule_qkv(
        &self,
        qkv: &CudaTensor,
        heads: (usize, usize, usize, usize),
        g: &CudaTensor,
        beta: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.prof("gated_delta_rule", || self.gated_delta_rule_qkv_with(qkv, heads, g, beta, P, GdrPath::Auto))
    }
    fn gated_rms_norm(&self, x: &CudaTensor, z: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        self.prof("gated_rms_norm", || self.gated_rms_norm_with(x, z, w, eps, P))
    }
    fn add_rms_norm(&self, x: &CudaTensor, h: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("add_rms_norm", || self.add_rms_norm_with(x, h, w, eps, P))
    }
    fn timed<R>(&self, op: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.prof(op, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn enc_attn_by_device() {
        assert_eq!(pick_enc_attn(true), EncAttn::Wgmma);
        assert_eq!(pick_enc_attn(false), EncAttn::Flash);
    }
}
