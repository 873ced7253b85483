//! The encoder's row kernels at their byte floor (`cuda/enc_floor.cu`, issue #7): the causal conv
//! with each thread owning V channels x TT tokens (its TT + 3 input rows loaded once; default 4 x 4
//! with the fast SiLU, convf4x4) and the DeltaNet gates as extra blocks of the same launch; silu_mul, the RMSNorm after the GEMM's
//! residual epilogue, the gated RMSNorm and the embedding gather with 2-D grids / loads issued
//! before the reductions; every small weight (taps, norm weights, A_log, dt_bias) read in its
//! loaded dtype instead of an f32 copy made by a cast (and, for the taps, a permute) every call.
//! Same formulas and rounding points as the kernels they replace. Measured: bench/notes-encrows.md.
//!
//! Switches (read per call):
//! - `MOSS_ENC_ROWS=old`: the previous kernels (conv8 + gates_s with their casts, silu_mul8r,
//!   rms1, grms8s, the scalar embed);
//! - `MOSS_ENC_CONV_TT=4|8|16`: convg (8 channels, IEEE SiLU) with this many tokens a thread
//!   instead of the default convf4x4;
//! - `MOSS_ENC_CONV_C4=1`: 4 channels a conv thread instead of 8 (`convq`: 64 / 78 registers
//!   at 4 / 8 tokens against 108 / 142, for occupancy; 16 tokens run as 8);
//! - `MOSS_ENC_CONV=g4|g8|g16|q4|q8|f8x4|f4x4|f4x8|f2x8|f2x16`: one conv kernel by name (overrides
//!   the two switches above): `g`/`q` + tokens = convg / convq (IEEE SiLU), `f<V>x<TT>` = convf,
//!   V channels x TT tokens a thread with the fast SiLU (`__expf`, `__fdividef`; helper convfloor,
//!   bench/notes-convfloor.md). Default [`CONV_DEFAULT`];
//! - `MOSS_ENC_GRMS=8r|f1|f2|f4`: the gated RMSNorm kernel (grms8r, or grmsf with 1 / 2 / 4 rows a
//!   16-lane group and the fast SiLU; widths ≤ 128). Default [`GRMS_DEFAULT`].
//!
//! Each `*_with` returns `None` where the shapes do not fit the kernel (the caller takes the old
//! path).

use super::ops::{Arg, Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};

/// Tokens a convg thread when `MOSS_ENC_CONV_TT` is unparsable: 4 measured fastest on the H200 at
/// 4096 and at 128 tokens (bench/notes-encrows.md: 68 us against 81 for 8, 107 for 16 and 81 for
/// conv8 at 4096).
pub const CONV_TT: usize = 4;

/// silu_mul8v from this many rows on; below, the previous grid-stride silu_mul8r (measured faster at
/// 128 rows, 5.5 against 6.0 us; silu_mul8v 70 against 80 us at 4096).
pub const SILU_V_MIN_ROWS: usize = 1024;

/// `MOSS_ENC_ROWS=old`: the previous row kernels.
pub fn rows_old() -> bool {
    std::env::var("MOSS_ENC_ROWS").is_ok_and(|v| v == "old")
}

/// Tokens a conv thread from `MOSS_ENC_CONV_TT` (4, 8 or 16; else [`CONV_TT`]).
pub fn conv_tt(v: Option<&str>) -> usize {
    match v.and_then(|s| s.parse().ok()) {
        Some(t @ (4 | 8 | 16)) => t,
        _ => CONV_TT,
    }
}

/// A conv kernel: tokens and channels a thread, and the fast SiLU (convf) or the IEEE one
/// (convg: 8 channels, convq: 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvK {
    pub tt: usize,
    pub v: usize,
    pub fast: bool,
}

impl ConvK {
    pub const fn new(tt: usize, v: usize, fast: bool) -> Self {
        ConvK { tt, v, fast }
    }
    /// Every kernel the fatbin carries.
    pub const ALL: [ConvK; 10] = [
        ConvK::new(4, 8, false),
        ConvK::new(8, 8, false),
        ConvK::new(16, 8, false),
        ConvK::new(4, 4, false),
        ConvK::new(8, 4, false),
        ConvK::new(4, 8, true),
        ConvK::new(4, 4, true),
        ConvK::new(8, 4, true),
        ConvK::new(8, 2, true),
        ConvK::new(16, 2, true),
    ];
    /// The kernel's name without prefix and dtype (`convg4`, `convq8`, `convf2x8`).
    pub fn name(self) -> String {
        match (self.fast, self.v) {
            (true, v) => format!("convf{v}x{}", self.tt),
            (false, 4) => format!("convq{}", self.tt),
            (false, _) => format!("convg{}", self.tt),
        }
    }
    /// From a `MOSS_ENC_CONV` value (`g4`, `q8`, `f2x8`, ...); `None` if no such kernel.
    pub fn parse(s: &str) -> Option<ConvK> {
        Self::ALL.into_iter().find(|k| k.name()[4..] == *s)
    }
}

