//! The encoder's row kernels at their byte floor (`cuda/encoder/row_ops.cu`, issue #7): the causal conv
//! with each thread owning V channels x TT tokens (its TT + 3 input rows loaded once; default 4 x 4
//! with the fast SiLU, conv_silu_gates) and the DeltaNet gates as extra blocks of the same launch; silu_mul, the RMSNorm after the GEMM's
//! residual epilogue, the gated RMSNorm and the embedding gather with 2-D grids / loads issued
//! before the reductions; every small weight (taps, norm weights, A_log, dt_bias) read in its
//! loaded dtype instead of an f32 copy made by a cast (and, for the taps, a permute) every call.
//! Same formulas and rounding points as the kernels they replace. Measured faster on the H200.
//!
//! The previous kernels (conv8 + gates_s with their casts, silu_mul8r, rms1, grms8s, the scalar
//! embed) serve the shapes these do not take. The conv and gated-RMSNorm variants measured slower
//! were deleted (git keeps them).
//!
//! Each op here returns `None` where the shapes do not fit the kernel (the caller takes the old
//! path).

use crate::kernels::{self, Dev, Elem, Family};
use crate::launch::{ENC_CONV_THREADS, ENC_RMS1_2_MAX_WIDTH, ENC_RMS1_MAX_WIDTH, ENC_RMS1_THREADS};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};

/// silu_mul8v from this many rows on; below, the previous grid-stride silu_mul8r (measured faster at
/// 128 rows, 5.5 against 6.0 us; silu_mul8v 70 against 80 us at 4096).
pub const SILU_V_MIN_ROWS: usize = 1024;

/// The conv kernel ([`kernels::ENC_CONV_SILU_GATES`]): [`CONV_V`] channels x [`CONV_TT`] tokens a thread, the fast SiLU, the gates in
/// its launch; measured on the H200 at 4096 tokens 49.8 us against 72.3 for 8 channels x 4
/// tokens with the IEEE SiLU (CUDA events; ncu 47.7 against 71.4), at 128 tokens 3.2 against 4.8;
/// the 4x8, 2x8 and 2x16 shapes measured slower.
pub const CONV_KERNEL: &str = "conv_silu_gates";
/// Channels a conv thread (cuda/encoder/launch.h).
pub const CONV_V: usize = crate::launch::ENC_CONV_V;
/// Tokens a conv thread.
pub const CONV_TT: usize = crate::launch::ENC_CONV_TT;

/// A gated RMSNorm kernel over columns of a wider tensor.
pub type GatedRms = Family<fn(Dev, Dev, Dev, Dev, i32, i64, i32, f32, i32, i64)>;

/// The gated RMSNorm kernels: gated_rms_norm_row16 (one row a 16-lane group, fast SiLU, widths ≤ 128; measured on
/// the H200 at 4096 tokens 30.8 us against 37.7 for gated_rms_norm_wide, CUDA events; ncu 29.2 against 36.4; at
/// 128 tokens 2.3 against 2.6), then gated_rms_norm_wide for wider heads.
pub static GRMS: [&GatedRms; 2] = [&kernels::ENC_GATED_RMS_NORM_ROW16, &kernels::ENC_GATED_RMS_NORM_WIDE];

/// The kernels' weight-dtype flag: 1 bf16, 0 f32.
fn wbf(t: &CudaTensor) -> i32 {
    i32::from(t.dtype == DType::BF16)
}

/// The conv output and, when asked for, the gates `(g, beta)`.
pub type ConvGates = (CudaTensor, Option<(CudaTensor, CudaTensor)>);

