//! [`DitOps`] on the GPU: kernels of `cuda/dit/dit_ops.cu`, the attention (`attention.rs`), the
//! Hopper GEMMs with fused epilogues (`linear_*.rs`).
//!
//! Dtypes follow `ops.rs`: outputs take the dtype of `x` (or `q`); the small per-channel vectors
//! (weights, shift, scale, gate, RoPE tables) may be bf16 or f32 — when one op's vectors differ,
//! they are cast to f32 first.

mod attention;
pub mod flash_attention;
mod fp8_act;
pub mod linear_qkv_norm_rope;
pub mod linear_situ_glu;

use crate::kernels::{self, Dev, Family};
use crate::launch::DIT_ROW_THREADS;
use crate::ops::{Cuda, CudaTensor, DType};
use crate::plan::MemoryPlan;
use crate::select;
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::result as dr;
pub use flash_attention::{flash_applies, flash_tensor_map, pick_flash, FlashKernel, FLASH_HEAD_DIM, FLASH_KERNELS};
pub use linear_qkv_norm_rope::{qkv_gemm_shape, QKV_FP8_KERNEL, QKV_KERNEL};
pub use linear_situ_glu::{situ_gemm_shape, SITU_FP8_KERNEL, SITU_KERNEL};
use moss_core::backend::cpu::Cpu;
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::checkpoint::{config::DitConfig, Component};

pub use attention::ATTN_SCORE_BUDGET;

/// The largest square picture side (a multiple of 16, up to the CLI's cap) whose plan at
/// `side²/256 + text` joint tokens needs at most `free` bytes.
pub fn largest_square(free: usize, text: usize, needed: impl Fn(usize) -> usize) -> Option<usize> {
    (1..=moss_core::options::MAX_SIDE as usize / 16).rev().find(|s| needed(s * s + text) <= free).map(|s| s * 16)
}

