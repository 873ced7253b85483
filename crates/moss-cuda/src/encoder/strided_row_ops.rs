//! The encoder's fused-projection ops on the GPU (`cuda/encoder/strided_row_ops.cu`, `cuda/encoder/add_rms_norm.cu`):
//! weights of linears over one input stacked at load (the model loads them as one tensor) and
//! run as one cuBLASLt GEMM ([`EncoderOps::linear_cat`]), the consumers reading their columns of
//! its output in place (row stride) instead of narrowed copies, the residual add in the output
//! projection's GEMM epilogue ([`EncoderOps::linear_add_rms_norm`]), and the attention's sigmoid
//! gate in one kernel. Measured on the H200.
//!
//! One path each (the other groupings and the unfused forms, once behind environment switches,
//! measured slower):
//! - the DeltaNet's qkv | z | a | b, the MLP's gate | up and the attention's q | k | v each as one
//!   GEMM (the model stacks their rows when it loads them, `moss_core::model::encoder::LayerMats`);
//! - the output projections with the residual add in the GEMM epilogue, then the RMSNorm alone
//!   (a plain GEMM + the add_rms_norm kernel only for widths that kernel does not take);
//! - the attention gate in one kernel (narrow + sigmoid + mul only where it does not apply).
//!
//! [`EncoderOps::linear_cat`]: moss_core::backend::ops::EncoderOps::linear_cat
//! [`EncoderOps::linear_add_rms_norm`]: moss_core::backend::ops::EncoderOps::linear_add_rms_norm

use crate::kernels::{self, Dev};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};
use moss_core::backend::Backend;

impl Cuda {
    /// The parts `ws` (same K and dtype) concatenated along N per group of indices.
    pub(crate) fn cat_weights_grouped(&self, ws: &[CudaTensor], groups: &[Vec<usize>]) -> Result<Vec<CudaTensor>> {
        let mut out = vec![];
        for g in groups {
            if g.len() == 1 {
                out.push(ws[g[0]].clone());
            } else {
                let parts: Vec<&CudaTensor> = g.iter().map(|&i| &ws[i]).collect();
                out.push(self.cat_copies(&parts, 0)?);
            }
        }
        Ok(out)
    }

    /// [`EncoderOps::linear_cat`](moss_core::backend::ops::EncoderOps::linear_cat): one GEMM per weight
    /// buffer, each writing its column block of the `[L, ΣN]` output (row stride ΣN).
    pub(crate) fn linear_cat_op(&self, x: &CudaTensor, ws: &[CudaTensor]) -> Result<CudaTensor> {
        ensure!(!ws.is_empty(), "linear_cat: no weights");
        let (dt, k) = (ws[0].dtype, ws[0].shape.get(1).copied().unwrap_or(0));
        for w in ws {
            ensure!(w.shape.len() == 2 && w.shape[1] == k && w.dtype == dt, "linear_cat: weight {:?} {:?} among [_, {k}] {dt:?}", w.shape, w.dtype);
        }
        ensure!(x.last_dim() == k, "linear_cat: input {:?} for weights [_, {k}]", x.shape);
        let x = self.cast(x, dt)?;
        let ntot: usize = ws.iter().map(|w| w.shape[0]).sum();
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = ntot;
        let out = self.alloc(dt, &shape)?;
        let rows = x.rows();
        let mut off = 0;
        for w in ws {
            let n = w.shape[0];
            if rows > 0 && n > 0 {
                let o = out.ptr() + (off * dt.size()) as u64;
                self.blas().linear_into(&self.gpu().stream, dt, (rows, n, k), x.ptr(), w.ptr(), None, o, ntot)?;
            }
            off += n;
        }
        Ok(out)
    }

