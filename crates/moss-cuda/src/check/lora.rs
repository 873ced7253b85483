//! Gates of the LoRA merge (`cuda/dit/lora_merge.cu`) at the DiT's weight shapes: the merged
//! weight's stored bits must equal the host merge's (`lora::merge::merge_tensor`, the CPU
//! backend's) in every element, and stay within the output rounding of an fp64 reference on random
//! rows. The planted control rounds the update to bf16 before adding it (two roundings).

use super::gates::*;
use crate::ops::{to_bytes, CudaTensor, DType};
use anyhow::Result;
use moss_core::checkpoint::Dtype;
use moss_core::lora::keys::{Delta, Factor, Mat, Module};
use moss_core::lora::merge::{merge_tensor, operands, Operands, Part};
use moss_core::lora::Term;
use moss_core::tensor::Tensor;

/// The merge's gates, in table order.
pub const GATES: &[(&str, GateFn)] = &[("lora merge (low rank)", gate_low_rank), ("lora merge (LoHa, LoKr, diff)", gate_other)];

fn mat(cx: &mut Cx, rows: usize, cols: usize, std: f64) -> Mat {
    Mat::new(vec![rows, cols], cx.rng.normals(rows * cols, std))
}

/// A module onto `targets` (name, shape) with `delta`.
fn module(targets: &[(&str, Vec<usize>)], delta: Delta) -> Module {
    Module { key: "gate".into(), targets: targets.iter().map(|(n, s)| (n.to_string(), s.clone())).collect(), delta }
}

/// A rank-`r` update of a `[rows, cols]` weight, about a third of the weight's size.
fn low_rank(cx: &mut Cx, rows: usize, cols: usize, r: usize, alpha: f32) -> Delta {
    Delta::LowRank { up: mat(cx, rows, r, 0.02), down: mat(cx, r, cols, 0.2), alpha: Some(alpha) }
}

