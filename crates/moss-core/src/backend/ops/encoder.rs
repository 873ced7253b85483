//! Fused ops of the encoder (see `crate::model::encoder`), the Qwen3.5 text backbone (spec 3.3).
//!
//! Each op is one kernel's worth of work. The CPU twins (`backend/cpu/encoder.rs`) compute on
//! fp32 data with every reduction and every recurrence in f64; a CUDA kernel is gated against them.
//! `L` is the prompt length (one prompt, unpadded, positions `0..L`).

use crate::backend::Backend;
use anyhow::Result;

/// Columns `start..start + len` of `of [L, N]`: one block of a joined projection's output
/// ([`EncoderOps::linear_cat`]). The `*_cols` ops take their inputs as such blocks; the CUDA
/// backend reads them in place, the CPU twin narrows them out.
pub struct Cols<'a, T> {
    pub of: &'a T,
    pub start: usize,
    pub len: usize,
}

impl<T> Clone for Cols<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Cols<'_, T> {}

/// `y`'s column blocks of the given widths, left to right from column 0.
pub fn split_cols<T, const N: usize>(y: &T, widths: [usize; N]) -> [Cols<'_, T>; N] {
    let mut start = 0;
    widths.map(|len| {
        let c = Cols { of: y, start, len };
        start += len;
        c
    })
}

/// Ops the encoder needs beyond the generic set.
pub trait EncoderOps: Backend {
    /// Token embedding: `out[t, :] = table[ids[t], :]`. `table [vocab, hidden]` → `[L, hidden]`.
    /// An id outside the table is an error.
    fn embed(&self, table: &Self::T, ids: &[u32]) -> Result<Self::T>;

    /// [`EncoderOps::embed`] with the table left in the checkpoint (`name` in `c`, host memory):
    /// the prompt's rows gathered on the host and uploaded, the same values in the same dtype
    /// as `embed` of the table as [`Backend::load`] loads it. Only the prompt's rows move.
    fn embed_from_host(&self, c: &crate::checkpoint::Component, name: &str, ids: &[u32]) -> Result<Self::T> {
        self.upload(&c.rows_f32(name, ids)?)
    }

    /// Per-head zero-centred RMSNorm followed by partial rotate-half RoPE, for the q and k of the
    /// gated full-attention layers. `x [L, H, hd]`, `w [hd]` → `[L, H, hd]`:
    ///
    /// - `y = x · rsqrt(mean_hd(x²) + eps) · (1 + w)` per (t, head);
    /// - on dims `0..rot` (`rot` even, ≤ hd) with `half = rot/2`, for `i < half`:
    ///   `y'[i] = y[i]·cos(θ_ti) − y[i+half]·sin(θ_ti)`, `y'[i+half] = y[i+half]·cos(θ_ti) + y[i]·sin(θ_ti)`,
    ///   dims `rot..hd` pass through;
    /// - angles as transformers makes them in fp32: `inv_i = f32(1 / f32(theta^(f32(2i)/rot)))`,
    ///   `θ_ti = f32(f32(t) · inv_i)`, position `t` = row index `0..L`.
    fn head_norm_rope(&self, x: &Self::T, w: &Self::T, eps: f64, rot: usize, theta: f64) -> Result<Self::T>;

    /// Causal softmax attention with grouped KV heads (flash style: no `[L, L]` matrix needs to
    /// exist). `q [L, H, hd]`, `k [L, Hkv, hd]`, `v [L, Hkv, hd]`, `H % Hkv == 0` → `[L, H, hd]`:
    /// query head `h` reads KV head `h / (H / Hkv)`;
    /// `out[t, h] = Σ_{s ≤ t} softmax_s(scale · q[t,h]·k[s,kv]) · v[s, kv]`.
    fn causal_attention(&self, q: &Self::T, k: &Self::T, v: &Self::T, scale: f64) -> Result<Self::T>;

    /// The gated full-attention core: [`EncoderOps::causal_attention`] of `q`, `k`, `v`, times
    /// `sigmoid(gate)`, where `qg [L, H, 2·hd]` is the q_proj output (per head `hd` query values,
    /// then the `hd` gate values) → `[L, H·hd]`:
    /// `out[t, h·hd + c] = attn(q, k, v)[t, h, c] · σ(qg[t, h, hd + c])`.
    /// This default is [`causal_attention_gated_unfused`] (narrow, sigmoid, mul); the CUDA backend
    /// can fuse the gate into the flash kernel's epilogue.
    fn causal_attention_gated(&self, q: &Self::T, k: &Self::T, v: &Self::T, qg: &Self::T, scale: f64) -> Result<Self::T> {
        causal_attention_gated_unfused(self, q, k, v, qg, scale)
    }