/// `(N, hd)` of a packed `[N, 3·heads·hd]` projection.
fn packed_dims(x: &CudaTensor, heads: usize, what: &str) -> Result<(usize, usize)> {
    ensure!(x.shape.len() == 2 && heads > 0 && x.shape[1].is_multiple_of(3 * heads), "{what}: expected [N, 3·{heads}·hd], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1] / (3 * heads)))
}

fn dims3(x: &CudaTensor, what: &str) -> Result<(usize, usize, usize)> {
    ensure!(x.shape.len() == 3, "{what}: expected [N, heads, dim], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2]))
}

impl Cuda {
    /// The vectors in one dtype: as they are if they agree, else all f32.
    fn same_dtype(&self, vs: &[&CudaTensor]) -> Result<(DType, Vec<CudaTensor>)> {
        let dt = if vs.iter().all(|v| v.dtype == vs[0].dtype) { vs[0].dtype } else { DType::F32 };
        Ok((dt, vs.iter().map(|v| self.cast(v, dt)).collect::<Result<_>>()?))
    }

    /// A one-warp-a-row norm's inputs checked, `x [N, D]` and each named vector of `vs` `[D]`:
    /// `(D, the vectors' dtype, the vectors in it)` ([`Cuda::same_dtype`]).
    fn row_vectors(&self, x: &CudaTensor, vs: &[(&str, &CudaTensor)], what: &str) -> Result<(usize, DType, Vec<CudaTensor>)> {
        ensure!(x.shape.len() == 2, "{what}: expected [N, D], got {:?}", x.shape);
        let d = x.shape[1];
        for (n, v) in vs {
            ensure!(v.numel() == d, "{what} {n}: {:?} for width {d}", v.shape);
        }
        let (vt, v) = self.same_dtype(&vs.iter().map(|(_, v)| *v).collect::<Vec<_>>())?;
        Ok((d, vt, v))
    }

    /// The dtype of a DiT norm's output (the next linear's input) over the stream `x` with
    /// vectors of `vt`: bf16 where `x` is the f32 stream of a bf16 forward (bf16 vectors: the
    /// `{op}_f32_bf16_to_bf16` kernels), else `x`'s.
    pub(crate) fn normed_dtype(&self, x: DType, vt: DType) -> DType {
        if x == DType::F32 && vt == DType::BF16 && self.act_dtype() == DType::BF16 {
            DType::BF16
        } else {
            x
        }
    }

    /// The norm kernel over `x` writing `y`: `same` where `y` is in x's dtype, else `to`
    /// (`*_to_bf16`, the f32 stream's norm into bf16).
    pub(crate) fn norm_kernel<'a, S>(x: DType, y: DType, same: &'a Family<S>, to: &'a Family<S>) -> &'a Family<S> {
        if y == x {
            same
        } else {
            to
        }
    }

    /// The gated residual + norm's inputs ([`Cuda::row_vectors`] of gate, weight, shift, scale),
    /// with `y` checked and in the normed output's dtype ([`Cuda::normed_dtype`]), which is
    /// returned last.
    #[allow(clippy::type_complexity)]
    fn gres_inputs(&self, x: &CudaTensor, y: &CudaTensor, vs: [&CudaTensor; 4]) -> Result<(usize, CudaTensor, DType, Vec<CudaTensor>, DType)> {
        let what = "gated_residual_norm_modulate";
        let (d, vt, v) = self.row_vectors(x, &[("gate", vs[0]), ("weight", vs[1]), ("shift", vs[2]), ("scale", vs[3])], what)?;
        ensure!(y.shape == x.shape, "{what}: y {:?} for x {:?}", y.shape, x.shape);
        let ty = self.normed_dtype(x.dtype, vt);
        Ok((d, self.cast(y, ty)?, vt, v, ty))
    }

    /// A warp-per-row kernel's launch over `rows` rows: 8 rows a block of 256 threads.
    fn rows_cfg(rows: usize) -> (u32, u32, u32) {
        (rows.div_ceil(8) as u32, 256, 0)
    }

    /// A one-block-a-row kernel's launch over `rows` rows of `d` (`cuda/dit/dit_ops.cu`'s gated
    /// residual + norm: ⌈d/8⌉ threads rounded up to a warp, at most [`DIT_ROW_THREADS`], each
    /// holding 8 values); `None` for no rows.
    fn row_blocks_cfg(what: &str, rows: usize, d: usize) -> Result<Option<(u32, u32, u32)>> {
        let threads = d.div_ceil(8).next_multiple_of(32);
        ensure!(threads <= DIT_ROW_THREADS, "{what}: rows of {d} are wider than the kernel holds ({})", 8 * DIT_ROW_THREADS);
        Ok((rows > 0).then_some((rows as u32, threads as u32, 0)))
    }

    /// [`DitOps::rms_norm_modulate`].
    pub(crate) fn rms_norm_modulate_op(&self, x: &CudaTensor, w: &CudaTensor, shift: &CudaTensor, scale: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        let (d, vt, v) = self.row_vectors(x, &[("weight", w), ("shift", shift), ("scale", scale)], "rms_norm_modulate")?;
        let ty = self.normed_dtype(x.dtype, vt);
        let out = self.alloc(ty, &x.shape)?;
        let kernel = Self::norm_kernel(x.dtype, ty, &kernels::RMS_MOD, &kernels::RMS_MOD_TO);
        let rows = x.shape[0];
        kernel.launch(self, Self::rows_cfg(rows), &out, x, &v[0], &v[1], &v[2], rows as i64, d as i32, eps as f32)?;
        Ok(out)
    }

    /// [`DitOps::qk_norm_rope`].
    pub(crate) fn qk_norm_rope_op(&self, x: &CudaTensor, w: &CudaTensor, cos: &CudaTensor, sin: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        let (n, nh, hd) = dims3(x, "qk_norm_rope")?;
        ensure!(hd.is_multiple_of(2), "qk_norm_rope: head dim {hd} must be even");
        ensure!(w.numel() == hd, "qk_norm_rope weight: {:?} for head dim {hd}", w.shape);
        for (name, t) in [("cos", cos), ("sin", sin)] {
            ensure!(t.shape == [n, hd / 2], "qk_norm_rope: {name} {:?}, expected [{n}, {}]", t.shape, hd / 2);
        }
        let (_, v) = self.same_dtype(&[w, cos, sin])?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let rows = n * nh;
        kernels::QK_ROPE.launch(self, Self::rows_cfg(rows), &out, x, &v[0], &v[1], &v[2], rows as i64, nh as i32, hd as i32, eps as f32)?;
        Ok(out)
    }

    /// [`DitOps::qkv_norm_rope`]. Head dims other than 16·2^i (≤ 512) take the unfused kernel on
    /// copies of the parts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qkv_norm_rope_op(
        &self,
        qkv: CudaTensor,
        heads: usize,
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        eps: f64,
    ) -> Result<CudaTensor> {
        let (n, hd) = packed_dims(&qkv, heads, "qkv_norm_rope")?;
        ensure!(hd.is_multiple_of(2), "qkv_norm_rope: head dim {hd} must be even");
        let half = hd / 2;
        for (name, w) in [("q weight", wq), ("k weight", wk)] {
            ensure!(w.numel() == hd, "qkv_norm_rope {name}: {:?} for head dim {hd}", w.shape);
        }
        for (name, t) in [("cos", cos), ("sin", sin)] {
            ensure!(t.shape == [n, half], "qkv_norm_rope: {name} {:?}, expected [{n}, {half}]", t.shape);
        }
        let d = heads * hd;
        let tpr = half / 8;
        if !half.is_multiple_of(8) || !tpr.is_power_of_two() || tpr > 32 {
            let part = |i: usize| self.narrow_copy(&qkv, 1, i * d, d).and_then(|t| self.reshape(&t, &[n, heads, hd]));
            let flat = |t: CudaTensor| self.reshape(&t, &[n, d]);
            let q = flat(self.qk_norm_rope_op(&part(0)?, wq, cos, sin, eps)?)?;
            let k = flat(self.qk_norm_rope_op(&part(1)?, wk, cos, sin, eps)?)?;
            let v = flat(part(2)?)?;
            return self.cat(&[&q, &k, &v], 1);
        }
        // Written in place; a buffer someone else still reads is copied first.
        let qkv = if qkv.is_unique() { qkv } else { self.cat_copies(&[&qkv], 1)? };
        let (_, v) = self.same_dtype(&[wq, wk, cos, sin])?;
        let threads = n * 2 * heads * tpr;
        if threads > 0 {
            let cfg = (threads.div_ceil(256) as u32, 256, 0);
            kernels::QKV_ROPE.launch(self, cfg, &qkv, &v[0], &v[1], &v[2], &v[3], n as i64, heads as i32, hd as i32, eps as f32)?;
        }
        Ok(qkv)
    }

    /// [`DitOps::gated_residual_norm_modulate`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gres_norm_mod_op(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f64,
    ) -> Result<(CudaTensor, CudaTensor)> {
        let (d, y, _, v, ty) = self.gres_inputs(x, y, [gate, w, shift, scale])?;
        let xo = self.alloc(x.dtype, &x.shape)?;
        let no = self.alloc(ty, &x.shape)?;
        let kernel = Self::norm_kernel(x.dtype, ty, &kernels::GRES_MOD, &kernels::GRES_MOD_TO);
        let rows = x.shape[0];
        if let Some(cfg) = Self::row_blocks_cfg("gated_residual_norm_modulate", rows, d)? {
            kernel.launch(self, cfg, &xo, &no, x, &y, &v[0], &v[1], &v[2], &v[3], rows as i64, d as i32, eps as f32)?;
        }
        Ok((xo, no))
    }

    /// [`DitOps::situ_glu`]: at bf16 the fast form (`moss_situ_fast_bf16`, see cuda/dit/dit_ops.cu), at
    /// fp32 the libm one (`moss_situ_f32`).
    pub(crate) fn situ_glu_op(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let two_f = x.last_dim();
        ensure!(two_f.is_multiple_of(2), "situ_glu: last dim {two_f} is not [up | gate]");
        let f = two_f / 2;
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = f;
        let out = self.alloc(x.dtype, &shape)?;
        let rows = x.rows();
        let work = if f.is_multiple_of(8) { rows * f / 8 } else { rows * f };
        let kernel = if x.dtype == DType::BF16 { &kernels::SITU_FAST } else { &kernels::SITU };
        kernel.launch(self, (self.grid_for(work), 256, 0), &out, x, rows as i64, f as i64)?;
        Ok(out)
    }

    /// [`DitOps::gated_residual`].
    pub(crate) fn gated_residual_op(&self, x: &CudaTensor, y: &CudaTensor, gate: &CudaTensor) -> Result<CudaTensor> {
        ensure!(x.shape.len() == 2, "gated_residual: expected [N, D], got {:?}", x.shape);
        ensure!(y.shape == x.shape, "gated_residual: y {:?} for x {:?}", y.shape, x.shape);
        let d = x.shape[1];
        ensure!(gate.numel() == d, "gated_residual gate: {:?} for width {d}", gate.shape);
        let y = self.cast(y, x.dtype)?;
        let out = self.alloc(x.dtype, &x.shape)?;
        let n = x.numel();
        let work = if d.is_multiple_of(8) { n / 8 } else { n };
        kernels::GRES.launch(self, (self.grid_for(work), 256, 0), &out, x, &y, gate, n as i64, d as i64)?;
        Ok(out)
    }

    /// [`DitOps::cfg_euler`]: `x + dsigma · (v_u + guidance · (v_c − v_u))` (`v_c` alone without
    /// `v_u`), in f32.
    pub(crate) fn cfg_euler_f32(&self, x: &CudaTensor, v_c: &CudaTensor, v_u: Option<&CudaTensor>, guidance: f32, dsigma: f32) -> Result<CudaTensor> {
        ensure!(v_c.shape == x.shape, "cfg_euler: v_c {:?} for x {:?}", v_c.shape, x.shape);
        if let Some(u) = v_u {
            ensure!(u.shape == x.shape, "cfg_euler: v_u {:?} for x {:?}", u.shape, x.shape);
        }
        let n = x.numel();
        ensure!(n < i32::MAX as usize, "cfg_euler: {n} values");
        let out = self.alloc(DType::F32, &x.shape)?;
        let xf = self.cast(x, DType::F32)?;
        let s = &self.gpu().stream;
        // SAFETY: both buffers hold n f32 values.
        unsafe { dr::memcpy_dtod_async(out.ptr(), xf.ptr(), n * 4, s.cu_stream()) }.map_err(|e| anyhow!("CUDA copy: {e:?}"))?;
        let vc = self.cast(v_c, DType::F32)?;
        let vu = v_u.map(|u| self.cast(u, DType::F32)).transpose()?;
        let vu = vu.as_ref().map_or(Dev::null(DType::F32), Dev::from);
        kernels::CFG_EULER.launch(self, (n.div_ceil(256) as u32, 256, 0), &out, &vc, vu, guidance, dsigma, n as i32)?;
        Ok(out)
    }
}

