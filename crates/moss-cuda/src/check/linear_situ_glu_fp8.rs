//! Gate of the e4m3 form of the FFN's up/gate product with SiTU in its epilogue
//! (`moss_dit_linear_situ_glu_fp8`, Hopper only, behind [`DitOps::linear_situ_glu_fp8`]) against
//! the CPU twin, with planted controls; and the op's timing against the pair it replaces. Other
//! GPUs do not have the kernel and do not gate it: there the op is `linear_fp8_quantized` +
//! `situ_glu_fp8`, each gated on its own (`linear_fp8`, `fp8 situ_glu`).

use super::dit_ops::stream_rows;
use super::gates::*;
use super::linear_situ_glu::pick_rows;
use crate::dit::SITU_FP8_KERNEL;
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::Result;
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::options::Precision;
use moss_core::tensor::Tensor;

/// The gate, in table order.
pub const GATES: &[(&str, GateFn)] = &[("dit linear_situ_glu_fp8", gate_linear_situ_fp8)];

/// `x` and `w` quantized per row on the GPU (`moss_quantize_fp8`): the codes and scales on the
/// device, and their values on the host (codes as their e4m3 values, scales f32).
pub(crate) fn quantized(cx: &Cx, x: &CudaTensor) -> Result<((CudaTensor, CudaTensor), (Tensor, Tensor))> {
    let (q, s) = cx.cuda.quantize_fp8(x)?;
    let host = (cx.cuda.download(&q)?, cx.cuda.download(&s)?);
    Ok(((q, s), host))
}

/// The kernel's SiTU output (bf16, before the op quantizes it) at the DiT's shape (4224 x 3072 ·
/// 3072 x 16384, 64 random rows on the CPU) and two ragged ones (77 x 128 · 128 x 512: one K step;
/// 333 x 512 · 512 x 1280: a partial row tile, the ring turned), against the CPU twin at the
/// unfused path's rounding points: `linear_fp8_quantized` of the same codes and scales (f64
/// accumulation), rounded to bf16, then `situ_glu`. The kernel accumulates a tile's whole K in
/// the tensor cores' accumulator (~14 bits kept between additions, what cuBLASLt's fast
/// accumulation does; ~1e-4 on these sums), well inside the bf16 output's bound. Controls (DiT
/// shape): up and gate swapped, the last K step left out (the kernel's check-image twins).
fn gate_linear_situ_fp8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 || !cx.cuda.has_sm90a() {
        return Ok(());
    }
    for (case, (m, k, f)) in [(TOKENS, DIM, FFN), (77, 128, 256), (333, 512, 640)].into_iter().enumerate() {
        let x = stream_rows(cx, m, k)?;
        let (_, gx) = cx.exact(x, DType::BF16)?;
        let (_, gw) = cx.input(&[2 * f, k], 2.0 / (k as f64).sqrt())?;
        let ((xq, xs), (hxq, hxs)) = quantized(cx, &gx)?;
        let ((wq, ws), (hwq, hws)) = quantized(cx, &gw)?;
        let rows = cx.rng.subset(m, if case == 0 { GEMM_REF_ROWS } else { m });
        let hxs_rows = Tensor::new(vec![rows.len()], rows.iter().map(|&r| hxs.data[r]).collect())?;
        let u = round_bf16(&cx.cpu.linear_fp8_quantized(&pick_rows(&hxq, &rows)?, &hxs_rows, &hwq, &hws)?);
        let want = cx.cpu.situ_glu(&u)?;
        let s = format!("{m}x{k} · {k}x{} (e4m3)", 2 * f);
        let note = if rows.len() < m { format!("CPU on {} of {m} rows", rows.len()) } else { String::new() };
        let rows = Some(&rows[..]);
        let out = cx.cuda.linear_situ_glu_fp8_fused(&xq, &xs, &wq, &ws);
        cx.judge(&format!("linear_situ_glu_fp8 ({SITU_FP8_KERNEL}, the SiTU output)"), &s, Kind::Gate, BF16_OUT, &note, out, &want, rows);
        if case == 0 {
            for (twin, what) in [
                (&controls::DIT_LINEAR_SITU_GLU_FP8_SWAPPED_CONTROL, "up and gate swapped"),
                (&controls::DIT_LINEAR_SITU_GLU_FP8_SHORT_K_CONTROL, "last K step left out"),
            ] {
                let out = cx.planted(&kernels::DIT_LINEAR_SITU_GLU_FP8, twin).linear_situ_glu_fp8_fused(&xq, &xs, &wq, &ws);
                cx.judge(&format!("linear_situ_glu_fp8 (fused), {what}"), &s, Kind::Control, BF16_OUT, &note, out, &want, rows);
            }
        }
    }
    Ok(())
}

/// The op at the DiT's shape (Hopper: the kernel, then the quantization of its output) against
/// the pair it replaces (`linear_fp8_quantized` + `situ_glu_fp8`): CUDA events, median of 10
/// after 3 warm-up runs.
pub fn time_linear_situ_fp8(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Fp8);
    let (m, k, f) = (TOKENS, DIM, FFN);
    let mut rng = Rng::new(19);
    let x = c.upload_as(&Tensor::new(vec![m, k], rng.normals(m * k, 1.0))?, DType::BF16)?;
    let w = c.upload_as(&Tensor::new(vec![2 * f, k], rng.normals(2 * f * k, 0.02))?, DType::BF16)?;
    let ((xq, xs), (wq, ws)) = (c.quantize_fp8(&x)?, c.quantize_fp8(&w)?);
    let timed = |f: &dyn Fn() -> Result<(CudaTensor, CudaTensor)>| time_ms(&c, 3, 10, || f().map(|_| ()));
    let pair = timed(&|| c.situ_glu_fp8(&c.linear_fp8_quantized(&xq, &xs, &wq, &ws)?))?;
    println!("timing: linear_situ_glu_fp8 {m}x{k} · {k}x{} (e4m3), CUDA events, median of 10 after 3 warm-up runs", 2 * f);
    println!("  linear_fp8_quantized + situ_glu_fp8: {pair:.4} ms");
    if !c.has_sm90a() {
        println!("  fused {SITU_FP8_KERNEL}: not on this GPU (sm_90a only): the op runs the pair");
        return Ok(());
    }
    let ms = timed(&|| c.linear_situ_glu_fp8(&xq, &xs, &wq, &ws))?;
    let tflops = 2.0 * (m * k * 2 * f) as f64 / (ms * 1e-3) / 1e12;
    println!("  fused {SITU_FP8_KERNEL} + quantize_fp8: {ms:.4} ms ({tflops:.0} TFLOP/s with both), {:.3}x the pair", pair / ms);
    Ok(())
}
