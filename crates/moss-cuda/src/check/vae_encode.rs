//! `moss check` gates of the VAE encoder on CUDA (src/backend/cuda/vae/encode.rs,
//! cuda/vae/encode.cu) against the CPU twins, at the FLUX.2 encoder's shapes (widths
//! 128/256/512/512), each with a planted control: the stride-2 downsample (the decoder's "same"
//! conv read at the odd pixels by `moss_vae_pick_odd`), the decoder's kernels at the shapes only
//! the encoder gives them (`conv_in`'s 3 input channels, `conv_out`'s 64 outputs, the mid block's
//! attention at D = 512), and the checkpoint's encoder whole against the CPU encoder and split
//! into row strips against whole. fp32 whatever the precision: run in the fp32 pass only.

use crate::check::gates::{shape_str, Cx, GateFn, Kind, EXACT, F32_GEMM};
use crate::check::vae::conv16_controls;
use crate::kernels::{self, controls};
use crate::ops::{Cuda, CudaTensor, DType};
use crate::vae::{ConvKernel, ATTN_CHUNK_BYTES};
use anyhow::Result;
use moss_core::backend::ops::{VaeEncodeOps, VaeOps};
use moss_core::tensor::Tensor;

pub const GATES: &[(&str, GateFn)] = &[
    ("vae encode conv2d_down2", gate_down2),
    ("vae encode conv shapes", gate_encoder_convs),
    ("vae encode attention D 512", gate_attention_512),
    ("vae encode whole and split", gate_encode),
];

fn fp32_pass(cx: &Cx) -> bool {
    cx.dtype == DType::F32
}

/// Run `f` with the decoder's convs on the TF32 halo kernel (the fp16 overflow re-run) when
/// `fallback`, else on the default split-fp16 kernel.
fn with_conv<T>(cx: &Cx, fallback: bool, f: impl FnOnce(&Cx) -> T) -> T {
    cx.cuda.set_conv_fallback(fallback);
    let r = f(cx);
    cx.cuda.set_conv_fallback(false);
    r
}

/// The backend with the downsampler's pick on the even pixels (`moss_ctl_vae_pick_odd`).
fn pick_control(cx: &Cx) -> Cuda {
    cx.planted(&kernels::VAE_PICK_ODD, &controls::CTL_VAE_PICK_ODD)
}

/// `conv2d_down2` against the CPU twin (the stride-2 sum computed directly, f64): each encoder
/// downsampler's shape (at a crop of the full resolution), odd sizes (the last row and column
/// of an odd side are never read), two images; on the default convs and on the TF32 re-run's.
/// Control: the pick kernel reading the even pixels (the conv then sees the zero padding above
/// and left instead of below and right).
fn gate_down2(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    // (input shape, controls?)
    let cases: &[([usize; 4], bool)] = &[
        ([1, 128, 256, 256], true),  // down block 0 (1024x1024 picture: 1024², here a crop)
        ([1, 256, 128, 128], false), // down block 1
        ([1, 512, 64, 64], true),    // down block 2
        ([2, 40, 37, 45], false),    // odd sizes, two images, Cin off the 16-channel chunk
    ];
    for &(xs, controls) in cases {
        let c = xs[1];
        let ws = [c, c, 3, 3];
        let (x, gx) = cx.input(&xs, 1.0)?;
        let (w, gw) = cx.input(&ws, 1.0 / ((c * 9) as f64).sqrt())?;
        let (b, gb) = cx.input(&[c], 0.1)?;
        let want = cx.cpu.conv2d_down2(&x, &w, &b)?;
        let s = format!("{} stride 2", shape_str(&[&xs, &ws]));
        for (fallback, what) in [(false, "vae conv2d_down2 (split fp16 conv + pick_odd)"), (true, "vae conv2d_down2 (TF32 halo conv + pick_odd)")] {
            let out = with_conv(cx, fallback, |cx| cx.cuda.conv2d_down2_op(&gx, &gw, &gb));
            cx.judge(what, &s, Kind::Gate, F32_GEMM, "", out, &want, None);
        }
        let out = cx.cuda.conv2d_down2(&gx, &gw, &gb);
        cx.judge("vae conv2d_down2 (the VaeEncodeOps entry)", &s, Kind::Gate, F32_GEMM, "", out, &want, None);
        if controls {
            let out = pick_control(cx).conv2d_down2_op(&gx, &gw, &gb);
            cx.judge("vae conv2d_down2 picking the even pixels", &s, Kind::Control, F32_GEMM, "", out, &want, None);
        }
    }
    Ok(())
}

