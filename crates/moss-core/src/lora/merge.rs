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
    match m.shape.as_slice() {
        [r, c] => Ok((*r, *c)),
        [r, c, 1, 1] => Ok((*r, *c)),
        [r] => Ok((*r, 1)),
        s => bail!("{what} has shape {s:?}, expected a matrix"),
    }
}

/// Values of a factor (or of rows of one): f32, or the adapter file's bytes as stored.
#[derive(Clone, Debug)]
pub enum Values<'a> {
    F32(Cow<'a, [f32]>),
    /// Little-endian `dtype` values (bf16, f16, f32 or f64).
    Stored {
        dtype: Dtype,
        bytes: &'a [u8],
    },
}

impl<'a> Values<'a> {
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::Stored { dtype, bytes } => bytes.len() / dtype.size(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32, borrowed when they are f32 already.
    pub fn f32(&self) -> Cow<'_, [f32]> {
        match self {
            Values::F32(v) => Cow::Borrowed(v),
            Values::Stored { dtype, bytes } => Cow::Owned(decode(*dtype, bytes)),
        }
    }

    pub fn into_f32(self) -> Cow<'a, [f32]> {
        match self {
            Values::F32(v) => v,
            Values::Stored { dtype, bytes } => Cow::Owned(decode(dtype, bytes)),
        }
    }
}

/// Stored values as f32 (the dtypes a [`Mat`] admits: exact but for f64's rounding).
fn decode(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    crate::checkpoint::tensors::decode_f32(dtype, bytes).expect("a LoRA tensor's dtype is checked when it is read")
}

/// A factor, or rows of one: `rows` x `cols` values, borrowed from the adapter (its own factors,
/// a tensor's rows of them, as stored) or formed on the host (a LoKr product).
#[derive(Clone, Debug)]
pub struct Part<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: Values<'a>,
}

impl<'a> Part<'a> {
    /// All of `m` (a matrix; a vector counts as a column).
    pub fn whole(m: &'a Mat, what: &str) -> Result<Part<'a>> {
        let (rows, cols) = dims2(m, what)?;
        Ok(Part { rows, cols, data: m.view() })
    }

    /// Rows `row0 .. row0 + rows` of `m`.
    pub fn rows_of(m: &'a Mat, row0: usize, rows: usize, what: &str) -> Result<Part<'a>> {
        let (r, cols) = dims2(m, what)?;
        ensure!(row0 + rows <= r, "{what}: rows {row0}..{} of {r}", row0 + rows);
        Ok(Part { rows, cols, data: m.elements(row0 * cols, rows * cols) })
    }
}

/// `a [n, r] · b [r, m]` in fp32 (rows in parallel): each element `Σ_k a[i,k]·b[k,j]`, product
/// and sum rounded to fp32 at every step, k in order.
pub fn matmul(a: &Part, b: &Part, what: &str) -> Result<Part<'static>> {
    let (n, r, m) = (a.rows, a.cols, b.cols);
    ensure!(r == b.rows, "{what}: inner dimensions {r} and {} differ", b.rows);
    let (ad, bd) = (a.data.f32(), b.data.f32());
    let (ad, bd) = (&ad[..], &bd[..]);
    let mut out = vec![0f32; n * m];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, n.max(1));
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (ci, chunk) in out.chunks_mut(per * m.max(1)).enumerate() {
            s.spawn(move || {
                for (li, row) in chunk.chunks_mut(m.max(1)).enumerate() {
                    let i = ci * per + li;
                    for k in 0..r {
                        let s = ad[i * r + k];
                        row.iter_mut().zip(&bd[k * m..(k + 1) * m]).for_each(|(o, &x)| *o += s * x);
                    }
                }
            });
        }
    });
    Ok(Part { rows: n, cols: m, data: Values::F32(Cow::Owned(out)) })
}

