//! The merge of one tensor: every update's delta rows in fp32, summed, added to the stored weight
//! and rounded once to its dtype.
//!
//! [`operands`] says what a term computes (the factors cut to the tensor's rows): both backends
//! start from it. [`merge_tensor`] is the host's evaluation, the CPU backend's merge and the
//! reference of the CUDA kernels (`cuda/dit/lora_merge.cu`), which repeat its arithmetic
//! exactly: every product and every sum rounded to fp32 (no fused multiply-add), the rank summed
//! in order, then `· alpha/rank`, `· scale`, the updates added in order to a sum that starts at
//! zero, and `W + sum` rounded once. So both give the same bytes.

use super::keys::{Delta, Factor, Mat, Module};
use super::plan::Term;
use crate::checkpoint::Dtype;
use anyhow::{bail, ensure, Result};
use std::borrow::Cow;

pub fn dims2(m: &Mat, what: &str) -> Result<(usize, usize)> {
    match m.0.as_slice() {
        [r, c] => Ok((*r, *c)),
        [r, c, 1, 1] => Ok((*r, *c)),
        [r] => Ok((*r, 1)),
        s => bail!("{what} has shape {s:?}, expected a matrix"),
    }
}

/// A factor, or rows of one: `rows` x `cols` fp32 values, borrowed from the adapter (its own
/// factors, a tensor's rows of them) or formed on the host (a LoKr product).
#[derive(Clone, Debug)]
pub struct Part<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: Cow<'a, [f32]>,
}

impl<'a> Part<'a> {
    /// All of `m` (a matrix; a vector counts as a column).
    pub fn whole(m: &'a Mat, what: &str) -> Result<Part<'a>> {
        let (rows, cols) = dims2(m, what)?;
        Ok(Part { rows, cols, data: Cow::Borrowed(&m.1) })
    }

    /// Rows `row0 .. row0 + rows` of `m`.
    pub fn rows_of(m: &'a Mat, row0: usize, rows: usize, what: &str) -> Result<Part<'a>> {
        let (r, cols) = dims2(m, what)?;
        ensure!(row0 + rows <= r, "{what}: rows {row0}..{} of {r}", row0 + rows);
        Ok(Part { rows, cols, data: Cow::Borrowed(&m.1[row0 * cols..(row0 + rows) * cols]) })
    }
}

/// `a [n, r] · b [r, m]` in fp32 (rows in parallel): each element `Σ_k a[i,k]·b[k,j]`, product
/// and sum rounded to fp32 at every step, k in order.
pub fn matmul(a: &Part, b: &Part, what: &str) -> Result<Part<'static>> {
    let (n, r, m) = (a.rows, a.cols, b.cols);
    ensure!(r == b.rows, "{what}: inner dimensions {r} and {} differ", b.rows);
    let mut out = vec![0f32; n * m];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, n.max(1));
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (ci, chunk) in out.chunks_mut(per * m.max(1)).enumerate() {
            s.spawn(move || {
                for (li, row) in chunk.chunks_mut(m.max(1)).enumerate() {
                    let i = ci * per + li;
                    for k in 0..r {
                        let s = a.data[i * r + k];
                        row.iter_mut().zip(&b.data[k * m..(k + 1) * m]).for_each(|(o, &x)| *o += s * x);
                    }
                }
            });
        }
    });
    Ok(Part { rows: n, cols: m, data: Cow::Owned(out) })
}

/// Rows `row0 .. row0 + rows` of `kron(a, b)`.
fn kron_rows(a: &Part, b: &Part, row0: usize, rows: usize) -> Vec<f32> {
    let (ac, br, bc) = (a.cols, b.rows, b.cols);
    let cols = ac * bc;
    let mut out = vec![0f32; rows * cols];
    for (i, row) in out.chunks_mut(cols.max(1)).enumerate() {
        let (ia, p) = ((row0 + i) / br, (row0 + i) % br);
        for (j, o) in row.iter_mut().enumerate() {
            *o = a.data[ia * ac + j / bc] * b.data[p * bc + j % bc];
        }
    }
    out
}

/// A LoKr factor as one matrix (a product formed on the host: small), and its rank if factored.
fn factor<'a>(f: &'a Factor, what: &str) -> Result<(Part<'a>, Option<usize>)> {
    match f {
        Factor::Full(m) => Ok((Part::whole(m, what)?, None)),
        Factor::Product(a, b) => Ok((matmul(&Part::whole(a, what)?, &Part::whole(b, what)?, what)?, Some(dims2(b, what)?.0))),
    }
}

/// What one term computes for a tensor of `rows` rows, before `· alpha/rank` and `· scale`.
#[derive(Clone, Debug)]
pub enum Operands<'a> {
    /// `up · down`; `up` holds the tensor's rows only.
    LowRank { up: Part<'a>, down: Part<'a> },
    /// LoHa: `(w1a · w1b) ⊙ (w2a · w2b)`; `w1a`, `w2a` hold the tensor's rows only.
    LoHa { w1a: Part<'a>, w1b: Part<'a>, w2a: Part<'a>, w2b: Part<'a> },
    /// Rows `row0 ..` of `kron(a, b)`: LoKr, and a full difference as `kron([1], diff rows)`.
    Kron { a: Part<'a>, b: Part<'a>, row0: usize },
}

