//! The DiT's e4m3 attention (`--precision fp8` on Hopper): `moss_dit_attention_fp8_operands`
//! (cuda/dit/attention_fp8_operands.cu: q and k codes over the QK-norm's fixed scales, V^T codes
//! over a scale a (head, 128-token tile)) then `moss_dit_flash_attention_fp8` (the warp-specialised
//! kernel of cuda/dit/sm90a/flash_attention_ws.cu on e4m3 wgmma). The arithmetic is
//! [`crate::backend::cpu::attention_fp8`]'s. Every other GPU runs the bf16 attention.

use super::packed_dims;
use crate::backend::cuda::launch::{DIT_ATTN_FP8_OPERANDS_THREADS, DIT_ATTN_FP8_TILE, DIT_FLASH_FP8_SMEM, DIT_FLASH_WS_ROWS, DIT_FLASH_WS_THREADS};
use crate::backend::cuda::ops::{tensor_map_2d, Arg, Cuda, CudaTensor, DType};
use crate::backend::cuda::dit::FLASH_HEAD_DIM;
use crate::fp8::{E4M3_MAX, MIN_AMAX};
use anyhow::{ensure, Result};

/// The e4m3 attention kernel and its planted control (the running output not rescaled); then its
/// ping-pong build and control, gated and timed by `moss check` against it (not taken by the op:
/// the slower of the two is to be deleted once measured).
pub const FLASH_FP8_KERNEL: &str = "moss_dit_flash_attention_fp8";
pub const FLASH_FP8_CONTROL: &str = "moss_dit_flash_attention_fp8_control";
pub const FLASH_FP8_PINGPONG: &str = "moss_dit_flash_attention_fp8_pingpong";
pub const FLASH_FP8_PINGPONG_CONTROL: &str = "moss_dit_flash_attention_fp8_pingpong_control";
/// The operands kernel (`_bf16` / `_f32`: the QK-norm weights' dtype) and its planted control
/// (codes toward zero).
pub const OPERANDS_KERNEL: &str = "moss_dit_attention_fp8_operands";
pub const OPERANDS_CONTROL: &str = "moss_ctl_attention_fp8_operands_rz";

/// The operands on the GPU: codes `q`, `k` `[n, D]`, `vt` `[D, 128·tiles]`, and `scales`
/// `[2 + heads·tiles]` f32 (layouts: [`crate::backend::cpu::attention_fp8`]).
pub struct Fp8Operands {
    pub n: usize,
    pub heads: usize,
    pub q: CudaTensor,
    pub k: CudaTensor,
    pub vt: CudaTensor,
    pub scales: CudaTensor,
}

impl Cuda {
    /// Whether [`crate::backend::ops::DitOps::attention_packed_fp8`] takes the e4m3 kernels: on
    /// Hopper, a bf16 projection with head dim 128 and QK-norm vectors of 128.
    pub(crate) fn takes_attention_fp8(&self, qkv: &CudaTensor, heads: usize, wq: &CudaTensor, wk: &CudaTensor) -> bool {
        self.has_sm90a()
            && qkv.dtype == DType::BF16
            && packed_dims(qkv, heads, "attention_packed_fp8").is_ok_and(|(n, hd)| hd == FLASH_HEAD_DIM && n > 0 && n < i32::MAX as usize)
            && [wq, wk].iter().all(|w| w.numel() == FLASH_HEAD_DIM && w.dtype != DType::F8E4M3 && w.dtype == wq.dtype)
    }

    /// The e4m3 operands of `qkv` (`kernel`: [`OPERANDS_KERNEL`] or its control).
    pub(crate) fn attention_fp8_operands_with(&self, qkv: &CudaTensor, heads: usize, wq: &CudaTensor, wk: &CudaTensor, kernel: &str) -> Result<Fp8Operands> {
        ensure!(self.takes_attention_fp8(qkv, heads, wq, wk), "attention_fp8: qkv {:?} {:?}, {heads} heads, QK-norm {:?}", qkv.shape, qkv.dtype, wq.shape);
        let n = qkv.shape[0];
        let d = heads * FLASH_HEAD_DIM;
        let tiles = n.div_ceil(DIT_ATTN_FP8_TILE);
        let q = self.alloc(DType::F8E4M3, &[n, d])?;
        let k = self.alloc(DType::F8E4M3, &[n, d])?;
        let vt = self.alloc(DType::F8E4M3, &[d, tiles * DIT_ATTN_FP8_TILE])?;
        let scales = self.alloc(DType::F32, &[2 + heads * tiles])?;
        let name = format!("{kernel}_{}", wq.dtype.name());
        let sqrt_hd = (FLASH_HEAD_DIM as f32).sqrt();
        self.launch_2d(
            &name,
            (tiles as u32, heads as u32),
            DIT_ATTN_FP8_OPERANDS_THREADS as u32,
            0,
            &[
                Arg::P(q.ptr()),
                Arg::P(k.ptr()),
                Arg::P(vt.ptr()),
                Arg::P(scales.ptr()),
                Arg::P(qkv.ptr()),
                Arg::P(wq.ptr()),
                Arg::P(wk.ptr()),
                Arg::I(n as i32),
                Arg::F(sqrt_hd),
                Arg::F(E4M3_MAX),
                Arg::F(MIN_AMAX),
            ],
        )?;
        Ok(Fp8Operands { n, heads, q, k, vt, scales })
    }

    /// The e4m3 attention of made operands → `[n, D]` bf16 (`kernel`: [`FLASH_FP8_KERNEL`] or its control).
    pub(crate) fn flash_attention_fp8_with(&self, o: &Fp8Operands, scale: f64, kernel: &str) -> Result<CudaTensor> {
        ensure!(self.has_sm90a(), "`{kernel}` needs an sm_90 (Hopper) GPU and a build with its sm_90a kernels");
        let (n, d) = (o.n, o.heads * FLASH_HEAD_DIM);
        let npad = o.vt.shape[1];
        let out = self.alloc(DType::BF16, &[n, d])?;
        let map = |t: &CudaTensor, cols: usize, rows: usize| -> Result<Arg> {
            Ok(Arg::Map(Box::new(tensor_map_2d(t.ptr(), DType::F8E4M3, cols, rows, cols, 128, 128)?)))
        };
        let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
        self.launch_2d(
            kernel,
            (n.div_ceil(DIT_FLASH_WS_ROWS) as u32, o.heads as u32),
            DIT_FLASH_WS_THREADS as u32,
            DIT_FLASH_FP8_SMEM as u32,
            &[
                map(&o.q, d, n)?,
                map(&o.k, d, n)?,
                map(&o.vt, npad, d)?,
                Arg::P(o.scales.ptr()),
                Arg::P(out.ptr()),
                Arg::I(n as i32),
                Arg::I(d as i32),
                Arg::F(scale_log2),
            ],
        )?;
        Ok(out)
    }

    /// [`crate::backend::ops::DitOps::attention_packed_fp8`] where [`Cuda::takes_attention_fp8`].
    pub(crate) fn attention_fp8(&self, qkv: &CudaTensor, heads: usize, scale: f64, wq: &CudaTensor, wk: &CudaTensor) -> Result<CudaTensor> {
        let o = self.attention_fp8_operands_with(qkv, heads, wq, wk, OPERANDS_KERNEL)?;
        self.flash_attention_fp8_with(&o, scale, FLASH_FP8_KERNEL)
    }
}
