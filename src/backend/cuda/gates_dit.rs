//! Gates of the DiT's flash attention kernels ([`FLASH_KERNELS`]: `moss_attn_d128_bf16` and its
//! `_v2` in `cuda/attention.cu`; on compute capability 9.0 also the wgmma kernels of
//! `cuda/sm90a/attention_wgmma.cu` and the warp-specialised TMA ones of `cuda/sm90a/attention_ws.cu`, which other GPUs do not have and do not gate), behind [`crate::backend::ops::DitOps::attention`] at bf16 with head dim 128. Registered in
//! `gates::run_all` next to the table of `gates.rs`.
//!
//! Rows, for each kernel (bf16 only: at fp32 the op takes the cuBLASLt path, gated in
//! `gates.rs`): the kernel on q/k/v as column slices of one fused `[N, 3·D]` projection (row strides 3·D, as
//! the kernel supports) and on contiguous `[N, H, 128]` tensors, at N = 4224 (1024² + 128 text
//! tokens, a multiple of the 64-row tile) and N = 4108 (the 12-token negative: a partial last
//! tile); CPU reference on 32 random query rows plus the last row, all keys, f64. Controls: the
//! planted kernel (running output not rescaled when the row maximum grows) and the real kernel
//! without the 1/√hd scale.

use super::dit::FLASH_KERNELS;
use super::gates::{attention_rows, dit, shape_str, Cx, GateFn, Kind, ATTN_REF_ROWS, BF16_OUT};
use super::ops::{CudaTensor, DType};
use crate::backend::Backend;
use anyhow::Result;

pub const GATES: &[(&str, GateFn)] = &[("dit flash attention", gate_flash)];

fn gate_flash(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(()); // not used at fp32 (the cuBLASLt path, gated in gates.rs)
    }
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    if !cx.cuda.has_sm90a() {
        println!("  dit flash attention: no sm_90a kernels on this GPU/build; the sm_90a (wgmma, ws) kernels are not gated (not used either)");
    }
    for n in [TOKENS, IMG + 12] {
        let shape = [n, HEADS, HEAD_DIM];
        let (q, gq) = cx.input(&shape, 2.0)?;
        let (k, gk) = cx.input(&shape, 1.0)?;
        let (v, gv) = cx.input(&shape, 1.0)?;
        let mut rows = cx.rng.subset(n - 1, ATTN_REF_ROWS);
        rows.push(n - 1);
        let want = attention_rows(&q, &k, &v, scale, &rows)?;
        let note = format!("CPU on {} of {n} query rows", rows.len());
        let cu = cx.cuda.clone();
        let flat = |t: &CudaTensor| cu.reshape(t, &[n, DIM]);
        let qkv = cu.cat(&[&flat(&gq)?, &flat(&gk)?, &flat(&gv)?], 1)?;
        let fused = |kernel: &str, scale: f64| -> Result<CudaTensor> {
            let out = cu.alloc(DType::BF16, &[n, DIM])?;
            let (p, ld) = (qkv.ptr(), 3 * DIM);
            cu.flash_attention_raw(
                kernel,
                (p, ld),
                (p + 2 * DIM as u64, ld),
                (p + 4 * DIM as u64, ld),
                (out.ptr(), DIM),
                n,
                HEADS,
                scale,
            )?;
            Ok(out)
        };
        let s = format!("{} (fused qkv)", shape_str(&[&shape]));
        for spec in FLASH_KERNELS.iter().filter(|k| !k.sm90a || cu.has_sm90a()) {
            let (kernel, control) = (spec.name, spec.control);
            cx.judge(
                &format!("attention ({kernel})"),
                &s,
                Kind::Gate,
                BF16_OUT,
                &note,
                fused(kernel, scale),
                &want,
                Some(&rows),
            );
            cx.judge(
                &format!("{kernel}: output not rescaled"),
                &s,
                Kind::Control,
                BF16_OUT,
                &note,
                fused(control, scale),
                &want,
                Some(&rows),
            );
            cx.judge(
                &format!("{kernel} without 1/sqrt(hd)"),
                &s,
                Kind::Control,
                BF16_OUT,
                &note,
                fused(kernel, 1.0),
                &want,
                Some(&rows),
            );
            let out = cu
                .flash_attention_with(&gq, &gk, &gv, scale, kernel)
                .and_then(|o| cu.reshape(&o, &[n, DIM]));
            cx.judge(
                &format!("attention ({kernel}, [N,H,hd] in)"),
                &shape_str(&[&shape]),
                Kind::Gate,
                BF16_OUT,
                &note,
                out,
                &want,
                Some(&rows),
            );
        }
    }
    Ok(())
}