/// The conv kernel by default: convf4x4 (4 channels x 4 tokens, fast SiLU), measured on the H200
/// with the gates in its launch at 4096 tokens 49.8 us against 72.3 for convg4 (CUDA events; ncu
/// 47.7 against 71.4), at 128 tokens 3.2 against 4.8 (bench/notes-convfloor.md).
/// `MOSS_ENC_CONV=g4`: the previous default.
pub const CONV_DEFAULT: ConvK = ConvK::new(4, 4, true);

/// The conv kernel from `MOSS_ENC_CONV`, else from `MOSS_ENC_CONV_TT` / `MOSS_ENC_CONV_C4` (convg /
/// convq), else [`CONV_DEFAULT`].
pub fn conv_kernel() -> ConvK {
    if let Some(k) = std::env::var("MOSS_ENC_CONV").ok().as_deref().and_then(ConvK::parse) {
        return k;
    }
    let tt = std::env::var("MOSS_ENC_CONV_TT").ok();
    let c4 = std::env::var("MOSS_ENC_CONV_C4").is_ok_and(|v| v == "1");
    if tt.is_none() && !c4 {
        return CONV_DEFAULT;
    }
    let tt = conv_tt(tt.as_deref());
    if c4 {
        ConvK::new(tt.min(8), 4, false)
    } else {
        ConvK::new(tt, 8, false)
    }
}

/// The gated RMSNorm kernels of this file: grms8r or grmsf with 1, 2, 4 rows a 16-lane group.
pub const GRMS_ALL: [&str; 4] = ["grms8r", "grmsf1", "grmsf2", "grmsf4"];
/// The gated RMSNorm kernel by default: grmsf1, measured on the H200 at 4096 tokens 30.8 us against
/// 37.7 for grms8r (CUDA events; ncu 29.2 against 36.4), at 128 tokens 2.3 against 2.6
/// (bench/notes-convfloor.md). `MOSS_ENC_GRMS=8r`: the previous default. Widths over 128 take grms8r.
pub const GRMS_DEFAULT: &str = "grmsf1";

