//! Gates of the DiT's flash attention kernels ([`FLASH_KERNELS`]: `moss_dit_flash_attention` in
//! `cuda/dit/flash_attention.cu`; on compute capability 9.0 also the warp-specialised TMA kernel
//! `moss_dit_flash_attention_ws` of `cuda/dit/sm90a/flash_attention_ws.cu` (on the wgmma helpers of
//! `cuda/common/sm90a/wgmma_attention.cuh`), which other GPUs do not have and do not gate), behind [`moss_core::backend::ops::DitOps::attention`] at bf16 with head dim 128. Registered in
//! `gates::run_all` next to the table of `gates.rs`.
//!
//! Rows, for each kernel (bf16 only: at fp32 the op takes the cuBLASLt path, gated in
//! `gates.rs`): the kernel on q/k/v as column slices of one fused `[N, 3·D]` projection (row strides 3·D, as
//! the kernel supports) and on contiguous `[N, H, 128]` tensors, at N = 4224 (1024² + 128 text
//! tokens, a multiple of the 64-row tile) and N = 4108 (the 12-token negative: a partial last
//! tile); CPU reference on 32 random query rows plus the last row, all keys, f64. Controls: the
//! planted kernel (running output not rescaled when the row maximum grows) and the real kernel
//! without the 1/√hd scale.
//!
//! Then the fused ops of the DiT block (CPU twins in `backend/cpu/dit.rs`): `qkv_norm_rope`
//! (QK-norm + RoPE in place on the packed projection), `attention_packed` (attention straight
//! from the packed projection) and `gated_residual_norm_modulate` (a gated residual and the next
//! norm + modulation in one pass), each with its planted control.

use crate::check::dit_ops::bf16_out;
use crate::check::gates::{
    attention_rows, dit, round_bf16, shape_str, stream_rows, uniform_vec, Cx, GateFn, Kind, ATTN_REF_ROWS, BF16_OUT, EXACT, F32_ELEMENTWISE, F32_NORM,
};
use crate::dit::{FlashKernel, FLASH_KERNELS};
use crate::kernels::{self, controls, Image};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::Result;
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::tensor::Tensor;

pub const GATES: &[(&str, GateFn)] = &[
    ("dit flash attention", gate_flash),
    ("dit qkv_norm_rope", gate_qkv_rope),
    ("dit attention_packed", gate_attention_packed),
    ("dit gated_residual_norm_modulate", gate_gres_mod),
];

/// The fused QK-norm + RoPE over a packed `[N, 3·D]` projection against the CPU twin (which
/// does each q and k head as `qk_norm_rope` does; v must come back unchanged). The gate runs the
/// in-place path (a buffer nobody else holds); the control, the planted kernel (k normed with the
/// q weight), runs on a shared buffer, so it takes the copy path, and a third row checks that the
/// shared input was left untouched (bit-exact).
fn gate_qkv_rope(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let half = HEAD_DIM / 2;
    let x = stream_rows(cx, TOKENS * 3 * HEADS, HEAD_DIM)?;
    let (x, gx) = cx.exact(Tensor::new(vec![TOKENS, 3 * DIM], x.data)?, cx.dtype)?;
    let (wq, gwq) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
    let (wk, gwk) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
    let theta: Vec<f64> = (0..TOKENS * half).map(|_| cx.rng.uniform() * 200.0 - 100.0).collect();
    let (c, gc) = cx.exact(Tensor::new(vec![TOKENS, half], theta.iter().map(|t| t.cos() as f32).collect())?, cx.dtype)?;
    let (sn, gs) = cx.exact(Tensor::new(vec![TOKENS, half], theta.iter().map(|t| t.sin() as f32).collect())?, cx.dtype)?;
    let want = cx.cpu.qkv_norm_rope(x.clone(), HEADS, &wq, &wk, &c, &sn, 1e-6)?;
    let s = shape_str(&[&[TOKENS, 3 * DIM], &[TOKENS, half]]);
    let bound = cx.out_bound(F32_NORM);
    let fresh = cx.cuda.upload_as(&x, cx.dtype)?;
    let out = cx.cuda.qkv_norm_rope_op(fresh, HEADS, &gwq, &gwk, &gc, &gs, 1e-6);
    cx.judge("qkv_norm_rope (packed q|k|v, in place)", &s, Kind::Gate, bound, "", out, &want, None);
    let out = qkv_rope_controls(&cx.cuda).qkv_norm_rope_op(gx.clone(), HEADS, &gwq, &gwk, &gc, &gs, 1e-6);
    cx.judge("qkv_norm_rope, k normed with the q weight", &s, Kind::Control, bound, "shared input: copy path", out, &want, None);
    cx.judge("qkv_norm_rope leaves a shared input as it was", &s, Kind::Gate, EXACT, "", Ok(gx), &x, None);
    Ok(())
}