/// The operands of `term` for a tensor of `rows` rows, and the factor `alpha/rank` (1 without).
pub fn operands<'a>(term: &Term<'a>, rows: usize) -> Result<(Operands<'a>, f32)> {
    let m = term.module;
    let what = m.key.as_str();
    let row0 = term.row0;
    Ok(match &m.delta {
        Delta::LowRank { up, down, alpha } => {
            let down = Part::whole(down, what)?;
            let fs = alpha.map_or(1.0, |a| a / down.rows as f32);
            (Operands::LowRank { up: Part::rows_of(up, row0, rows, what)?, down }, fs)
        }
        Delta::LoHa { w1a, w1b, w2a, w2b, alpha } => {
            let w1b = Part::whole(w1b, what)?;
            let fs = alpha.map_or(1.0, |a| a / w1b.rows as f32);
            let ops = Operands::LoHa {
                w1a: Part::rows_of(w1a, row0, rows, what)?,
                w1b,
                w2a: Part::rows_of(w2a, row0, rows, what)?,
                w2b: Part::whole(w2b, what)?,
            };
            (ops, fs)
        }
        Delta::LoKr { w1, w2, alpha } => {
            let ((a, ra), (b, rb)) = (factor(w1, what)?, factor(w2, what)?);
            let fs = match (alpha, rb.or(ra)) {
                (Some(al), Some(r)) => al / r as f32,
                _ => 1.0,
            };
            (Operands::Kron { a, b, row0 }, fs)
        }
        Delta::Full(d) => {
            let one = Part { rows: 1, cols: 1, data: Cow::Owned(vec![1.0]) };
            (Operands::Kron { a: one, b: Part::rows_of(d, row0, rows, what)?, row0: 0 }, 1.0)
        }
    })
}

/// Device bytes of a term's operands in fp32 for a tensor of `numel` values (an upper bound
/// for the memory plan: a fused module counts whole).
pub fn operand_bytes(m: &Module, numel: usize) -> usize {
    let n = |x: &Mat| x.1.len();
    let f = |x: &Factor| match x {
        Factor::Full(a) => n(a),
        Factor::Product(a, b) => n(a) + n(b) + dims2(a, "").map_or(0, |d| d.0) * dims2(b, "").map_or(0, |d| d.1),
    };
    4 * match &m.delta {
        Delta::LowRank { up, down, .. } => n(up) + n(down),
        Delta::LoHa { w1a, w1b, w2a, w2b, .. } => n(w1a) + n(w1b) + n(w2a) + n(w2b),
        Delta::LoKr { w1, w2, .. } => f(w1) + f(w2),
        Delta::Full(_) => numel + 1,
    }
}

/// The delta the operands give, `[rows, cols]` in fp32 (the host's evaluation).
pub fn evaluate(ops: &Operands, rows: usize, what: &str) -> Result<Vec<f32>> {
    match ops {
        Operands::LowRank { up, down } => Ok(matmul(up, down, what)?.data.into_owned()),
        Operands::LoHa { w1a, w1b, w2a, w2b } => {
            let (p, q) = (matmul(w1a, w1b, what)?, matmul(w2a, w2b, what)?);
            ensure!((p.rows, p.cols) == (q.rows, q.cols), "{what}: LoHa halves [{}, {}] and [{}, {}] differ", p.rows, p.cols, q.rows, q.cols);
            let mut p = p.data.into_owned();
            p.iter_mut().zip(q.data.iter()).for_each(|(x, y)| *x *= y);
            Ok(p)
        }
        Operands::Kron { a, b, row0 } => Ok(kron_rows(a, b, *row0, rows)),
    }
}

/// The delta's rows and columns must tile the target tensors (rows split in order).
pub fn check_shape(m: &Module) -> Result<()> {
    let (rows, cols) = match &m.delta {
        Delta::LowRank { up, down, .. } => (dims2(up, &m.key)?.0, dims2(down, &m.key)?.1),
        Delta::LoHa { w1a, w1b, .. } => (dims2(w1a, &m.key)?.0, dims2(w1b, &m.key)?.1),
        Delta::LoKr { w1, w2, .. } => {
            let outer = |f: &Factor| -> Result<(usize, usize)> {
                match f {
                    Factor::Full(w) => dims2(w, &m.key),
                    Factor::Product(a, b) => Ok((dims2(a, &m.key)?.0, dims2(b, &m.key)?.1)),
                }
            };
            let ((a, b), (c, d)) = (outer(w1)?, outer(w2)?);
            (a * c, b * d)
        }
        Delta::Full(d) => dims2(d, &m.key)?,
    };
    let want_rows: usize = m.targets.iter().map(|t| t.1[0]).sum();
    let want_cols = m.targets[0].1.get(1).copied().unwrap_or(1);
    if rows != want_rows || cols != want_cols {
        let names: Vec<String> = m.targets.iter().map(|t| format!("`{}` {:?}", t.0, t.1)).collect();
        bail!("`{}` gives a [{rows}, {cols}] update, but {} (shape does not fit)", m.key, names.join(" + "));
    }
    Ok(())
}

