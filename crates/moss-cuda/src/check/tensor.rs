//! Gates of the generic tensor ops (casts, copies, load, linear, elementwise, RMSNorm, reshape,
//! narrow, cat, permute) against the CPU backend, each with its planted control.

use super::gates::*;
use crate::blas::Gemm;
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use anyhow::{anyhow, Result};
use moss_core::backend::Backend;
use moss_core::tensor::{rel_l2, Tensor};

/// The generic ops' gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[
    ("cast", gate_cast),
    ("upload", gate_upload),
    ("download", gate_download),
    ("load", gate_load),
    ("linear", gate_linear),
    ("add/mul", gate_binary),
    ("silu/sigmoid", gate_unary),
    ("rms_norm", gate_rms_norm),
    ("reshape", gate_reshape),
    ("narrow", gate_narrow),
    ("cat", gate_cat),
    ("permute", gate_permute),
];

fn gate_cast(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::BF16 {
        return Ok(()); // the casts are precision-independent; gate them once
    }
    let shape = [TOKENS, DIM];
    let s = shape_str(&[&shape]);
    // f32 → bf16: round to nearest even, bit-exact against `half`.
    let (x, gx) = cx.input_as(&shape, 3.0, DType::F32)?;
    let want = round_bf16(&x);
    let out = cx.cuda.cast(&gx, DType::BF16);
    cx.judge("cast f32->bf16", &s, Kind::Gate, EXACT, "", out, &want, None);
    let out = cx.planted(&kernels::CAST, &controls::CTL_CAST).cast(&gx, DType::BF16);
    cx.judge("cast f32->bf16 truncating", &s, Kind::Control, EXACT, "", out, &want, None);
    // bf16 → f32: exact widening.
    let (x, gx) = cx.input_as(&shape, 3.0, DType::BF16)?;
    let out = cx.cuda.cast(&gx, DType::F32);
    cx.judge("cast bf16->f32", &s, Kind::Gate, EXACT, "", out, &x, None);
    let out = cx.planted(&kernels::CAST, &controls::CTL_CAST).cast(&gx, DType::F32);
    cx.judge("cast bf16->f32 without the shift", &s, Kind::Control, EXACT, "", out, &x, None);
    Ok(())
}

/// The pinned staging path of `load`: 2½ chunks of random bytes, bit-exact.
fn gate_upload(cx: &mut Cx) -> Result<()> {
    if cx.dtype != DType::BF16 {
        return Ok(());
    }
    use crate::ops::STAGING_CHUNK;
    let n = STAGING_CHUNK * 5 / 2 / 2 + 77; // bf16 values, an odd tail
    let s = format!("{n} bf16 (staged)");
    let t = round_bf16(&Tensor::new(vec![n], cx.rng.normals(n, 1.0))?);
    let bytes = crate::ops::to_bytes(&t.data, DType::BF16);
    // The control: the same staged copy without its last chunk.
    let head = (bytes.len() - 1) / STAGING_CHUNK * STAGING_CHUNK;
    for (kind, copied, what) in [(Kind::Gate, &bytes[..], "upload (pinned staging)"), (Kind::Control, &bytes[..head], "staging drops the last chunk")] {
        let out = cx.cuda.alloc(DType::BF16, &[n]).and_then(|o| {
            cx.cuda.write_bytes(o.ptr(), copied)?;
            Ok(o)
        });
        cx.judge(what, &s, kind, EXACT, "", out, &t, None);
    }
    Ok(())
}

