//! Gates of the quantized matrices kept as stored (`cuda/dit/dequant.cu`, `ops/quant.rs`) at the
//! DiT's weight shapes: random packed bytes of every format (finite scales), dequantized on the GPU
//! into the run's dtype, against the CPU twin ([`Layout::dequantize`]: the loaders of the CPU
//! backend, bit-exact against the `gguf` package and convert-to-quant) rounded to that dtype: every
//! element's bits must agree. Then the products that read them (`linear` of a kept matrix: the
//! dequantize then cuBLASLt) against an fp64 reference, and the gather of a kept embedding table.
//! Each has a planted control: the format's `moss_ctl_dequant_*` twin (codes read unsigned, nibbles
//! exchanged, a high bit dropped, the k-quant scales unpacked wrongly, the rotation left out).
//! W4A8 (the W4A8 text encoders' matrices) is gated at the text encoder's shapes.

use super::gates::*;
use crate::ops::{to_bytes, Cuda, CudaTensor, DType};
use anyhow::Result;
use moss_core::backend::Backend;
use moss_core::checkpoint::ggml::GgmlType;
use moss_core::checkpoint::kept::{Format, Layout};
use moss_core::tensor::Tensor;

/// The gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[
    ("dequantize (ggml blocks)", gate_ggml),
    ("dequantize (int8, ConvRot)", gate_int8),
    ("dequantize (W4A8)", gate_w4a8),
    ("dequantize: kept matrices in products", gate_products),
];

