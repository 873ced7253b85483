//! `moss check` gates of the VAE decoder's CUDA kernels (cuda/vae/vae_ops.cu, crates/moss-cuda/src/vae/)
//! against the CPU twins (f64 accumulation), at the full decoder's shapes (widths
//! 96/192/384/384, a 1024×1024 picture: 128×128 in the mid block), each with planted controls.
//! The VAE is fp32 at every precision, so these run once, in the fp32 pass.

use crate::check::gates::{Cx, GateFn, Kind, EXACT, F32_GEMM, F32_NORM};
use crate::kernels::{self, controls, Image};
use crate::ops::{Cuda, CudaTensor, DType};
use crate::vae::conv::halo_bm;
use crate::vae::ConvKernel;
use anyhow::Result;
use moss_core::backend::ops::VaeOps;
use moss_core::tensor::Tensor;

pub const GATES: &[(&str, GateFn)] = &[
    ("vae bn_unpatchify", gate_bn_unpatchify),
    ("vae conv2d", gate_conv),
    ("vae conv2d split fp16", gate_conv_f16),
    ("vae conv2d fp16 overflow fallback", gate_conv_f16_overflow),
    ("vae group_norm", gate_group_norm),
    ("vae spatial_attention", gate_attention),
    ("vae to_rgb8", gate_to_rgb8),
    ("vae split decode", gate_split_decode),
];

fn shape_str(shapes: &[&[usize]]) -> String {
    shapes.iter().map(|s| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")).collect::<Vec<_>>().join(" · ")
}

/// The VAE runs fp32 whatever the precision: gate it in the fp32 pass only.
fn fp32_pass(cx: &Cx) -> bool {
    cx.dtype == DType::F32
}

fn gate_bn_unpatchify(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    let zs = [1, 128, 64, 64];
    let (z, gz) = cx.input(&zs, 1.0)?;
    let (mean, gm) = cx.input(&[128], 0.3)?;
    let var = Tensor::new(vec![128], cx.rng.normals(128, 0.4).iter().map(|v| v.exp() * 0.8).collect())?;
    let (var, gv) = cx.exact(var, DType::F32)?;
    let want = cx.cpu.bn_unpatchify(&z, &mean, &var, 1e-4, [2, 2])?;
    let s = shape_str(&[&zs]);
    let out = cx.cuda.bn_unpatchify(&gz, &gm, &gv, 1e-4, [2, 2]);
    cx.judge("vae bn_unpatchify", &s, Kind::Gate, EXACT, "bit-exact", out, &want, None);
    let out = cx.planted(&kernels::VAE_BN_UNPATCHIFY, &controls::CTL_VAE_BN_UNPATCHIFY).bn_unpatchify(&gz, &gm, &gv, 1e-4, [2, 2]);
    cx.judge("vae bn_unpatchify with dy/dx swapped", &s, Kind::Control, EXACT, "", out, &want, None);
    Ok(())
}

/// A planted bug in one convolution (the kernels are twins in the check image).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConvControl {
    /// One TF32 product (the lo parts dropped), on the generic split-TF32 kernel.
    Tf32x1,
    /// The halo kernel with one TF32 product.
    HaloTf32x1,
    /// The small-Cout kernel with its taps mirrored in x.
    SmallMirrored,
    /// The upsample fold off by one, in the kernel `conv2d_on` takes for this one and the shape.
    FoldOffByOne(ConvKernel),
}