    /// q, k and v of the gated attention out of the joined projection `y = x·[q_proj | k_proj |
    /// v_proj]ᵀ`, `y [L, H·2·hd + 2·Hkv·hd]`: per token the H query heads, each `hd` query values
    /// then `hd` gate values (q_proj's layout), then the Hkv k heads, then the Hkv v heads;
    /// `heads = (H, Hkv, hd)`. → `(q [L, H, hd], k [L, Hkv, hd], v [L, Hkv, hd])`, q and k through
    /// [`EncoderOps::head_norm_rope`] with `wq` / `wk`, v as it is. This default (the CPU twin) is
    /// [`attn_qkv_split`]: narrowed copies and the op twice; the CUDA backend reads y in place in
    /// one kernel.
    #[allow(clippy::too_many_arguments)]
    fn attn_qkv_norm_rope(
        &self,
        y: &Self::T,
        heads: (usize, usize, usize),
        wq: &Self::T,
        wk: &Self::T,
        eps: f64,
        rot: usize,
        theta: f64,
    ) -> Result<(Self::T, Self::T, Self::T)> {
        attn_qkv_split(self, y, heads, wq, wk, eps, rot, theta)
    }

    /// [`EncoderOps::causal_attention_gated`] with the gate read out of the joined projection `y`
    /// of [`EncoderOps::attn_qkv_norm_rope`] (head h's gate: columns `h·2·hd + hd ..= h·2·hd +
    /// 2·hd − 1`) → `[L, H·hd]`. Default: q_proj's columns narrowed out, then that op.
    fn causal_attention_gated_y(&self, q: &Self::T, k: &Self::T, v: &Self::T, y: &Self::T, scale: f64) -> Result<Self::T> {
        let d = self.dims(q);
        anyhow::ensure!(d.len() == 3, "causal_attention_gated_y: q {d:?} is not [L, H, hd]");
        let (l, nh, hd) = (d[0], d[1], d[2]);
        let qg = self.reshape(&self.narrow(y, 1, 0, nh * 2 * hd)?, &[l, nh, 2 * hd])?;
        self.causal_attention_gated(q, k, v, &qg, scale)
    }

    /// `silu(gate) · up`, elementwise (the SiLU-gated MLP's middle). Same shapes.
    fn silu_mul(&self, gate: &Self::T, up: &Self::T) -> Result<Self::T>;

    /// Causal depthwise conv1d along the sequence, then SiLU. `x [L, C]`, `w [C, 1, K]` (no bias)
    /// → `[L, C]`: `out[t, c] = silu(Σ_{j<K} w[c, 0, j] · x[t − (K−1) + j, c])`, with `x = 0` at
    /// negative positions.
    fn causal_conv1d_silu(&self, x: &Self::T, w: &Self::T) -> Result<Self::T>;

    /// The Gated-DeltaNet gates, in fp32 or better. `a [L, Hv]`, `b [L, Hv]`, `a_log [Hv]`,
    /// `dt_bias [Hv]` → `(g, beta)`, both `[L, Hv]`:
    /// `g = −exp(a_log) · softplus(a + dt_bias)` (the log-decay, ≤ 0; softplus(x) = x above 20,
    /// as torch), `beta = sigmoid(b)`.
    fn gdn_gates(&self, a: &Self::T, b: &Self::T, a_log: &Self::T, dt_bias: &Self::T) -> Result<(Self::T, Self::T)>;

    /// The gated delta rule over the whole prompt, state starting at zero.
    /// `q [L, Hk, dk]`, `k [L, Hk, dk]`, `v [L, Hv, dv]`, `g [L, Hv]`, `beta [L, Hv]`, `Hv % Hk == 0`
    /// → `o [L, Hv, dv]`. Value head `h` reads key head `h / (Hv / Hk)` (repeat-interleave).
    /// First `q ← q · rsqrt(Σq² + 1e-6) / √dk`, `k ← k · rsqrt(Σk² + 1e-6)` per (t, head); then per
    /// value head, with `S ∈ ℝ^{dk×dv}` = 0, for t in order:
    /// `S ← exp(g_t)·S; u = beta_t·(v_t − Sᵀk_t); S ← S + k_t uᵀ; o_t = Sᵀq_t`.
    /// Implementations may (and the GPU kernel does) evaluate it in chunks, the form of
    /// transformers' `torch_chunk_gated_delta_rule`; the CPU twin uses chunks of
    /// [`DELTA_CHUNK`].
    fn gated_delta_rule(&self, q: &Self::T, k: &Self::T, v: &Self::T, g: &Self::T, beta: &Self::T) -> Result<Self::T>;

