//! The kernel gates of `moss check --device cuda`: every CUDA op, on fresh random inputs at the
//! full model's shapes, against the CPU backend (f64 accumulation) by relative L2 error
//! `‖gpu − cpu‖ / ‖cpu‖` with a bound per gate; plus, for every gate, planted controls —
//! deliberately wrong variants (kernels compiled with a bug, `moss_ctl_*`, or the GEMM called
//! with a planted mistake) run through the same comparison, which must reject them.
//!
//! Rules every gate keeps: inputs are rounded to the dtype the GPU reads, so both sides see the
//! same numbers; every GPU allocation is poisoned with NaN first (0xFF bytes), so an element no
//! kernel wrote fails; any non-finite value anywhere in the GPU output fails; NaN never passes.
//!
//! To add a gate (a DiT, encoder or VAE kernel): write `fn gate_x(cx: &mut Cx) -> Result<()>`
//! that draws inputs with [`Cx::input`], computes the CPU twin, and calls [`Cx::judge`] once
//! for the real kernel and once per planted control; then list it in [`GATES`].

use crate::backend::cuda::blas::LinearBug;
use crate::backend::cuda::ops::{par_chunks, Cuda, CudaTensor, DType};
use crate::backend::cpu::{dot, Cpu};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::options::Precision;
use crate::tensor::{rel_l2, Tensor};
use anyhow::{anyhow, ensure, Result};

// ---- bounds (relative L2) --------------------------------------------------------------------

/// Any op whose output is bf16: one rounding to bf16 gives a relative L2 error of about 1.6e-3
/// on random data (unit roundoff 2^-8, the rounding error uniform within the binade), and fp32
/// accumulation adds far less. 4e-3 is 2.5x that floor; errors from a wrong formula are O(1e-1).
pub const BF16_OUT: f64 = 4e-3;
/// fp32 elementwise ops: one fp32 rounding (~6e-8) plus `expf`'s few ulps.
pub const F32_ELEMENTWISE: f64 = 1e-6;
/// fp32 rms_norm: fp32 sum of squares over the row, `rsqrtf` (≤ 2 ulp), two products.
pub const F32_NORM: f64 = 2e-6;
/// fp32 ops with `tanhf`/`expf` chains (SiTU-GLU): a few ulps each.
pub const F32_TRANSCENDENTAL: f64 = 2e-6;
/// fp32 GEMM with fp32 accumulation (TF32 off), K ≤ 16384: rounding grows like u·√K ≈ 1e-5 at
/// worst for sequential sums (cuBLAS's blocked sums do better). TF32 would give ~4e-4.
pub const F32_GEMM: f64 = 2e-5;
/// Copies, permutes, casts with round-to-nearest-even, loads: bit-exact.
pub const EXACT: f64 = 0.0;

/// Query rows the CPU attention reference computes (all heads, all keys, f64).
pub const ATTN_REF_ROWS: usize = 32;

/// Rows of a GEMM output the CPU reference computes (a random subset keeps `moss check` under a
/// minute on a laptop CPU; the GPU output is still checked for non-finite values everywhere).
pub const GEMM_REF_ROWS: usize = 64;

/// The full DiT's shapes (spec 4.1) at 1024x1024 with a 128-token prompt.
pub mod dit {
    /// Joint tokens: 64·64 image tokens + 128 text tokens.
    pub const TOKENS: usize = 4224;
    pub const IMG: usize = 4096;
    pub const TXT: usize = 128;
    pub const DIM: usize = 3072;
    pub const FFN: usize = 8192;
    pub const HEADS: usize = 24;
    pub const HEAD_DIM: usize = 128;
    pub const LATENT: usize = 128;
}
/// The encoder's hidden width (Qwen3.5-9B), for the zero-centred norm.
const ENC_HIDDEN: usize = 4096;

// ---- random numbers ----------------------------------------------------------------------------