/// `conv2d` (f32 inputs) with the planted bug `ctl`, dispatched as `conv2d_on` dispatches.
fn conv2d_planted(cu: &Cuda, x: &CudaTensor, w: &CudaTensor, b: &CudaTensor, up: bool, ctl: ConvControl) -> Result<CudaTensor> {
    use controls as c;
    use kernels as k;
    let (cout, cin, kk) = (w.shape[0], w.shape[1], w.shape[2]);
    let halo = (kk == 1 || kk == 3) && cin % 8 == 0 && cu.halo_fits(halo_bm(cout), kk);
    let tap = cin % 16 == 0 && (kk == 1 || kk == 3);
    let view = |img: Image| cu.with_image(img);
    let halo_one = || {
        Image::production()
            .swap(&k::VAE_CONV_HALO_B96_K1, &c::CTL_VAE_CONV_HALO_B96_K1)
            .swap(&k::VAE_CONV_HALO_B96_K3, &c::CTL_VAE_CONV_HALO_B96_K3)
            .swap(&k::VAE_CONV_HALO_B128_K1, &c::CTL_VAE_CONV_HALO_B128_K1)
            .swap(&k::VAE_CONV_HALO_B128_K3, &c::CTL_VAE_CONV_HALO_B128_K3)
    };
    let halo_fold = || {
        Image::production()
            .swap(&k::VAE_CONV_HALO_B96_K1, &c::CTL_VAE_CONV_HALO_FOLD_B96_K1)
            .swap(&k::VAE_CONV_HALO_B96_K3, &c::CTL_VAE_CONV_HALO_FOLD_B96_K3)
            .swap(&k::VAE_CONV_HALO_B128_K1, &c::CTL_VAE_CONV_HALO_FOLD_B128_K1)
            .swap(&k::VAE_CONV_HALO_B128_K3, &c::CTL_VAE_CONV_HALO_FOLD_B128_K3)
    };
    match ctl {
        ConvControl::SmallMirrored if cout <= 4 && kk <= 3 => {
            cu.with_image(Image::production().swap(&k::VAE_CONV_SMALL, &c::CTL_VAE_CONV_SMALL)).conv2d_small(x, w, b, up)
        }
        ConvControl::HaloTf32x1 if halo => view(halo_one()).conv2d_halo(x, w, Some(b), up, false),
        ConvControl::Tf32x1 => {
            let img = Image::production()
                .swap(&k::VAE_CONV_TF32X3, &c::CTL_VAE_CONV_TF32X1)
                .swap(&k::VAE_CONV_TF32X3_K1, &c::CTL_VAE_CONV_TF32X1_K1)
                .swap(&k::VAE_CONV_TF32X3_K3, &c::CTL_VAE_CONV_TF32X1_K3);
            view(img).conv2d_gemm(false, x, w, b, up)
        }
        ConvControl::FoldOffByOne(ConvKernel::Halo) if halo => view(halo_fold()).conv2d_halo(x, w, Some(b), up, false),
        ConvControl::FoldOffByOne(ConvKernel::Halo | ConvKernel::Tf32x3Tap) if tap => {
            let img = Image::production()
                .swap(&k::VAE_CONV_TF32X3T_K1, &c::CTL_VAE_CONV_TF32X3T_FOLD_K1)
                .swap(&k::VAE_CONV_TF32X3T_K3, &c::CTL_VAE_CONV_TF32X3T_FOLD_K3);
            view(img).conv2d_gemm(true, x, w, b, up)
        }
        ConvControl::FoldOffByOne(_) => {
            let img = Image::production()
                .swap(&k::VAE_CONV_TF32X3, &c::CTL_VAE_CONV_TF32X3_FOLD)
                .swap(&k::VAE_CONV_TF32X3_K1, &c::CTL_VAE_CONV_TF32X3_FOLD_K1)
                .swap(&k::VAE_CONV_TF32X3_K3, &c::CTL_VAE_CONV_TF32X3_FOLD_K3);
            view(img).conv2d_gemm(false, x, w, b, up)
        }
        c => anyhow::bail!("conv2d: {c:?} does not apply to {:?} ⊛ {:?}", x.shape, w.shape),
    }
}

/// The fp16 conv's planted twins of one bug, every build: `""` the activation lo parts dropped,
/// `"scale"` one channel's weight scale not undone, `"fold"` the upsample fold off by one.
pub(crate) fn conv16_controls(cu: &Cuda, bug: &str) -> Cuda {
    use controls as c;
    use kernels as k;
    let twins = match bug {
        "scale" => [&c::CTL_VAE_CONV16_SCALE_B96_K1, &c::CTL_VAE_CONV16_SCALE_B96_K3, &c::CTL_VAE_CONV16_SCALE_B128_K1, &c::CTL_VAE_CONV16_SCALE_B128_K3],
        "fold" => [&c::CTL_VAE_CONV16_FOLD_B96_K1, &c::CTL_VAE_CONV16_FOLD_B96_K3, &c::CTL_VAE_CONV16_FOLD_B128_K1, &c::CTL_VAE_CONV16_FOLD_B128_K3],
        _ => [&c::CTL_VAE_CONV16_B96_K1, &c::CTL_VAE_CONV16_B96_K3, &c::CTL_VAE_CONV16_B128_K1, &c::CTL_VAE_CONV16_B128_K3],
    };
    let builds = [&k::VAE_CONV16_B96_K1, &k::VAE_CONV16_B96_K3, &k::VAE_CONV16_B128_K1, &k::VAE_CONV16_B128_K3];
    cu.with_image(builds.into_iter().zip(twins).fold(Image::production(), |img, (from, to)| img.swap(from, to)))
}

/// One conv gate's inputs (random, weights scaled by 1/√(Cin·k²)), the CPU twin's output and
/// the row's shape text.
struct ConvCase {
    x: Tensor,
    gx: CudaTensor,
    w: Tensor,
    gw: CudaTensor,
    gb: CudaTensor,
    want: Tensor,
    s: String,
}