/// The gated RMSNorm kernel from `MOSS_ENC_GRMS` (`8r`, `f1`, `f2`, `f4`), else [`GRMS_DEFAULT`].
pub fn grms_kernel() -> &'static str {
    let v = std::env::var("MOSS_ENC_GRMS").unwrap_or_default();
    GRMS_ALL.into_iter().find(|k| !v.is_empty() && k[4..] == *v).unwrap_or(GRMS_DEFAULT)
}

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
    /// `[L, hv]` each) from extra blocks of the same launch. `(tt, v)`: tokens and channels a
    /// thread and SiLU: one of [`ConvK::ALL`].
    #[allow(clippy::type_complexity)]
    pub(crate) fn convg_cols_with(
        &self,
        y: &CudaTensor,
        (start, c): (usize, usize),
        w: &CudaTensor,
        gates: Option<((usize, usize, usize), &CudaTensor, &CudaTensor)>,
        k: ConvK,
        prefix: &str,
    ) -> Result<Option<ConvGates>> {
        ensure!(y.shape.len() == 2 && start + c <= y.shape[1], "causal_conv1d_silu: columns {start}+{c} of {:?}", y.shape);
        ensure!(w.shape.len() == 3 && w.shape[0] == c && w.shape[1] == 1, "causal_conv1d_silu: weight {:?} for {c} channels", w.shape);
        ensure!(ConvK::ALL.contains(&k), "conv: no kernel {k:?}");
        let (tt, v) = (k.tt, k.v);
        let (l, ld, es) = (y.shape[0], y.shape[1], y.dtype.size());
        let fits = w.shape[2] == 4 && c % 8 == 0 && ld % 8 == 0 && start % 8 == 0 && y.ptr() % 16 == 0 && l < (1 << 30) && c < (1 << 30);
        if !fits {
            return Ok(None);
        }
        let out = self.alloc(y.dtype, &[l, c])?;
        let (ncx, nty) = ((c / v).div_ceil(128), l.div_ceil(tt));
        let ncb = ncx * nty;
        let mut gate_args = vec![Arg::P(0), Arg::P(0), Arg::P(0), Arg::P(0), Arg::P(0), Arg::P(0), Arg::I(0), Arg::I(0), Arg::L(0)];
        let mut ngb = 0;
        let mut gb = None;
        if let Some(((a0, b0, hv), a_log, dt_bias)) = gates {
            ensure!(a0 + hv <= ld && b0 + hv <= ld, "gdn_gates: columns {a0}, {b0} (+{hv}) of {:?}", y.shape);
            ensure!(a_log.numel() == hv && dt_bias.numel() == hv, "gdn_gates: A_log {:?} / dt_bias {:?} for {hv} heads", a_log.shape, dt_bias.shape);
            // one dtype flag for both vectors
            let (al, dt) = if a_log.dtype == dt_bias.dtype { (a_log.clone(), dt_bias.clone()) } else { (self.cast(a_log, DType::F32)?, self.cast(dt_bias, DType::F32)?) };
            let g = self.alloc(DType::F32, &[l, hv])?;
            let beta = self.alloc(DType::F32, &[l, hv])?;
            ngb = (l * hv).div_ceil(128);
            gate_args = vec![
                Arg::P(g.ptr()),
                Arg::P(beta.ptr()),
                Arg::P(y.ptr() + (a0 * es) as u64),
                Arg::P(y.ptr() + (b0 * es) as u64),
                Arg::P(al.ptr()),
                Arg::P(dt.ptr()),
                Arg::I(wbf(&al)),
                Arg::I(hv as i32),
                Arg::L(ld as i64),
            ];
            gb = Some((g, beta));
        }
        if l == 0 {
            return Ok(Some((out, gb)));
        }
        let mut args = vec![
            Arg::P(out.ptr()),
            Arg::P(y.ptr() + (start * es) as u64),
            Arg::P(w.ptr()),
            Arg::I(wbf(w)),
            Arg::I(l as i32),
            Arg::I(c as i32),
            Arg::L(ld as i64),
            Arg::I(ncx as i32),
            Arg::I(ncb as i32),
        ];
        args.extend(gate_args);
        self.launch(&format!("{prefix}_{}_{}", k.name(), y.dtype.name()), (ncb + ngb) as u32, 128, 0, &args)?;
        Ok(Some((out, gb)))
    }

    /// `silu(gate)·up` with gate = columns `0..f`, up = columns `f..2f` of `y [L, 2f]`, a 2-D grid
    /// (rows ≤ 65535). → `[L, f]`.
    pub(crate) fn silu_mul8v_with(&self, y: &CudaTensor, f: usize, prefix: &str) -> Result<Option<CudaTensor>> {
        ensure!(y.shape.len() >= 2 && y.last_dim() == 2 * f, "silu_mul: {:?} is not [.., 2·{f}]", y.shape);
        let rows = y.rows();
        if f % 8 != 0 || rows > 65535 || f >= (1 << 30) {
            return Ok(None);
        }
        let mut shape = y.shape.clone();
        *shape.last_mut().unwrap() = f;
        let out = self.alloc(y.dtype, &shape)?;
        if rows == 0 || f == 0 {
            return Ok(Some(out));
        }
        self.launch_2d(
            &format!("{prefix}_silu_mul8v_{}", y.dtype.name()),
            ((f / 8).div_ceil(512) as u32, rows as u32),
            256,
            0,
            &[Arg::P(out.ptr()), Arg::P(y.ptr()), Arg::P(y.ptr() + (f * y.dtype.size()) as u64), Arg::I(f as i32), Arg::L((2 * f) as i64)],
        )?;
        Ok(Some(out))
    }

    /// The zero-centred RMSNorm of `x [rows, d]` (d % 8 == 0, d ≤ 8192), block per row, the weight
    /// in its loaded dtype.
    pub(crate) fn rms1w_with(&self, x: &CudaTensor, w: &CudaTensor, eps: f64, prefix: &str) -> Result<CudaTensor> {
        let d = x.last_dim();
        ensure!(d % 8 == 0 && d <= 8192 && d > 0 && w.numel() == d, "rms1w: width {d}, weight {:?}", w.shape);
        let out = self.alloc(x.dtype, &x.shape)?;
        if x.rows() > 0 {
            let k = if d <= 4096 { "rms1w2" } else { "rms1w" };
            self.launch(
                &format!("{prefix}_{k}_{}", x.dtype.name()),
                x.rows() as u32,
                256,
                0,
                &[Arg::P(out.ptr()), Arg::P(x.ptr()), Arg::P(w.ptr()), Arg::I(wbf(w)), Arg::I(d as i32), Arg::F(eps as f32)],
            )?;
        }
        Ok(out)
    }

    /// The gated RMSNorm of `x [L, Hv, dv]` with z = columns `z0..z0 + Hv·dv` of `y [L, N]`, read
    /// in place, the weight in its loaded dtype (dv % 8 == 0, dv ≤ 256; `grmsf*`: dv ≤ 128), by
    /// kernel `k` (one of [`GRMS_ALL`]).
    pub(crate) fn grms_cols_with(&self, x: &CudaTensor, y: &CudaTensor, z0: usize, w: &CudaTensor, eps: f64, k: &str, prefix: &str) -> Result<Option<CudaTensor>> {
        ensure!(x.shape.len() == 3, "gated_rms_norm: x {:?} is not [L, Hv, dv]", x.shape);
        let (l, hv, d) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(y.shape.len() == 2 && y.shape[0] == l && z0 + hv * d <= y.shape[1], "gated_rms_norm: z columns {z0}+{} of {:?}", hv * d, y.shape);
        ensure!(w.numel() == d, "gated_rms_norm: weight {:?} for width {d}", w.shape);
        let ld = y.shape[1];
        ensure!(GRMS_ALL.contains(&k), "gated_rms_norm: no kernel {k}");
        // grmsf: 8 elements a lane of 16, rows < 2^31 (32-bit row arithmetic); R rows a group
        let per_block = match k {
            "grmsf1" => 16,
            "grmsf2" => 32,
            "grmsf4" => 64,
            _ => 16,
        };
        let dmax = if k == "grms8r" { 256 } else { 128 };
        if d % 8 != 0 || d > dmax || ld % 8 != 0 || z0 % 8 != 0 || y.dtype != x.dtype || hv == 0 || l * hv >= (1 << 31) {
            return Ok(None);
        }
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = l * hv;
        if rows > 0 {
            self.launch(
                &format!("{prefix}_{k}_{}", x.dtype.name()),
                rows.div_ceil(per_block) as u32,
                256,
                0,
                &[
                    Arg::P(out.ptr()),
                    Arg::P(x.ptr()),
                    Arg::P(y.ptr() + (z0 * y.dtype.size()) as u64),
                    Arg::P(w.ptr()),
                    Arg::I(wbf(w)),
                    Arg::L(rows as i64),
                    Arg::I(d as i32),
                    Arg::F(eps as f32),
                    Arg::I(hv as i32),
                    Arg::L(ld as i64),
                ],
            )?;
        }
        Ok(Some(out))
    }

    /// The embedding gather with 8 elements a thread (hidden % 8 == 0, ≤ 65535 tokens).
    pub(crate) fn embed8_with(&self, table: &CudaTensor, ids: &[u32], prefix: &str) -> Result<Option<CudaTensor>> {
        ensure!(table.shape.len() == 2, "embed: table must be [vocab, hidden], got {:?}", table.shape);
        let (vocab, h) = (table.shape[0], table.shape[1]);
        if h % 8 != 0 || ids.len() > 65535 || ids.is_empty() {
            return Ok(None);
        }
        for &id in ids {
            ensure!((id as usize) < vocab, "token id {id} is outside the embedding table of {vocab}");
        }
        ensure!(vocab < (1 << 24), "embed: a vocabulary of {vocab} does not fit exact f32 ids");
        let idt = self.upload_as(&crate::tensor::Tensor::new(vec![ids.len()], ids.iter().map(|&i| i as f32).collect())?, DType::F32)?;
        let out = self.alloc(table.dtype, &[ids.len(), h])?;
        self.launch_2d(
            &format!("{prefix}_embed8_{}", table.dtype.name()),
            ((h / 8).div_ceil(256) as u32, ids.len() as u32),
            256,
            0,
            &[Arg::P(out.ptr()), Arg::P(table.ptr()), Arg::P(idt.ptr()), Arg::L(h as i64)],
        )?;
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn conv_tt_switch() {
        assert_eq!(super::conv_tt(None), super::CONV_TT);
        assert_eq!(super::conv_tt(Some("16")), 16);
        assert_eq!(super::conv_tt(Some("4")), 4);
        assert_eq!(super::conv_tt(Some("5")), super::CONV_TT);
        assert_eq!(super::conv_tt(Some("x")), super::CONV_TT);
    }

    #[test]
    fn kernel_names() {
        use super::ConvK;
        let names: Vec<String> = ConvK::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["convg4", "convg8", "convg16", "convq4", "convq8", "convf8x4", "convf4x4", "convf4x8", "convf2x8", "convf2x16"]);
        assert_eq!(ConvK::parse("f2x8"), Some(ConvK::new(8, 2, true)));
        assert_eq!(ConvK::parse("g16"), Some(ConvK::new(16, 8, false)));
        assert_eq!(ConvK::parse("q4"), Some(ConvK::new(4, 4, false)));
        assert_eq!(ConvK::parse("f2x4"), None);
        assert!(ConvK::ALL.contains(&super::CONV_DEFAULT));
        assert!(super::GRMS_ALL.contains(&super::GRMS_DEFAULT));
        // the kernel names the CUDA source defines
        let src = include_str!("../../../cuda/enc_floor.cu");
        for n in names.iter().map(String::as_str).chain(super::GRMS_ALL) {
            assert!(src.contains(&format!("PFX##_{n}_##SX")) || src.contains(&format!("SX, {n},")), "{n} not in enc_floor.cu");
        }
    }
}