/// The decoder's conv kernels at the shapes only the encoder gives them: `conv_in` (3 input
/// channels: the fp16 kernel's channel chunk mostly padding, the re-run's generic TF32 kernel
/// since 3 is not a multiple of 8), `conv_out` (512 → 64) and `quant_conv` (64 → 64, 1×1).
/// Control: the fp16 kernel with the activation lo parts dropped, at `conv_in`.
fn gate_encoder_convs(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    let cases: &[([usize; 4], usize, usize, bool)] = &[
        ([1, 3, 512, 512], 128, 3, true),   // conv_in at a 512x512 crop
        ([1, 512, 128, 128], 64, 3, false), // conv_out at 1024x1024
        ([1, 64, 128, 128], 64, 1, false),  // quant_conv
    ];
    for &(xs, cout, k, controls) in cases {
        let cin = xs[1];
        let ws = [cout, cin, k, k];
        let (x, gx) = cx.input(&xs, 1.0)?;
        let (w, gw) = cx.input(&ws, 1.0 / ((cin * k * k) as f64).sqrt())?;
        let (b, gb) = cx.input(&[cout], 0.1)?;
        let want = cx.cpu.conv2d(&x, &w, &b, false)?;
        let s = shape_str(&[&xs, &ws]);
        for (kern, what) in [(ConvKernel::F16, "vae encode conv2d split fp16 (default)"), (ConvKernel::Halo, "vae encode conv2d fp16 overflow re-run")] {
            let out = cx.cuda.conv2d_on(&gx, &gw, &gb, false, kern);
            cx.judge(what, &s, Kind::Gate, F32_GEMM, "", out, &want, None);
        }
        if controls {
            let out = conv16_controls(&cx.cuda, "").conv2d_f16(&gx, &gw, Some(&gb), false);
            cx.judge("vae encode conv2d split fp16, activation lo dropped", &s, Kind::Control, F32_GEMM, "", out, &want, None);
        }
    }
    Ok(())
}

/// The encoder's mid-block attention (D = 512: the D = 384 flash and fp16 kernels do not apply,
/// the dispatcher takes the split-TF32 products + softmax) at the latent resolution of 512x512
/// and 1024x1024 pictures, on 32 query rows of the f64 reference. Control: the scores without
/// 1/√D.
fn gate_attention_512(cx: &mut Cx) -> Result<()> {
    if !fp32_pass(cx) {
        return Ok(());
    }
    for (l, ctl) in [(4096usize, true), (16384, false)] {
        let sh = [1, l, 512];
        let (q, gq) = cx.input(&sh, 1.5)?;
        let (k, gk) = cx.input(&sh, 1.5)?;
        let (v, gv) = cx.input(&sh, 1.0)?;
        let rows = cx.rng.subset(l, 32);
        let want = crate::check::vae::attention_rows(&q, &k, &v, &rows)?;
        let s = shape_str(&[&sh]);
        let note = format!("CPU on {} of {l} query rows", rows.len());
        let out = cx.cuda.spatial_attention(&gq, &gk, &gv);
        cx.judge("vae encode spatial_attention D 512 (dispatched)", &s, Kind::Gate, F32_GEMM, &note, out, &want, Some(&rows));
        if ctl {
            let out = cx.planted(&kernels::VAE_SOFTMAX_ROWS, &controls::CTL_VAE_SOFTMAX_ROWS).spatial_attention_split(&gq, &gk, &gv, ATTN_CHUNK_BYTES);
            cx.judge("vae encode spatial_attention D 512 without 1/sqrt(D)", &s, Kind::Control, F32_GEMM, &note, out, &want, Some(&rows));
        }
    }
    Ok(())
}