/// Rows `row0 .. row0 + rows` of `kron(a, b)`.
fn kron_rows(a: &Part, b: &Part, row0: usize, rows: usize) -> Vec<f32> {
    let (ac, br, bc) = (a.cols, b.rows, b.cols);
    let (ad, bd) = (a.data.f32(), b.data.f32());
    let cols = ac * bc;
    let mut out = vec![0f32; rows * cols];
    for (i, row) in out.chunks_mut(cols.max(1)).enumerate() {
        let (ia, p) = ((row0 + i) / br, (row0 + i) % br);
        for (j, o) in row.iter_mut().enumerate() {
            *o = ad[ia * ac + j / bc] * bd[p * bc + j % bc];
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
            let ops =
                Operands::LoHa { w1a: Part::rows_of(w1a, row0, rows, what)?, w1b, w2a: Part::rows_of(w2a, row0, rows, what)?, w2b: Part::whole(w2b, what)? };
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
            let one = Part { rows: 1, cols: 1, data: Values::F32(Cow::Owned(vec![1.0])) };
            (Operands::Kron { a: one, b: Part::rows_of(d, row0, rows, what)?, row0: 0 }, 1.0)
        }
    })
}

/// Device bytes of a term's operands for a tensor of `numel` values: each factor in fp32, and a
/// bf16 one also as stored (uploaded as it is and widened on the device), every buffer 256-byte
/// aligned. An upper bound for the memory plan (a fused module counts whole).
pub fn operand_bytes(m: &Module, numel: usize) -> usize {
    let dev = |n: usize, x: Option<&Mat>| {
        let raw = if x.is_some_and(|x| x.stored_dtype() == Some(Dtype::BF16)) { 2 * n + ALIGN } else { 0 };
        4 * n + ALIGN + raw
    };
    let n = |x: &Mat| dev(x.numel(), Some(x));
    let f = |x: &Factor| match x {
        Factor::Full(a) => n(a),
        // The product is formed on the host and uploaded in fp32.
        Factor::Product(a, b) => dev(dims2(a, "").map_or(0, |d| d.0) * dims2(b, "").map_or(0, |d| d.1), None),
    };
    match &m.delta {
        Delta::LowRank { up, down, .. } => n(up) + n(down),
        Delta::LoHa { w1a, w1b, w2a, w2b, .. } => n(w1a) + n(w1b) + n(w2a) + n(w2b),
        Delta::LoKr { w1, w2, .. } => f(w1) + f(w2),
        Delta::Full(d) => dev(numel, Some(d)) + dev(1, None),
    }
}

/// Alignment of each operand in the merge's device buffers (bytes).
pub const ALIGN: usize = 256;

/// The delta the operands give, `[rows, cols]` in fp32 (the host's evaluation).
pub fn evaluate(ops: &Operands, rows: usize, what: &str) -> Result<Vec<f32>> {
    match ops {
        Operands::LowRank { up, down } => Ok(matmul(up, down, what)?.data.into_f32().into_owned()),
        Operands::LoHa { w1a, w1b, w2a, w2b } => {
            let (p, q) = (matmul(w1a, w1b, what)?, matmul(w2a, w2b, what)?);
            ensure!((p.rows, p.cols) == (q.rows, q.cols), "{what}: LoHa halves [{}, {}] and [{}, {}] differ", p.rows, p.cols, q.rows, q.cols);
            let mut p = p.data.into_f32().into_owned();
            p.iter_mut().zip(q.data.f32().iter()).for_each(|(x, y)| *x *= y);
            Ok(p)
        }
        Operands::Kron { a, b, row0 } => Ok(kron_rows(a, b, *row0, rows)),
    }
}