impl Cuda {
    /// The DiT stage's memory plan at `tokens` joint tokens: weights as loaded, one forward's
    /// activations ([`crate::plan::dit_activation_bytes`]; at fp32 plus one chunk of cuBLASLt
    /// attention scores and probabilities), the reserve.
    pub fn dit_plan(&self, c: &Component, cfg: &DitConfig, tokens: usize) -> MemoryPlan {
        let dt = self.act_dtype();
        let mut act = crate::plan::dit_activation_bytes(cfg, tokens, dt);
        if dt != DType::BF16 {
            act += (ATTN_SCORE_BUDGET / 4) * (4 + dt.size());
        }
        MemoryPlan::component(c, self.precision).activations(act)
    }
}

impl DitOps for Cuda {
    fn plan_dit(&self, c: &Component, cfg: &DitConfig, image: usize, text: usize) -> Result<()> {
        let (free, total) = self.gpu().mem_info()?;
        let plan = self.dit_plan(c, cfg, image + text);
        if let Err(e) = plan.check_against(free, total, &self.gpu().name) {
            // The largest square picture (sides a multiple of 16) whose plan fits, same text.
            let fits = largest_square(free, text, |tokens| self.dit_plan(c, cfg, tokens).needed());
            let hint = match fits {
                Some(side) => format!("the largest square size that fits is {side}x{side}"),
                None => "no picture size fits: not even the weights do".to_string(),
            };
            return Err(e.context(format!("the DiT stage does not fit ({hint})")));
        }
        Ok(())
    }

