//! CPU twins of the DiT's fused ops: fp32 in and out, f64 inside (norms, the rotation, the
//! softmax and its weighted sum). The loop's `cfg_euler` is plain f32, as the reference.

use super::{dot, par_rows, Cpu};
use crate::backend::ops::DitOps;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

fn dims3(x: &Tensor, what: &str) -> Result<(usize, usize, usize)> {
    ensure!(x.shape.len() == 3, "{what}: expected [N, heads, dim], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2]))
}

fn rows_of(x: &Tensor, what: &str) -> Result<(usize, usize)> {
    ensure!(x.shape.len() == 2, "{what}: expected [N, D], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1]))
}

fn vec_of(v: &Tensor, d: usize, what: &str) -> Result<()> {
    ensure!(v.numel() == d, "{what}: {:?} for width {d}", v.shape);
    Ok(())
}

impl DitOps for Cpu {
    fn timestep_sinusoid(&self, t: f32, dim: usize) -> Result<Tensor> {
        ensure!(dim.is_multiple_of(2) && dim > 0, "timestep_sinusoid: dim {dim} must be even");
        let half = dim / 2;
        let t = t as f64;
        let mut out = vec![0f32; dim];
        for k in 0..half {
            let ang = t * 10000f64.powf(-(k as f64) / half as f64);
            out[k] = ang.cos() as f32;
            out[half + k] = ang.sin() as f32;
        }
        Tensor::new(vec![dim], out)
    }

    fn rms_norm_modulate(&self, x: &Tensor, w: &Tensor, shift: &Tensor, scale: &Tensor, eps: f64) -> Result<Tensor> {
        let (_, d) = rows_of(x, "rms_norm_modulate")?;
        vec_of(w, d, "rms_norm_modulate weight")?;
        vec_of(shift, d, "rms_norm_modulate shift")?;
        vec_of(scale, d, "rms_norm_modulate scale")?;
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, d, |r, row| {
            let xr = &x.data[r * d..(r + 1) * d];
            let inv = 1.0 / (dot(xr, xr) / d as f64 + eps).sqrt();
            for (i, o) in row.iter_mut().enumerate() {
                let y = xr[i] as f64 * inv * w.data[i] as f64;
                *o = (y * (1.0 + scale.data[i] as f64) + shift.data[i] as f64) as f32;
            }
        });
        Tensor::new(x.shape.clone(), out)
    }

    fn qk_norm_rope(&self, x: &Tensor, w: &Tensor, cos: &Tensor, sin: &Tensor, eps: f64) -> Result<Tensor> {
        let (n, nh, hd) = dims3(x, "qk_norm_rope")?;
        ensure!(hd.is_multiple_of(2), "qk_norm_rope: head dim {hd} must be even");
        let half = hd / 2;
        vec_of(w, hd, "qk_norm_rope weight")?;
        for (name, t) in [("cos", cos), ("sin", sin)] {
            ensure!(t.shape == [n, half], "qk_norm_rope: {name} {:?}, expected [{n}, {half}]", t.shape);
        }
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, hd, |r, row| {
            let tok = r / nh;
            let xr = &x.data[r * hd..(r + 1) * hd];
            let inv = 1.0 / (dot(xr, xr) / hd as f64 + eps).sqrt();
            let y = |i: usize| xr[i] as f64 * inv * w.data[i] as f64;
            for m in 0..half {
                let (c, s) = (cos.data[tok * half + m] as f64, sin.data[tok * half + m] as f64);
                let (a, b) = (y(m), y(m + half));
                row[m] = (a * c - b * s) as f32;
                row[m + half] = (b * c + a * s) as f32;
            }
        });
        Tensor::new(x.shape.clone(), out)
    }

    /// One query row at a time: its `N` scores (f64), their max, then the exp-weighted sum of
    /// the values (f64) over the normaliser. Memory per row is `O(N)`.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
        let (n, nh, hd) = dims3(q, "attention q")?;
        ensure!(k.shape == q.shape && v.shape == q.shape, "attention: q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape);
        let mut out = vec![0f32; q.numel()];
        par_rows(&mut out, nh * hd, |i, row| {
            let mut s = vec![0f64; n];
            let mut acc = vec![0f64; hd];
            for h in 0..nh {
                let qr = &q.data[(i * nh + h) * hd..][..hd];
                let mut max = f64::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate() {
                    *sj = scale * dot(qr, &k.data[(j * nh + h) * hd..][..hd]);
                    max = max.max(*sj);
                }
                acc.iter_mut().for_each(|a| *a = 0.0);
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
        Tensor::new(q.shape.clone(), out)
    }

    fn situ_glu(&self, x: &Tensor) -> Result<Tensor> {
        let two_f = x.last_dim();
        ensure!(two_f.is_multiple_of(2), "situ_glu: last dim {two_f} is not [up | gate]");
        let f = two_f / 2;
        let mut shape = x.shape.clone();
        *shape.last_mut().unwrap() = f;
        let mut out = vec![0f32; x.rows() * f];
        par_rows(&mut out, f, |r, row| {
            let xr = &x.data[r * two_f..(r + 1) * two_f];
            for (i, o) in row.iter_mut().enumerate() {
                let (h, g) = (xr[i] as f64, xr[f + i] as f64);
                let sig = 1.0 / (1.0 + (-g).exp());
                *o = ((4.0 * (g / 4.0).tanh() * sig) * (25.0 * (h / 25.0).tanh())) as f32;
            }
        });
        Tensor::new(shape, out)
    }

    fn gated_residual(&self, x: &Tensor, y: &Tensor, gate: &Tensor) -> Result<Tensor> {
        let (_, d) = rows_of(x, "gated_residual")?;
        ensure!(y.shape == x.shape, "gated_residual: y {:?} for x {:?}", y.shape, x.shape);
        vec_of(gate, d, "gated_residual gate")?;
        let data = x
            .data
            .iter()
            .zip(&y.data)
            .enumerate()
            .map(|(i, (&a, &b))| (a as f64 + b as f64 * gate.data[i % d] as f64) as f32)
            .collect();
        Tensor::new(x.shape.clone(), data)
    }

    fn cfg_euler(&self, x: &Tensor, v_c: &Tensor, v_u: Option<&Tensor>, guidance: f32, dsigma: f32) -> Result<Tensor> {
        ensure!(v_c.shape == x.shape, "cfg_euler: v_c {:?} for x {:?}", v_c.shape, x.shape);
        let mut out = x.data.clone();
        match v_u {
            Some(v_u) => {
                ensure!(v_u.shape == x.shape, "cfg_euler: v_u {:?} for x {:?}", v_u.shape, x.shape);
                for ((o, &c), &u) in out.iter_mut().zip(&v_c.data).zip(&v_u.data) {
                    let v = u + guidance * (c - u);
                    *o += dsigma * v;
                }
            }
            None => {
                for (o, &c) in out.iter_mut().zip(&v_c.data) {
                    *o += dsigma * c;
                }
            }
        }
        Tensor::new(x.shape.clone(), out)
    }
}