/// Random packed bytes of `layout`: random codes, f16 block scales in a weight's range, positive
/// f32 row scales.
pub fn random_bytes(rng: &mut Rng, layout: &Layout) -> Vec<u8> {
    let mut b: Vec<u8> = (0..layout.bytes.div_ceil(8)).flat_map(|_| rng.next_u64().to_le_bytes()).take(layout.bytes).collect();
    let k = layout.k;
    for p in &layout.parts {
        let data = p.data;
        match p.format {
            Format::Ggml(t) => {
                let scale_at: &[usize] = match t {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
                    GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                    GgmlType::Q6_K => &[208],
                };
                let blocks = p.rows * k / t.block_values();
                for i in 0..blocks {
                    for &a in scale_at {
                        let v = half::f16::from_f32((rng.uniform() * 2e-3 + 1e-5) as f32);
                        let at = data + i * t.block_bytes() + a;
                        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Format::Int8 { .. } => {
                let s = p.scales.expect("int8 parts have scales");
                for r in 0..p.rows {
                    let v = (rng.uniform() * 1e-3 + 1e-6) as f32;
                    b[s + 4 * r..s + 4 * r + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            Format::W4a8 { bits, group, f32_scales, .. } => {
                // row scales as comfy-kitchen's (amax / 127); group scales that take the levels
                // over the whole int8 grid and past it (clamped); a sorted random codebook
                let s = p.scales.expect("W4A8 parts have scales");
                for r in 0..p.rows {
                    let v = (rng.uniform() * 1e-3 + 1e-6) as f32;
                    b[s + 4 * r..s + 4 * r + 4].copy_from_slice(&v.to_le_bytes());
                }
                let g = p.group_scales.expect("W4A8 parts have group scales");
                let top = if bits == 4 { 160.0 } else { 5.0 };
                for i in 0..p.rows * (k / group) {
                    let v = (rng.uniform() * top) as f32;
                    if f32_scales {
                        b[g + 4 * i..g + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
                    } else {
                        b[g + i] = moss_core::fp8::e4m3_from_f32(v);
                    }
                }
                let l = p.levels.expect("W4A8 parts have levels");
                let mut book: Vec<f32> = match bits {
                    6 => moss_core::checkpoint::comfy_quant::w4a8_levels(6, None),
                    _ => (0..16).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect(),
                };
                book.sort_by(f32::total_cmp);
                for (i, v) in book.iter().enumerate() {
                    b[l + 4 * i..l + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            Format::BF16 => {
                let v = rng.normals(p.rows * k, 0.02);
                b[data..data + 2 * v.len()].copy_from_slice(&to_bytes(&v, DType::BF16));
            }
            Format::F32 => {
                let v = rng.normals(p.rows * k, 0.02);
                b[data..data + 4 * v.len()].copy_from_slice(&to_bytes(&v, DType::F32));
            }
        }
    }
    b
}

/// The kernel families a format's control swaps in (its planted twin).
fn stem(f: Format) -> String {
    match f {
        Format::Ggml(t) => format!("moss_dequant_{}", t.name().to_lowercase()),
        Format::Int8 { convrot: None } => "moss_dequant_int8".into(),
        Format::Int8 { convrot: Some(_) } => "moss_dequant_int8_rot".into(),
        Format::W4a8 { .. } => "moss_dequant_w4a8".into(),
        Format::BF16 | Format::F32 => String::new(),
    }
}

/// The share of elements of `cu`'s dequantization of `w` whose bits differ from `want` (the CPU
/// twin's values in the run's dtype); NaN when the run failed.
fn differ(cx: &Cx, cu: &Cuda, w: &CudaTensor, want: &[u8]) -> f64 {
    let es = cx.dtype.size();
    match cu.dequantize(w, cx.dtype).and_then(|g| cx.cuda.download_bytes(&g)) {
        Ok(b) if b.len() == want.len() => b.chunks(es).zip(want.chunks(es)).filter(|(x, y)| x != y).count() as f64 / (b.len() / es) as f64,
        _ => f64::NAN,
    }
}

/// One layout: random bytes dequantized on the GPU against the CPU twin bit for bit, then with the
/// planted twin of `control`'s kernel.
fn judge_layout(cx: &mut Cx, what: &str, layout: &Layout, control: Format) -> Result<()> {
    let bytes = random_bytes(&mut cx.rng, layout);
    let want = to_bytes(&layout.dequantize(&bytes)?, cx.dtype);
    let w = cx.cuda.upload_kept(layout, &bytes)?;
    let s = format!("{} ({})", shape_str(&[&[layout.rows(), layout.k]]), layout.formats());
    let e = differ(cx, &cx.cuda.clone(), &w, &want);
    cx.judge_value(&format!("dequantize {what} = CPU"), &s, Kind::Gate, EXACT, "share of elements whose bits differ", e);
    let stem = stem(control);
    let e = differ(cx, &cx.twins(|s| s == stem), &w, &want);
    cx.judge_value(&format!("dequantize {what}, {}", bug(control)), &s, Kind::Control, EXACT, "", e);
    Ok(())
}

fn bug(f: Format) -> &'static str {
    match f {
        Format::Ggml(GgmlType::Q8_0) | Format::Int8 { convrot: None } => "codes read unsigned",
        Format::Ggml(GgmlType::Q4_0 | GgmlType::Q4_1) => "nibbles exchanged",
        Format::Ggml(GgmlType::Q5_0 | GgmlType::Q5_1) => "fifth bit dropped",
        Format::Ggml(GgmlType::Q4_K | GgmlType::Q5_K) => "scales 4..7 unpacked as 0..3",
        Format::Ggml(GgmlType::Q6_K) => "high bits of the first half only",
        Format::Int8 { convrot: Some(_) } => "rotation left out",
        Format::W4a8 { .. } => "nibbles exchanged",
        Format::BF16 | Format::F32 => "",
    }
}

fn gate_ggml(cx: &mut Cx) -> Result<()> {
    use dit::*;
    for t in GgmlType::ALL {
        let f = Format::Ggml(t);
        // q|k|v stacked, and ffn_down (rows of 8192)
        judge_layout(cx, t.name(), &Layout::new(DIM, &[(3 * DIM, f)]), f)?;
        judge_layout(cx, t.name(), &Layout::new(FFN, &[(DIM, f)]), f)?;
    }
    // q, k and v of three block types and a bf16 part (a GGUF file's mixed stack)
    let mixed = [(DIM, Format::Ggml(GgmlType::Q4_K)), (DIM, Format::Ggml(GgmlType::Q6_K)), (DIM, Format::BF16)];
    judge_layout(cx, "mixed stack", &Layout::new(DIM, &mixed), Format::Ggml(GgmlType::Q6_K))
}

fn gate_int8(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let plain = Format::Int8 { convrot: None };
    judge_layout(cx, "int8", &Layout::new(DIM, &[(3 * DIM, plain)]), plain)?;
    // ConvRot groups of 256 (H4^{⊗4}, convert-to-quant's default) and 128 (Sylvester's)
    for g in [256, 128] {
        let f = Format::Int8 { convrot: Some(g) };
        judge_layout(cx, &format!("int8 + ConvRot {g}"), &Layout::new(DIM, &[(3 * DIM, f)]), f)?;
        judge_layout(cx, &format!("int8 + ConvRot {g}"), &Layout::new(FFN, &[(DIM, f)]), f)?;
    }
    let mixed = [(FFN, Format::Int8 { convrot: Some(256) }), (32, Format::BF16), (32, Format::Int8 { convrot: None })];
    judge_layout(cx, "mixed stack", &Layout::new(DIM, &mixed), Format::Int8 { convrot: Some(256) })
}

/// W4A8 at the text encoder's shapes (two stacked projections of 4096, `[8192, 4096]`; the MLP's
/// down projection, `[4096, 12288]`): comfy-kitchen's default (4-bit codebook, e4m3 group scales of 16, ConvRot
/// 256), f32 group scales, 6-bit uniform codes, and a stack with a bf16 part.
fn gate_w4a8(cx: &mut Cx) -> Result<()> {
    let f = |bits, f32_scales| Format::W4a8 { bits, group: 16, convrot: 256, f32_scales };
    let (d, ffn) = (ENC_HIDDEN, super::encoder::enc::FFN);
    judge_layout(cx, "w4a8", &Layout::new(d, &[(2 * d, f(4, false))]), f(4, false))?;
    judge_layout(cx, "w4a8", &Layout::new(ffn, &[(d, f(4, false))]), f(4, false))?;
    judge_layout(cx, "w4a8, f32 group scales", &Layout::new(d, &[(d, f(4, true))]), f(4, true))?;
    judge_layout(cx, "w6a8", &Layout::new(d, &[(d, f(6, false))]), f(6, false))?;
    let mixed = [(d, f(4, false)), (32, Format::BF16), (d, f(6, false))];
    judge_layout(cx, "mixed stack", &Layout::new(d, &mixed), f(4, false))
}

/// `linear` of a kept matrix (the dequantize, then cuBLASLt) against the fp64 product with the CPU
/// twin's weight; the embedding gather of a kept table against the twin's rows.
fn gate_products(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let m = TOKENS;
    let w4a8 = Format::W4a8 { bits: 4, group: 16, convrot: 256, f32_scales: false };
    for f in [Format::Ggml(GgmlType::Q4_K), Format::Ggml(GgmlType::Q8_0), Format::Int8 { convrot: Some(256) }, w4a8] {
        let layout = Layout::new(DIM, &[(2 * FFN, f)]);
        let bytes = random_bytes(&mut cx.rng, &layout);
        // the weight the product reads: the twin's values in the run's dtype
        let w = Tensor::new(vec![2 * FFN, DIM], layout.dequantize(&bytes)?)?;
        let w = if cx.dtype == DType::BF16 { round_bf16(&w) } else { w };
        let gw = cx.cuda.upload_kept(&layout, &bytes)?;
        let (x, gx) = cx.input(&[m, DIM], 1.0)?;
        let rows = cx.rng.subset(m, GEMM_REF_ROWS);
        let xs = Tensor::new(vec![rows.len(), DIM], rows.iter().flat_map(|&r| x.data[r * DIM..(r + 1) * DIM].iter().copied()).collect())?;
        let want = cx.cpu.linear(&xs, &w, None)?;
        let s = format!("{m}x{DIM} · {DIM}x{} ({})", 2 * FFN, f.name());
        let (bound, note) = (cx.out_bound(F32_GEMM), format!("CPU on {} of {m} rows", rows.len()));
        let out = cx.cuda.linear(&gx, &gw, None);
        cx.judge("linear of a kept matrix", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
        let stem = stem(f);
        let out = cx.twins(|s| s == stem).linear(&gx, &gw, None);
        cx.judge(&format!("linear of a kept matrix, {}", bug(f)), &s, Kind::Control, bound, &note, out, &want, Some(&rows));
    }
    // a kept embedding table (the text encoder's, rows of 4096): a prompt's rows
    let f = Format::Int8 { convrot: Some(256) };
    let layout = Layout::new(ENC_HIDDEN, &[(4096, f)]);
    let bytes = random_bytes(&mut cx.rng, &layout);
    let table = layout.dequantize(&bytes)?;
    let ids: Vec<u32> = (0..128).map(|_| (cx.rng.next_u64() % 4096) as u32).collect();
    let rows: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * ENC_HIDDEN..(i as usize + 1) * ENC_HIDDEN].iter().copied()).collect();
    let want = Tensor::new(vec![ids.len(), ENC_HIDDEN], rows)?;
    let want = if cx.dtype == DType::BF16 { round_bf16(&want) } else { want };
    let g = cx.cuda.upload_kept(&layout, &bytes)?;
    let s = format!("128 of {} ({})", shape_str(&[&[4096, ENC_HIDDEN]]), f.name());
    let out = moss_core::backend::ops::EncoderOps::embed(&cx.cuda, &g, &ids);
    cx.judge("embed from a kept table", &s, Kind::Gate, EXACT, "", out, &want, None);
    let out = moss_core::backend::ops::EncoderOps::embed(&cx.twins(|s| s == "moss_dequant_int8_rot"), &g, &ids);
    cx.judge("embed from a kept table, rotation left out", &s, Kind::Control, EXACT, "", out, &want, None);
    Ok(())
}

/// The dequantize kernels' time at the DiT's largest matrix (`ffn_up_gate`, 16384 x 3072) against
/// the bf16 product that follows it.
pub fn time_dequant(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(moss_core::options::Precision::Bf16);
    let mut rng = Rng::new(11);
    let x = c.upload_as(&Tensor::new(vec![TOKENS, DIM], rng.normals(TOKENS * DIM, 1.0))?, DType::BF16)?;
    for f in [
        Format::Ggml(GgmlType::Q8_0),
        Format::Ggml(GgmlType::Q6_K),
        Format::Ggml(GgmlType::Q4_K),
        Format::Int8 { convrot: None },
        Format::Int8 { convrot: Some(256) },
        Format::W4a8 { bits: 4, group: 16, convrot: 256, f32_scales: false },
    ] {
        let layout = Layout::new(DIM, &[(2 * FFN, f)]);
        let w = c.upload_kept(&layout, &random_bytes(&mut rng, &layout))?;
        let deq = time_ms(&c, 5, 20, || c.dequantize(&w, DType::BF16).map(|_| ()))?;
        let lin = time_ms(&c, 5, 20, || c.linear(&x, &w, None).map(|_| ()))?;
        println!("  dequantize {} {}x{DIM}: {deq:.4} ms; linear {TOKENS}x{DIM} · {DIM}x{} with it: {lin:.4} ms", f.name(), 2 * FFN, 2 * FFN);
    }
    Ok(())
}