/// Rounding to `dtype` and back (round to nearest even).
pub fn rounding(dtype: Dtype) -> Result<fn(f32) -> f32> {
    Ok(match dtype {
        Dtype::BF16 => |v| half::bf16::from_f32(v).to_f32(),
        Dtype::F16 => |v| half::f16::from_f32(v).to_f32(),
        Dtype::F32 => |v| v,
        d => bail!("cannot merge a LoRA into a tensor stored as {}", d.name()),
    })
}

/// Merge `terms` into `w` (a tensor of shape `shape` stored as `stored`, its values as f32):
/// `W + Σ scale · (alpha/rank) · delta` in fp32, rounded once to `stored`. Memory: the tensor's
/// sum and one term's delta rows.
pub fn merge_tensor(w: &mut [f32], shape: &[usize], stored: Dtype, terms: &[Term]) -> Result<()> {
    let round = rounding(stored)?;
    let rows = shape.first().copied().unwrap_or(1);
    let mut sum = vec![0f32; w.len()];
    for t in terms {
        let (ops, fs) = operands(t, rows)?;
        let mut d = evaluate(&ops, rows, &t.module.key)?;
        ensure!(d.len() == w.len(), "`{}`: {} update values for a tensor of {}", t.module.key, d.len(), w.len());
        if fs != 1.0 {
            d.iter_mut().for_each(|x| *x *= fs);
        }
        sum.iter_mut().zip(&d).for_each(|(a, &x)| *a += t.scale * x);
    }
    w.iter_mut().zip(&sum).for_each(|(w, a)| *w = round(*w + a));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, k: f32) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * k).collect()
    }

    /// A tensor's rows of a fused module's delta, from its operands, equal those rows of the
    /// whole delta, for every kind of update (so no term needs the whole module's delta).
    #[test]
    fn row_ranges_equal_the_whole_deltas_rows() {
        let (rows, cols) = (24, 12);
        let m = |delta| Module { key: "m".into(), targets: vec![("m.weight".into(), vec![rows, cols])], delta };
        let mods = [
            m(Delta::LowRank { up: (vec![rows, 3], pattern(rows * 3, 1.0)), down: (vec![3, cols], pattern(3 * cols, 0.7)), alpha: Some(2.0) }),
            m(Delta::LoHa {
                w1a: (vec![rows, 2], pattern(rows * 2, 1.0)),
                w1b: (vec![2, cols], pattern(2 * cols, 0.6)),
                w2a: (vec![rows, 2], pattern(rows * 2, 0.9)),
                w2b: (vec![2, cols], pattern(2 * cols, 0.8)),
                alpha: None,
            }),
            m(Delta::LoKr {
                w1: Factor::Full((vec![4, 3], pattern(12, 1.0))),
                w2: Factor::Product((vec![6, 2], pattern(12, 0.5)), (vec![2, 4], pattern(8, 0.3))),
                alpha: Some(1.0),
            }),
            m(Delta::Full((vec![rows, cols], pattern(rows * cols, 0.1)))),
        ];
        for md in &mods {
            let whole = |row0, n| {
                let (ops, fs) = operands(&Term { module: md, row0, scale: 1.0 }, n).unwrap();
                (evaluate(&ops, n, "m").unwrap(), fs)
            };
            let (all, fs) = whole(0, rows);
            for (row0, n) in [(0, 8), (8, 8), (16, 8), (5, 1)] {
                let (part, fs2) = whole(row0, n);
                assert_eq!(fs, fs2);
                assert_eq!(part, all[row0 * cols..(row0 + n) * cols], "{:?}: rows {row0}..{}", md.delta, row0 + n);
            }
        }
    }

    /// The sum starts at zero, takes each update in order, and `W + sum` is rounded once.
    #[test]
    fn merge_tensor_rounds_once() {
        let md = Module {
            key: "m".into(),
            targets: vec![("m.weight".into(), vec![1, 1])],
            delta: Delta::Full((vec![1, 1], vec![1.0])),
        };
        // 1 + 2·(3·2^-10) = 1 + 0.75·2^-7 rounds to bf16's 1 + 2^-7; rounding after each update
        // (1 + 0.375·2^-7 → 1) would stay at 1.
        let t = Term { module: &md, row0: 0, scale: 3.0 * 2f32.powi(-10) };
        let mut w = vec![1.0f32];
        merge_tensor(&mut w, &[1, 1], Dtype::BF16, &[t, t]).unwrap();
        assert_eq!(w[0], 1.0 + 2f32.powi(-7));
        let mut w = vec![1.0f32];
        merge_tensor(&mut w, &[1, 1], Dtype::F32, &[t]).unwrap();
        assert_eq!(w[0], 1.0 + 3.0 * 2f32.powi(-10));
        assert!(merge_tensor(&mut [0.0], &[1, 1], Dtype::I64, &[t]).is_err());
    }
}
