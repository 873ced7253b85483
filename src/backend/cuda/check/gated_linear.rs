//! Gates of the gated residual in a product's epilogue (`linear_gated_residual`,
//! `linear_fp8_gated_residual`: src/backend/cuda/dit/gated_linear.rs) against the CPU twin
//! (`x + linear(a, w) · gate`, f64 accumulation), at the DiT's o and ffn_down shapes and an odd
//! one, each with a planted control; and their timing beside the two steps they replace.

use super::fp8::FP8_GEMM_F32;
use super::gates::*;
use crate::backend::cuda::ops::{Cuda, CudaTensor, DType};
use crate::backend::cuda::select::fp8_refusal;
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use crate::options::Precision;
use crate::tensor::Tensor;
use anyhow::Result;

/// The gated products' gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[("dit linear_gated_residual", gate_linear_gated)];

/// An odd shape: rows not a multiple of 8, K and N multiples of 16 (what the FP8 products take).
const ODD: (usize, usize, usize) = (77, 208, 48);

/// One case's inputs: the activation `a [m, k]`, the weight `w [n, k]` (scaled by 1/√k so the
/// product is as large as the stream), the stream `x [m, n]`, the gate `[n]` in ±[0.25, 1.25]
/// (both signs, as trained gates have), and the gate in reverse channel order (the control's).
struct Case {
    a: (Tensor, CudaTensor),
    w: (Tensor, CudaTensor),
    x: (Tensor, CudaTensor),
    gate: (Tensor, CudaTensor),
    reversed: CudaTensor,
}

fn case(cx: &mut Cx, m: usize, k: usize, n: usize) -> Result<Case> {
    let a = stream_rows(cx, m, k)?;
    let mut w = stream_rows(cx, n, k)?;
    w.data.iter_mut().for_each(|v| *v /= (k as f32).sqrt());
    let x = stream_rows(cx, m, n)?;
    let g: Vec<f32> = (0..n).map(|_| ((0.25 + cx.rng.uniform()) * if cx.rng.uniform() < 0.5 { -1.0 } else { 1.0 }) as f32).collect();
    let gate = cx.exact(Tensor::new(vec![n], g)?, DType::F32)?;
    let reversed = cx.cuda.upload_as(&Tensor::new(vec![n], gate.0.data.iter().rev().copied().collect())?, DType::F32)?;
    Ok(Case { a: cx.exact(a, cx.dtype)?, w: cx.exact(w, cx.dtype)?, x: cx.exact(x, cx.dtype)?, gate, reversed })
}

/// Rows `rows` of `t [.., d]`.
fn pick(t: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let d = t.last_dim();
    Tensor::new(vec![rows.len(), d], rows.iter().flat_map(|&r| t.data[r * d..(r + 1) * d].iter().copied()).collect())
}