/// `cuda` with QK-norm + RoPE's planted twins (k normed with the q weight): the packed kernel
/// and the per-part one its fallback takes.
pub(crate) fn qkv_rope_controls(cuda: &Cuda) -> Cuda {
    cuda.with_image(Image::production().swap(&kernels::QKV_ROPE, &controls::CTL_QKV_ROPE).swap(&kernels::QK_ROPE, &controls::CTL_QK_ROPE))
}

/// Attention over the packed projection (the flash kernel on column slices at bf16, the parts
/// copied out for cuBLASLt at fp32) against the f64 CPU attention on 32 query rows plus the last.
/// Control: k and v slices exchanged.
fn gate_attention_packed(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let n = TOKENS;
    let (qkv, gqkv) = cx.input(&[n, 3 * DIM], 1.5)?;
    let part = |i: usize| -> Result<Tensor> {
        let data = qkv.data.chunks(3 * DIM).flat_map(|r| r[i * DIM..(i + 1) * DIM].iter().copied()).collect();
        Tensor::new(vec![n, HEADS, HEAD_DIM], data)
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let mut rows = cx.rng.subset(n - 1, ATTN_REF_ROWS);
    rows.push(n - 1);
    let want = attention_rows(&q, &k, &v, scale, &rows)?;
    let note = format!("CPU on {} of {n} query rows", rows.len());
    let s = shape_str(&[&[n, 3 * DIM]]);
    let bound = cx.out_bound(crate::check::gates::F32_GEMM);
    let out = cx.cuda.attention_packed(&gqkv, HEADS, scale);
    cx.judge("attention_packed", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
    let out = cx.cuda.attention_packed_blocks(&gqkv, HEADS, scale, (2, 1));
    cx.judge("attention_packed, k and v exchanged", &s, Kind::Control, bound, &note, out, &want, Some(&rows));
    Ok(())
}

/// The gated residual fused with the next norm + modulation: `x'` against the CPU's gated
/// residual, the norm against the CPU's `rms_norm_modulate` of `x'` as the GPU stores it (rounded
/// to bf16 at bf16: the reference's rounding point). Control: the norm of the old `x`.
fn gate_gres_mod(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let x = stream_rows(cx, TOKENS, DIM)?;
    let (x, gx) = cx.exact(x, cx.dtype)?;
    let (y, gy) = cx.input(&[TOKENS, DIM], 1.0)?;
    let (g, gg) = cx.input(&[DIM], 1.0)?;
    let (w, gw) = uniform_vec(cx, DIM, 0.5, 1.5)?;
    let (sh, gsh) = cx.input(&[DIM], 1.0)?;
    let (sc, gsc) = cx.input(&[DIM], 1.0)?;
    let want_x = cx.cpu.gated_residual(&x, &y, &g)?;
    let stored = if cx.dtype == DType::BF16 { round_bf16(&want_x) } else { want_x.clone() };
    let want_n = cx.cpu.rms_norm_modulate(&stored, &w, &sh, &sc, 1e-6)?;
    let s = shape_str(&[&[TOKENS, DIM], &[DIM]]);
    let (bx, bn) = (cx.out_bound(F32_ELEMENTWISE), cx.out_bound(F32_NORM));
    let controls = gres_mod_controls(&cx.cuda);
    let run = |cu: &Cuda| cu.gres_norm_mod_op(&gx, &gy, &gg, &gw, &gsh, &gsc, 1e-6);
    let (ox, on) = match run(&cx.cuda) {
        Ok((a, b)) => (Ok(a), Ok(b)),
        Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(e)),
    };
    let ctl = run(&controls).map(|(_, n)| n);
    cx.judge("gated_residual_norm_modulate: x + y·gate", &s, Kind::Gate, bx, "", ox, &want_x, None);
    cx.judge("gated_residual_norm_modulate: norm", &s, Kind::Gate, bn, "", on, &want_n, None);
    cx.judge("gated_residual_norm_modulate, norm of the old x", &s, Kind::Control, bn, "", ctl, &want_n, None);
    if cx.dtype == DType::BF16 {
        // The bf16 forward's f32 residual stream: x and x' f32, y and the norm bf16
        // (`_f32_bf16_to_bf16`); the norm of x' as stored (f32, so not rounded).
        let x = stream_rows(cx, TOKENS, DIM)?;
        let (x, gx) = cx.exact(x, DType::F32)?;
        let want_x = cx.cpu.gated_residual(&x, &y, &g)?;
        let want_n = cx.cpu.rms_norm_modulate(&want_x, &w, &sh, &sc, 1e-6)?;
        let note = "x, x' f32 (the stream), y and the norm bf16";
        let run = |cu: &Cuda| {
            let (xo, n) = cu.gres_norm_mod_op(&gx, &gy, &gg, &gw, &gsh, &gsc, 1e-6)?;
            anyhow::ensure!(xo.dtype == DType::F32, "gated_residual_norm_modulate: stream {} where f32 was expected", xo.dtype.name());
            Ok((xo, bf16_out(n, "gated_residual_norm_modulate")?))
        };
        let (ox, on) = match run(&cx.cuda) {
            Ok((a, b)) => (Ok(a), Ok(b)),
            Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(e)),
        };
        let ctl = run(&controls).map(|(_, n)| n);
        cx.judge("gated_residual_norm_modulate: x + y·gate", &s, Kind::Gate, F32_ELEMENTWISE, note, ox, &want_x, None);
        cx.judge("gated_residual_norm_modulate: norm", &s, Kind::Gate, BF16_OUT, note, on, &want_n, None);
        cx.judge("gated_residual_norm_modulate, norm of the old x", &s, Kind::Control, BF16_OUT, note, ctl, &want_n, None);
    }
    Ok(())
}