impl Cuda {
    /// The causal conv (K = 4) + SiLU of columns `start..start + c` of `y [L, N]` (row stride N)
    /// → `[L, c]`, taps `w [c, 1, 4]` in their loaded dtype; with `gates = Some(((a0, b0, hv),
    /// A_log, dt_bias))` also the DeltaNet gates of columns `a0..a0 + hv`, `b0..b0 + hv` (f32
    /// `[L, hv]` each) from extra blocks of the same launch ([`CONV_KERNEL`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn convg_cols(
        &self,
        y: &CudaTensor,
        (start, c): (usize, usize),
        w: &CudaTensor,
        gates: Option<((usize, usize, usize), &CudaTensor, &CudaTensor)>,
    ) -> Result<Option<ConvGates>> {
        ensure!(y.shape.len() == 2 && start + c <= y.shape[1], "causal_conv1d_silu: columns {start}+{c} of {:?}", y.shape);
        ensure!(w.shape.len() == 3 && w.shape[0] == c && w.shape[1] == 1, "causal_conv1d_silu: weight {:?} for {c} channels", w.shape);
        let (tt, v) = (CONV_TT, CONV_V);
        let (l, ld, es) = (y.shape[0], y.shape[1], y.dtype.size());
        let fits = w.shape[2] == 4 && c % 8 == 0 && ld % 8 == 0 && start % 8 == 0 && y.ptr().is_multiple_of(16) && l < (1 << 30) && c < (1 << 30);
        if !fits {
            return Ok(None);
        }
        let out = self.alloc(y.dtype, &[l, c])?;
        let (ncx, nty) = ((c / v).div_ceil(ENC_CONV_THREADS), l.div_ceil(tt));
        let ncb = ncx * nty;
        // no gates: null pointers of the types the variant takes, no extra blocks
        let f32_null = Dev::null(Elem::F32);
        let y_null = Dev::null(y.dtype);
        let mut gate_args = (f32_null, f32_null, y_null, y_null, Dev::null(Elem::Void), Dev::null(Elem::Void), 0, 0, 0i64);
        let mut ngb = 0;
        let mut gb = None;
        if let Some(((a0, b0, hv), a_log, dt_bias)) = gates {
            ensure!(a0 + hv <= ld && b0 + hv <= ld, "gdn_gates: columns {a0}, {b0} (+{hv}) of {:?}", y.shape);
            ensure!(a_log.numel() == hv && dt_bias.numel() == hv, "gdn_gates: A_log {:?} / dt_bias {:?} for {hv} heads", a_log.shape, dt_bias.shape);
            // one dtype flag for both vectors
            let (al, dt) =
                if a_log.dtype == dt_bias.dtype { (a_log.clone(), dt_bias.clone()) } else { (self.cast(a_log, DType::F32)?, self.cast(dt_bias, DType::F32)?) };
            let g = self.alloc(DType::F32, &[l, hv])?;
            let beta = self.alloc(DType::F32, &[l, hv])?;
            ngb = (l * hv).div_ceil(ENC_CONV_THREADS);
            let (a, b) = (Dev::new(y.ptr() + (a0 * es) as u64, y.dtype), Dev::new(y.ptr() + (b0 * es) as u64, y.dtype));
            gate_args = (Dev::from(&g), Dev::from(&beta), a, b, Dev::from(&al), Dev::from(&dt), wbf(&al), hv as i32, ld as i64);
            gb = Some((g, beta));
        }
        if l == 0 {
            return Ok(Some((out, gb)));
        }
        let x = Dev::new(y.ptr() + (start * es) as u64, y.dtype);
        let (g, beta, a, b, al, dt, gbf, hv, lda) = gate_args;
        let cfg = ((ncb + ngb) as u32, ENC_CONV_THREADS as u32, 0);
        let (l, c, ld, ncx, ncb) = (l as i32, c as i32, ld as i64, ncx as i32, ncb as i32);
        kernels::ENC_CONV_SILU_GATES.launch(self, cfg, &out, x, w, wbf(w), l, c, ld, ncx, ncb, g, beta, a, b, al, dt, gbf, hv, lda)?;
        Ok(Some((out, gb)))
    }

    /// `silu(gate)·up` with gate = columns `0..f`, up = columns `f..2f` of `y [L, 2f]`, a 2-D grid
    /// (rows ≤ 65535). → `[L, f]`.
    pub(crate) fn silu_mul8v(&self, y: &CudaTensor, f: usize) -> Result<Option<CudaTensor>> {
        ensure!(y.shape.len() >= 2 && y.last_dim() == 2 * f, "silu_mul: {:?} is not [.., 2·{f}]", y.shape);
        let rows = y.rows();
        if !f.is_multiple_of(8) || rows > 65535 || f >= (1 << 30) {
            return Ok(None);
        }
        let mut shape = y.shape.clone();
        *shape.last_mut().unwrap() = f;
        let out = self.alloc(y.dtype, &shape)?;
        if rows == 0 || f == 0 {
            return Ok(Some(out));
        }
        let up = Dev::new(y.ptr() + (f * y.dtype.size()) as u64, y.dtype);
        let cfg = (((f / 8).div_ceil(512) as u32, rows as u32), 256, 0);
        kernels::ENC_SILU_MUL8V.launch(self, cfg, &out, y, up, f as i32, (2 * f) as i64)?;
        Ok(Some(out))
    }

    /// The zero-centred RMSNorm of `x [rows, d]` (d % 8 == 0, d ≤ 8192), block per row, the weight
    /// in its loaded dtype.
    pub(crate) fn rms1w(&self, x: &CudaTensor, w: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        let d = x.last_dim();
        ensure!(d.is_multiple_of(8) && d <= ENC_RMS1_MAX_WIDTH && d > 0 && w.numel() == d, "rms1w: width {d}, weight {:?}", w.shape);
        let out = self.alloc(x.dtype, &x.shape)?;
        if x.rows() > 0 {
            let k = if d <= ENC_RMS1_2_MAX_WIDTH { &kernels::ENC_RMS1W2 } else { &kernels::ENC_RMS1W };
            k.launch(self, (x.rows() as u32, ENC_RMS1_THREADS as u32, 0), &out, x, w, wbf(w), d as i32, eps as f32)?;
        }
        Ok(out)
    }

    /// The gated RMSNorm of `x [L, Hv, dv]` with z = columns `z0..z0 + Hv·dv` of `y [L, N]`, read
    /// in place, the weight in its loaded dtype (dv % 8 == 0, dv ≤ 256; `gated_rms_norm_row16`: dv ≤ 128), by
    /// kernel `k` (one of [`GRMS`]).
    pub(crate) fn grms_cols(&self, x: &CudaTensor, y: &CudaTensor, z0: usize, w: &CudaTensor, eps: f64, k: &GatedRms) -> Result<Option<CudaTensor>> {
        ensure!(x.shape.len() == 3, "gated_rms_norm: x {:?} is not [L, Hv, dv]", x.shape);
        let (l, hv, d) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(y.shape.len() == 2 && y.shape[0] == l && z0 + hv * d <= y.shape[1], "gated_rms_norm: z columns {z0}+{} of {:?}", hv * d, y.shape);
        ensure!(w.numel() == d, "gated_rms_norm: weight {:?} for width {d}", w.shape);
        let ld = y.shape[1];
        // gated_rms_norm_row16: 8 elements a lane of 16, a row a group, rows < 2^31 (32-bit row arithmetic);
        // gated_rms_norm_wide: a row a warp; both 16 rows a block of 256
        let per_block = 16;
        let dmax = if std::ptr::eq(k, &kernels::ENC_GATED_RMS_NORM_WIDE) { 256 } else { 128 };
        if d % 8 != 0 || d > dmax || !ld.is_multiple_of(8) || !z0.is_multiple_of(8) || y.dtype != x.dtype || hv == 0 || l * hv >= (1 << 31) {
            return Ok(None);
        }
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = l * hv;
        if rows > 0 {
            let z = Dev::new(y.ptr() + (z0 * y.dtype.size()) as u64, y.dtype);
            let cfg = (rows.div_ceil(per_block) as u32, 256, 0);
            k.launch(self, cfg, &out, x, z, w, wbf(w), rows as i64, d as i32, eps as f32, hv as i32, ld as i64)?;
        }
        Ok(Some(out))
    }

    /// The embedding gather with 8 elements a thread (hidden % 8 == 0, ≤ 65535 tokens).
    pub(crate) fn embed8(&self, table: &CudaTensor, ids: &[u32]) -> Result<Option<CudaTensor>> {
        ensure!(table.shape.len() == 2, "embed: table must be [vocab, hidden], got {:?}", table.shape);
        let (vocab, h) = (table.shape[0], table.shape[1]);
        if h % 8 != 0 || ids.len() > 65535 || ids.is_empty() {
            return Ok(None);
        }
        for &id in ids {
            ensure!((id as usize) < vocab, "token id {id} is outside the embedding table of {vocab}");
        }
        ensure!(vocab < (1 << 24), "embed: a vocabulary of {vocab} does not fit exact f32 ids");
        let idt = self.upload_as(&moss_core::tensor::Tensor::new(vec![ids.len()], ids.iter().map(|&i| i as f32).collect())?, DType::F32)?;
        let out = self.alloc(table.dtype, &[ids.len(), h])?;
        let cfg = (((h / 8).div_ceil(256) as u32, ids.len() as u32), 256, 0);
        kernels::ENC_EMBED8.launch(self, cfg, &out, table, &idt, h as i64)?;
        Ok(Some(out))
    }
}