/// SplitMix64 with Box-Muller normals: fast, seedable, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    /// `n` normals N(0, std²) (Marsaglia's polar method), generated in parallel chunks each
    /// seeded from one draw of this generator.
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        let base = self.next_u64();
        let mut v = vec![0f32; n];
        par_chunks(&mut v, 1 << 16, |i, out| {
            let mut r = Rng::new(base ^ (i as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
            let mut k = 0;
            while k < out.len() {
                let (a, b) = (2.0 * r.uniform() - 1.0, 2.0 * r.uniform() - 1.0);
                let s = a * a + b * b;
                if s >= 1.0 || s == 0.0 {
                    continue;
                }
                let m = (-2.0 * s.ln() / s).sqrt() * std;
                out[k] = (a * m) as f32;
                if k + 1 < out.len() {
                    out[k + 1] = (b * m) as f32;
                }
                k += 2;
            }
        });
        v
    }
    /// `count` distinct sorted indices below `n`.
    pub fn subset(&mut self, n: usize, count: usize) -> Vec<usize> {
        if count >= n {
            return (0..n).collect();
        }
        let mut picked = std::collections::BTreeSet::new();
        while picked.len() < count {
            picked.insert((self.next_u64() % n as u64) as usize);
        }
        picked.into_iter().collect()
    }
}

/// Every value rounded to bf16 and back (`half`'s round-to-nearest-even: the reference for the
/// GPU's casts), on all cores.
pub fn round_bf16(t: &Tensor) -> Tensor {
    let mut data = t.data.clone();
    par_chunks(&mut data, 1 << 16, |_, c| c.iter_mut().for_each(|v| *v = half::bf16::from_f32(*v).to_f32()));
    Tensor { shape: t.shape.clone(), data }
}

// ---- the table ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gate,
    /// A planted wrong variant: the comparison must reject it.
    Control,
}

pub struct Row {
    pub kernel: String,
    pub precision: &'static str,
    pub shape: String,
    pub kind: Kind,
    pub error: f64,
    pub bound: f64,
    pub note: String,
}

impl Row {
    /// A gate passes if its error is finite and within the bound; a control is good if the
    /// same test rejects it.
    pub fn ok(&self) -> bool {
        let within = self.error.is_finite() && self.error <= self.bound;
        match self.kind {
            Kind::Gate => within,
            Kind::Control => !within,
        }
    }
    pub fn verdict(&self) -> &'static str {
        match (self.kind, self.ok()) {
            (Kind::Gate, true) => "pass",
            (Kind::Gate, false) => "FAIL",
            (Kind::Control, true) => "rejected (ok)",
            (Kind::Control, false) => "ACCEPTED: gate is blind",
        }
    }
}

/// What a gate function works with.
pub struct Cx {
    pub cuda: Cuda,
    pub cpu: Cpu,
    pub rng: Rng,
    /// The dtype activations and weights take at this precision.
    pub dtype: DType,
    pub precision: &'static str,
    pub rows: Vec<Row>,
    pub ck: Option<Checkpoint>,
}

