//! [`EncoderOps`] on the GPU: the kernels of `cuda/encoder/encoder_ops.cu` (the linears are the generic
//! cuBLASLt `linear`).
//!
//! Dtypes: activations (q, k, v, x, z, gate, up) keep their dtype (bf16, or f32 with
//! `--precision fp32`) and the output takes it; the small per-channel vectors (norm weights, the
//! conv taps, `A_log`, `dt_bias`) are read as f32 (cast first where the checkpoint holds bf16; the
//! kernels of `row_ops.rs`, the default for the DeltaNet / MLP row ops, read them as loaded);
//! the DeltaNet gates `g`, `beta` are f32 and the delta rule keeps its state and decays in f32.

pub mod attention_qkv_gate;
pub mod delta_rule;
pub mod delta_rule_compact;
pub mod row_ops;
pub mod strided_row_ops;

pub(crate) use delta_rule::GdrPath;
pub use delta_rule::GDR_MAX_DIM;

use crate::blas::Gemm;
use crate::encoder::row_ops::{GRMS, SILU_V_MIN_ROWS};
use crate::kernels::{self, Dev, Family};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::cpu::encoder::rope_angles;
use moss_core::backend::ops::encoder::Cols;
use moss_core::backend::ops::EncoderOps;
use moss_core::backend::Backend;
use moss_core::tensor::Tensor;

