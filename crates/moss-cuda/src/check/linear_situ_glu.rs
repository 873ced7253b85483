//! Gate of [`DitOps::linear_situ_glu`] (the fused Hopper kernel `moss_dit_linear_situ_glu`, or
//! cuBLASLt + `situ_glu` where it does not run) against the CPU twin, with planted controls; and
//! its timing against the unfused pair at the DiT's shape.

use super::dit_ops::situ_controls;
use super::dit_ops::stream_rows;
use super::gates::*;
use crate::dit::SITU_KERNEL;
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::Result;
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::options::Precision;
use moss_core::tensor::Tensor;

/// The gate, in table order.
pub const GATES: &[(&str, GateFn)] = &[("dit linear_situ_glu", gate_linear_situ)];

/// Rows `rows` of `x [m, k]`.
pub(crate) fn pick_rows(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let k = x.last_dim();
    Tensor::new(vec![rows.len(), k], rows.iter().flat_map(|&r| x.data[r * k..(r + 1) * k].iter().copied()).collect())
}

/// bf16: the op (on Hopper the fused kernel, persistent), else its cuBLASLt + `situ_glu`, at the
/// DiT's shape (4224 x 3072 · 3072 x 16384: 2112 tiles, the persistent grid loops) and two ragged
/// ones (77 x 128 · 128 x 512: one partial row tile, 2 K steps, fewer than the ring's stages;
/// 333 x 512 · 512 x 1280: a partial last row tile, 5 column tiles, 8 K steps round the ring twice). The reference is the CPU twin
/// at the unfused path's rounding points: the product in f64 (the CPU `linear`), rounded to bf16
/// as the unfused path stores it, then the CPU `situ_glu`; on 64 random rows at the DiT's shape,
/// every row of the others. Controls (DiT shape): up and gate swapped in the epilogue, the last K
/// step left out (Hopper: the kernel's check-image twins); elsewhere the unfused pair with the
/// swapped `situ_glu` (`moss_ctl`). fp32 has no fused kernel: its op is `linear` then `situ_glu`,
/// each gated on its own.
fn gate_linear_situ(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(());
    }
    let hopper = cx.cuda.has_sm90a();
    for (case, (m, k, f)) in [(TOKENS, DIM, FFN), (77, 128, 256), (333, 512, 640)].into_iter().enumerate() {
        let x = stream_rows(cx, m, k)?;
        let (x, gx) = cx.exact(x, DType::BF16)?;
        let (w, gw) = cx.input(&[2 * f, k], 2.0 / (k as f64).sqrt())?;
        let rows = cx.rng.subset(m, if case == 0 { GEMM_REF_ROWS } else { m });
        let u = round_bf16(&cx.cpu.linear(&pick_rows(&x, &rows)?, &w, None)?);
        let want = cx.cpu.situ_glu(&u)?;
        let s = format!("{m}x{k} · {k}x{}", 2 * f);
        let note = if rows.len() < m { format!("CPU on {} of {m} rows", rows.len()) } else { String::new() };
        let (bound, rows) = (BF16_OUT, Some(&rows[..]));
        if hopper {
            let out = cx.cuda.linear_situ_glu(&gx, &gw);
            cx.judge(&format!("linear_situ_glu (op: fused {SITU_KERNEL})"), &s, Kind::Gate, bound, &note, out, &want, rows);
            if case == 0 {
                for (twin, what) in [
                    (&controls::DIT_LINEAR_SITU_GLU_SWAPPED_CONTROL, "up and gate swapped"),
                    (&controls::DIT_LINEAR_SITU_GLU_SHORT_K_CONTROL, "last K step left out"),
                ] {
                    let out = cx.planted(&kernels::DIT_LINEAR_SITU_GLU, twin).linear_situ_glu_fused(&gx, &gw);
                    cx.judge(&format!("linear_situ_glu (fused), {what}"), &s, Kind::Control, bound, &note, out, &want, rows);
                }
            }
        } else {
            let out = cx.cuda.linear_situ_glu(&gx, &gw);
            cx.judge("linear_situ_glu (cuBLASLt + situ_glu)", &s, Kind::Gate, bound, &note, out, &want, rows);
            if case == 0 {
                let cu = situ_controls(&cx.cuda);
                let out = cu.linear(&gx, &gw, None).and_then(|u| cu.situ_glu_op(&u));
                cx.judge("linear_situ_glu (cuBLASLt + situ_glu), up and gate swapped", &s, Kind::Control, bound, &note, out, &want, rows);
            }
        }
    }
    Ok(())
}

/// The fused kernel (as production launches it) against cuBLASLt `linear` + `situ_glu` at the DiT's shape, bf16:
/// CUDA events, median of 10 after 3 warm-up runs; TFLOP/s of the product (2·M·K·2F).
pub fn time_linear_situ(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Bf16);
    let (m, k, f) = (TOKENS, DIM, FFN);
    let mut rng = Rng::new(11);
    let x = c.upload_as(&Tensor::new(vec![m, k], rng.normals(m * k, 1.0))?, DType::BF16)?;
    let w = c.upload_as(&Tensor::new(vec![2 * f, k], rng.normals(2 * f * k, 0.02))?, DType::BF16)?;
    let tflops = |ms: f64| 2.0 * (m * k * 2 * f) as f64 / (ms * 1e-3) / 1e12;
    let timed = |f: &dyn Fn() -> Result<CudaTensor>| time_ms(&c, 3, 10, || f().map(|_| ()));
    let lin = timed(&|| c.linear(&x, &w, None))?;
    let pair = timed(&|| c.situ_glu(&c.linear(&x, &w, None)?))?;
    println!("timing: linear_situ_glu {m}x{k} · {k}x{}, bf16, CUDA events, median of 10 after 3 warm-up runs", 2 * f);
    println!("  cuBLASLt linear + situ_glu: {pair:.4} ms ({:.0} TFLOP/s; the linear alone {lin:.4} ms, {:.0} TFLOP/s)", tflops(pair), tflops(lin));
    if !c.has_sm90a() {
        println!("  fused {SITU_KERNEL}: not on this GPU (sm_90a only): the op runs the pair");
        return Ok(());
    }
    let ms = timed(&|| c.linear_situ_glu_fused(&x, &w))?;
    println!("  fused {SITU_KERNEL} (persistent): {ms:.4} ms ({:.0} TFLOP/s), {:.3}x the pair", tflops(ms), pair / ms);
    Ok(())
}