/// `cuda` with the gated residual + norm's planted twins (the norm of the old x), both outputs.
fn gres_mod_controls(cuda: &Cuda) -> Cuda {
    cuda.with_image(Image::production().swap(&kernels::GRES_MOD, &controls::CTL_GRES_MOD).swap(&kernels::GRES_MOD_TO, &controls::CTL_GRES_MOD_TO))
}

/// `cuda` with the flash kernels' planted twins: the running output not rescaled when the row
/// maximum grows.
fn flash_controls(cuda: &Cuda) -> Cuda {
    let img = Image::production()
        .swap(&kernels::DIT_FLASH_ATTENTION, &controls::DIT_FLASH_ATTENTION_CONTROL)
        .swap(&kernels::DIT_FLASH_ATTENTION_WS, &controls::DIT_FLASH_ATTENTION_WS_CONTROL);
    cuda.with_image(img)
}

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
        let ctl = flash_controls(&cu);
        let flat = |t: &CudaTensor| cu.reshape(t, &[n, DIM]);
        let qkv = cu.cat(&[&flat(&gq)?, &flat(&gk)?, &flat(&gv)?], 1)?;
        let fused = |cu: &Cuda, kernel: &FlashKernel, scale: f64| -> Result<CudaTensor> {
            let out = cu.alloc(DType::BF16, &[n, DIM])?;
            let (p, ld) = (qkv.ptr(), 3 * DIM);
            cu.flash_attention_raw(kernel, (p, ld), (p + 2 * DIM as u64, ld), (p + 4 * DIM as u64, ld), (out.ptr(), DIM), n, HEADS, scale)?;
            Ok(out)
        };
        let s = format!("{} (fused qkv)", shape_str(&[&shape]));
        for spec in FLASH_KERNELS.iter().filter(|k| !k.sm90a || cu.has_sm90a()) {
            let kernel = spec.name;
            cx.judge(&format!("attention ({kernel})"), &s, Kind::Gate, BF16_OUT, &note, fused(&cu, spec, scale), &want, Some(&rows));
            cx.judge(&format!("{kernel}: output not rescaled"), &s, Kind::Control, BF16_OUT, &note, fused(&ctl, spec, scale), &want, Some(&rows));
            cx.judge(&format!("{kernel} without 1/sqrt(hd)"), &s, Kind::Control, BF16_OUT, &note, fused(&cu, spec, 1.0), &want, Some(&rows));
            let out = cu.flash_attention_on(&gq, &gk, &gv, scale, spec).and_then(|o| cu.reshape(&o, &[n, DIM]));
            cx.judge(&format!("attention ({kernel}, [N,H,hd] in)"), &shape_str(&[&shape]), Kind::Gate, BF16_OUT, &note, out, &want, Some(&rows));
        }
    }
    Ok(())
}

/// What the f32 residual stream costs: `gated_residual_norm_modulate` at the DiT's shape on a bf16
/// stream and on the f32 one (y and the norm bf16 in both), CUDA events, median of 50 after 10;
/// and the difference over a guided step's forward (83 blocks, two a block).
pub fn time_stream(c: &crate::ops::Cuda) -> Result<()> {
    use crate::check::gates::{time_ms, Rng};
    let mut rng = Rng::new(17);
    let mut up = |shape: &[usize], dt: DType| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(shape.iter().product(), 1.0))?, dt);
    let (xb, xf, y, v) = (
        up(&[dit::TOKENS, dit::DIM], DType::BF16)?,
        up(&[dit::TOKENS, dit::DIM], DType::F32)?,
        up(&[dit::TOKENS, dit::DIM], DType::BF16)?,
        up(&[dit::DIM], DType::BF16)?,
    );
    let ms = |x: &CudaTensor| time_ms(c, 10, 50, || c.gres_norm_mod_op(x, &y, &v, &v, &v, &v, 1e-6).map(|_| ()));
    let (b, f) = (ms(&xb)?, ms(&xf)?);
    println!(
        "  gated_residual_norm_modulate {}x{}: stream bf16 {b:.4} ms, stream f32 {f:.4} ms ({:.2} ms more a forward of 83 blocks)",
        dit::TOKENS,
        dit::DIM,
        166.0 * (f - b)
    );
    Ok(())
}