fn gate_linear_gated(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let bf16 = cx.dtype == DType::BF16;
    let fp8 = bf16 && fp8_refusal(cx.cuda.gpu().compute_capability).is_none();
    // (rows, K, N): o and ffn_down at 1024x1024 with a 128-token prompt; the odd shape.
    let cases = if bf16 { vec![(TOKENS, DIM, DIM), (TOKENS, FFN, DIM), ODD] } else { vec![(TOKENS, DIM, DIM), ODD] };
    for (m, k, n) in cases {
        let c = case(cx, m, k, n)?;
        let rows = cx.rng.subset(m, GEMM_REF_ROWS);
        let (a, x) = (pick(&c.a.0, &rows)?, pick(&c.x.0, &rows)?);
        let s = format!("{m}x{k} · {k}x{n} + {m}x{n}");
        let note = format!("CPU on {} of {m} rows", rows.len());
        let want = cx.cpu.linear_gated_residual(&a, &c.w.0, &x, &c.gate.0)?;
        let bound = cx.out_bound(F32_GEMM);
        let out = cx.cuda.linear_gated_with(&c.a.1, &c.w.1, &c.x.1, &c.gate.1);
        cx.judge("linear_gated_residual (cuBLASLt alpha vector + C)", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
        let out = cx.cuda.linear_gated_with(&c.a.1, &c.w.1, &c.x.1, &c.reversed);
        cx.judge("linear_gated_residual, gate in reverse channel order", &s, Kind::Control, bound, &note, out, &want, Some(&rows));
        if fp8 {
            let (wq, ws) = cx.cpu.quantize_rows(&c.w.0)?;
            let (gwq, gws) = (cx.cuda.upload_as(&wq, DType::F8E4M3)?, cx.cuda.upload_as(&ws, DType::F32)?);
            let want = cx.cpu.linear_fp8_gated_residual(&a, &wq, &ws, &x, &c.gate.0)?;
            let out = cx.cuda.linear_fp8_gated_with(&c.a.1, &gwq, &gws, &c.x.1, &c.gate.1);
            cx.judge("linear_fp8_gated_residual (cuBLASLt outer-vector scales + alpha vector + C)", &s, Kind::Gate, cx.out_bound(FP8_GEMM_F32), &note, out, &want, Some(&rows));
            let out = cx.cuda.linear_fp8_gated_with(&c.a.1, &gwq, &gws, &c.x.1, &c.reversed);
            cx.judge("linear_fp8_gated_residual, gate in reverse channel order", &s, Kind::Control, cx.out_bound(FP8_GEMM_F32), &note, out, &want, Some(&rows));
        }
    }
    Ok(())
}

/// The block's gated residuals as they run now (the gated product, then the next
/// `rms_norm_modulate`) beside the path they replace (the product, then the fused
/// `gated_residual_norm_modulate`), at the DiT's o and ffn_down shapes, bf16 (and fp8 products);
/// CUDA events, median of 50 after 10.
pub fn time_gated(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Bf16);
    let mut rng = Rng::new(13);
    let fp8 = fp8_refusal(c.gpu().compute_capability).is_none();
    let eps = 1e-6;
    for (m, k, n) in [(TOKENS, DIM, DIM), (TOKENS, FFN, DIM)] {
        let up = |shape: &[usize], std: f64, rng: &mut Rng| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(shape.iter().product(), std))?, DType::BF16);
        let (a, w, x) = (up(&[m, k], 1.0, &mut rng)?, up(&[n, k], 0.02, &mut rng)?, up(&[m, n], 1.0, &mut rng)?);
        let (nw, shift, scale) = (up(&[n], 1.0, &mut rng)?, up(&[n], 1.0, &mut rng)?, up(&[n], 1.0, &mut rng)?);
        let gate = up(&[n], 1.0, &mut rng)?;
        let g32 = c.gate_vector(gate.clone())?;
        let now = time_ms(&c, 10, 50, || {
            let x = c.linear_gated_with(&a, &w, &x, &g32)?;
            c.rms_norm_modulate(&x, &nw, &shift, &scale, eps).map(|_| ())
        })?;
        let before = time_ms(&c, 10, 50, || {
            c.gated_residual_norm_modulate(&x, &c.linear(&a, &w, None)?, &gate, &nw, &shift, &scale, eps).map(|_| ())
        })?;
        let mut line = format!("  gated residual + norm after linear {m}x{k} · {k}x{n}: {now:.4} ms in the epilogue (before: {before:.4} ms)");
        if fp8 {
            let (wq, ws) = c.quantize_rows(&w)?;
            let now = time_ms(&c, 10, 50, || {
                let x = c.linear_fp8_gated_with(&a, &wq, &ws, &x, &g32)?;
                c.rms_norm_modulate(&x, &nw, &shift, &scale, eps).map(|_| ())
            })?;
            let before = time_ms(&c, 10, 50, || {
                c.gated_residual_norm_modulate(&x, &c.linear_fp8(&a, &wq, &ws)?, &gate, &nw, &shift, &scale, eps).map(|_| ())
            })?;
            line += &format!("; fp8 {now:.4} ms (before: {before:.4} ms)");
        }
        println!("{line}");
    }
    Ok(())
}