    /// [`EncoderOps::gated_delta_rule`] on q, k, v taken side by side out of the conv output
    /// `qkv [L, 2·Hk·dk + Hv·dv]` (per token: the Hk q heads, the Hk k heads, the Hv v heads);
    /// `heads = (Hk, dk, Hv, dv)`. This default (the CPU twin) narrows them out; the CUDA backend
    /// reads them in place with a row stride.
    fn gated_delta_rule_qkv(&self, qkv: &Self::T, (hk, dk, hv, dv): (usize, usize, usize, usize), g: &Self::T, beta: &Self::T) -> Result<Self::T> {
        let l = self.dims(qkv)[0];
        let q = self.reshape(&self.narrow(qkv, 1, 0, hk * dk)?, &[l, hk, dk])?;
        let k = self.reshape(&self.narrow(qkv, 1, hk * dk, hk * dk)?, &[l, hk, dk])?;
        let v = self.reshape(&self.narrow(qkv, 1, 2 * hk * dk, hv * dv)?, &[l, hv, dv])?;
        self.gated_delta_rule(&q, &k, &v, g, beta)
    }

    /// The DeltaNet output norm: per-head RMSNorm with a **plain** weight, gated by `silu(z)`.
    /// `x [L, Hv, dv]`, `z [L, Hv, dv]`, `w [dv]` → `[L, Hv, dv]`:
    /// `out = x · rsqrt(mean_dv(x²) + eps) · w · silu(z)`.
    fn gated_rms_norm(&self, x: &Self::T, z: &Self::T, w: &Self::T, eps: f64) -> Result<Self::T>;

    /// The residual add fused with the next zero-centred RMSNorm: `x' = x + h` (in the activation
    /// type), `n = rms_norm(x', w, eps, one_plus)`; returns `(x', n)`. This default (the CPU twin)
    /// is the two generic ops; the CUDA backend runs one kernel with the same rounding points.
    fn add_rms_norm(&self, x: &Self::T, h: &Self::T, w: &Self::T, eps: f64) -> Result<(Self::T, Self::T)> {
        let x = self.add(x, h)?;
        let n = self.rms_norm(&x, Some(w), eps, true)?;
        Ok((x, n))
    }

    /// `[x·w_0ᵀ | x·w_1ᵀ | …]`: `x [L, K]`, weights `[N_i, K]` → `[L, ΣN_i]`, the products side by
    /// side in each row. The model passes one weight whose rows stack the linears that read `x`
    /// (loaded stacked), so one GEMM gives them all. This default (the CPU twin) is the separate
    /// linears and a `cat`, so its values are those of the separate linears.
    fn linear_cat(&self, x: &Self::T, ws: &[Self::T]) -> Result<Self::T> {
        let ys = ws.iter().map(|w| self.linear(x, w, None)).collect::<Result<Vec<_>>>()?;
        if ys.len() == 1 {
            return Ok(ys.into_iter().next().unwrap());
        }
        self.cat(&ys.iter().collect::<Vec<_>>(), 1)
    }

    /// The column block `c` as a tensor `[L, c.len]` (a copy).
    fn cols(&self, c: Cols<'_, Self::T>) -> Result<Self::T> {
        self.narrow(c.of, 1, c.start, c.len)
    }

    /// [`EncoderOps::causal_conv1d_silu`] of the column block `x` → `[L, x.len]`.
    fn causal_conv1d_silu_cols(&self, x: Cols<'_, Self::T>, w: &Self::T) -> Result<Self::T> {
        self.causal_conv1d_silu(&self.cols(x)?, w)
    }

    /// [`EncoderOps::gdn_gates`] of the column blocks `a` and `b` (Hv columns each).
    fn gdn_gates_cols(&self, a: Cols<'_, Self::T>, b: Cols<'_, Self::T>, a_log: &Self::T, dt_bias: &Self::T) -> Result<(Self::T, Self::T)> {
        self.gdn_gates(&self.cols(a)?, &self.cols(b)?, a_log, dt_bias)
    }