fn conv_case(cx: &mut Cx, xs: [usize; 4], cout: usize, k: usize, up: bool) -> Result<ConvCase> {
    let cin = xs[1];
    let ws = [cout, cin, k, k];
    let (x, gx) = cx.input(&xs, 1.0)?;
    let (w, gw) = cx.input(&ws, 1.0 / ((cin * k * k) as f64).sqrt())?;
    let (b, gb) = cx.input(&[cout], 0.1)?;
    let want = cx.cpu.conv2d(&x, &w, &b, up)?;
    let s = format!("{}{}", shape_str(&[&xs, &ws]), if up { " up2x" } else { "" });
    Ok(ConvCase { x, gx, w, gw, gb, want, s })
}

fn gate_conv(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    // (input shape, cout, k, upsample, controls?)
    let cases: &[([usize; 4], usize, usize, bool, bool)] = &[
        ([1, 384, 128, 128], 384, 3, false, true), // mid block / up block 0
        ([1, 96, 512, 512], 96, 3, false, false),  // up block 3 at a 512x512 crop
        ([1, 192, 64, 64], 192, 3, true, true),    // an upsampler (64 -> 128)
        ([1, 384, 64, 64], 192, 1, false, false),  // a 1x1 shortcut
        ([1, 96, 256, 256], 3, 3, false, false),   // conv_out (3 outputs: a partial tile)
        ([2, 40, 37, 45], 52, 3, true, false),     // odd sizes, two images, upsampled
    ];
    for &(xs, cout, k, up, controls) in cases {
        let ConvCase { gx, gw, gb, want, s, .. } = conv_case(cx, xs, cout, k, up)?;
        let default_what = if cout <= 4 { "vae conv2d small-Cout f64 SIMT (fast kernels)" } else { "vae conv2d split-TF32 halo (fp16 overflow re-run)" };
        for (kern, what) in [
            (ConvKernel::Halo, default_what),
            (ConvKernel::F16, if cout <= 4 { "vae conv2d small-Cout f64 SIMT (default, f16)" } else { "vae conv2d split fp16 (default)" }),
            (ConvKernel::Tf32x3Tap, "vae conv2d split-TF32 tap-major"),
            (ConvKernel::Tf32x3, "vae conv2d split-TF32 mma"),
        ] {
            let out = cx.cuda.conv2d_on(&gx, &gw, &gb, up, kern);
            cx.judge(what, &s, Kind::Gate, F32_GEMM, "", out, &want, None);
        }
        if cout <= 4 {
            let out = conv2d_planted(&cx.cuda, &gx, &gw, &gb, up, ConvControl::SmallMirrored);
            cx.judge("vae conv2d small-Cout, taps mirrored", &s, Kind::Control, F32_GEMM, "", out, &want, None);
        }
        if controls {
            let out = conv2d_planted(&cx.cuda, &gx, &gw, &gb, up, ConvControl::HaloTf32x1);
            cx.judge("vae conv2d halo with one TF32 product", &s, Kind::Control, F32_GEMM, "", out, &want, None);
            let out = conv2d_planted(&cx.cuda, &gx, &gw, &gb, up, ConvControl::Tf32x1);
            cx.judge("vae conv2d with one TF32 product (lo dropped)", &s, Kind::Control, F32_GEMM, "", out, &want, None);
            if up {
                let out = conv2d_planted(&cx.cuda, &gx, &gw, &gb, up, ConvControl::FoldOffByOne(ConvKernel::Tf32x3));
                cx.judge("vae conv2d upsample fold off by one", &s, Kind::Control, F32_GEMM, "", out, &want, None);
                let out = conv2d_planted(&cx.cuda, &gx, &gw, &gb, up, ConvControl::FoldOffByOne(ConvKernel::Tf32x3Tap));
                cx.judge("vae conv2d tap-major, upsample fold off by one", &s, Kind::Control, F32_GEMM, "", out, &want, None);
                let out = conv2d_planted(&cx.cuda, &gx, &gw, &gb, up, ConvControl::FoldOffByOne(ConvKernel::Halo));
                cx.judge("vae conv2d halo, upsample fold off by one", &s, Kind::Control, F32_GEMM, "", out, &want, None);
            }
        }
    }
    Ok(())
}