/// The pinned download path: 3½ chunks and a ragged tail of random
/// values in the run's dtype, bit-exact against what was uploaded, next to the pageable path;
/// the control drops the last chunk.
fn gate_download(cx: &mut Cx) -> Result<()> {
    use crate::ops::{Download, DOWNLOAD_CHUNK};
    let es = cx.dtype.size();
    let n = DOWNLOAD_CHUNK * 7 / 2 / es + 77;
    let s = format!("{n} {} ({} chunks)", cx.dtype.name(), (n * es).div_ceil(DOWNLOAD_CHUNK));
    let (t, g) = cx.input(&[n], 1.0)?;
    // The control: the pinned download without its last chunk.
    let head = (n * es - 1) / DOWNLOAD_CHUNK * DOWNLOAD_CHUNK;
    let cu = cx.cuda.clone();
    let modes: [(Kind, &dyn Fn() -> Result<Tensor>, &str); 3] = [
        (Kind::Gate, &|| cu.download_with(&g, Download::Pageable), "download (pageable)"),
        (Kind::Gate, &|| cu.download_with(&g, Download::Pinned), "download (pinned chunks)"),
        (Kind::Control, &|| cu.download_pinned(&g, head), "pinned download drops the last chunk"),
    ];
    for (kind, download, what) in modes {
        // Twice: the second call reuses the slots and their events.
        for rep in 0..2 {
            let error = match download() {
                Ok(h) if h.data.len() != t.data.len() || h.shape != t.shape => f64::NAN,
                Ok(h) if h.data.iter().any(|v| !v.is_finite()) => f64::NAN,
                Ok(h) => rel_l2(&h.data, &t.data),
                Err(_) => f64::NAN,
            };
            cx.judge_value(what, &format!("{s} #{}", rep + 1), kind, EXACT, "", error);
        }
    }
    Ok(())
}

/// Every tensor of the checkpoint's transformer and vae, loaded, against the CPU loader.
/// `load` with the stored bytes written one element late (bf16 and f32 tensors; others load
/// as they are).
fn load_one_late(cu: &Cuda, c: &moss_core::checkpoint::Component, name: &str) -> Result<CudaTensor> {
    use moss_core::checkpoint::Dtype;
    let info = c.info(name)?;
    let stored = match info.dtype {
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        _ => return cu.load(c, name),
    };
    let t = cu.alloc(stored, &info.shape)?;
    let bytes = c.store.bytes(info);
    let es = stored.size().min(bytes.len());
    cu.write_bytes(t.ptr() + es as u64, &bytes[..bytes.len() - es])?;
    cu.cast(&t, crate::ops::held_dtype(c, info.dtype, cu.precision))
}

fn gate_load(cx: &mut Cx) -> Result<()> {
    let Some(ck) = cx.ck.clone() else { return Ok(()) };
    for comp in ["transformer", "vae"] {
        let c = match ck.open_component(comp) {
            Ok(c) => c,
            Err(e) => {
                let nan = Tensor::zeros(&[1]);
                cx.judge(&format!("load {comp}"), "-", Kind::Gate, EXACT, "", Err(e), &nan, None);
                continue;
            }
        };
        let names: Vec<String> = c.store.tensors.keys().filter_map(|k| k.strip_prefix(&c.prefix).map(String::from)).collect();
        let mut cpu_all = vec![];
        let mut bad = vec![];
        let mut gpu_all = vec![];
        for shift in [false, true] {
            let mut data = vec![];
            for name in &names {
                let loaded = if shift { load_one_late(&cx.cuda, &c, name) } else { cx.cuda.load(&c, name) };
                match loaded.and_then(|g| cx.cuda.download(&g)) {
                    Ok(t) => data.extend(t.data),
                    Err(e) => bad.push(format!("{name}: {e:#}")),
                }
                if !shift {
                    cpu_all.extend(cx.cpu.load(&c, name)?.data);
                }
            }
            gpu_all.push(data);
        }
        let want = Tensor::new(vec![cpu_all.len()], cpu_all)?;
        let s = format!("{} tensors, {} values", names.len(), want.numel());
        for (i, (kind, what)) in [(Kind::Gate, format!("load {comp}")), (Kind::Control, format!("load {comp}, one element late"))].into_iter().enumerate() {
            let got = std::mem::take(&mut gpu_all[i]);
            let out = if bad.is_empty() {
                Tensor::new(vec![got.len()], got).and_then(|t| cx.cuda.upload_as(&t, DType::F32))
            } else {
                Err(anyhow!("{}", bad.join("; ")))
            };
            cx.judge(&what, &s, kind, EXACT, "", out, &want, None);
        }
    }
    Ok(())
}

/// A planted bug in `linear`'s cuBLASLt call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinearBug {
    /// The bias epilogue is left out.
    NoBias,
    /// W is read as stored instead of transposed (only shape-valid for square W).
    NoTranspose,
    /// fp32 with TF32 tensor-core compute (what the fp32 path must not do).
    Tf32,
    /// Only the first half of the reduction (k = K/2 with the leading dimension still K).
    ShortK,
}

