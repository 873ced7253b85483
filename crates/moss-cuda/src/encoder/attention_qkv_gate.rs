//! The gated full attention's ops on the joined projection `y = x·[q_proj | k_proj | v_proj]ᵀ`
//! (`cuda/encoder/attention_qkv_gate.cu`): q and k normed + RoPE'd and v copied out of `y` in one kernel
//! ([`EncoderOps::attn_qkv_norm_rope`]), the output gate read in place out of `y`
//! ([`EncoderOps::causal_attention_gated_y`]). Gated in `check/encoder_attention.rs`.
//!
//! q_proj, k_proj, v_proj are one GEMM over the weights joined at load; q and k are normed and
//! RoPE'd by `qkrope_t` reading the call's sines and cosines from a table (`rope_tab`); shapes it
//! does not take run the split ops (narrow + `head_norm_rope`).
//!
//! [`EncoderOps::attn_qkv_norm_rope`]: moss_core::backend::ops::EncoderOps::attn_qkv_norm_rope
//! [`EncoderOps::causal_attention_gated_y`]: moss_core::backend::ops::EncoderOps::causal_attention_gated_y
//! [`EncoderOps::causal_attention_gated`]: moss_core::backend::ops::EncoderOps::causal_attention_gated

use crate::kernels::{self, Dev, Elem};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{ensure, Result};

/// Rows (warps) per block of `qkrope` and its largest head dim (cuda/encoder/launch.h).
const QK_WARPS: usize = crate::launch::ENC_QK_WARPS;
pub const QK_MAXHD: usize = crate::launch::ENC_QK_MAXHD;

impl Cuda {
    /// q, k (normed + RoPE'd) and v out of `y [L, (2H + 2Hkv)·hd]` by one kernel (`qkrope`), or
    /// if `tab` by `qkrope_t` after `rope_tab` made the call's sines and cosines; `None` where
    /// the kernel does not take the shapes (head dim not a multiple of 8 or above [`QK_MAXHD`],
    /// an odd or too wide rotary dim): the caller runs the split ops.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attn_qkv_rope(
        &self,
        y: &CudaTensor,
        (nh, nkv, hd): (usize, usize, usize),
        wq: &CudaTensor,
        wk: &CudaTensor,
        eps: f64,
        rot: usize,
        theta: f64,
    ) -> Result<Option<(CudaTensor, CudaTensor, CudaTensor)>> {
        let ld = (2 * nh + 2 * nkv) * hd;
        ensure!(y.shape.len() == 2 && y.shape[1] == ld, "attn_qkv: y {:?} for {nh} + {nkv} heads of {hd}", y.shape);
        ensure!(wq.numel() == hd && wk.numel() == hd, "attn_qkv: norm weights {:?}, {:?} for head_dim {hd}", wq.shape, wk.shape);
        ensure!(rot.is_multiple_of(2) && rot <= hd, "attn_qkv: rotary dim {rot} of head_dim {hd}");
        if hd % 8 != 0 || hd > QK_MAXHD || !y.ptr().is_multiple_of(16) {
            return Ok(None);
        }
        let l = y.shape[0];
        let dt = y.dtype;
        // norm weights in the activation dtype (a no-op for a bf16 checkpoint at bf16)
        let (wq, wk) = (self.cast(wq, dt)?, self.cast(wk, dt)?);
        let q = self.alloc(dt, &[l, nh, hd])?;
        let k = self.alloc(dt, &[l, nkv, hd])?;
        let v = self.alloc(dt, &[l, nkv, hd])?;
        let rows = l * (nh + 2 * nkv);
        if rows > 0 {
            // tab: the call's (cos, sin) table [L, rot/2] (with the planted position bug in the
            // check image's twin: qkrope_t has none of its own), read by qkrope_t
            let half = rot / 2;
            let t = self.alloc(DType::F32, &[(l * half * 2).max(1)])?;
            let tab = Dev::new(t.ptr(), Elem::F32x2);
            if half > 0 {
                kernels::ENC_ROPE_TAB.launch(self, (self.grid_for(l * half), 256, 0), tab, l as i64, rot as i32, theta.to_bits() as i64)?;
            }
            let cfg = (rows.div_ceil(QK_WARPS) as u32, (QK_WARPS * 32) as u32, 0);
            let (l, nh32, nkv32, hd32) = (l as i64, nh as i32, nkv as i32, hd as i32);
            let (ld, qhs, koff, voff) = (ld as i64, (2 * hd) as i64, (2 * nh * hd) as i64, ((2 * nh + nkv) * hd) as i64);
            kernels::ENC_QKROPE_T.launch(self, cfg, &q, &k, &v, y, &wq, &wk, l, nh32, nkv32, hd32, ld, qhs, koff, voff, eps as f32, rot as i32, tab)?;
        }
        Ok(Some((q, k, v)))
    }

    /// `o [L, H·hd] · sigmoid(gate)`, head h's gate read in place out of `y [L, ld]` at columns
    /// `h·2·hd + hd ..` (`gmulh`); `None` where hd or ld is not a multiple of 8.
    pub(crate) fn attn_gate_y(&self, o: &CudaTensor, y: &CudaTensor, (nh, hd): (usize, usize)) -> Result<Option<CudaTensor>> {
        ensure!(y.shape.len() == 2 && y.shape[1] >= 2 * nh * hd, "attn_gate: y {:?} for {nh} heads of {hd}", y.shape);
        let l = y.shape[0];
        ensure!(o.numel() == l * nh * hd, "attn_gate: o {:?} for {l} x {nh} x {hd}", o.shape);
        let ld = y.shape[1];
        if hd % 8 != 0 || !ld.is_multiple_of(8) || !y.ptr().is_multiple_of(16) || !o.ptr().is_multiple_of(16) {
            return Ok(None);
        }
        let y = self.cast(y, o.dtype)?;
        let out = self.alloc(o.dtype, &[l, nh * hd])?;
        if l > 0 {
            let gate = Dev::new(y.ptr() + (hd * o.dtype.size()) as u64, y.dtype);
            let cfg = (self.grid_for(l * nh * hd / 8), 256, 0);
            kernels::ENC_GMULH.launch(self, cfg, &out, o, gate, l as i64, nh as i32, hd as i32, ld as i64, (2 * hd) as i64)?;
        }
        Ok(Some(out))
    }
}