/// `m`'s values rounded to `dtype` and kept as the bytes an adapter file stores (the merge
/// uploads stored bf16 and f32 as they are and widens bf16 on the device; f16 converts on the host).
fn stored(m: Mat, dtype: Dtype) -> Mat {
    let v = m.values();
    let bytes: Vec<u8> = match dtype {
        Dtype::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
        Dtype::F16 => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let n = bytes.len();
    Mat::stored(m.shape.clone(), dtype, std::sync::Arc::new(bytes), 0..n).expect("bytes of the tensor's size")
}

/// [`low_rank`] with both factors stored as `dtype`.
fn low_rank_stored(cx: &mut Cx, rows: usize, cols: usize, r: usize, alpha: f32, dtype: Dtype) -> Delta {
    let (up, down) = (stored(mat(cx, rows, r, 0.02), dtype), stored(mat(cx, r, cols, 0.2), dtype));
    Delta::LowRank { up, down, alpha: Some(alpha) }
}

/// Rows `rows` of `W + Σ scale · alpha/rank · delta`, every product and sum in f64.
fn reference_rows(w: &Tensor, terms: &[Term], rows: &[usize]) -> Result<Tensor> {
    let cols = w.numel() / w.shape[0];
    // One row of `a` (rank r) times `b` [r, m].
    let prod = |a: &Part, b: &Part| -> Vec<f64> {
        let (ad, bd) = (a.data.f32(), b.data.f32());
        (0..b.cols).map(|j| (0..a.cols).map(|k| ad[k] as f64 * bd[k * b.cols + j] as f64).sum()).collect()
    };
    let mut out = Vec::with_capacity(rows.len() * cols);
    for &i in rows {
        let mut row: Vec<f64> = w.data[i * cols..(i + 1) * cols].iter().map(|&v| v as f64).collect();
        for t in terms {
            let (ops, fs) = operands(&Term { row0: t.row0 + i, ..*t }, 1)?;
            let d: Vec<f64> = match &ops {
                Operands::LowRank { up, down } => prod(up, down),
                Operands::LoHa { w1a, w1b, w2a, w2b } => prod(w1a, w1b).iter().zip(prod(w2a, w2b)).map(|(x, y)| x * y).collect(),
                Operands::Kron { a, b, row0 } => {
                    let (ac, br, bc) = (a.cols, b.rows, b.cols);
                    let (ad, bd) = (a.data.f32(), b.data.f32());
                    (0..cols).map(|j| ad[(row0 / br) * ac + j / bc] as f64 * bd[(row0 % br) * bc + j % bc] as f64).collect()
                }
            };
            row.iter_mut().zip(d).for_each(|(o, x)| *o += t.scale as f64 * fs as f64 * x);
        }
        out.extend(row.iter().map(|&v| v as f32));
    }
    Tensor::new(vec![rows.len(), cols], out)
}

/// One case: a random weight of `shape` (stored in the run's dtype) merged with `terms` on the
/// GPU, against the host merge (bit for bit) and the fp64 reference; then the control.
fn judge_case(cx: &mut Cx, what: &str, shape: &[usize], terms: &[Term]) -> Result<()> {
    let stored = if cx.dtype == DType::BF16 { Dtype::BF16 } else { Dtype::F32 };
    let (w, _) = cx.input(shape, 0.02)?;
    let mut host = w.clone();
    merge_tensor(&mut host.data, shape, stored, terms)?;
    // A vector (a bias) is checked whole; a matrix on random rows.
    let rows = if shape.len() == 1 { (0..shape[0]).collect() } else { cx.rng.subset(shape[0], GEMM_REF_ROWS) };
    let picked = if shape.len() == 1 { None } else { Some(&rows[..]) };
    let reference = reference_rows(&w, terms, &rows)?;
    let ranks: Vec<String> = terms.iter().map(|t| describe(t.module)).collect();
    let s = format!("{} + {}", shape_str(&[shape]), ranks.join(" + "));
    // `planted`: the merge kernels' twins (the update rounded before the add)
    let run = |cx: &mut Cx, planted: bool| -> Result<CudaTensor> {
        let (_, g) = cx.exact(w.clone(), cx.dtype)?;
        let cu = if planted { cx.twins(|s| s.starts_with("moss_lora_")) } else { cx.cuda.clone() };
        cu.merge_lora_into(&g, terms)?;
        Ok(g)
    };
    // The share of elements whose stored bits differ from the host merge's (NaN: no output).
    let want = to_bytes(&host.data, cx.dtype);
    let differ = |cx: &mut Cx, planted: bool| -> f64 {
        let es = cx.dtype.size();
        match run(cx, planted).and_then(|g| cx.cuda.download_bytes(&g)) {
            Ok(b) if b.len() == want.len() => b.chunks(es).zip(want.chunks(es)).filter(|(x, y)| x != y).count() as f64 / (b.len() / es) as f64,
            _ => f64::NAN,
        }
    };
    let e = differ(cx, false);
    cx.judge_value(&format!("{what} = host merge"), &s, Kind::Gate, EXACT, "share of elements whose bits differ", e);
    let out = run(cx, false);
    let bound = cx.out_bound(F32_GEMM);
    cx.judge(&format!("{what} vs fp64"), &s, Kind::Gate, bound, "", out, &reference, picked);
    let e = differ(cx, true);
    cx.judge_value(&format!("{what}, update rounded before the add"), &s, Kind::Control, EXACT, "", e);
    Ok(())
}

fn describe(m: &Module) -> String {
    match &m.delta {
        Delta::LowRank { down, .. } => format!("rank {}", down.shape[0]),
        Delta::LoHa { w1b, .. } => format!("LoHa rank {}", w1b.shape[0]),
        Delta::LoKr { w1, .. } => format!(
            "LoKr {:?}",
            match w1 {
                Factor::Full(a) => &a.shape,
                Factor::Product(a, _) => &a.shape,
            }
        ),
        Delta::Full(_) => "diff".into(),
    }
}

/// Rank 64 onto a 3072x3072 weight (f32 factors) and onto the 16384x3072 ffn_up_gate (bf16
/// factors as a file stores them: uploaded as stored, widened on the device); a fused q|k|v
/// LoRA's k rows (f32 as stored) plus a second adapter (f16, converted on the host) on the same
/// weight (the fp32 sum between the two).
fn gate_low_rank(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let sq = vec![DIM, DIM];
    let m = module(&[("q", sq.clone())], low_rank(cx, DIM, DIM, 64, 32.0));
    judge_case(cx, "lora merge", &sq, &[Term { module: &m, row0: 0, scale: 0.8 }])?;
    if cx.dtype == DType::BF16 {
        let ug = vec![2 * FFN, DIM];
        let m = module(&[("ffn_up_gate", ug.clone())], low_rank_stored(cx, 2 * FFN, DIM, 64, 64.0, Dtype::BF16));
        judge_case(cx, "lora merge", &ug, &[Term { module: &m, row0: 0, scale: 1.0 }])?;
    }
    let fused = module(&[("q", sq.clone()), ("k", sq.clone()), ("v", sq.clone())], low_rank_stored(cx, 3 * DIM, DIM, 32, 16.0, Dtype::F32));
    let second = module(&[("k", sq.clone())], low_rank_stored(cx, DIM, DIM, 16, 16.0, Dtype::F16));
    let terms = [Term { module: &fused, row0: DIM, scale: 1.1 }, Term { module: &second, row0: 0, scale: -0.6 }];
    judge_case(cx, "lora merge, qkv k rows + 2nd", &sq, &terms)
}

/// LoHa, LoKr (a 4x4 by a factored 768x768) and a full difference (bf16 as stored: too large
/// for the upload ring, it goes through the staging chunks) onto 3072x3072 alone and all three
/// on one weight; a bias difference.
fn gate_other(cx: &mut Cx) -> Result<()> {
    use dit::*;
    let sq = vec![DIM, DIM];
    let loha = Delta::LoHa { w1a: mat(cx, DIM, 16, 0.1), w1b: mat(cx, 16, DIM, 0.1), w2a: mat(cx, DIM, 16, 0.1), w2b: mat(cx, 16, DIM, 0.1), alpha: Some(8.0) };
    let loha = module(&[("w", sq.clone())], loha);
    let w2 = Factor::Product(mat(cx, DIM / 4, 8, 0.1), mat(cx, 8, DIM / 4, 0.1));
    let lokr = module(&[("w", sq.clone())], Delta::LoKr { w1: Factor::Full(mat(cx, 4, 4, 1.0)), w2, alpha: Some(4.0) });
    let diff = module(&[("w", sq.clone())], Delta::Full(stored(mat(cx, DIM, DIM, 0.01), Dtype::BF16)));
    let t = |m| Term { module: m, row0: 0, scale: 0.9 };
    judge_case(cx, "lora merge", &sq, &[t(&loha)])?;
    judge_case(cx, "lora merge", &sq, &[t(&lokr)])?;
    judge_case(cx, "lora merge", &sq, &[t(&diff)])?;
    judge_case(cx, "lora merge, 3 kinds", &sq, &[t(&loha), t(&lokr), t(&diff)])?;
    let bias = module(&[("b", vec![DIM])], Delta::Full(mat(cx, DIM, 1, 0.01)));
    judge_case(cx, "lora merge", &[DIM], &[t(&bias)])
}

/// The time of one rank-64 update of each of a DiT block's six weights (bf16, the factors bf16 as
/// a file stores them): the host's preparation and the device's part (CUDA events), as `moss
/// generate` counts them in `lora_merge_host_s` / `lora_merge_device_s`. A full-size LoRA on
/// every linear costs about num_layers times this.
pub fn time_merge(cuda: &crate::ops::Cuda) -> Result<()> {
    use dit::*;
    let mut rng = Rng::new(11);
    let mut mat = |r: usize, c: usize, std: f64| -> Mat { stored(Mat::new(vec![r, c], rng.normals(r * c, std)), Dtype::BF16) };
    let shapes = [(DIM, DIM), (DIM, DIM), (DIM, DIM), (DIM, DIM), (2 * FFN, DIM), (DIM, FFN)];
    let reps = 10;
    let clock = moss_core::lora::plan::MergeClock::default();
    for (rows, cols) in shapes {
        let m = module(&[("w", vec![rows, cols])], Delta::LowRank { up: mat(rows, 64, 0.02), down: mat(64, cols, 0.2), alpha: Some(64.0) });
        let w = cuda.upload_as(&Tensor::new(vec![rows, cols], vec![0.01; rows * cols])?, DType::BF16)?;
        let terms = [Term { module: &m, row0: 0, scale: 1.0 }];
        cuda.merge_lora_into(&w, &terms)?;
        cuda.sync()?;
        for _ in 0..reps {
            cuda.merge_lora_timed(w.clone(), &terms, &clock)?;
        }
    }
    let t = clock.total();
    let (host, device) = (t.host_s * 1e3 / reps as f64, t.device_s * 1e3 / reps as f64);
    println!("  lora merge, rank 64 into one DiT block's 6 weights (bf16, factors bf16 as stored): host preparation {host:.3} ms, device {device:.3} ms");
    Ok(())
}