/// The checkpoint's encoder (`--model`, e.g. golden/tiny-a) on a random picture: the CUDA
/// encode (split fp16 convs; and on the TF32 re-run's) against the CPU encoder's moments; split
/// into row strips (the kept pictures in host memory, half kept, all on the device; strips of 1,
/// 5 and 13 rows) against whole, bit for bit, at 96x80 and 368x320 (sides not multiples of the
/// conv tile). Controls: the CPU comparison with the downsampler's pick on the even pixels (an
/// encoder built on the planted pick), strips without their halo rows. Skipped without a
/// checkpoint.
fn gate_encode(cx: &mut Cx) -> Result<()> {
    use moss_core::model::vae::{Split, Strips, VaeEncoder};
    if !fp32_pass(cx) {
        return Ok(());
    }
    let Some(ck) = cx.ck.clone() else { return Ok(()) };
    let comp = ck.open_component("vae")?;
    let enc = VaeEncoder::load(&cx.cuda, &comp, &ck.vae)?;
    let cpu = VaeEncoder::load(&cx.cpu, &comp, &ck.vae)?;
    for (h, w) in [(80usize, 96usize), (320, 368)] {
        let x = Tensor::new(vec![1, 3, h, w], cx.rng.normals(3 * h * w, 0.5).iter().map(|v| v.clamp(-1.0, 1.0)).collect())?;
        let want = cpu.moments_once(&cx.cpu, &x, Split::Whole)?;
        let s = format!("1x3x{h}x{w} -> {:?}", want.shape);
        let up = |cx: &Cx, t: Result<Tensor>| -> Result<CudaTensor> { cx.cuda.upload_as(&t?, DType::F32) };
        for (fallback, what) in [(false, "vae encode (CUDA) vs CPU encoder, moments"), (true, "vae encode on the TF32 re-run's convs vs CPU")] {
            let out = with_conv(cx, fallback, |cx| up(cx, enc.moments_once(&cx.cuda, &x, Split::Whole)));
            cx.judge(what, &s, Kind::Gate, 1e-4, "whole network, fp32", out, &want, None);
        }
        let whole = enc.moments_once(&cx.cuda, &x, Split::Whole)?;
        let all = crate::vae::encode_plan::encode_keep_bytes(&ck.vae, h, w);
        for rows in [1usize, 5, 13] {
            for (keep, place) in [(0, "host"), (all / 2, "half kept"), (usize::MAX, "device")] {
                let ss = format!("1x3x{h}x{w} strips of {rows}, pictures in {place}");
                let out = up(cx, enc.moments_once(&cx.cuda, &x, Split::strips_keeping(rows, keep)));
                cx.judge("vae split encode == whole (float bits)", &ss, Kind::Gate, EXACT, "", out, &whole, None);
            }
        }
        let ss = format!("1x3x{h}x{w} strips of 5");
        let out = up(cx, enc.moments_once(&cx.cuda, &x, Split::Strips(Strips { rows: 5, keep_bytes: 0, no_halo: true })));
        cx.judge("vae split encode without halo rows", &ss, Kind::Control, EXACT, "", out, &whole, None);
    }
    // The end-to-end control: the moments with every downsampler on the planted pick.
    let (h, w) = (80usize, 96usize);
    let x = Tensor::new(vec![1, 3, h, w], cx.rng.normals(3 * h * w, 0.5).iter().map(|v| v.clamp(-1.0, 1.0)).collect())?;
    let want = cpu.moments_once(&cx.cpu, &x, Split::Whole)?;
    let out = enc.moments_once(&pick_control(cx), &x, Split::Whole).and_then(|t| cx.cuda.upload_as(&t, DType::F32));
    cx.judge("vae encode with the downsamplers on the even pixels", &format!("1x3x{h}x{w}"), Kind::Control, 1e-4, "", out, &want, None);
    Ok(())
}