/// `linear` (x, w, b of one dtype, as the gate makes them) with `bug` in its cuBLASLt product.
fn linear_planted(cu: &Cuda, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>, bug: LinearBug) -> Result<CudaTensor> {
    let (n, k) = (w.shape[0], w.shape[1]);
    anyhow::ensure!(bug != LinearBug::NoTranspose || n == k, "linear control `NoTranspose` needs a square weight");
    let (dt, rows) = (w.dtype, x.rows());
    let out = cu.alloc(dt, &[rows, n])?;
    let bias = b.filter(|_| bug != LinearBug::NoBias).map(|b| b.ptr());
    // cuBLAS's m is our n (rows of the column-major result), its n is our rows.
    let kk = if bug == LinearBug::ShortK { k / 2 } else { k };
    let mut g = if bug == LinearBug::NoTranspose {
        Gemm::plain(dt, dt, false, false, n, rows, kk, n, k, n)
    } else {
        Gemm::plain(dt, dt, true, false, n, rows, kk, k, k, n)
    };
    g.tf32 = bug == LinearBug::Tf32;
    cu.blas().gemm(&cu.gpu().stream, g, w.ptr(), x.ptr(), out.ptr(), bias, 1.0)?;
    Ok(out)
}

fn gate_linear(cx: &mut Cx) -> Result<()> {
    use dit::*;
    // (K, N, bias, the controls that apply)
    type Case = (usize, usize, bool, Vec<(LinearBug, &'static str)>);
    let cases: Vec<Case> = vec![
        (DIM, DIM, true, vec![(LinearBug::NoBias, "bias dropped"), (LinearBug::NoTranspose, "W not transposed")]),
        (DIM, 2 * FFN, false, vec![(LinearBug::ShortK, "half the reduction")]),
        (FFN, DIM, false, vec![(LinearBug::ShortK, "half the reduction")]),
    ];
    for (k, n, bias, mut controls) in cases {
        if cx.dtype == DType::F32 {
            if k == FFN {
                continue; // fp32 ffn_down adds CPU time and nothing the other two shapes lack
            }
            controls.push((LinearBug::Tf32, "TF32 compute"));
        }
        let m = TOKENS;
        let (x, gx) = cx.input(&[m, k], 1.0)?;
        let (w, gw) = cx.input(&[n, k], 1.0 / (k as f64).sqrt())?;
        let (b, gb) = if bias {
            let (b, gb) = cx.input(&[n], 0.5)?;
            (Some(b), Some(gb))
        } else {
            (None, None)
        };
        let rows = cx.rng.subset(m, GEMM_REF_ROWS);
        let xs = Tensor::new(vec![rows.len(), k], rows.iter().flat_map(|&r| x.data[r * k..(r + 1) * k].iter().copied()).collect())?;
        let want = cx.cpu.linear(&xs, &w, b.as_ref())?;
        let s = format!("{m}x{k} · {k}x{n}{}", if bias { " + b" } else { "" });
        let bound = cx.out_bound(F32_GEMM);
        let note = format!("CPU on {} of {m} rows", rows.len());
        let out = cx.cuda.linear(&gx, &gw, gb.as_ref());
        cx.judge("linear (cuBLASLt)", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
        for (bug, what) in controls {
            let out = linear_planted(&cx.cuda, &gx, &gw, gb.as_ref(), bug);
            cx.judge(&format!("linear, {what}"), &s, Kind::Control, bound, &note, out, &want, Some(&rows));
        }
    }
    Ok(())
}

fn gate_binary(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let bound = cx.out_bound(F32_ELEMENTWISE);
    // (op, a shape, b shape, b's dtype)
    let cases: Vec<(&str, Vec<usize>, Vec<usize>, DType)> = vec![
        ("add", vec![TOKENS, DIM], vec![TOKENS, DIM], cx.dtype),
        ("add", vec![TOKENS, DIM], vec![DIM], cx.dtype),
        ("add", vec![TOKENS, DIM], vec![DIM], DType::F32),
        ("mul", vec![TOKENS, DIM], vec![DIM], cx.dtype),
        ("mul", vec![TOKENS, FFN], vec![TOKENS, FFN], cx.dtype),
        ("add", vec![1001, 99], vec![99], cx.dtype), // the scalar (non-multiple-of-8) path
    ];
    for (op, sa, sb, tb) in cases {
        let (a, ga) = cx.input(&sa, 1.0)?;
        let (b, gb) = cx.input_as(&sb, 1.0, tb)?;
        let want = if op == "add" { cx.cpu.add(&a, &b)? } else { cx.cpu.mul(&a, &b)? };
        let s = shape_str(&[&sa, &sb]);
        let name = format!("{op} {}+{}", ga.dtype.name(), gb.dtype.name());
        let run = |cu: &Cuda| if op == "add" { cu.add(&ga, &gb) } else { cu.mul(&ga, &gb) };
        let out = run(&cx.cuda);
        cx.judge(&name, &s, Kind::Gate, bound, "", out, &want, None);
        let out = run(&if op == "add" { cx.planted(&kernels::ADD, &controls::CTL_ADD) } else { cx.planted(&kernels::MUL, &controls::CTL_MUL) });
        cx.judge(&format!("{op}, broadcast index off by one"), &s, Kind::Control, bound, "", out, &want, None);
    }
    Ok(())
}

fn gate_unary(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let bound = cx.out_bound(F32_ELEMENTWISE);
    for (op, shape) in [("silu", [TOKENS, DIM]), ("sigmoid", [TOKENS, FFN])] {
        let (x, gx) = cx.input(&shape, 3.0)?;
        let want = if op == "silu" { cx.cpu.silu(&x)? } else { cx.cpu.sigmoid(&x)? };
        let s = shape_str(&[&shape]);
        let run = |cu: &Cuda| if op == "silu" { cu.silu(&gx) } else { cu.sigmoid(&gx) };
        let out = run(&cx.cuda);
        cx.judge(op, &s, Kind::Gate, bound, "", out, &want, None);
        let out = run(&if op == "silu" { cx.planted(&kernels::SILU, &controls::CTL_SILU) } else { cx.planted(&kernels::SIGMOID, &controls::CTL_SIGMOID) });
        cx.judge(&format!("{op}, exponent sign flipped"), &s, Kind::Control, bound, "", out, &want, None);
    }
    Ok(())
}

fn gate_rms_norm(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let bound = cx.out_bound(F32_NORM);
    // (rows, width, one_plus): the DiT norms, the per-head qk-norm, the encoder's 1+w norm.
    for (rows, d, one_plus) in [(TOKENS, DIM, false), (TOKENS * HEADS, HEAD_DIM, false), (512, ENC_HIDDEN, true)] {
        // Rows of very different scales, like a residual stream.
        let scales: Vec<f32> = (0..rows).map(|_| (cx.rng.uniform() * 4.0 - 2.0).exp() as f32).collect();
        let mut x = Tensor::new(vec![rows, d], cx.rng.normals(rows * d, 1.0))?;
        for (r, row) in x.data.chunks_mut(d).enumerate() {
            row.iter_mut().for_each(|v| *v *= scales[r]);
        }
        let (x, gx) = cx.exact(x, cx.dtype)?;
        let w: Vec<f32> = (0..d).map(|_| if one_plus { cx.rng.normals(1, 0.1)[0] } else { (0.5 + cx.rng.uniform()) as f32 }).collect();
        let (w, gw) = cx.exact(Tensor::new(vec![d], w)?, cx.dtype)?;
        let eps = 1e-6;
        let want = cx.cpu.rms_norm(&x, Some(&w), eps, one_plus)?;
        let s = shape_str(&[&[rows, d]]);
        let name = if one_plus { "rms_norm (1+w)" } else { "rms_norm" };
        let out = cx.cuda.rms_norm(&gx, Some(&gw), eps, one_plus);
        cx.judge(name, &s, Kind::Gate, bound, "", out, &want, None);
        let (ctl, what) =
            if one_plus { (&controls::CTL_RMS_NOPLUS, "rms_norm, w instead of 1+w") } else { (&controls::CTL_RMS_NOWEIGHT, "rms_norm without the weight") };
        let out = cx.planted(&kernels::RMS_NORM, ctl).rms_norm(&gx, Some(&gw), eps, one_plus);
        cx.judge(what, &s, Kind::Control, bound, "", out, &want, None);
    }
    Ok(())
}

fn gate_reshape(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let (x, gx) = cx.input(&[TOKENS, DIM], 1.0)?;
    let to = [TOKENS, HEADS, HEAD_DIM];
    let want = cx.cpu.reshape(&x, &to)?;
    let s = shape_str(&[&[TOKENS, DIM], &to]);
    let out = cx.cuda.reshape(&gx, &to);
    cx.judge("reshape", &s, Kind::Gate, EXACT, "", out, &want, None);
    // Planted: the reshape done as a transpose of the two leading dims.
    let out = cx.cuda.reshape(&gx, &to).and_then(|r| cx.cuda.permute(&r, &[1, 0, 2])).and_then(|p| cx.cuda.reshape(&p, &to));
    cx.judge("reshape moving data (a transpose)", &s, Kind::Control, EXACT, "", out, &want, None);
    Ok(())
}

fn gate_narrow(cx: &mut Cx) -> Result<()> {
    use dit::*;
    // (shape, dim, start, len): image tokens off the joint stream; q/k/v out of a fused qkv;
    // the gate half of ffn_up_gate.
    for (shape, dim, start, len) in [(vec![TOKENS, DIM], 0, IMG, TXT), (vec![TOKENS, 3 * DIM], 1, DIM, DIM), (vec![TOKENS, 2 * FFN], 1, FFN, FFN)] {
        let (x, gx) = cx.input(&shape, 1.0)?;
        let want = cx.cpu.narrow(&x, dim, start, len)?;
        let s = format!("{} dim {dim} [{start}..+{len}]", shape_str(&[&shape]));
        let out = cx.cuda.narrow(&gx, dim, start, len);
        cx.judge("narrow", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = cx.planted(&kernels::COPY2D, &controls::CTLSRC_COPY2D).narrow(&gx, dim, start, len);
        cx.judge("narrow ignoring start", &s, Kind::Control, EXACT, "", out, &want, None);
    }
    Ok(())
}

fn gate_cat(cx: &mut Cx) -> Result<()> {
    use dit::*;
    // The joint stream [img; txt]; the RoPE angle tables cat(θ, θ) along the last dim.
    for (a, b, dim) in [(vec![IMG, DIM], vec![TXT, DIM], 0), (vec![TOKENS, HEAD_DIM / 2], vec![TOKENS, HEAD_DIM / 2], 1)] {
        let (x, gx) = cx.input(&a, 1.0)?;
        let (y, gy) = cx.input(&b, 1.0)?;
        let want = cx.cpu.cat(&[&x, &y], dim)?;
        let s = format!("{} dim {dim}", shape_str(&[&a, &b]));
        let out = cx.cuda.cat(&[&gx, &gy], dim);
        cx.judge("cat", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = cx.planted(&kernels::COPY2D, &controls::CTL_COPY2D).cat(&[&gx, &gy], dim);
        cx.judge("cat ignoring the offset", &s, Kind::Control, EXACT, "", out, &want, None);
    }
    Ok(())
}

fn gate_permute(cx: &mut Cx) -> Result<()> {
    use dit::*;
    // Heads out of / back into the token stream; the final [h·w, C] → [C, h·w] transpose.
    for (shape, perm) in [
        (vec![TOKENS, HEADS, HEAD_DIM], vec![1, 0, 2]),
        (vec![HEADS, TOKENS, HEAD_DIM], vec![1, 0, 2]),
        (vec![IMG, LATENT], vec![1, 0]),
        (vec![2, TOKENS, HEADS, HEAD_DIM / 2], vec![2, 1, 0, 3]),
    ] {
        let (x, gx) = cx.input(&shape, 1.0)?;
        let want = cx.cpu.permute(&x, &perm)?;
        let s = format!("{} {perm:?}", shape_str(&[&shape]));
        let out = cx.cuda.permute(&gx, &perm);
        cx.judge("permute", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = cx.planted(&kernels::PERMUTE, &controls::CTL_PERMUTE).permute(&gx, &perm);
        cx.judge("permute as a plain copy", &s, Kind::Control, EXACT, "", out, &want, None);
    }
    Ok(())
}