pub fn shape_str(shapes: &[&[usize]]) -> String {
    shapes
        .iter()
        .map(|s| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x"))
        .collect::<Vec<_>>()
        .join(" · ")
}

impl Cx {
    /// The bound of ops whose output is the activation dtype.
    pub fn out_bound(&self, f32_bound: f64) -> f64 {
        match self.dtype {
            DType::BF16 => BF16_OUT,
            DType::F32 => f32_bound,
        }
    }

    /// Random N(0, std²) values as the GPU will read them in `dtype`: the host copy rounded to
    /// that dtype (for the CPU twin) and the uploaded tensor.
    pub fn input_as(&mut self, shape: &[usize], std: f64, dtype: DType) -> Result<(Tensor, CudaTensor)> {
        let t = Tensor::new(shape.to_vec(), self.rng.normals(shape.iter().product(), std))?;
        self.exact(t, dtype)
    }

    pub fn input(&mut self, shape: &[usize], std: f64) -> Result<(Tensor, CudaTensor)> {
        self.input_as(shape, std, self.dtype)
    }

    /// Upload `t` in `dtype` and return the values the GPU holds.
    pub fn exact(&self, t: Tensor, dtype: DType) -> Result<(Tensor, CudaTensor)> {
        let t = if dtype == DType::BF16 { round_bf16(&t) } else { t };
        let g = self.cuda.upload_as(&t, dtype)?;
        Ok((t, g))
    }

    /// Relative L2 error of `gpu` against `cpu`; `rows` (of `gpu` viewed as [rows, last]) when
    /// the CPU computed only those. NaN if anything in the GPU output is not finite.
    pub fn error(&self, gpu: &CudaTensor, cpu: &Tensor, rows: Option<&[usize]>) -> Result<f64> {
        let g = self.cuda.download(gpu)?;
        if g.data.iter().any(|v| !v.is_finite()) {
            return Ok(f64::NAN);
        }
        let picked: Vec<f32>;
        let g = match rows {
            None => &g.data[..],
            Some(rows) => {
                let w = g.last_dim();
                picked = rows.iter().flat_map(|&r| g.data[r * w..(r + 1) * w].iter().copied()).collect();
                &picked[..]
            }
        };
        ensure!(g.len() == cpu.data.len(), "gate: GPU gave {} values, the CPU {}", g.len(), cpu.data.len());
        Ok(rel_l2(g, &cpu.data))
    }

    /// Compare and record one row. A run that fails outright (an error instead of an output)
    /// records NaN: a failed gate, or a rejected control.
    #[allow(clippy::too_many_arguments)]
    pub fn judge(
        &mut self,
        kernel: &str,
        shape: &str,
        kind: Kind,
        bound: f64,
        note: &str,
        out: Result<CudaTensor>,
        cpu: &Tensor,
        rows: Option<&[usize]>,
    ) {
        let (error, note) = match out.and_then(|o| {
            self.cuda.sync()?;
            self.error(&o, cpu, rows)
        }) {
            Ok(e) => (e, note.to_string()),
            Err(e) => (f64::NAN, format!("{note} [error: {e:#}]")),
        };
        let kernel = match kind {
            Kind::Gate => kernel.to_string(),
            Kind::Control => format!("  control: {kernel}"),
        };
        self.rows.push(Row { kernel, precision: self.precision, shape: shape.into(), kind, error, bound, note });
    }
}

impl Cx {
    /// Record one row whose error was computed by the caller (NaN: failed / rejected).
    pub fn judge_value(&mut self, kernel: &str, shape: &str, kind: Kind, bound: f64, note: &str, error: f64) {
        let kernel = match kind {
            Kind::Gate => kernel.to_string(),
            Kind::Control => format!("  control: {kernel}"),
        };
        self.rows.push(Row { kernel, precision: self.precision, shape: shape.into(), kind, error, bound, note: note.into() });
    }
}

// ---- the gates ---------------------------------------------------------------------------------

/// One gate family: the real kernel's rows and its controls' rows.
pub type GateFn = fn(&mut Cx) -> Result<()>;

/// Every gate, in table order. Later kernels (DiT, encoder, VAE) add their rows here.
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
    ("dit rms_norm_modulate", gate_rms_mod),
    ("dit qk_norm_rope", gate_qk_rope),
    ("dit attention", gate_attention),
    ("dit situ_glu", gate_situ),
    ("dit gated_residual", gate_gres),
    ("cfg_euler", gate_cfg_euler),
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
    let out = cx.cuda.cast_with(&gx, DType::BF16, "moss_ctl");
    cx.judge("cast f32->bf16 truncating", &s, Kind::Control, EXACT, "", out, &want, None);
    // bf16 → f32: exact widening.
    let (x, gx) = cx.input_as(&shape, 3.0, DType::BF16)?;
    let out = cx.cuda.cast(&gx, DType::F32);
    cx.judge("cast bf16->f32", &s, Kind::Gate, EXACT, "", out, &x, None);
    let out = cx.cuda.cast_with(&gx, DType::F32, "moss_ctl");
    cx.judge("cast bf16->f32 without the shift", &s, Kind::Control, EXACT, "", out, &x, None);
    Ok(())
}