fn gate_group_norm(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    for (xs, silu, controls) in [([1usize, 384, 128, 128], true, true), ([1, 96, 512, 512], false, false), ([2, 64, 33, 20], true, false)] {
        let c = xs[1];
        // An offset mean so a variance without the mean subtracted would show.
        let (x, gx) = {
            let n: usize = xs.iter().product();
            let t = Tensor::new(xs.to_vec(), cx.rng.normals(n, 2.0).iter().map(|v| v + 3.0).collect())?;
            cx.exact(t, DType::F32)?
        };
        let w = Tensor::new(vec![c], cx.rng.normals(c, 0.1).iter().map(|v| v + 1.0).collect())?;
        let (w, gw) = cx.exact(w, DType::F32)?;
        let (b, gb) = cx.input(&[c], 0.05)?;
        let want = cx.cpu.group_norm(&x, &w, &b, 32, 1e-6, silu)?;
        let s = format!("{} g32{}", shape_str(&[&xs]), if silu { " +silu" } else { "" });
        let ng = xs[0] * 32;
        let (h, per_row) = (xs[2], c / 32 * xs[3]);
        // Row partials (on `stats`) → host combine → apply (on `apply`).
        let run = |stats: &Cuda, apply: &Cuda| -> Result<CudaTensor> {
            let rows = stats.group_norm_rows(&gx, 32)?;
            let st = moss_core::backend::ops::vae::group_norm_combine(&rows, ng, h, per_row);
            apply.group_norm_normalise(&gx, &gw, &gb, 32, &st, 1e-6, silu)
        };
        let out = run(&cx.cuda, &cx.cuda);
        cx.judge("vae group_norm (f64 row partials, host combine)", &s, Kind::Gate, F32_NORM, "", out, &want, None);
        if controls {
            let out = run(&cx.cuda, &cx.planted(&kernels::VAE_GN_APPLY, &controls::CTL_VAE_GN_APPLY));
            cx.judge("vae group_norm, affine channel = idx % C", &s, Kind::Control, F32_NORM, "", out, &want, None);
            let out = run(&cx.planted(&kernels::VAE_GN_ROW_STATS, &controls::CTL_VAE_GN_ROW_STATS), &cx.cuda);
            cx.judge("vae group_norm, row partials skip an element", &s, Kind::Control, F32_NORM, "", out, &want, None);
            strip_invariance(cx, &gx, &xs)?;
        }
    }
    Ok(())
}

/// The split decode's premise: the row partials of a row strip (rows 37..87 narrowed out of the
/// picture, so the kernel sees a different `h` and base) are bit for bit those rows' partials of
/// the whole picture. Error: max |strip − whole| / max |whole|, NaN if not finite. Control: the
/// strip compared one row off (bad strip bookkeeping), which the same comparison must reject.
fn strip_invariance(cx: &mut Cx, gx: &CudaTensor, xs: &[usize]) -> Result<()> {
    use moss_core::backend::Backend;
    let (y0, len, h) = (37usize, 50usize, xs[2]);
    let whole = cx.cuda.group_norm_rows(gx, 32)?;
    let strip = cx.cuda.group_norm_rows(&cx.cuda.narrow(gx, 2, y0, len)?, 32)?;
    let s = format!("{} rows {y0}..{}", shape_str(&[xs]), y0 + len);
    for (kind, off, what) in [
        (Kind::Gate, 0usize, "vae group_norm row partials: strip == whole (bits)"),
        (Kind::Control, 1, "vae group_norm row partials: strip vs whole one row off"),
    ] {
        let (mut diff, mut top, mut bad) = (0f64, 0f64, false);
        for g in 0..xs[0] * 32 {
            for r in 0..len.min(h - y0 - off) {
                for k in 0..2 {
                    let a = strip[(g * len + r) * 2 + k];
                    let b = whole[(g * h + y0 + off + r) * 2 + k];
                    bad |= !a.is_finite();
                    diff = diff.max((a - b).abs());
                    top = top.max(b.abs());
                }
            }
        }
        let error = if bad { f64::NAN } else { diff / top.max(f64::MIN_POSITIVE) };
        let kernel = if kind == Kind::Control { format!("  control: {what}") } else { what.to_string() };
        cx.rows.push(crate::check::gates::Row { kernel, precision: cx.precision, shape: s.clone(), kind, error, bound: EXACT, note: "f64 partials".into() });
    }
    Ok(())
}

