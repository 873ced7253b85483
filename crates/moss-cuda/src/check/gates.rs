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
//! for the real kernel and once per planted control; then list it in its module's `GATES` table
//! (chained in [`run_all`]).

use crate::ops::{par_chunks, Cuda, CudaTensor, DType};
use anyhow::{anyhow, ensure, Result};
use moss_core::backend::cpu::Cpu;
use moss_core::backend::ops::DitOps;
use moss_core::backend::Backend;
use moss_core::checkpoint::Checkpoint;
use moss_core::options::Precision;
use moss_core::tensor::{rel_l2, Tensor};

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
pub(crate) const ENC_HIDDEN: usize = 4096;

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
    shapes.iter().map(|s| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")).collect::<Vec<_>>().join(" · ")
}

impl Cx {
    /// The bound of ops whose output is the activation dtype.
    pub fn out_bound(&self, f32_bound: f64) -> f64 {
        match self.dtype {
            DType::F32 => f32_bound,
            _ => BF16_OUT,
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
    pub fn judge(&mut self, kernel: &str, shape: &str, kind: Kind, bound: f64, note: &str, out: Result<CudaTensor>, cpu: &Tensor, rows: Option<&[usize]>) {
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

pub(crate) use super::dit_ops::{attention_rows, stream_rows, uniform_vec};

// ---- the run -----------------------------------------------------------------------------------

/// Run every gate at bf16 and at fp32; print the table; true if every gate passed and every
/// control was rejected.
pub fn run_all(cuda: &Cuda, ck: Option<&Checkpoint>, seed: u64, verbose: bool) -> bool {
    println!("kernel gates: relative L2 vs the CPU backend (f64 accumulation), fresh random inputs (seed {seed}),");
    println!("  outputs poisoned with NaN before each run; GEMM references on {GEMM_REF_ROWS} random rows of each output");
    println!("  (the whole GPU output is still checked for NaN/Inf); each control is a planted bug that must be rejected");
    if let Err(e) = cuda.load_check_image() {
        println!("kernel gates: {e:#}");
        return false;
    }
    cuda.set_poison(true);
    // MOSS_CHECK_ONLY=TEXT: only the gate families whose name holds TEXT (a developer's quick run;
    // the table then says so)
    let only = std::env::var("MOSS_CHECK_ONLY").ok().filter(|o| !o.is_empty());
    if let Some(o) = &only {
        println!("kernel gates: only the families whose name holds `{o}` (MOSS_CHECK_ONLY)");
    }
    let mut rows = vec![];
    let mut rng = Rng::new(seed);
    crate::select::print(cuda);
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
        for (name, f) in super::tensor::GATES
            .iter()
            .chain(super::dit_ops::GATES)
            .chain(super::linear_situ_glu::GATES)
            .chain(super::linear_situ_glu_fp8::GATES)
            .chain(super::linear_qkv_norm_rope::GATES)
            .chain(crate::check::encoder::GATES)
            .chain(crate::check::dit::GATES)
            .chain(crate::check::vae::GATES)
            .chain(crate::check::vae_encode::GATES)
            .chain(crate::check::lora::GATES)
            .chain(crate::check::quant::GATES)
            .chain(super::fp8::GATES)
            .chain(super::fp8_act::GATES)
            .chain(super::int8::GATES)
            .filter(|(name, _)| only.as_deref().is_none_or(|o| name.contains(o)))
        {
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
            if verbose {
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
/// numbers the since-deleted bench/linear_torch.py compared).
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
    let qkv: Vec<CudaTensor> =
        (0..3).map(|_| c.upload_as(&Tensor::new(shape.to_vec(), rng.normals(TOKENS * DIM, 1.0))?, DType::BF16)).collect::<Result<_>>()?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let ms = time_ms(&c, 10, 50, || c.attention(&qkv[0], &qkv[1], &qkv[2], scale).map(|_| ()))?;
    let tflops = 4.0 * (TOKENS * TOKENS * DIM) as f64 / (ms * 1e-3) / 1e12;
    println!("  attention {TOKENS}x{HEADS}x{HEAD_DIM} (q, k, v apart): {ms:.4} ms  ({tflops:.0} TFLOP/s)");
    // as the DiT runs it: out of the packed [N, 3·D] projection, after the QK-norm + RoPE
    let qkv = c.upload_as(&Tensor::new(vec![TOKENS, 3 * DIM], rng.normals(TOKENS * 3 * DIM, 1.0))?, DType::BF16)?;
    let ms = time_ms(&c, 10, 50, || c.attention_packed(&qkv, HEADS, scale).map(|_| ()))?;
    let tflops = 4.0 * (TOKENS * TOKENS * DIM) as f64 / (ms * 1e-3) / 1e12;
    println!("  attention {TOKENS}x{HEADS}x{HEAD_DIM} (packed q|k|v): {ms:.4} ms  ({tflops:.0} TFLOP/s)");
    super::dit::time_stream(&c)?;
    super::linear_situ_glu::time_linear_situ(&c)?;
    super::linear_situ_glu_fp8::time_linear_situ_fp8(&c)?;
    super::linear_qkv_norm_rope::time_linear_qkv(&c)?;
    super::lora::time_merge(&c)?;
    super::quant::time_dequant(&c)?;
    super::fp8::time_fp8(&c)?;
    super::fp8_act::time_fp8_act(&c)?;
    super::int8::time_int8(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_judge_gates_and_controls() {
        let row = |kind, error| Row { kernel: "k".into(), precision: "bf16", shape: "-".into(), kind, error, bound: 1e-3, note: String::new() };
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
