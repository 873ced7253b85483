//! The CPU backend: the readable fp32 reference. Reductions (dot products, norms, softmax sums)
//! accumulate in f64, so it also serves as the high-precision reference the CUDA kernels are
//! gated against.

use super::Backend;
use crate::checkpoint::{Component, Dtype};
use crate::lora::{plan::MergeClock, Term};
use crate::tensor::Tensor;
use anyhow::{bail, ensure, Result};

#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// Run `f(row_index, row_out)` over the rows of `out` (each `width` long) on all cores.
pub fn par_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len().checked_div(width).unwrap_or(0);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(rows.max(1));
    if threads <= 1 || rows < 2 {
        for (i, r) in out.chunks_mut(width.max(1)).enumerate() {
            f(i, r);
        }
        return;
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(per * width).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (i, r) in chunk.chunks_mut(width).enumerate() {
                    f(t * per + i, r);
                }
            });
        }
    });
}

/// Dot product with f64 accumulation.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let mut ca = a.chunks_exact(4);
    let mut cb = b.chunks_exact(4);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for j in 0..4 {
            acc[j] += x[j] as f64 * y[j] as f64;
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += *x as f64 * *y as f64;
    }
    s
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn broadcast(a: &Tensor, b: &Tensor, op: impl Fn(f32, f32) -> f32) -> Result<Tensor> {
    ensure!(a.shape.ends_with(&b.shape) && !b.data.is_empty(), "cannot broadcast {:?} onto {:?}", b.shape, a.shape);
    let n = b.numel();
    let data = a.data.iter().enumerate().map(|(i, &x)| op(x, b.data[i % n])).collect();
    Ok(Tensor { shape: a.shape.clone(), data })
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

impl Backend for Cpu {
    type T = Tensor;

    fn name(&self) -> String {
        "cpu".into()
    }
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn upload_f32(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    fn download(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn dims(&self, x: &Tensor) -> Vec<usize> {
        x.shape.clone()
    }
    fn load(&self, c: &Component, name: &str) -> Result<Tensor> {
        let (shape, data) = c.f32(name)?;
        super::merge_loras(self, &c.loras, &c.full_name(name), c.info(name)?.dtype, Tensor::new(shape, data)?)
    }
    fn merge_lora(&self, mut w: Tensor, stored: Dtype, terms: &[Term], clock: &MergeClock) -> Result<Tensor> {
        let t = std::time::Instant::now();
        crate::lora::merge::merge_tensor(&mut w.data, &w.shape, stored, terms)?;
        clock.add_host(t.elapsed().as_secs_f64());
        Ok(w)
    }

    fn linear(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        ensure!(w.shape.len() == 2, "linear: weight must be 2-D, got {:?}", w.shape);
        let (n, k) = (w.shape[0], w.shape[1]);
        ensure!(x.last_dim() == k, "linear: input {:?} does not match weight {:?}", x.shape, w.shape);
        if let Some(b) = b {
            ensure!(b.numel() == n, "linear: bias {:?} for {n} outputs", b.shape);
        }
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = n;
        let mut out = vec![0f32; x.rows() * n];
        par_rows(&mut out, n, |r, row| {
            let xr = &x.data[r * k..(r + 1) * k];
            for (j, o) in row.iter_mut().enumerate() {
                let bias = b.map_or(0.0, |b| b.data[j] as f64);
                *o = (dot(xr, &w.data[j * k..(j + 1) * k]) + bias) as f32;
            }
        });
        Tensor::new(shape, out)
    }

    fn quantize_rows(&self, w: &Tensor) -> Result<(Tensor, Tensor)> {
        ensure!(w.shape.len() == 2, "quantize_rows: weight must be 2-D, got {:?}", w.shape);
        let (n, k) = (w.shape[0], w.shape[1]);
        let mut q = vec![0f32; n * k];
        let mut scale = vec![0f32; n];
        for ((qr, wr), s) in q.chunks_mut(k.max(1)).zip(w.data.chunks(k.max(1))).zip(&mut scale) {
            *s = crate::fp8::quantize_row(wr, qr);
        }
        Ok((Tensor::new(w.shape.clone(), q)?, Tensor::new(vec![n], scale)?))
    }

    fn linear_fp8(&self, x: &Tensor, q: &Tensor, scale: &Tensor) -> Result<Tensor> {
        ensure!(q.shape.len() == 2, "linear_fp8: weight must be 2-D, got {:?}", q.shape);
        let k = q.shape[1];
        ensure!(x.last_dim() == k, "linear_fp8: input {:?} does not match weight {:?}", x.shape, q.shape);
        let (mut xq, mut xs) = (vec![0f32; x.numel()], vec![0f32; x.rows()]);
        for ((qr, xr), s) in xq.chunks_mut(k.max(1)).zip(x.data.chunks(k.max(1))).zip(&mut xs) {
            *s = crate::fp8::quantize_row(xr, qr);
        }
        self.linear_fp8_quantized(&Tensor::new(x.shape.clone(), xq)?, &Tensor::new(vec![xs.len()], xs)?, q, scale)
    }

    fn linear_fp8_quantized(&self, xq: &Tensor, xs: &Tensor, q: &Tensor, scale: &Tensor) -> Result<Tensor> {
        ensure!(q.shape.len() == 2, "linear_fp8: weight must be 2-D, got {:?}", q.shape);
        let (n, k) = (q.shape[0], q.shape[1]);
        ensure!(xq.last_dim() == k, "linear_fp8: input {:?} does not match weight {:?}", xq.shape, q.shape);
        ensure!(scale.numel() == n, "linear_fp8: {} scales for {n} rows", scale.numel());
        ensure!(xs.numel() == xq.rows(), "linear_fp8: {} activation scales for {} rows", xs.numel(), xq.rows());
        let mut shape = xq.shape.clone();
        *shape.last_mut().unwrap() = n;
        let mut out = vec![0f32; xq.rows() * n];
        par_rows(&mut out, n, |r, row| {
            let xr = &xq.data[r * k..(r + 1) * k];
            for (j, o) in row.iter_mut().enumerate() {
                *o = (dot(xr, &q.data[j * k..(j + 1) * k]) * xs.data[r] as f64 * scale.data[j] as f64) as f32;
            }
        });
        Tensor::new(shape, out)
    }

    fn quantize_rows_int8(&self, x: &Tensor, convrot: Option<usize>) -> Result<(Tensor, Tensor)> {
        let k = x.last_dim();
        if let Some(g) = convrot {
            ensure!(g > 0 && k.is_multiple_of(g), "quantize_rows_int8: rows of {k} are not whole ConvRot groups of {g}");
        }
        let mut q = vec![0f32; x.numel()];
        let mut scale = vec![0f32; x.rows()];
        let (mut row, mut codes) = (vec![0f32; k], vec![0i8; k]);
        for ((qr, xr), s) in q.chunks_mut(k.max(1)).zip(x.data.chunks(k.max(1))).zip(&mut scale) {
            row.copy_from_slice(xr);
            if let Some(g) = convrot {
                crate::int8::turn(&mut row, g);
            }
            *s = crate::int8::quantize_row(&row, &mut codes);
            qr.iter_mut().zip(&codes).for_each(|(o, &c)| *o = c as f32);
        }
        Ok((Tensor::new(x.shape.clone(), q)?, Tensor::new(vec![scale.len()], scale)?))
    }

    fn upload_int8(&self, shape: &[usize], codes: &[u8]) -> Result<Tensor> {
        Tensor::new(shape.to_vec(), codes.iter().map(|&c| c as i8 as f32).collect())
    }

    fn linear_int8_quantized(&self, xq: &Tensor, xs: &Tensor, q: &Tensor, scale: &Tensor) -> Result<Tensor> {
        ensure!(q.shape.len() == 2, "linear_int8: weight must be 2-D, got {:?}", q.shape);
        let (n, k) = (q.shape[0], q.shape[1]);
        ensure!(xq.last_dim() == k, "linear_int8: input {:?} does not match weight {:?}", xq.shape, q.shape);
        ensure!(scale.numel() == n, "linear_int8: {} scales for {n} rows", scale.numel());
        ensure!(xs.numel() == xq.rows(), "linear_int8: {} activation scales for {} rows", xs.numel(), xq.rows());
        let codes = |t: &Tensor| t.data.iter().map(|&v| v as i8).collect::<Vec<i8>>();
        let (a, w) = (codes(xq), codes(q));
        let mut shape = xq.shape.clone();
        *shape.last_mut().unwrap() = n;
        let mut out = vec![0f32; xq.rows() * n];
        par_rows(&mut out, n, |r, row| {
            let ar = &a[r * k..(r + 1) * k];
            for (j, o) in row.iter_mut().enumerate() {
                *o = crate::int8::scaled(crate::int8::dot(ar, &w[j * k..(j + 1) * k]), xs.data[r], scale.data[j]);
            }
        });
        Tensor::new(shape, out)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        broadcast(a, b, |x, y| x + y)
    }
    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        broadcast(a, b, |x, y| x * y)
    }
    fn silu(&self, x: &Tensor) -> Result<Tensor> {
        Ok(Tensor { shape: x.shape.clone(), data: x.data.iter().map(|&v| silu(v)).collect() })
    }
    fn sigmoid(&self, x: &Tensor) -> Result<Tensor> {
        Ok(Tensor { shape: x.shape.clone(), data: x.data.iter().map(|&v| sigmoid(v)).collect() })
    }

    fn rms_norm(&self, x: &Tensor, w: Option<&Tensor>, eps: f64, one_plus: bool) -> Result<Tensor> {
        let d = x.last_dim();
        if let Some(w) = w {
            ensure!(w.numel() == d, "rms_norm: weight {:?} for width {d}", w.shape);
        }
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, d, |r, row| {
            let xr = &x.data[r * d..(r + 1) * d];
            let inv = 1.0 / (dot(xr, xr) / d as f64 + eps).sqrt();
            for (i, o) in row.iter_mut().enumerate() {
                let g = match w {
                    Some(w) if one_plus => 1.0 + w.data[i] as f64,
                    Some(w) => w.data[i] as f64,
                    None => 1.0,
                };
                *o = (xr[i] as f64 * inv * g) as f32;
            }
        });
        Tensor::new(x.shape.clone(), out)
    }

    fn reshape(&self, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
        Tensor::new(shape.to_vec(), x.data.clone())
    }

    fn narrow(&self, x: &Tensor, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        ensure!(dim < x.shape.len() && start + len <= x.shape[dim], "narrow {dim}:{start}+{len} of {:?}", x.shape);
        let outer: usize = x.shape[..dim].iter().product();
        let inner: usize = x.shape[dim + 1..].iter().product();
        let full = x.shape[dim];
        let mut data = Vec::with_capacity(outer * len * inner);
        for o in 0..outer {
            let base = (o * full + start) * inner;
            data.extend_from_slice(&x.data[base..base + len * inner]);
        }
        let mut shape = x.shape.clone();
        shape[dim] = len;
        Tensor::new(shape, data)
    }

    fn cat(&self, xs: &[&Tensor], dim: usize) -> Result<Tensor> {
        let Some(first) = xs.first() else { bail!("cat of nothing") };
        let mut shape = first.shape.clone();
        ensure!(dim < shape.len(), "cat: dim {dim} of {:?}", shape);
        for x in &xs[1..] {
            ensure!(
                x.shape.len() == shape.len() && x.shape.iter().enumerate().all(|(i, &s)| i == dim || s == shape[i]),
                "cat: {:?} and {:?}",
                first.shape,
                x.shape
            );
        }
        shape[dim] = xs.iter().map(|x| x.shape[dim]).sum();
        let outer: usize = shape[..dim].iter().product();
        let inner: usize = shape[dim + 1..].iter().product();
        let mut data = Vec::with_capacity(shape.iter().product());
        for o in 0..outer {
            for x in xs {
                let chunk = x.shape[dim] * inner;
                data.extend_from_slice(&x.data[o * chunk..(o + 1) * chunk]);
            }
        }
        Tensor::new(shape, data)
    }

    fn permute(&self, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
        let nd = x.shape.len();
        ensure!(perm.len() == nd && (0..nd).all(|i| perm.contains(&i)), "permute {perm:?} of {:?}", x.shape);
        let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
        let src = strides(&x.shape);
        let mut data = Vec::with_capacity(x.numel());
        let mut idx = vec![0usize; nd];
        for _ in 0..x.numel() {
            let off: usize = (0..nd).map(|i| idx[i] * src[perm[i]]).sum();
            data.push(x.data[off]);
            for i in (0..nd).rev() {
                idx[i] += 1;
                if idx[i] < shape[i] {
                    break;
                }
                idx[i] = 0;
            }
        }
        Tensor::new(shape, data)
    }
}

pub mod dit;
pub mod encoder;
pub mod vae;
pub mod vae_encode;