/// The pinned staging path of `load`: 2½ chunks of random bytes, bit-exact.
fn gate_upload(cx: &mut Cx) -> Result<()> {
    if cx.dtype != DType::BF16 {
        return Ok(());
    }
    let n = crate::backend::cuda::ops::STAGING_CHUNK * 5 / 2 / 2 + 77; // bf16 values, an odd tail
    let s = format!("{n} bf16 (staged)");
    let t = round_bf16(&Tensor::new(vec![n], cx.rng.normals(n, 1.0))?);
    let bytes = crate::backend::cuda::ops::to_bytes(&t.data, DType::BF16);
    for (kind, drop_tail, what) in [(Kind::Gate, false, "upload (pinned staging)"), (Kind::Control, true, "staging drops the last chunk")] {
        let out = cx.cuda.alloc(DType::BF16, &[n]).and_then(|o| {
            cx.cuda.write_bytes(o.ptr(), &bytes, drop_tail)?;
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
    use crate::backend::cuda::ops::{Download, DOWNLOAD_CHUNK};
    let es = cx.dtype.size();
    let n = DOWNLOAD_CHUNK * 7 / 2 / es + 77;
    let s = format!("{n} {} ({} chunks)", cx.dtype.name(), (n * es).div_ceil(DOWNLOAD_CHUNK));
    let (t, g) = cx.input(&[n], 1.0)?;
    let modes = [
        (Kind::Gate, Download::Pageable, "download (pageable)"),
        (Kind::Gate, Download::Pinned { drop_tail: false }, "download (pinned chunks)"),
        (Kind::Control, Download::Pinned { drop_tail: true }, "pinned download drops the last chunk"),
    ];
    for (kind, mode, what) in modes {
        // Twice: the second call reuses the slots and their events.
        for rep in 0..2 {
            let error = match cx.cuda.download_with(&g, mode) {
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
                match cx.cuda.load_with(&c, name, shift).and_then(|g| cx.cuda.download(&g)) {
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
        for (i, (kind, what)) in [(Kind::Gate, format!("load {comp}")), (Kind::Control, format!("load {comp}, one element late"))]
            .into_iter()
            .enumerate()
        {
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
        let out = cx.cuda.linear_with(&gx, &gw, gb.as_ref(), LinearBug::None);
        cx.judge("linear (cuBLASLt)", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
        for (bug, what) in controls {
            let out = cx.cuda.linear_with(&gx, &gw, gb.as_ref(), bug);
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
        let out = cx.cuda.binary_with(op, &ga, &gb, "moss");
        cx.judge(&name, &s, Kind::Gate, bound, "", out, &want, None);
        let out = cx.cuda.binary_with(op, &ga, &gb, "moss_ctl");
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
        let out = cx.cuda.unary_with(op, &gx, "moss");
        cx.judge(op, &s, Kind::Gate, bound, "", out, &want, None);
        let out = cx.cuda.unary_with(op, &gx, "moss_ctl");
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
        let w: Vec<f32> = (0..d)
            .map(|_| if one_plus { cx.rng.normals(1, 0.1)[0] } else { (0.5 + cx.rng.uniform()) as f32 })
            .collect();
        let (w, gw) = cx.exact(Tensor::new(vec![d], w)?, cx.dtype)?;
        let eps = 1e-6;
        let want = cx.cpu.rms_norm(&x, Some(&w), eps, one_plus)?;
        let s = shape_str(&[&[rows, d]]);
        let name = if one_plus { "rms_norm (1+w)" } else { "rms_norm" };
        let out = cx.cuda.rms_norm_with(&gx, Some(&gw), eps, one_plus, "moss_rms_norm");
        cx.judge(name, &s, Kind::Gate, bound, "", out, &want, None);
        let (ctl, what) = if one_plus {
            ("moss_ctl_rms_noplus", "rms_norm, w instead of 1+w")
        } else {
            ("moss_ctl_rms_noweight", "rms_norm without the weight")
        };
        let out = cx.cuda.rms_norm_with(&gx, Some(&gw), eps, one_plus, ctl);
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
    for (shape, dim, start, len) in
        [(vec![TOKENS, DIM], 0, IMG, TXT), (vec![TOKENS, 3 * DIM], 1, DIM, DIM), (vec![TOKENS, 2 * FFN], 1, FFN, FFN)]
    {
        let (x, gx) = cx.input(&shape, 1.0)?;
        let want = cx.cpu.narrow(&x, dim, start, len)?;
        let s = format!("{} dim {dim} [{start}..+{len}]", shape_str(&[&shape]));
        let out = cx.cuda.narrow_with(&gx, dim, start, len, "moss");
        cx.judge("narrow", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = cx.cuda.narrow_with(&gx, dim, start, len, "moss_ctlsrc");
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
        let out = cx.cuda.cat_with(&[&gx, &gy], dim, "moss");
        cx.judge("cat", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = cx.cuda.cat_with(&[&gx, &gy], dim, "moss_ctl");
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
        let out = cx.cuda.permute_with(&gx, &perm, "moss");
        cx.judge("permute", &s, Kind::Gate, EXACT, "", out, &want, None);
        let out = cx.cuda.permute_with(&gx, &perm, "moss_ctl");
        cx.judge("permute as a plain copy", &s, Kind::Control, EXACT, "", out, &want, None);
    }
    Ok(())
}

// ---- the DiT's fused ops (CPU twins in backend/cpu/dit.rs) ------------------------------------

/// `[rows, d]` normals with per-row scales spread over e^±2, like a residual stream.
pub(crate) fn stream_rows(cx: &mut Cx, rows: usize, d: usize) -> Result<Tensor> {
    let scales: Vec<f32> = (0..rows).map(|_| (cx.rng.uniform() * 4.0 - 2.0).exp() as f32).collect();
    let mut x = Tensor::new(vec![rows, d], cx.rng.normals(rows * d, 1.0))?;
    for (r, row) in x.data.chunks_mut(d).enumerate() {
        row.iter_mut().for_each(|v| *v *= scales[r]);
    }
    Ok(x)
}

pub(crate) fn uniform_vec(cx: &mut Cx, d: usize, lo: f64, hi: f64) -> Result<(Tensor, CudaTensor)> {
    let v: Vec<f32> = (0..d).map(|_| (lo + (hi - lo) * cx.rng.uniform()) as f32).collect();
    cx.exact(Tensor::new(vec![d], v)?, cx.dtype)
}

fn gate_rms_mod(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let x = stream_rows(cx, TOKENS, DIM)?;
    let (x, gx) = cx.exact(x, cx.dtype)?;
    let (w, gw) = uniform_vec(cx, DIM, 0.5, 1.5)?;
    let (sh, gsh) = cx.input(&[DIM], 1.0)?;
    let (sc, gsc) = cx.input(&[DIM], 1.0)?;
    let want = cx.cpu.rms_norm_modulate(&x, &w, &sh, &sc, 1e-6)?;
    let s = shape_str(&[&[TOKENS, DIM], &[DIM]]);
    let bound = cx.out_bound(F32_NORM);
    let out = cx.cuda.rms_norm_modulate_with(&gx, &gw, &gsh, &gsc, 1e-6, "moss");
    cx.judge("rms_norm_modulate", &s, Kind::Gate, bound, "", out, &want, None);
    let out = cx.cuda.rms_norm_modulate_with(&gx, &gw, &gsh, &gsc, 1e-6, "moss_ctl");
    cx.judge("rms_norm_modulate, scale without the 1+", &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

fn gate_qk_rope(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let half = HEAD_DIM / 2;
    let x = stream_rows(cx, TOKENS * HEADS, HEAD_DIM)?;
    let (x, gx) = cx.exact(Tensor::new(vec![TOKENS, HEADS, HEAD_DIM], x.data)?, cx.dtype)?;
    let (w, gw) = uniform_vec(cx, HEAD_DIM, 0.5, 1.5)?;
    let theta: Vec<f64> = (0..TOKENS * half).map(|_| cx.rng.uniform() * 200.0 - 100.0).collect();
    let (c, gc) = cx.exact(Tensor::new(vec![TOKENS, half], theta.iter().map(|t| t.cos() as f32).collect())?, cx.dtype)?;
    let (sn, gs) = cx.exact(Tensor::new(vec![TOKENS, half], theta.iter().map(|t| t.sin() as f32).collect())?, cx.dtype)?;
    let want = cx.cpu.qk_norm_rope(&x, &w, &c, &sn, 1e-6)?;
    let s = shape_str(&[&[TOKENS, HEADS, HEAD_DIM], &[TOKENS, half]]);
    let bound = cx.out_bound(F32_NORM);
    let out = cx.cuda.qk_norm_rope_with(&gx, &gw, &gc, &gs, 1e-6, "moss");
    cx.judge("qk_norm_rope", &s, Kind::Gate, bound, "", out, &want, None);
    let out = cx.cuda.qk_norm_rope_with(&gx, &gw, &gc, &gs, 1e-6, "moss_ctl");
    cx.judge("qk_norm_rope, rotating the other way", &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

/// The CPU twin's attention (f64 scores, max, exp-weighted sum) for the query `rows` only.
pub(crate) fn attention_rows(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, rows: &[usize]) -> Result<Tensor> {
    let (n, nh, hd) = (q.shape[0], q.shape[1], q.shape[2]);
    let mut out = vec![0f32; rows.len() * nh * hd];
    crate::backend::cpu::par_rows(&mut out, nh * hd, |r, row| {
        let i = rows[r];
        let mut s = vec![0f64; n];
        for h in 0..nh {
            let qr = &q.data[(i * nh + h) * hd..][..hd];
            let mut max = f64::NEG_INFINITY;
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = scale * dot(qr, &k.data[(j * nh + h) * hd..][..hd]);
                max = max.max(*sj);
            }
            let mut acc = vec![0f64; hd];
            let mut sum = 0f64;
            for (j, &sj) in s.iter().enumerate() {
                let p = (sj - max).exp();
                sum += p;
                for (a, &vv) in acc.iter_mut().zip(&v.data[(j * nh + h) * hd..][..hd]) {
                    *a += p * vv as f64;
                }
            }
            for (o, a) in row[h * hd..(h + 1) * hd].iter_mut().zip(&acc) {
                *o = (a / sum) as f32;
            }
        }
    });
    Tensor::new(vec![rows.len(), nh * hd], out)
}

fn gate_attention(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let shape = [TOKENS, HEADS, HEAD_DIM];
    let (q, gq) = cx.input(&shape, 2.0)?;
    let (k, gk) = cx.input(&shape, 1.0)?;
    let (v, gv) = cx.input(&shape, 1.0)?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let rows = cx.rng.subset(TOKENS, ATTN_REF_ROWS);
    let want = attention_rows(&q, &k, &v, scale, &rows)?;
    let s = shape_str(&[&shape]);
    let bound = cx.out_bound(F32_GEMM);
    let note = format!("CPU on {} of {TOKENS} query rows", rows.len());
    let cu = cx.cuda.clone();
    let view = |t: Result<CudaTensor>| t.and_then(|t| cu.reshape(&t, &[TOKENS, HEADS * HEAD_DIM]));
    let out = view(cx.cuda.attention_with(&gq, &gk, &gv, scale, "moss"));
    cx.judge("attention (cuBLASLt + softmax)", &s, Kind::Gate, bound, &note, out, &want, Some(&rows));
    let out = view(cx.cuda.attention_with(&gq, &gk, &gv, scale, "moss_ctl"));
    cx.judge("attention, normaliser short of 64 keys", &s, Kind::Control, bound, &note, out, &want, Some(&rows));
    let out = view(cx.cuda.attention_with(&gq, &gk, &gv, 1.0, "moss"));
    cx.judge("attention without the 1/sqrt(hd) scale", &s, Kind::Control, bound, &note, out, &want, Some(&rows));
    // The subset reference is the CPU twin's loop: confirm on a size the twin itself can do.
    if cx.dtype == DType::F32 {
        let small = [96, 2, HEAD_DIM];
        let (a, b, c) = (
            Tensor::new(small.to_vec(), cx.rng.normals(96 * 2 * HEAD_DIM, 2.0))?,
            Tensor::new(small.to_vec(), cx.rng.normals(96 * 2 * HEAD_DIM, 1.0))?,
            Tensor::new(small.to_vec(), cx.rng.normals(96 * 2 * HEAD_DIM, 1.0))?,
        );
        let all: Vec<usize> = (0..96).collect();
        let twin = cx.cpu.attention(&a, &b, &c, scale)?;
        let mine = attention_rows(&a, &b, &c, scale, &all)?;
        ensure!(rel_l2(&mine.data, &twin.data) == 0.0, "the gate's row-subset attention reference differs from the CPU twin");
    }
    Ok(())
}

fn gate_situ(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let shape = [TOKENS, 2 * FFN];
    let (x, gx) = cx.input(&shape, 4.0)?;
    let want = cx.cpu.situ_glu(&x)?;
    let s = shape_str(&[&shape]);
    let bound = cx.out_bound(F32_TRANSCENDENTAL);
    // bf16 runs the fast form (`moss_situ_fast_bf16`), fp32 the libm one.
    let what = if cx.dtype == DType::BF16 { " (fast form)" } else { "" };
    let out = cx.cuda.situ_glu_with(&gx, "moss");
    cx.judge(&format!("situ_glu{what}"), &s, Kind::Gate, bound, "", out, &want, None);
    let out = cx.cuda.situ_glu_with(&gx, "moss_ctl");
    cx.judge(&format!("situ_glu{what}, up and gate swapped"), &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

fn gate_gres(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let (x, gx) = cx.input(&[TOKENS, DIM], 1.0)?;
    let (y, gy) = cx.input(&[TOKENS, DIM], 1.0)?;
    let (g, gg) = cx.input(&[DIM], 1.0)?;
    let want = cx.cpu.gated_residual(&x, &y, &g)?;
    let s = shape_str(&[&[TOKENS, DIM], &[DIM]]);
    let bound = cx.out_bound(F32_ELEMENTWISE);
    let out = cx.cuda.gated_residual_with(&gx, &gy, &gg, "moss");
    cx.judge("gated_residual", &s, Kind::Gate, bound, "", out, &want, None);
    let out = cx.cuda.gated_residual_with(&gx, &gy, &gg, "moss_ctl");
    cx.judge("gated_residual with 1+gate", &s, Kind::Control, bound, "", out, &want, None);
    Ok(())
}

fn gate_cfg_euler(cx: &mut Cx) -> Result<()> {
    use dit::*;
    if cx.dtype != DType::F32 {
        return Ok(()); // the latents and the update are f32 at either precision
    }
    let shape = [1, LATENT, 64, 64];
    let (x, gx) = cx.input(&shape, 1.0)?;
    let (c, gc) = cx.input(&shape, 1.0)?;
    let (u, gu) = cx.input(&shape, 1.0)?;
    let (g, ds) = (3.0f32, -0.05f32);
    let s = shape_str(&[&shape]);
    let want = cx.cpu.cfg_euler(&x, &c, Some(&u), g, ds)?;
    let out = cx.cuda.cfg_euler_with(&gx, &gc, Some(&gu), g, ds, false);
    cx.judge("cfg_euler", &s, Kind::Gate, F32_ELEMENTWISE, "", out, &want, None);
    let out = cx.cuda.cfg_euler_with(&gx, &gc, Some(&gu), g, ds, true);
    cx.judge("cfg_euler, cond and uncond swapped", &s, Kind::Control, F32_ELEMENTWISE, "", out, &want, None);
    let want = cx.cpu.cfg_euler(&x, &c, None, g, ds)?;
    let out = cx.cuda.cfg_euler_with(&gx, &gc, None, g, ds, false);
    cx.judge("cfg_euler (no uncond)", &s, Kind::Gate, F32_ELEMENTWISE, "", out, &want, None);
    let out = cx.cuda.cfg_euler_with(&gx, &gc, None, g, -ds, false);
    cx.judge("cfg_euler stepping backwards", &s, Kind::Control, F32_ELEMENTWISE, "", out, &want, None);
    Ok(())
}

// ---- the run -----------------------------------------------------------------------------------

/// Run every gate at bf16 and at fp32; print the table; true if every gate passed and every
/// control was rejected.
pub fn run_all(cuda: &Cuda, ck: Option<&Checkpoint>, seed: u64) -> bool {
    println!("kernel gates: relative L2 vs the CPU backend (f64 accumulation), fresh random inputs (seed {seed}),");
    println!("  outputs poisoned with NaN before each run; GEMM references on {GEMM_REF_ROWS} random rows of each output");
    println!("  (the whole GPU output is still checked for NaN/Inf); each control is a planted bug that must be rejected");
    if let Err(e) = cuda.load_check_image() {
        println!("kernel gates: {e:#}");
        return false;
    }
    cuda.set_poison(true);
    let mut rows = vec![];
    let mut rng = Rng::new(seed);
    crate::backend::cuda::select::print(cuda);
    for p in [Precision::Bf16, Precision::Fp32] {
        let c = cuda.with_precision(p);
        let mut cx = Cx {
            cuda: c,
            cpu: Cpu,
            rng: Rng::new(rng.next_u64()),
            dtype: DType::of(p),
            precision: if p == Precision::Bf16 { "bf16" } else { "fp32" },
            rows: vec![],
            ck: ck.cloned(),
        };
        for (name, f) in GATES.iter().chain(crate::backend::cuda::check::encoder::GATES).chain(crate::backend::cuda::check::dit::GATES).chain(crate::backend::cuda::check::vae::GATES) {
            let t = std::time::Instant::now();
            if let Err(e) = f(&mut cx) {
                cx.rows.push(Row {
                    kernel: name.to_string(),
                    precision: cx.precision,
                    shape: "-".into(),
                    kind: Kind::Gate,
                    error: f64::NAN,
                    bound: 0.0,
                    note: format!("[error: {e:#}]"),
                });
            }
            if std::env::var_os("MOSS_CHECK_VERBOSE").is_some() {
                eprintln!("  {name} ({}): {:.1} s", cx.precision, t.elapsed().as_secs_f64());
            }
        }
        rows.extend(cx.rows);
    }
    cuda.set_poison(false);
    print_table(&rows);
    let bad = rows.iter().filter(|r| !r.ok()).count();
    let gates = rows.iter().filter(|r| r.kind == Kind::Gate).count();
    let controls = rows.len() - gates;
    println!(
        "kernel gates: {} of {gates} passed, {} of {controls} controls rejected",
        rows.iter().filter(|r| r.kind == Kind::Gate && r.ok()).count(),
        rows.iter().filter(|r| r.kind == Kind::Control && r.ok()).count()
    );
    bad == 0
}

pub fn print_table(rows: &[Row]) {
    println!("{:<50} {:<5} {:<34} {:>10} {:>8}  verdict", "kernel", "prec", "shape", "error", "bound");
    for r in rows {
        let err = if r.error.is_nan() { "NaN".to_string() } else { format!("{:.2e}", r.error) };
        println!(
            "{:<50} {:<5} {:<34} {:>10} {:>8.1e}  {}{}",
            r.kernel,
            r.precision,
            r.shape,
            err,
            r.bound,
            r.verdict(),
            if r.note.is_empty() { String::new() } else { format!("  ({})", r.note) }
        );
    }
}

// ---- timing ------------------------------------------------------------------------------------

/// Median milliseconds of `f` over `reps` runs after `warmup`, by CUDA events on the stream.
pub fn time_ms(cuda: &Cuda, warmup: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let ctx = &cuda.gpu().ctx;
    let stream = &cuda.gpu().stream;
    for _ in 0..warmup {
        f()?;
    }
    cuda.sync()?;
    let mut times = vec![];
    for _ in 0..reps {
        // Timing events (None would give CU_EVENT_DISABLE_TIMING).
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = ctx.new_event(timed).map_err(|e| anyhow!("{e:?}"))?;
        let b = ctx.new_event(timed).map_err(|e| anyhow!("{e:?}"))?;
        a.record(stream).map_err(|e| anyhow!("{e:?}"))?;
        f()?;
        b.record(stream).map_err(|e| anyhow!("{e:?}"))?;
        b.synchronize().map_err(|e| anyhow!("{e:?}"))?;
        times.push(a.elapsed_ms(&b).map_err(|e| anyhow!("{e:?}"))? as f64);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(times[times.len() / 2])
}

/// moss's bf16 `linear` at the DiT's GEMM shapes and its attention at the DiT's full size (the
/// numbers bench/linear_torch.py compares).
pub fn time_ops(cuda: &Cuda) -> Result<()> {
    use dit::*;
    let c = cuda.with_precision(Precision::Bf16);
    let mut rng = Rng::new(7);
    println!("timing: moss, bf16, CUDA events, median of 50 after 10 warm-up runs");
    for (m, k, n) in [(TOKENS, DIM, DIM), (TOKENS, DIM, 2 * FFN)] {
        let x = c.upload_as(&Tensor::new(vec![m, k], rng.normals(m * k, 1.0))?, DType::BF16)?;
        let w = c.upload_as(&Tensor::new(vec![n, k], rng.normals(n * k, 0.02))?, DType::BF16)?;
        let ms = time_ms(&c, 10, 50, || c.linear(&x, &w, None).map(|_| ()))?;
        let tflops = 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
        println!("  linear {m}x{k} · {k}x{n}: {ms:.4} ms  ({tflops:.0} TFLOP/s)");
    }
    let shape = [TOKENS, HEADS, HEAD_DIM];
    let qkv: Vec<CudaTensor> = (0..3)
        .map(|_| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(TOKENS * DIM, 1.0))?, DType::BF16))
        .collect::<Result<_>>()?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let ms = time_ms(&c, 10, 50, || c.attention(&qkv[0], &qkv[1], &qkv[2], scale).map(|_| ()))?;
    let tflops = 4.0 * (TOKENS * TOKENS * DIM) as f64 / (ms * 1e-3) / 1e12;
    println!("  attention {TOKENS}x{HEADS}x{HEAD_DIM} (cuBLASLt + softmax): {ms:.4} ms  ({tflops:.0} TFLOP/s)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_judge_gates_and_controls() {
        let row = |kind, error| Row {
            kernel: "k".into(),
            precision: "bf16",
            shape: "-".into(),
            kind,
            error,
            bound: 1e-3,
            note: String::new(),
        };
        assert!(row(Kind::Gate, 5e-4).ok());
        assert!(!row(Kind::Gate, 2e-3).ok());
        assert!(!row(Kind::Gate, f64::NAN).ok(), "NaN never passes");
        assert!(row(Kind::Control, 2e-3).ok());
        assert!(row(Kind::Control, f64::NAN).ok(), "a NaN control is rejected");
        assert!(!row(Kind::Control, 5e-4).ok(), "a control within the bound means the gate is blind");
        let exact = Row { bound: 0.0, ..row(Kind::Gate, 0.0) };
        assert!(exact.ok());
    }

    #[test]
    fn rng_normals_and_subsets() {
        let mut r = Rng::new(1);
        let v = r.normals(100_001, 2.0);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        println!("mean {mean:.4} var {var:.4}");
        assert!(mean.abs() < 0.03 && (var - 4.0).abs() < 0.1);
        let s = r.subset(4224, 64);
        assert_eq!(s.len(), 64);
        assert!(s.windows(2).all(|w| w[0] < w[1]) && *s.last().unwrap() < 4224);
    }
}