    /// The causal conv + SiLU of columns `start..start + c` of `x [L, N]` (row stride N) → `[L, c]`:
    /// `conv8` (8 channels a thread, taps transposed) where the columns are 8-aligned, else the
    /// scalar kernel on a narrowed copy. (A variant with 8 tokens a thread and its 11 input rows
    /// loaded once, `convt`, measured slower on the H200.)
    pub(crate) fn conv_cols(&self, x: &CudaTensor, start: usize, c: usize, w: &CudaTensor) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 2 && start + c <= x.shape[1], "causal_conv1d_silu: columns {start}+{c} of {:?}", x.shape);
        ensure!(w.shape.len() == 3 && w.shape[0] == c && w.shape[1] == 1, "causal_conv1d_silu: weight {:?} for {c} channels", w.shape);
        let (l, ldx, kk) = (x.shape[0], x.shape[1], w.shape[2]);
        let es = x.dtype.size();
        let vec = c.is_multiple_of(8) && ldx % 8 == 0 && start.is_multiple_of(8) && x.ptr().is_multiple_of(16);
        if !vec {
            let xs = if start == 0 && c == ldx { x.clone() } else { self.narrow_copy(x, 1, start, c)? };
            return self.conv_scalar(&xs, w);
        }
        let out = self.alloc(x.dtype, &[l, c])?;
        if l == 0 {
            return Ok(out);
        }
        // taps transposed, [K, C] f32
        let wt = self.permute_copy(&Backend::reshape(self, &self.cast(w, DType::F32)?, &[c, kk])?, &[1, 0])?;
        let xp = Dev::new(x.ptr() + (start * es) as u64, x.dtype);
        kernels::ENC_CONV8.launch(self, (self.grid_for(l * c / 8), 256, 0), &out, xp, &wt, l as i64, c as i32, kk as i32, ldx as i64)?;
        Ok(out)
    }

    /// The scalar conv kernel (any width, contiguous `x [L, C]`, taps `[C, 1, K]`).
    fn conv_scalar(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        let (l, c, kk) = (x.shape[0], x.shape[1], w.shape[2]);
        let w = self.cast(w, DType::F32)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        kernels::ENC_CONV.launch(self, (self.grid_for(l * c), 256, 0), &out, x, &w, l as i64, c as i32, kk as i32)?;
        Ok(out)
    }

    /// The DeltaNet gates of `a` = columns `a0..a0+hv`, `b` = columns `b0..b0+hv` of `y [L, N]`,
    /// read in place. → `(g, beta)` f32 `[L, hv]`.
    pub(crate) fn gdn_gates_cols_in(
        &self,
        y: &CudaTensor,
        (a0, b0, hv): (usize, usize, usize),
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor)> {
        ensure!(y.shape.len() == 2 && a0 + hv <= y.shape[1] && b0 + hv <= y.shape[1], "gdn_gates: columns {a0}, {b0} (+{hv}) of {:?}", y.shape);
        ensure!(a_log.numel() == hv && dt_bias.numel() == hv, "gdn_gates: A_log {:?} / dt_bias {:?} for {hv} heads", a_log.shape, dt_bias.shape);
        let (l, ld) = (y.shape[0], y.shape[1]);
        let (al, dt) = (self.cast(a_log, DType::F32)?, self.cast(dt_bias, DType::F32)?);
        let g = self.alloc(DType::F32, &[l, hv])?;
        let beta = self.alloc(DType::F32, &[l, hv])?;
        let es = y.dtype.size() as u64;
        let n = l * hv;
        let (a, b) = (Dev::new(y.ptr() + a0 as u64 * es, y.dtype), Dev::new(y.ptr() + b0 as u64 * es, y.dtype));
        kernels::ENC_GATES_S.launch(self, (self.grid_for(n), 256, 0), &g, &beta, a, b, &al, &dt, n as i64, hv as i32, ld as i64)?;
        Ok((g, beta))
    }

    /// The gated RMSNorm of `x [L, Hv, dv]` with z = columns `z0..z0 + Hv·dv` of `y [L, N]`, read
    /// in place (8-aligned widths; else z is narrowed out for the contiguous kernel).
    pub(crate) fn gated_rms_norm_cols_in(&self, x: &CudaTensor, y: &CudaTensor, z0: usize, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 3, "gated_rms_norm: x {:?} is not [L, Hv, dv]", x.shape);
        let (l, hv, d) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(y.shape.len() == 2 && y.shape[0] == l && z0 + hv * d <= y.shape[1], "gated_rms_norm: z columns {z0}+{} of {:?}", hv * d, y.shape);
        ensure!(w.numel() == d, "gated_rms_norm: weight {:?} for width {d}", w.shape);
        let ld = y.shape[1];
        let y = self.cast(y, x.dtype)?;
        if d % 8 != 0 || !ld.is_multiple_of(8) || !z0.is_multiple_of(8) {
            let z = Backend::reshape(self, &self.narrow_copy(&y, 1, z0, hv * d)?, &x.shape)?;
            return self.gated_rms_norm_op(x, &z, w, eps);
        }
        let w = self.cast(w, DType::F32)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = l * hv;
        let z = Dev::new(y.ptr() + (z0 * y.dtype.size()) as u64, y.dtype);
        let cfg = (rows.div_ceil(16) as u32, 256, 0);
        kernels::ENC_GRMS8S.launch(self, cfg, &out, x, z, &w, rows as i64, d as i32, eps as f32, hv as i32, ld as i64)?;
        Ok(out)
    }

    /// `silu(gate)·up` with gate = columns `0..f`, up = columns `f..2f` of `y [L, 2f]`, read in
    /// place (8-aligned f; else narrowed copies and the contiguous kernel). → `[L, f]`.
    pub(crate) fn silu_mul_cols_in(&self, y: &CudaTensor, f: usize) -> Result<CudaTensor> {
        ensure!(y.shape.len() >= 2 && y.last_dim() == 2 * f, "silu_mul: {:?} is not [.., 2·{f}]", y.shape);
        if !f.is_multiple_of(8) {
            let last = y.shape.len() - 1;
            return self.silu_mul_op(&self.narrow_copy(y, last, 0, f)?, &self.narrow_copy(y, last, f, f)?);
        }
        let rows = y.rows();
        let mut shape = y.shape.clone();
        *shape.last_mut().unwrap() = f;
        let out = self.alloc(y.dtype, &shape)?;
        let up = Dev::new(y.ptr() + (f * y.dtype.size()) as u64, y.dtype);
        kernels::ENC_SILU_MUL8R.launch(self, (self.grid_for(rows * f / 8), 256, 0), &out, y, up, rows as i64, f as i32, (2 * f) as i64)?;
        Ok(out)
    }

    /// `(x', n)`: `x' = res + a·wᵀ` from one GEMM (residual as its C, beta 1), then the
    /// zero-centred RMSNorm alone (`rms1`). Widths that are not a multiple of 8 or above 8192 take
    /// the plain GEMM and the add_rms_norm path.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_add_rms_norm_op(
        &self,
        a: &CudaTensor,
        w: &CudaTensor,
        res: &CudaTensor,
        w_norm: &CudaTensor,
        eps: f64,
    ) -> Result<(CudaTensor, CudaTensor)> {
        ensure!(w.shape.len() == 2, "linear_add_rms_norm: weight {:?}", w.shape);
        let (n, k) = (w.shape[0], w.shape[1]);
        ensure!(
            a.last_dim() == k && res.last_dim() == n && a.rows() == res.rows(),
            "linear_add_rms_norm: a {:?} · w {:?} + res {:?}",
            a.shape,
            w.shape,
            res.shape
        );
        ensure!(w_norm.numel() == n, "linear_add_rms_norm: norm weight {:?} for width {n}", w_norm.shape);
        let dt = w.dtype;
        if n % 8 != 0 || n > crate::launch::ENC_RMS1_MAX_WIDTH || n == 0 {
            let h = self.prof("linear", || self.linear_dense(a, w, None))?;
            return self.prof("add_rms_norm", || self.add_rms_norm_op(res, &h, w_norm, eps));
        }
        let (a, res) = (self.cast(a, dt)?, self.cast(res, dt)?);
        let rows = a.rows();
        let xo = self.alloc(dt, &res.shape)?;
        self.prof("linear", || {
            if rows > 0 {
                self.blas().linear_into(&self.gpu().stream, dt, (rows, n, k), a.ptr(), w.ptr(), Some(res.ptr()), xo.ptr(), n)?;
            }
            Ok(())
        })?;
        let nrm = self.prof("add_rms_norm", || self.rms1w(&xo, w_norm, eps))?;
        Ok((xo, nrm))
    }

    /// The gated attention's output gate in one kernel: `o [L, H·hd] · sigmoid(gate)`, the gate
    /// read in place out of `qg [L, H, 2·hd]` (its second half of each head). `None` where the
    /// widths are not multiples of 8 (the caller runs the unfused ops).
    pub(crate) fn attn_gate(&self, o: &CudaTensor, qg: &CudaTensor) -> Result<Option<CudaTensor>> {
        ensure!(qg.shape.len() == 3, "attn_gate: qg {:?} is not [L, H, 2·hd]", qg.shape);
        let (l, nh, hd) = (qg.shape[0], qg.shape[1], qg.shape[2] / 2);
        ensure!(o.numel() == l * nh * hd && qg.shape[2] == 2 * hd, "attn_gate: o {:?} for qg {:?}", o.shape, qg.shape);
        // q_proj's [L, H, 2·hd] is the joined projection's layout without its k and v columns:
        // `gmulh` with the row stride 2·H·hd
        self.attn_gate_y(o, &Backend::reshape(self, qg, &[l, 2 * nh * hd])?, (nh, hd))
    }
}