/// f64 attention for the query rows `rows` of `q`, `k`, `v` `[1, L, D]` → `[rows, D]`.
pub(crate) fn attention_rows(q: &Tensor, k: &Tensor, v: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let (l, d) = (q.shape[1], q.shape[2]);
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::with_capacity(rows.len() * d);
    for &r in rows {
        let qr = &q.data[r * d..(r + 1) * d];
        let s: Vec<f64> = (0..l).map(|j| qr.iter().zip(&k.data[j * d..(j + 1) * d]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
        let sum: f64 = p.iter().sum();
        let mut o = vec![0f64; d];
        for (j, &pj) in p.iter().enumerate() {
            for (a, &vv) in o.iter_mut().zip(&v.data[j * d..(j + 1) * d]) {
                *a += pj * vv as f64;
            }
        }
        out.extend(o.iter().map(|a| (a / sum) as f32));
    }
    Tensor::new(vec![rows.len(), d], out)
}

fn gate_attention(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    for (l, chunk) in [(4096usize, crate::vae::ATTN_CHUNK_BYTES), (4096, 4096 * 4 * 1000), (16384, crate::vae::ATTN_CHUNK_BYTES)] {
        let d = 384;
        let sh = [1, l, d];
        let (q, gq) = cx.input(&sh, 1.5)?;
        let (k, gk) = cx.input(&sh, 1.5)?;
        let (v, gv) = cx.input(&sh, 1.0)?;
        let rows = cx.rng.subset(l, 32);
        let want = attention_rows(&q, &k, &v, &rows)?;
        let chunks = l.div_ceil((chunk / (4 * l)).clamp(1, l));
        let s = format!("{} ({chunks} chunks)", shape_str(&[&sh]));
        let note = format!("CPU on {} of {l} query rows", rows.len());
        let softmax_ctl = cx.planted(&kernels::VAE_SOFTMAX_ROWS, &controls::CTL_VAE_SOFTMAX_ROWS);
        let out = cx.cuda.spatial_attention_chunks(&gq, &gk, &gv, chunk);
        cx.judge("vae spatial_attention (cuBLAS fp32 + softmax)", &s, Kind::Gate, F32_GEMM, &note, out, &want, Some(&rows));
        let chunks_split = l.div_ceil((chunk / 3 / (4 * l)).clamp(1, l));
        let s2 = format!("{} ({chunks_split} chunks)", shape_str(&[&sh]));
        let out = cx.cuda.spatial_attention_split(&gq, &gk, &gv, chunk);
        cx.judge("vae spatial_attention (split-TF32 halo GEMMs + softmax)", &s2, Kind::Gate, F32_GEMM, &note, out, &want, Some(&rows));
        if chunks == 1 {
            let out = softmax_ctl.spatial_attention_split(&gq, &gk, &gv, chunk);
            cx.judge("vae spatial_attention split-TF32 without 1/sqrt(D)", &s2, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
            let out = softmax_ctl.spatial_attention_chunks(&gq, &gk, &gv, chunk);
            cx.judge("vae spatial_attention without 1/sqrt(D)", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
        }
    }
    // The flash kernel (D = 384 on a GPU with the shared memory for it): the mid block's L at
    // 512x512, 1024x1024 and 2048x2048 pictures (4096, 16384, 65536: the last as rows of the CPU
    // twin only), and an L off the 64-row / 32-key tiles (masked keys, rows past L).
    if cx.cuda.flash_fits(384) {
        for (l, ctl) in [(4096usize, true), (16384, true), (1000, false), (65536, false)] {
            let d = 384;
            let sh = [1, l, d];
            let (q, gq) = cx.input(&sh, 1.5)?;
            let (k, gk) = cx.input(&sh, 1.5)?;
            let (v, gv) = cx.input(&sh, 1.0)?;
            let rows = cx.rng.subset(l, if l > 16384 { 8 } else { 32 });
            let want = attention_rows(&q, &k, &v, &rows)?;
            let s = shape_str(&[&sh]);
            let note = format!("CPU on {} of {l} query rows", rows.len());
            let out = cx.cuda.spatial_attention_flash(&gq, &gk, &gv);
            cx.judge("vae spatial_attention flash (split-TF32, online softmax)", &s, Kind::Gate, F32_GEMM, &note, out, &want, Some(&rows));
            if ctl {
                let out = cx.planted(&kernels::VAE_FLASH_D384, &controls::CTL_VAE_FLASH_D384).spatial_attention_flash(&gq, &gk, &gv);
                cx.judge("vae spatial_attention flash, output not rescaled", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
            }
            // The fp16 hi/lo kernel (the default where it fits), same inputs.
            if cx.cuda.f16_attn_fits(d) {
                let out = cx.cuda.spatial_attention_f16(&gq, &gk, &gv);
                cx.judge("vae spatial_attention f16 (fp16 hi/lo split, P in registers)", &s, Kind::Gate, F32_GEMM, &note, out, &want, Some(&rows));
                if ctl {
                    let out = cx.planted(&kernels::VAE_ATTN16_D384, &controls::CTL_VAE_ATTN16_D384).spatial_attention_f16(&gq, &gk, &gv);
                    cx.judge("vae spatial_attention f16, V's scale not undone", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
                    let out = cx.planted(&kernels::VAE_ATTN16_D384, &controls::CTL2_VAE_ATTN16_D384).spatial_attention_f16(&gq, &gk, &gv);
                    cx.judge("vae spatial_attention f16, small terms of the scores dropped", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
                    let out = cx.planted(&kernels::VAE_ATTN16_D384, &controls::CTL3_VAE_ATTN16_D384).spatial_attention_f16(&gq, &gk, &gv);
                    cx.judge("vae spatial_attention f16, P V straight into O (no fresh tiles)", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
                }
            }
        }
    }
    // The row-subset reference against the CPU twin on a size the twin does whole.
    let sh = [1, 200, 64];
    let (q, k, v) = (
        Tensor::new(sh.to_vec(), cx.rng.normals(200 * 64, 1.5))?,
        Tensor::new(sh.to_vec(), cx.rng.normals(200 * 64, 1.5))?,
        Tensor::new(sh.to_vec(), cx.rng.normals(200 * 64, 1.0))?,
    );
    let all: Vec<usize> = (0..200).collect();
    let twin = cx.cpu.spatial_attention(&q, &k, &v)?;
    let mine = attention_rows(&q, &k, &v, &all)?;
    let e = moss_core::tensor::rel_l2(&mine.data, &twin.data);
    anyhow::ensure!(e < 1e-7, "the gate's attention reference differs from the CPU twin by {e:.2e}");
    Ok(())
}

fn gate_to_rgb8(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    let xs = [1, 3, 512, 512];
    let n: usize = xs.iter().product();
    // Values past ±1 (the clamp) and exact ties (x = (2j + 1)/255 − 1 lands on j + 0.5).
    let mut data = cx.rng.normals(n, 0.8);
    for (i, v) in data.iter_mut().enumerate().step_by(7) {
        *v = ((2 * (i % 255) + 1) as f32) / 255.0 - 1.0;
    }
    let (x, gx) = cx.exact(Tensor::new(xs.to_vec(), data)?, DType::F32)?;
    let want = cx.cpu.to_rgb8(&x)?;
    let want = Tensor::new(vec![want.len()], want.iter().map(|&b| b as f32).collect())?;
    let s = shape_str(&[&xs]);
    let as_tensor = |r: Result<Vec<u8>>, cx: &Cx| -> Result<CudaTensor> {
        let b = r?;
        cx.cuda.upload_as(&Tensor::new(vec![b.len()], b.iter().map(|&v| v as f32).collect())?, DType::F32)
    };
    let out = as_tensor(cx.cuda.to_rgb8(&gx), cx);
    cx.judge("vae to_rgb8 (rintf)", &s, Kind::Gate, EXACT, "bytes, bit-exact", out, &want, None);
    let out = as_tensor(cx.planted(&kernels::VAE_TO_RGB8, &controls::CTL_VAE_TO_RGB8).to_rgb8(&gx), cx);
    cx.judge("vae to_rgb8 truncating", &s, Kind::Control, EXACT, "", out, &want, None);
    Ok(())
}

/// The split decode (issue #8) on CUDA: the checkpoint's decoder (`--model`, e.g. golden/tiny-a)
/// on random latents, whole vs row strips (`moss decode --strip-rows`' path: the mid block whole,
/// every later layer in strips, the kept pictures in pinned host memory (rows on the copy
/// streams, fetched ahead), all in device memory, or half the planner's budget for keeping them
/// all): the float picture must be bit-identical (bound 0), at the golden size (strips of 5 and
/// of 1 row, less than the halo) and at 368x320 (widths 23·16 etc., not multiples of the conv's
/// 128-pixel tile), and the RGB8 bytes too. Control: strips without their halo rows. Skipped
/// without a checkpoint (like `load`).
fn gate_split_decode(cx: &mut Cx) -> Result<()> {
    use moss_core::model::vae::VaeDecoder;
    if !fp32_pass(cx) {
        return Ok(());
    }
    let Some(ck) = cx.ck.clone() else { return Ok(()) };
    let comp = ck.open_component("vae")?;
    let vae = VaeDecoder::load(&cx.cuda, &comp, &ck.vae)?;
    // The default convs (split fp16) and the TF32 halo kernel (the overflow re-run).
    for conv in [None, Some(ConvKernel::Halo)] {
        cx.cuda.set_conv_fallback(conv.is_some());
        let r = split_decode_rows(cx, &vae, &ck.vae, conv);
        cx.cuda.set_conv_fallback(false);
        r?;
    }
    Ok(())
}

fn split_decode_rows(
    cx: &mut Cx,
    vae: &moss_core::model::vae::VaeDecoder<crate::ops::Cuda>,
    cfg: &moss_core::checkpoint::config::VaeConfig,
    conv: Option<ConvKernel>,
) -> Result<()> {
    use moss_core::model::vae::{Split, Strips};
    let c = cfg.packed_channels();
    let tag = conv.map_or(String::new(), |k| format!(" [conv {k:?}]"));
    for (h, w, rows) in [(4usize, 4usize, 5usize), (4, 4, 1), (20, 23, 13)] {
        let z = Tensor::new(vec![1, c, h, w], cx.rng.normals(c * h * w, 1.0))?;
        let whole = vae.decode_with(&cx.cuda, &z, Split::Whole)?;
        let want = {
            let b = vae.decode_rgb8_with(&cx.cuda, &z, Split::Whole)?;
            Tensor::new(vec![b.len()], b.iter().map(|&v| v as f32).collect())?
        };
        let all = crate::vae::vae_keep_bytes(cfg, h, w);
        for (keep, place) in [(0, "host"), (all / 2, "half kept"), (usize::MAX, "device")] {
            let s = format!("1x{c}x{h}x{w} -> {}x{} strips of {rows}, pictures in {place}{tag}", 16 * w, 16 * h);
            let out = vae.decode_with(&cx.cuda, &z, Split::strips_keeping(rows, keep)).and_then(|img| cx.cuda.upload_as(&img, DType::F32));
            cx.judge("vae split decode == whole (float bits)", &s, Kind::Gate, EXACT, "", out, &whole, None);
            let out = vae
                .decode_rgb8_with(&cx.cuda, &z, Split::strips_keeping(rows, keep))
                .and_then(|b| cx.cuda.upload_as(&Tensor::new(vec![b.len()], b.iter().map(|&v| v as f32).collect())?, DType::F32));
            cx.judge("vae split decode == whole (RGB8 bytes)", &s, Kind::Gate, EXACT, "", out, &want, None);
        }
        if rows > 1 {
            let s = format!("1x{c}x{h}x{w} -> {}x{} strips of {rows}{tag}", 16 * w, 16 * h);
            let out =
                vae.decode_with(&cx.cuda, &z, Split::Strips(Strips { rows, keep_bytes: 0, no_halo: true })).and_then(|img| cx.cuda.upload_as(&img, DType::F32));
            cx.judge("vae split decode without halo rows", &s, Kind::Control, EXACT, "", out, &whole, None);
        }
    }
    Ok(())
}

/// The split-fp16 conv (cuda/vae/conv_fp16.cu, the default) at the decoder's shapes (384->384
/// 3x3 at 64², 192->96 3x3 at 96², 1x1, upsample, odd sizes with Cin off the 16-channel chunk),
/// both accumulation variants (F16: the small terms in one running tile; F16A: all 3 products
/// in a fresh tile a k-step) against the f64 CPU twin; a null bias (the GEMM use); controls: the
/// activation lo parts dropped, one output channel's weight scale not undone, the upsample fold
/// off by one.
fn gate_conv_f16(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    // (input shape, cout, k, upsample, controls?)
    let cases: &[([usize; 4], usize, usize, bool, bool)] = &[
        ([1, 384, 64, 64], 384, 3, false, true),
        ([1, 192, 96, 96], 96, 3, false, false),
        ([1, 32, 128, 128], 96, 3, false, false), // up block 3's 96 from a 32-channel input
        ([1, 384, 64, 64], 192, 1, false, true),
        ([1, 192, 64, 64], 192, 3, true, true),
        ([2, 40, 37, 45], 52, 3, true, false),
        ([1, 24, 21, 19], 130, 1, false, false),
    ];
    for &(xs, cout, k, up, controls) in cases {
        let ConvCase { x, gx, w, gw, gb, want, s, .. } = conv_case(cx, xs, cout, k, up)?;
        let out = cx.cuda.conv2d_f16(&gx, &gw, Some(&gb), up);
        cx.judge("vae conv2d split fp16 (small terms in a running tile)", &s, Kind::Gate, F32_GEMM, "", out, &want, None);
        if k == 1 && !up {
            let zero = Tensor::new(vec![cout], vec![0.0; cout])?;
            let want0 = cx.cpu.conv2d(&x, &w, &zero, false)?;
            let out = cx.cuda.conv2d_f16(&gx, &gw, None, false);
            cx.judge("vae conv2d split fp16, null bias (GEMM)", &s, Kind::Gate, F32_GEMM, "", out, &want0, None);
        }
        if controls {
            let out = conv16_controls(&cx.cuda, "").conv2d_f16(&gx, &gw, Some(&gb), up);
            cx.judge("vae conv2d split fp16, activation lo dropped", &s, Kind::Control, F32_GEMM, "", out, &want, None);
            let out = conv16_controls(&cx.cuda, "scale").conv2d_f16(&gx, &gw, Some(&gb), up);
            cx.judge("vae conv2d split fp16, channel 5's weight scale not undone", &s, Kind::Control, F32_GEMM, "", out, &want, None);
            if up {
                let out = conv16_controls(&cx.cuda, "fold").conv2d_f16(&gx, &gw, Some(&gb), up);
                cx.judge("vae conv2d split fp16, upsample fold off by one", &s, Kind::Control, F32_GEMM, "", out, &want, None);
            }
        }
    }
    Ok(())
}

/// The fp16 range: an input with a 1e6 value sets the overflow flag (a normal input does not),
/// and the decoder (`--model`) on latents with a 1e6 value, convs forced to fp16, decodes again
/// on the TF32 halo kernel: its float picture must be the halo decode's bit for bit. Controls:
/// the fp16 conv's own result on the 1e6 input (no fallback) against the CPU twin; the decode
/// with the flag ignored against the halo decode.
fn gate_conv_f16_overflow(cx: &mut Cx) -> Result<()> {
    use moss_core::backend::ops::VaeOps;
    if !fp32_pass(cx) {
        return Ok(());
    }
    let xs = [1usize, 64, 32, 32];
    let ws = [96usize, 64, 3, 3];
    let n: usize = xs.iter().product();
    let mut data = cx.rng.normals(n, 1.0);
    let (x_ok, gx_ok) = cx.exact(Tensor::new(xs.to_vec(), data.clone())?, DType::F32)?;
    data[5 * 1024 + 17 * 32 + 9] = 1.0e6;
    let (x_big, gx_big) = cx.exact(Tensor::new(xs.to_vec(), data)?, DType::F32)?;
    let (w, gw) = cx.input(&ws, 1.0 / (64.0f64 * 9.0).sqrt())?;
    let (b, gb) = cx.input(&[96], 0.1)?;
    let s = shape_str(&[&xs, &ws]);
    cx.cuda.vae_flag_take()?;
    let flag_of = |cx: &mut Cx, gx: &CudaTensor| -> Result<bool> {
        let o = cx.cuda.conv2d_f16(gx, &gw, Some(&gb), false)?;
        cx.cuda.sync()?;
        drop(o);
        cx.cuda.vae_flag_take()
    };
    let set_ok = flag_of(cx, &gx_ok)?;
    let set_big = flag_of(cx, &gx_big)?;
    cx.judge_value("vae conv2d fp16 overflow flag: clear on a normal input", &s, Kind::Gate, EXACT, "1 if set", if set_ok { 1.0 } else { 0.0 });
    cx.judge_value("vae conv2d fp16 overflow flag: set on one 1e6 value", &s, Kind::Gate, EXACT, "1 if not set", if set_big { 0.0 } else { 1.0 });
    let want = cx.cpu.conv2d(&x_big, &w, &b, false)?;
    let out = cx.cuda.conv2d_on(&gx_big, &gw, &gb, false, ConvKernel::Halo);
    cx.judge("vae conv2d TF32 halo on the 1e6 input (the fallback's kernel)", &s, Kind::Gate, F32_GEMM, "", out, &want, None);
    let out = cx.cuda.conv2d_f16(&gx_big, &gw, Some(&gb), false);
    cx.judge("vae conv2d fp16 on the 1e6 input, no fallback", &s, Kind::Control, F32_GEMM, "", out, &want, None);
    cx.cuda.vae_flag_take()?;
    let _ = x_ok;

    let Some(ck) = cx.ck.clone() else { return Ok(()) };
    use moss_core::model::vae::{Split, VaeDecoder};
    let comp = ck.open_component("vae")?;
    let vae = VaeDecoder::load(&cx.cuda, &comp, &ck.vae)?;
    let c = ck.vae.packed_channels();
    let (h, w) = (6usize, 5usize);
    let mut zd = cx.rng.normals(c * h * w, 1.0);
    zd[3 * h * w + 2 * w + 1] = 1.0e6;
    let z = Tensor::new(vec![1, c, h, w], zd)?;
    let s = format!("1x{c}x{h}x{w}, one latent 1e6");
    let decode = |cx: &Cx, k: ConvKernel| -> Result<Tensor> {
        cx.cuda.set_conv_fallback(k == ConvKernel::Halo);
        let r = vae.decode_with(&cx.cuda, &z, Split::Whole);
        cx.cuda.set_conv_fallback(false);
        r
    };
    let want = decode(cx, ConvKernel::Halo)?;
    let out = decode(cx, ConvKernel::F16).and_then(|t| cx.cuda.upload_as(&t, DType::F32));
    cx.judge("vae decode, fp16 convs, overflow -> TF32 re-run == TF32 decode (bits)", &s, Kind::Gate, EXACT, "", out, &want, None);
    // The planted bug: one decode without the re-run (the overflow flag ignored).
    cx.cuda.conv_overflow()?;
    let out = vae.decode_once(&cx.cuda, &z, Split::Whole).and_then(|t| cx.cuda.upload_as(&t, DType::F32));
    cx.cuda.conv_overflow()?;
    cx.judge("vae decode, fp16 convs, overflow flag ignored", &s, Kind::Control, EXACT, "", out, &want, None);
    Ok(())
}