    /// Host f64 (the CPU twin's own code: 256 values), uploaded as f32.
    fn timestep_sinusoid(&self, t: f32, dim: usize) -> Result<CudaTensor> {
        self.prof("timestep_sinusoid (host + upload)", || self.upload_as(&Cpu.timestep_sinusoid(t, dim)?, DType::F32))
    }
    fn rms_norm_modulate(&self, x: &CudaTensor, w: &CudaTensor, shift: &CudaTensor, scale: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        self.prof("rms_norm_modulate", || self.rms_norm_modulate_op(x, w, shift, scale, eps))
    }
    fn qk_norm_rope(&self, x: &CudaTensor, w: &CudaTensor, cos: &CudaTensor, sin: &CudaTensor, eps: f64) -> Result<CudaTensor> {
        self.prof("qk_norm_rope", || self.qk_norm_rope_op(x, w, cos, sin, eps))
    }
    /// bf16 with head dim 128: a flash kernel ([`Cuda::flash_kernel`]: the warp-specialised `ws_nopp` on Hopper);
    /// otherwise cuBLASLt.
    fn attention(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, scale: f64) -> Result<CudaTensor> {
        self.prof("attention", || {
            if flash_applies(q, k, v) {
                self.flash_attention_on(q, k, v, scale, self.flash_kernel())
            } else {
                self.attention_gemm(q, k, v, scale)
            }
        })
    }
    fn qkv_norm_rope(
        &self,
        qkv: CudaTensor,
        heads: usize,
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        eps: f64,
    ) -> Result<CudaTensor> {
        self.prof("qkv_norm_rope", || self.qkv_norm_rope_op(qkv, heads, wq, wk, cos, sin, eps))
    }
    fn attention_packed(&self, qkv: &CudaTensor, heads: usize, scale: f64) -> Result<CudaTensor> {
        self.prof("attention", || self.attention_packed_blocks(qkv, heads, scale, (1, 2)))
    }
    fn gated_residual_norm_modulate(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f64,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.prof("gated_residual_norm_modulate", || self.gres_norm_mod_op(x, y, gate, w, shift, scale, eps))
    }
    fn situ_glu(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.prof("situ_glu", || self.situ_glu_op(x))
    }
    /// On Hopper the fused kernel where the shape qualifies ([`Cuda::linear_situ_glu_op`]).
    fn linear_situ_glu(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        self.linear_situ_glu_op(x, w)
    }
    /// On Hopper the fused kernel where the shape qualifies ([`Cuda::linear_qkv_norm_rope_op`]).
    fn linear_qkv_norm_rope(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        heads: usize,
        eps: f64,
    ) -> Result<CudaTensor> {
        self.linear_qkv_norm_rope_op(x, w, wq, wk, cos, sin, heads, eps)
    }
    fn linear_qkv_norm_rope_fp8(
        &self,
        x: (&CudaTensor, &CudaTensor),
        w: (&CudaTensor, &CudaTensor),
        wq: &CudaTensor,
        wk: &CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        heads: usize,
        eps: f64,
    ) -> Result<CudaTensor> {
        self.linear_qkv_norm_rope_fp8_op(x, w, wq, wk, cos, sin, heads, eps)
    }
    fn linear_situ_glu_fp8(&self, xq: &CudaTensor, xs: &CudaTensor, wq: &CudaTensor, ws: &CudaTensor) -> Result<fp8_act::Quantized> {
        self.linear_situ_glu_fp8_op(xq, xs, wq, ws)
    }
    fn rms_norm_modulate_fp8(&self, x: &CudaTensor, w: &CudaTensor, shift: &CudaTensor, scale: &CudaTensor, eps: f64) -> Result<fp8_act::Quantized> {
        self.prof("rms_norm_modulate_fp8", || self.rms_norm_modulate_fp8_op(x, w, shift, scale, eps))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_residual_norm_modulate_fp8(
        &self,
        x: &CudaTensor,
        y: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f64,
    ) -> Result<(CudaTensor, fp8_act::Quantized)> {
        self.prof("gated_residual_norm_modulate_fp8", || self.gres_norm_mod_fp8_op(x, y, gate, w, shift, scale, eps))
    }
    /// The fused kernel where [`select::situ_fp8_fused`] takes the width, else `situ_glu` and
    /// `quantize_rows` (the trait's composition).
    fn situ_glu_fp8(&self, x: &CudaTensor) -> Result<fp8_act::Quantized> {
        if !select::situ_fp8_fused(x.last_dim() / 2) {
            return self.quantize_rows(&self.situ_glu(x)?);
        }
        self.prof("situ_glu_fp8", || self.situ_glu_fp8_op(x))
    }
    fn linear_f32(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        let name = || format!("linear_f32 {}x{}x{}", x.rows(), w.shape.get(1).unwrap_or(&0), w.shape.first().unwrap_or(&0));
        self.timed_op(name, || self.linear_dense_into(x, w, None, DType::F32))
    }
    fn residual_stream(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.prof("residual_stream", || self.cast(x, DType::F32))
    }
    fn gated_residual(&self, x: &CudaTensor, y: &CudaTensor, gate: &CudaTensor) -> Result<CudaTensor> {
        self.prof("gated_residual", || self.gated_residual_op(x, y, gate))
    }
    fn cfg_euler(&self, x: &CudaTensor, v_c: &CudaTensor, v_u: Option<&CudaTensor>, guidance: f32, dsigma: f32) -> Result<CudaTensor> {
        self.prof("cfg_euler", || self.cfg_euler_f32(x, v_c, v_u, guidance, dsigma))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn largest_square_fitting() {
        // 1 GiB fixed + 1 MiB a token: 2 GiB free leaves 1024 tokens, 128 of them text → 29² = 841
        // image tokens (30² = 900 > 896), a 464x464 picture.
        let need = |t: usize| (1usize << 30) + t * (1 << 20);
        assert_eq!(super::largest_square(2 << 30, 128, need), Some(464));
        assert_eq!(super::largest_square(1 << 30, 128, need), None);
        assert_eq!(super::largest_square(usize::MAX, 0, need), Some(moss_core::options::MAX_SIDE as usize));
    }
}