    /// [`EncoderOps::causal_conv1d_silu_cols`] of `x` and [`EncoderOps::gdn_gates_cols`] of `a`,
    /// `b` → `(conv, g, beta)`. Default: the two ops; CUDA: one launch (the gates as extra blocks
    /// of the conv's) where the blocks are columns of one tensor.
    fn conv_gates_cols(
        &self,
        x: Cols<'_, Self::T>,
        w: &Self::T,
        (a, b): (Cols<'_, Self::T>, Cols<'_, Self::T>),
        a_log: &Self::T,
        dt_bias: &Self::T,
    ) -> Result<(Self::T, Self::T, Self::T)> {
        let conv = self.causal_conv1d_silu_cols(x, w)?;
        let (g, beta) = self.gdn_gates_cols(a, b, a_log, dt_bias)?;
        Ok((conv, g, beta))
    }

    /// [`EncoderOps::gated_rms_norm`] of `x [L, Hv, dv]` with `z` the column block of Hv·dv
    /// columns.
    fn gated_rms_norm_cols(&self, x: &Self::T, z: Cols<'_, Self::T>, w: &Self::T, eps: f64) -> Result<Self::T> {
        let z = self.reshape(&self.cols(z)?, &self.dims(x))?;
        self.gated_rms_norm(x, &z, w, eps)
    }

    /// [`EncoderOps::silu_mul`] of the column blocks `gate` and `up` → `[L, gate.len]`.
    fn silu_mul_cols(&self, gate: Cols<'_, Self::T>, up: Cols<'_, Self::T>) -> Result<Self::T> {
        self.silu_mul(&self.cols(gate)?, &self.cols(up)?)
    }

    /// A sublayer's output projection, the residual add and the next norm:
    /// `x' = res + a·wᵀ`, `n = rms_norm(x', w_norm, eps, one_plus)`; returns `(x', n)`. This
    /// default (the CPU twin) is `linear` then [`EncoderOps::add_rms_norm`]; the CUDA backend adds
    /// the residual in the GEMM's epilogue (`x'` rounded once, from the fp32 product) and runs
    /// the norm alone.
    fn linear_add_rms_norm(&self, a: &Self::T, w: &Self::T, res: &Self::T, w_norm: &Self::T, eps: f64) -> Result<(Self::T, Self::T)> {
        let h = self.linear(a, w, None)?;
        self.add_rms_norm(res, &h, w_norm, eps)
    }
}

/// [`EncoderOps::causal_attention_gated`] as separate ops: attention, the gate narrowed out of
/// `qg`, sigmoid, mul (each rounded to the activation dtype).
pub fn causal_attention_gated_unfused<B: EncoderOps + ?Sized>(b: &B, q: &B::T, k: &B::T, v: &B::T, qg: &B::T, scale: f64) -> Result<B::T> {
    let d = b.dims(q);
    anyhow::ensure!(d.len() == 3, "causal_attention_gated: q {d:?} is not [L, H, hd]");
    let (l, nh, hd) = (d[0], d[1], d[2]);
    let gate = b.reshape(&b.narrow(qg, 2, hd, hd)?, &[l, nh * hd])?;
    let o = b.causal_attention(q, k, v, scale)?;
    b.mul(&b.reshape(&o, &[l, nh * hd])?, &b.sigmoid(&gate)?)
}

/// [`EncoderOps::attn_qkv_norm_rope`] as separate ops: q (out of q_proj's per-head [q | gate]
/// rows), k and v narrowed out of `y`, then [`EncoderOps::head_norm_rope`] of q and of k.
#[allow(clippy::too_many_arguments)]
pub fn attn_qkv_split<B: EncoderOps + ?Sized>(
    b: &B,
    y: &B::T,
    (nh, nkv, hd): (usize, usize, usize),
    wq: &B::T,
    wk: &B::T,
    eps: f64,
    rot: usize,
    theta: f64,
) -> Result<(B::T, B::T, B::T)> {
    let d = b.dims(y);
    anyhow::ensure!(d.len() == 2 && d[1] == (2 * nh + 2 * nkv) * hd, "attn_qkv: y {d:?} for {nh} + {nkv} heads of {hd}");
    let l = d[0];
    let qg = b.reshape(&b.narrow(y, 1, 0, 2 * nh * hd)?, &[l, nh, 2 * hd])?;
    let q = b.narrow(&qg, 2, 0, hd)?;
    let k = b.reshape(&b.narrow(y, 1, 2 * nh * hd, nkv * hd)?, &[l, nkv, hd])?;
    let v = b.reshape(&b.narrow(y, 1, (2 * nh + nkv) * hd, nkv * hd)?, &[l, nkv, hd])?;
    let q = b.head_norm_rope(&q, wq, eps, rot, theta)?;
    let k = b.head_norm_rope(&k, wk, eps, rot, theta)?;
    Ok((q, k, v))
}

/// The chunk length of the chunked delta rule (transformers' default).
pub const DELTA_CHUNK: usize = 64;