/// The delta's rows and columns must tile the target tensors (rows split in order).
pub fn check_shape(m: &Module) -> Result<()> {
    let factors: Vec<&Mat> = match &m.delta {
        Delta::LowRank { up, down, .. } => vec![up, down],
        Delta::LoHa { w1a, w1b, w2a, w2b, .. } => vec![w1a, w1b, w2a, w2b],
        Delta::LoKr { w1, w2, .. } => [w1, w2]
            .into_iter()
            .flat_map(|f| match f {
                Factor::Full(w) => vec![w],
                Factor::Product(a, b) => vec![a, b],
            })
            .collect(),
        Delta::Full(d) => vec![d],
    };
    if let Some(f) = factors.iter().find(|f| f.shape.contains(&0)) {
        bail!("`{}` has a factor of shape {:?}: a rank or a side of 0 makes no update (a damaged adapter)", m.key, f.shape);
    }
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
        // dequantized as loaded (ggml blocks, int8 with row scales): the merge stays in f32
        Dtype::F32 | Dtype::Ggml(_) | Dtype::I8 | Dtype::W4a8 { .. } => |v| v,
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
            m(Delta::LowRank { up: Mat::new(vec![rows, 3], pattern(rows * 3, 1.0)), down: Mat::new(vec![3, cols], pattern(3 * cols, 0.7)), alpha: Some(2.0) }),
            m(Delta::LoHa {
                w1a: Mat::new(vec![rows, 2], pattern(rows * 2, 1.0)),
                w1b: Mat::new(vec![2, cols], pattern(2 * cols, 0.6)),
                w2a: Mat::new(vec![rows, 2], pattern(rows * 2, 0.9)),
                w2b: Mat::new(vec![2, cols], pattern(2 * cols, 0.8)),
                alpha: None,
            }),
            m(Delta::LoKr {
                w1: Factor::Full(Mat::new(vec![4, 3], pattern(12, 1.0))),
                w2: Factor::Product(Mat::new(vec![6, 2], pattern(12, 0.5)), Mat::new(vec![2, 4], pattern(8, 0.3))),
                alpha: Some(1.0),
            }),
            m(Delta::Full(Mat::new(vec![rows, cols], pattern(rows * cols, 0.1)))),
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

    /// A factor kept as the file stores it (bf16, f16, f32, f64 bytes at an offset of a buffer)
    /// gives the values it holds, whole and by rows, and the same merge as those values in f32.
    #[test]
    fn stored_factors_read_as_their_values() {
        let (rows, cols) = (6, 5);
        // Values every stored dtype holds exactly.
        let v: Vec<f32> = (0..rows * cols).map(|i| (i as f32 - 11.0) * 0.125).collect();
        let encodings: [(Dtype, Vec<u8>); 4] = [
            (Dtype::BF16, v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect()),
            (Dtype::F16, v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect()),
            (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            (Dtype::F64, v.iter().flat_map(|x| (*x as f64).to_le_bytes()).collect()),
        ];
        let down = Mat::new(vec![rows, cols], v.clone());
        for (dtype, enc) in encodings {
            // Three bytes of something else before it, as in a file.
            let bytes: crate::lora::keys::Bytes = std::sync::Arc::new([vec![7u8; 3], enc.clone()].concat());
            let m = Mat::stored(vec![rows, cols], dtype, bytes.clone(), 3..3 + enc.len()).unwrap();
            assert_eq!(m.stored_dtype(), Some(dtype));
            assert_eq!(*m.values(), v[..], "{}", dtype.name());
            let p = Part::rows_of(&m, 2, 3, "m").unwrap();
            assert_eq!(*p.data.f32(), v[2 * cols..5 * cols], "{}", dtype.name());
            let Values::Stored { bytes: b, .. } = p.data else { panic!("rows of a stored factor are stored") };
            assert_eq!(b, &enc[2 * cols * dtype.size()..5 * cols * dtype.size()]);
            assert!(Mat::stored(vec![rows, cols + 1], dtype, bytes.clone(), 3..3 + enc.len()).is_err(), "a wrong size");
            // The same update from the stored factor and from its f32 values.
            let up = Mat::new(vec![rows, rows], (0..rows * rows).map(|i| i as f32 * 0.01).collect());
            let md = |down: Mat| Module {
                key: "m".into(),
                targets: vec![("m.weight".into(), vec![rows, cols])],
                delta: Delta::LowRank { up: up.clone(), down, alpha: Some(3.0) },
            };
            let (a, b) = (md(m.clone()), md(down.clone()));
            let merged = |md: &Module| {
                let mut w = vec![0.5f32; rows * cols];
                merge_tensor(&mut w, &[rows, cols], Dtype::BF16, &[Term { module: md, row0: 0, scale: 0.7 }]).unwrap();
                w
            };
            assert_eq!(merged(&a), merged(&b), "{}", dtype.name());
        }
        let bytes: crate::lora::keys::Bytes = std::sync::Arc::new(vec![0u8; 8]);
        assert!(Mat::stored(vec![1], Dtype::I64, bytes, 0..8).is_err(), "i64 is no factor dtype");
    }

    /// The sum starts at zero, takes each update in order, and `W + sum` is rounded once.
    #[test]
    fn merge_tensor_rounds_once() {
        let md = Module { key: "m".into(), targets: vec![("m.weight".into(), vec![1, 1])], delta: Delta::Full(Mat::new(vec![1, 1], vec![1.0])) };
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