fn dims3(x: &CudaTensor, what: &str) -> Result<(usize, usize, usize)> {
    ensure!(x.shape.len() == 3, "{what}: expected [L, heads, dim], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2]))
}

use crate::launch::{
    ENC_ADD_RMS_MAX_WIDTH, ENC_ADD_RMS_THREADS, ENC_ATTN_Q, ENC_ATTN_SMEM_FLOATS, ENC_ATTN_THREADS, ENC_FLASH_HD, ENC_FLASH_ROWS, ENC_FLASH_SMEM,
    ENC_FLASH_THREADS, ENC_FLASH_WG_ROWS, ENC_FLASH_WG_SMEM, ENC_FLASH_WG_THREADS,
};
/// Prompts longer than this take the cuBLASLt attention path (tensor cores), shorter ones the
/// tiled kernel.
pub const ATTN_TILED_MAX: usize = 256;
/// Query rows per chunk of the cuBLASLt path (keys only up to the chunk's end are scored).
const ATTN_GEMM_CHUNK: usize = 1024;
/// Largest head dim the attention kernel takes (one output dim per thread).
pub const ATTN_MAX_HD: usize = ENC_ATTN_THREADS;
/// Head dim of the flash causal kernel and its dynamic shared memory (`cuda/encoder/causal_flash_attention.cu`).
pub const FLASH_HD: usize = ENC_FLASH_HD;
pub(crate) const FLASH_SMEM: u32 = ENC_FLASH_SMEM as u32;
/// Dynamic shared memory of the Hopper kernel (`cuda/encoder/sm90a/causal_flash_attention_wgmma.cu`).
pub(crate) const FLASH_WG_SMEM: u32 = ENC_FLASH_WG_SMEM as u32;

/// The flash kernels' parameter list (`moss_enc_fattn_bf16`, `moss_enc_fattn_wg_bf16`).
type FlashKernel = Family<fn(Dev, Dev, Dev, Dev, i32, i32, i32, f32)>;

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
/// ([`crate::select::choices`]).
pub fn kernel_choices(hopper: bool, smem_optin: usize) -> Vec<crate::select::Choice> {
    use crate::select::Choice;
    use delta_rule_compact::{pick_state_pass, StatePass};
    let attn = if hopper { "moss_enc_fattn_wg_bf16 (wgmma)" } else { "moss_enc_fattn_bf16 (mma.sync)" };
    let gdr = match (hopper, pick_state_pass(true, smem_optin)) {
        (true, _) => "moss_enc_delta_rule_prep_bf16 + moss_enc_gdr_tma_bf16 (TMA, clusters of 2)",
        (false, Some(StatePass::Wide)) => "moss_enc_delta_rule_prep_bf16 + moss_enc_gdr_seq_tc + moss_enc_gdr_out_tc_bf16",
        (false, Some(StatePass::Compact)) => {
            "moss_enc_delta_rule_prep_bf16 + moss_enc_gdr_seq_compact_tc + moss_enc_gdr_out_compact_tc_bf16 (≤ 96 KiB a block)"
        }
        (false, None) => "moss_enc_gdr_bf16 (sequential: the chunked kernels' shared memory does not fit)",
    };
    let gdr32 = match pick_state_pass(false, smem_optin) {
        Some(StatePass::Wide) => "moss_enc_gdr_prep_f32 + moss_enc_gdr_seq + moss_enc_gdr_out_f32",
        Some(StatePass::Compact) => "moss_enc_gdr_prep_f32 + moss_enc_gdr_seq_compact_f32 + moss_enc_gdr_out_compact_f32 (≤ 96 KiB a block)",
        None => "moss_enc_gdr_f32 (sequential)",
    };
    vec![
        Choice { op: "enc causal_attention (bf16, L > 256, hd 256)", kernel: attn.into() },
        Choice { op: "enc causal_attention (L <= 256, or fp32)", kernel: "moss_enc_attn_* (tiled) / cuBLASLt + moss_enc_csoftmax_*".into() },
        Choice { op: "enc gated_delta_rule (bf16)", kernel: gdr.into() },
        Choice { op: "enc gated_delta_rule (fp32)", kernel: gdr32.into() },
    ]
}

impl Cuda {
    /// The long-prompt attention path of this device ([`pick_enc_attn`]).
    pub fn enc_attn(&self) -> EncAttn {
        pick_enc_attn(self.has_sm90a())
    }

    fn f32v(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.cast(x, DType::F32)
    }

    /// The embedding gather, a thread an element (any width).
    pub(crate) fn embed_rows(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor> {
        ensure!(table.shape.len() == 2, "embed: table must be [vocab, hidden], got {:?}", table.shape);
        let (vocab, h) = (table.shape[0], table.shape[1]);
        for &id in ids {
            ensure!((id as usize) < vocab, "token id {id} is outside the embedding table of {vocab}");
        }
        ensure!(vocab < (1 << 24), "embed: a vocabulary of {vocab} does not fit exact f32 ids");
        let idt = self.upload_as(&Tensor::new(vec![ids.len()], ids.iter().map(|&i| i as f32).collect())?, DType::F32)?;
        let out = self.alloc(table.dtype, &[ids.len(), h])?;
        kernels::ENC_EMBED.launch(self, (self.grid_for(ids.len() * h), 256, 0), &out, table, &idt, ids.len() as i64, h as i64)?;
        Ok(out)
    }

    /// [`EncoderOps::head_norm_rope`].
    pub(crate) fn head_norm_rope_op(&self, x: &CudaTensor, w: &CudaTensor, eps: f64, rot: usize, theta: f64) -> Result<CudaTensor> {
        let (l, nh, hd) = dims3(x, "head_norm_rope")?;
        ensure!(w.numel() == hd, "head_norm_rope: weight {:?} for head_dim {hd}", w.shape);
        ensure!(rot.is_multiple_of(2) && rot <= hd, "head_norm_rope: rotary dim {rot} of head_dim {hd}");
        // The inverse frequencies exactly as the CPU twin makes them (angle of position 1).
        let inv = rope_angles(1, rot, theta);
        let inv = self.upload_as(&Tensor::new(vec![inv.len().max(1)], if inv.is_empty() { vec![0.0] } else { inv })?, DType::F32)?;
        let w = self.f32v(w)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = l * nh;
        let cfg = (rows.div_ceil(8) as u32, 256, 0);
        kernels::ENC_HEAD_ROPE.launch(self, cfg, &out, x, &w, &inv, rows as i64, nh as i32, hd as i32, eps as f32, rot as i32)?;
        Ok(out)
    }

    /// Causal GQA attention. Prompts up to [`ATTN_TILED_MAX`] take the tiled kernel; longer ones
    /// the flash kernel `path` ([`EncAttn::Flash`] / [`EncAttn::Wgmma`]) when the data are bf16
    /// with head dim [`FLASH_HD`], else the cuBLASLt path.
    pub(crate) fn causal_attention_on(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, scale: f64, path: EncAttn) -> Result<CudaTensor> {
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
            let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
            self.launch_enc_flash(path, l, nh, (&out, q, &k, &v), (nkv, scale_log2))?;
            return Ok(out);
        }
        if l > ATTN_TILED_MAX {
            return self.causal_attention_gemm(q, &k, &v, scale, out);
        }
        let blocks = l.div_ceil(ENC_ATTN_Q) * nh;
        let cfg = (blocks as u32, ENC_ATTN_THREADS as u32, (ENC_ATTN_SMEM_FLOATS(hd) * 4) as u32);
        kernels::ENC_ATTN.launch(self, cfg, &out, q, &k, &v, l as i32, nh as i32, nkv as i32, hd as i32, scale as f32)?;
        Ok(out)
    }

    /// Launch the encoder's flash attention kernel of `path` (same arguments for both):
    /// `moss_enc_fattn_bf16`, grid (L/64, H), 128 threads, or on Hopper `moss_enc_fattn_wg_bf16`,
    /// grid (H, L/128) (heads of one row block together), 256; `(o, q, k, v)`, `(Hkv, scale·log2 e)`.
    pub(crate) fn launch_enc_flash(
        &self,
        path: EncAttn,
        l: usize,
        nh: usize,
        (o, q, k, v): (&CudaTensor, &CudaTensor, &CudaTensor, &CudaTensor),
        (nkv, scale_log2): (usize, f32),
    ) -> Result<()> {
        let (kernel, cfg): (&FlashKernel, _) = match path {
            EncAttn::Wgmma => {
                ensure!(self.has_sm90a(), "the wgmma attention needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
                (&kernels::ENC_FATTN_WG, ((nh as u32, l.div_ceil(ENC_FLASH_WG_ROWS) as u32), ENC_FLASH_WG_THREADS as u32, FLASH_WG_SMEM))
            }
            EncAttn::Flash => (&kernels::ENC_FATTN, ((l.div_ceil(ENC_FLASH_ROWS) as u32, nh as u32), ENC_FLASH_THREADS as u32, FLASH_SMEM)),
            EncAttn::Gemm => anyhow::bail!("launch_enc_flash: the cuBLASLt path has no flash kernel"),
        };
        kernel.launch(self, cfg, o, q, k, v, l as i32, nh as i32, nkv as i32, scale_log2)
    }

    /// The long-prompt path of [`Cuda::causal_attention_on`]: per query chunk and per query
    /// head within a KV group (`r < H/Hkv`), `S = scale · Q Kᵀ` for all KV groups at once
    /// (cuBLASLt strided-batched straight out of the `[L, heads, hd]` layouts, fp32 scores, keys
    /// only up to the chunk's last query), the causal softmax (fp32, `P` in the activation
    /// dtype), `O = P V` written straight into `[L, H, hd]`.
    fn causal_attention_gemm(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, scale: f64, out: CudaTensor) -> Result<CudaTensor> {
        let (l, nh, hd) = dims3(q, "causal_attention q")?;
        let nkv = k.shape[1];
        let rep = nh / nkv;
        let dt = q.dtype;
        let es = dt.size() as u64;
        let qc = ATTN_GEMM_CHUNK.min(l).min((crate::dit::ATTN_SCORE_BUDGET / (nkv * l * 4)).max(1));
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
                kernels::ENC_CSOFTMAX.launch(self, ((nkv * qn) as u32, 256, 0), &p, &s, qn as i32, nk as i32, i0 as i32)?;
                // O (column-major hd × qn per group, ld H·hd) = V · P, into heads g·rep + r.
                let g2 = Gemm::plain(dt, dt, false, false, hd, qn, nk, ldk, nk, ldq).batched(nkv, hd, qn * nk, rep * hd);
                self.blas().gemm(stream, g2, v.ptr(), p.ptr(), out.ptr() + off_q, None, 1.0)?;
            }
        }
        Ok(out)
    }

    /// [`EncoderOps::silu_mul`].
    pub(crate) fn silu_mul_op(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        ensure!(gate.shape == up.shape, "silu_mul: {:?} vs {:?}", gate.shape, up.shape);
        let up = self.cast(up, gate.dtype)?;
        let out = self.alloc(gate.dtype, &gate.shape)?;
        let n = gate.numel();
        // 8 elements per thread where the size and the addresses allow 16-byte vectors.
        let vec = n.is_multiple_of(8) && [gate.ptr(), up.ptr(), out.ptr()].iter().all(|p| p % 16 == 0);
        let (kernel, n) = if vec { (&kernels::ENC_SILU_MUL8, n / 8) } else { (&kernels::ENC_SILU_MUL, n) };
        kernel.launch(self, (self.grid_for(n), 256, 0), &out, gate, &up, n as i64)?;
        Ok(out)
    }

    /// [`EncoderOps::gdn_gates`].
    pub(crate) fn gdn_gates_op(&self, a: &CudaTensor, b: &CudaTensor, a_log: &CudaTensor, dt_bias: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        let hv = a.last_dim();
        ensure!(a.shape == b.shape, "gdn_gates: a {:?} vs b {:?}", a.shape, b.shape);
        ensure!(a_log.numel() == hv && dt_bias.numel() == hv, "gdn_gates: A_log {:?} / dt_bias {:?} for {hv} heads", a_log.shape, dt_bias.shape);
        let b = self.cast(b, a.dtype)?;
        let (al, dt) = (self.f32v(a_log)?, self.f32v(dt_bias)?);
        let g = self.alloc(DType::F32, &a.shape)?;
        let beta = self.alloc(DType::F32, &a.shape)?;
        let n = a.numel();
        kernels::ENC_GATES.launch(self, (self.grid_for(n), 256, 0), &g, &beta, a, &b, &al, &dt, n as i64, hv as i32)?;
        Ok((g, beta))
    }

    /// The residual add and the next RMSNorm in one kernel (`cuda/encoder/add_rms_norm.cu`): block per row,
    /// rows of a width that is a multiple of 8 up to 8192; other widths take the generic add and
    /// rms_norm (the same rounding points).
    pub(crate) fn add_rms_norm_op(&self, x: &CudaTensor, h: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<(CudaTensor, CudaTensor)> {
        ensure!(x.shape == h.shape, "add_rms_norm: x {:?} vs h {:?}", x.shape, h.shape);
        let d = x.last_dim();
        ensure!(w.numel() == d, "add_rms_norm: weight {:?} for width {d}", w.shape);
        let h = self.cast(h, x.dtype)?;
        if !d.is_multiple_of(8) || d > ENC_ADD_RMS_MAX_WIDTH || d == 0 || !x.ptr().is_multiple_of(16) || h.ptr() % 16 != 0 {
            let xo = self.binary(&kernels::ADD, "add", x, &h)?;
            let n = self.rms_norm_rows(&xo, Some(w), eps, true)?;
            return Ok((xo, n));
        }
        let w = self.f32v(w)?;
        let xo = self.alloc(x.dtype, &x.shape)?;
        let n = self.alloc(x.dtype, &x.shape)?;
        kernels::ENC_ADD_RMS.launch(self, (x.rows() as u32, ENC_ADD_RMS_THREADS as u32, 0), &xo, &n, x, &h, &w, d as i32, eps as f32)?;
        Ok((xo, n))
    }

    /// [`EncoderOps::gated_rms_norm`].
    pub(crate) fn gated_rms_norm_op(&self, x: &CudaTensor, z: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        ensure!(x.shape == z.shape, "gated_rms_norm: x {:?} vs z {:?}", x.shape, z.shape);
        let d = x.last_dim();
        ensure!(w.numel() == d, "gated_rms_norm: weight {:?} for width {d}", w.shape);
        let z = self.cast(z, x.dtype)?;
        let w = self.f32v(w)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = x.rows();
        // 16 lanes per row with 16-byte vectors where the width and the addresses allow, else a
        // warp per row.
        let vec = d.is_multiple_of(8) && [x.ptr(), z.ptr(), out.ptr()].iter().all(|p| p % 16 == 0);
        let (kernel, per_block) = if vec { (&kernels::ENC_GRMS8, 16) } else { (&kernels::ENC_GRMS, 8) };
        kernel.launch(self, (rows.div_ceil(per_block) as u32, 256, 0), &out, x, &z, &w, rows as i64, d as i32, eps as f32)?;
        Ok(out)
    }
}

/// Whether two column blocks are columns of one tensor (the fused kernels read both from it).
fn same_cols(a: Cols<'_, CudaTensor>, b: Cols<'_, CudaTensor>) -> bool {
    a.of.ptr() == b.of.ptr() && a.of.shape == b.of.shape
}

impl EncoderOps for Cuda {
    fn embed_from_host(&self, c: &moss_core::checkpoint::Component, name: &str, ids: &[u32]) -> Result<CudaTensor> {
        // The dtype `load` gives the table (bf16 stays bf16 at bf16 precision, else f32): the
        // rows are exact in it, so these are `embed`'s values.
        let dtype = crate::ops::held_dtype(c, c.info(name)?.dtype, self.precision);
        self.prof("embed (host rows)", || self.upload_as(&c.rows_f32(name, ids)?, dtype))
    }
    fn embed(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor> {
        self.prof("embed", || {
            if table.kept.is_some() {
                return self.embed_kept(table, ids);
            }
            if let Some(out) = self.embed8(table, ids)? {
                return Ok(out);
            }
            self.embed_rows(table, ids)
        })
    }
    fn head_norm_rope(&self, x: &CudaTensor, w: &CudaTensor, eps: f64, rot: usize, theta: f64) -> Result<CudaTensor> {
        self.prof("head_norm_rope", || self.head_norm_rope_op(x, w, eps, rot, theta))
    }
    fn causal_attention(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        let path = self.enc_attn();
        self.prof("causal_attention", || self.causal_attention_on(q, k, v, scale, path))
    }
    fn causal_attention_gated(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, qg: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        if qg.shape.len() == 3 && qg.shape[2].is_multiple_of(16) {
            let o = self.causal_attention(q, k, v, scale)?;
            if let Some(out) = self.prof("attn_gate", || self.attn_gate(&o, qg))? {
                return Ok(out);
            }
        }
        moss_core::backend::ops::encoder::causal_attention_gated_unfused(self, q, k, v, qg, scale)
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
        if let Some(r) = self.prof("head_norm_rope", || self.attn_qkv_rope(y, heads, wq, wk, eps, rot, theta))? {
            return Ok(r);
        }
        moss_core::backend::ops::encoder::attn_qkv_split(self, y, heads, wq, wk, eps, rot, theta)
    }
    fn causal_attention_gated_y(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, y: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        if q.shape.len() == 3 {
            let (nh, hd) = (q.shape[1], q.shape[2]);
            let o = self.causal_attention(q, k, v, scale)?;
            if let Some(out) = self.prof("attn_gate", || self.attn_gate_y(&o, y, (nh, hd)))? {
                return Ok(out);
            }
        }
        let d = &q.shape;
        ensure!(d.len() == 3, "causal_attention_gated_y: q {d:?} is not [L, H, hd]");
        let qg = Backend::reshape(self, &self.prof("narrow", || self.narrow(y, 1, 0, d[1] * 2 * d[2]))?, &[d[0], d[1], 2 * d[2]])?;
        self.causal_attention_gated(q, k, v, &qg, scale)
    }
    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.prof("silu_mul", || self.silu_mul_op(gate, up))
    }
    fn causal_conv1d_silu(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 2, "causal_conv1d_silu: x must be [L, C], got {:?}", x.shape);
        self.prof("causal_conv1d_silu", || self.conv_cols(x, 0, x.shape[1], w))
    }
    fn causal_conv1d_silu_cols(&self, x: Cols<'_, CudaTensor>, w: &CudaTensor) -> Result<CudaTensor> {
        self.prof("causal_conv1d_silu", || {
            if let Some((out, _)) = self.convg_cols(x.of, (x.start, x.len), w, None)? {
                return Ok(out);
            }
            self.conv_cols(x.of, x.start, x.len, w)
        })
    }
    fn conv_gates_cols(
        &self,
        x: Cols<'_, CudaTensor>,
        w: &CudaTensor,
        (a, b): (Cols<'_, CudaTensor>, Cols<'_, CudaTensor>),
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor, CudaTensor)> {
        if same_cols(x, a) && same_cols(a, b) && a.len == b.len {
            let gates = ((a.start, b.start, a.len), a_log, dt_bias);
            let r = self.prof("causal_conv1d_silu", || self.convg_cols(x.of, (x.start, x.len), w, Some(gates)))?;
            if let Some((conv, Some((g, beta)))) = r {
                return Ok((conv, g, beta));
            }
        }
        let conv = self.causal_conv1d_silu_cols(x, w)?;
        let (g, beta) = self.gdn_gates_cols(a, b, a_log, dt_bias)?;
        Ok((conv, g, beta))
    }
    fn linear_cat(&self, x: &CudaTensor, ws: &[CudaTensor]) -> Result<CudaTensor> {
        let ws = ws.iter().map(|w| self.dense(w).map(std::borrow::Cow::into_owned)).collect::<Result<Vec<_>>>()?;
        self.prof("linear", || self.linear_cat_op(x, &ws))
    }
    fn gdn_gates_cols(&self, a: Cols<'_, CudaTensor>, b: Cols<'_, CudaTensor>, a_log: &CudaTensor, dt_bias: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        if !same_cols(a, b) || a.len != b.len {
            return self.gdn_gates(&self.cols(a)?, &self.cols(b)?, a_log, dt_bias);
        }
        self.prof("gdn_gates", || self.gdn_gates_cols_in(a.of, (a.start, b.start, a.len), a_log, dt_bias))
    }
    fn gated_rms_norm_cols(&self, x: &CudaTensor, z: Cols<'_, CudaTensor>, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        let (y, z0) = (z.of, z.start);
        ensure!(z.len == x.numel() / x.shape.first().copied().unwrap_or(1).max(1), "gated_rms_norm: z block of {} columns for x {:?}", z.len, x.shape);
        self.prof("gated_rms_norm", || {
            // gated_rms_norm_row16, then gated_rms_norm_wide for heads wider than 128
            for k in GRMS {
                if let Some(out) = self.grms_cols(x, y, z0, w, eps, k)? {
                    return Ok(out);
                }
            }
            self.gated_rms_norm_cols_in(x, y, z0, w, eps)
        })
    }
    fn silu_mul_cols(&self, gate: Cols<'_, CudaTensor>, up: Cols<'_, CudaTensor>) -> Result<CudaTensor> {
        // the kernels read gate | up as the two halves of one `[L, 2f]`
        let (y, f) = (gate.of, gate.len);
        if !(same_cols(gate, up) && gate.start == 0 && up.start == f && up.len == f && y.last_dim() == 2 * f) {
            return self.silu_mul(&self.cols(gate)?, &self.cols(up)?);
        }
        self.prof("silu_mul", || {
            if y.rows() >= SILU_V_MIN_ROWS {
                if let Some(out) = self.silu_mul8v(y, f)? {
                    return Ok(out);
                }
            }
            self.silu_mul_cols_in(y, f)
        })
    }
    fn linear_add_rms_norm(&self, a: &CudaTensor, w: &CudaTensor, res: &CudaTensor, w_norm: &CudaTensor, eps: f64) -> Result<(CudaTensor, CudaTensor)> {
        self.linear_add_rms_norm_op(a, &*self.dense(w)?, res, w_norm, eps)
    }
    fn gdn_gates(&self, a: &CudaTensor, b: &CudaTensor, a_log: &CudaTensor, dt_bias: &CudaTensor) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("gdn_gates", || self.gdn_gates_op(a, b, a_log, dt_bias))
    }
    fn gated_delta_rule(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, g: &CudaTensor, beta: &CudaTensor) -> Result<CudaTensor> {
        self.prof("gated_delta_rule", || self.gated_delta_rule_on(q, k, v, g, beta, GdrPath::Auto))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule_qkv(&self, qkv: &CudaTensor, heads: (usize, usize, usize, usize), g: &CudaTensor, beta: &CudaTensor) -> Result<CudaTensor> {
        self.prof("gated_delta_rule", || self.gated_delta_rule_qkv_on(qkv, heads, g, beta, GdrPath::Auto))
    }
    fn gated_rms_norm(&self, x: &CudaTensor, z: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        self.prof("gated_rms_norm", || self.gated_rms_norm_op(x, z, w, eps))
    }
    fn add_rms_norm(&self, x: &CudaTensor, h: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("add_rms_norm", || self.add_rms_norm_op(x, h, w, eps))
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
