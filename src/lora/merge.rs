//! The merge: every adapter's delta in fp32, summed per tensor, added to the stored weight and
//! rounded once to its dtype; the merged bytes replace the tensor in the component's store.

use super::keys::{Delta, Factor, Mat, Module};
use super::Lora;
use crate::checkpoint::{Dtype, TensorStore};
use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;

fn dims2(m: &Mat, what: &str) -> Result<(usize, usize)> {
    match m.0.as_slice() {
        [r, c] => Ok((*r, *c)),
        [r, c, 1, 1] => Ok((*r, *c)),
        [r] => Ok((*r, 1)),
        s => bail!("{what} has shape {s:?}, expected a matrix"),
    }
}

/// `a [n, r] · b [r, m]` in fp32 (rows in parallel).
pub fn matmul(a: &Mat, b: &Mat, what: &str) -> Result<Mat> {
    let (n, r) = dims2(a, what)?;
    let (r2, m) = dims2(b, what)?;
    ensure!(r == r2, "{what}: inner dimensions {r} and {r2} differ ({:?} · {:?})", a.0, b.0);
    let mut out = vec![0f32; n * m];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, n.max(1));
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (ci, chunk) in out.chunks_mut(per * m.max(1)).enumerate() {
            s.spawn(move || {
                for (li, row) in chunk.chunks_mut(m.max(1)).enumerate() {
                    let i = ci * per + li;
                    for k in 0..r {
                        let s = a.1[i * r + k];
                        if s != 0.0 {
                            row.iter_mut().zip(&b.1[k * m..(k + 1) * m]).for_each(|(o, &x)| *o += s * x);
                        }
                    }
                }
            });
        }
    });
    Ok((vec![n, m], out))
}

fn kron(a: &Mat, b: &Mat) -> Result<Mat> {
    let (ar, ac) = dims2(a, "lokr_w1")?;
    let (br, bc) = dims2(b, "lokr_w2")?;
    let (rows, cols) = (ar * br, ac * bc);
    let mut out = vec![0f32; rows * cols];
    for i in 0..ar {
        for j in 0..ac {
            let s = a.1[i * ac + j];
            for p in 0..br {
                let row = (i * br + p) * cols + j * bc;
                for (o, &x) in out[row..row + bc].iter_mut().zip(&b.1[p * bc..(p + 1) * bc]) {
                    *o = s * x;
                }
            }
        }
    }
    Ok((vec![rows, cols], out))
}

fn factor(f: &Factor, what: &str) -> Result<(Mat, Option<usize>)> {
    match f {
        Factor::Full(m) => Ok((m.clone(), None)),
        Factor::Product(a, b) => Ok((matmul(a, b, what)?, Some(dims2(b, what)?.0))),
    }
}

/// The module's delta `[rows, cols]` in fp32, alpha/rank applied (not yet the user's scale).
pub fn delta(m: &Module) -> Result<Mat> {
    let what = m.key.as_str();
    let (mut d, factor_scale) = match &m.delta {
        Delta::LowRank { up, down, alpha } => {
            let r = dims2(down, what)?.0;
            (matmul(up, down, what)?, alpha.map_or(1.0, |a| a / r as f32))
        }
        Delta::LoHa { w1a, w1b, w2a, w2b, alpha } => {
            let (mut p, q) = (matmul(w1a, w1b, what)?, matmul(w2a, w2b, what)?);
            ensure!(p.0 == q.0, "{what}: LoHa halves {:?} and {:?} differ", p.0, q.0);
            p.1.iter_mut().zip(&q.1).for_each(|(x, y)| *x *= y);
            (p, alpha.map_or(1.0, |a| a / dims2(w1b, what).map_or(1, |d| d.0) as f32))
        }
        Delta::LoKr { w1, w2, alpha } => {
            let ((a, ra), (b, rb)) = (factor(w1, what)?, factor(w2, what)?);
            let rank = rb.or(ra);
            (kron(&a, &b)?, match (alpha, rank) {
                (Some(al), Some(r)) => al / r as f32,
                _ => 1.0,
            })
        }
        Delta::Full(d) => (d.clone(), 1.0),
    };
    if factor_scale != 1.0 {
        d.1.iter_mut().for_each(|x| *x *= factor_scale);
    }
    Ok(d)
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

/// Sum every adapter's scaled delta per target tensor (full names without the store prefix).
pub fn deltas(loras: &[Lora]) -> Result<BTreeMap<String, Vec<f32>>> {
    let mut sums: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for l in loras {
        for m in &l.modules {
            let d = delta(m).with_context(|| format!("LoRA {}", l.spec.path.display()))?;
            let mut off = 0;
            for (name, shape) in &m.targets {
                let n: usize = shape.iter().product();
                let acc = sums.entry(name.clone()).or_insert_with(|| vec![0f32; n]);
                for (a, &x) in acc.iter_mut().zip(&d.1[off..off + n]) {
                    *a += l.spec.scale * x;
                }
                off += n;
            }
        }
    }
    Ok(sums)
}

/// Merge `loras` into `store` (tensor names carry `prefix`): `W + Σ delta` in fp32, rounded once
/// to the stored dtype; the merged tensors are served from memory from then on.
pub fn apply(store: &mut TensorStore, prefix: &str, loras: &[Lora]) -> Result<()> {
    for (name, d) in deltas(loras)? {
        let full = format!("{prefix}{name}");
        let (_, mut w) = store.to_f32(&full)?;
        w.iter_mut().zip(&d).for_each(|(w, d)| *w += d);
        let info = store.get(&full).cloned().context("merged tensor vanished")?;
        let bytes: Vec<u8> = match info.dtype {
            Dtype::BF16 => w.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
            Dtype::F16 => w.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
            Dtype::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            d => bail!("cannot merge a LoRA into `{full}` stored as {}", d.name()),
        };
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).context("LoRA merge: no memory")?;
        map[..bytes.len()].copy_from_slice(&bytes);
        let file = store.files.len();
        store.files.push((format!("<{full} merged with LoRA>").into(), map.make_read_only()?));
        let t = store.tensors.get_mut(&full).unwrap();
        (t.file, t.start, t.end) = (file, 0, bytes.len());
    }
    Ok(())
}
