//! CPU twins of the DiT's fused ops: fp32 in and out, f64 inside (norms, the rotation, the
//! softmax and its weighted sum). The loop's `cfg_euler` is plain f32, as the reference.

use super::{dot, par_rows, Cpu};
use crate::backend::ops::DitOps;
use crate::backend::Backend;
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

/// `(N, hd)` of a packed `[N, 3·heads·hd]` projection.
fn packed_dims(x: &Tensor, heads: usize, what: &str) -> Result<(usize, usize)> {
    ensure!(x.shape.len() == 2 && heads > 0 && x.shape[1].is_multiple_of(3 * heads), "{what}: expected [N, 3·{heads}·hd], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1] / (3 * heads)))
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

    fn qkv_norm_rope(&self, mut qkv: Tensor, heads: usize, wq: &Tensor, wk: &Tensor, cos: &Tensor, sin: &Tensor, eps: f64) -> Result<Tensor> {
        let (n, hd) = packed_dims(&qkv, heads, "qkv_norm_rope")?;
        ensure!(hd.is_multiple_of(2), "qkv_norm_rope: head dim {hd} must be even");
        let half = hd / 2;
        vec_of(wq, hd, "qkv_norm_rope q weight")?;
        vec_of(wk, hd, "qkv_norm_rope k weight")?;
        for (name, t) in [("cos", cos), ("sin", sin)] {
            ensure!(t.shape == [n, half], "qkv_norm_rope: {name} {:?}, expected [{n}, {half}]", t.shape);
        }
        let width = 3 * heads * hd;
        // Row by row, each (part, head) exactly as `qk_norm_rope` does it.
        par_rows(&mut qkv.data, width, |tok, row| {
            for (p, w) in [wq, wk].into_iter().enumerate() {
                for h in 0..heads {
                    let r = &mut row[(p * heads + h) * hd..][..hd];
                    let xr: Vec<f32> = r.to_vec();
                    let inv = 1.0 / (dot(&xr, &xr) / hd as f64 + eps).sqrt();
                    let y = |i: usize| xr[i] as f64 * inv * w.data[i] as f64;
                    for m in 0..half {
                        let (c, s) = (cos.data[tok * half + m] as f64, sin.data[tok * half + m] as f64);
                        let (a, b) = (y(m), y(m + half));
                        r[m] = (a * c - b * s) as f32;
                        r[m + half] = (b * c + a * s) as f32;
                    }
                }
            }
        });
        Ok(qkv)
    }

    fn attention_packed(&self, qkv: &Tensor, heads: usize, scale: f64) -> Result<Tensor> {
        let (n, hd) = packed_dims(qkv, heads, "attention_packed")?;
        let d = heads * hd;
        let part = |i: usize| self.narrow(qkv, 1, i * d, d).and_then(|t| self.reshape(&t, &[n, heads, hd]));
        let o = self.attention(&part(0)?, &part(1)?, &part(2)?, scale)?;
        self.reshape(&o, &[n, d])
    }

    fn gated_residual_norm_modulate(
        &self,
        x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        w: &Tensor,
        shift: &Tensor,
        scale: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        let x = self.gated_residual(x, y, gate)?;
        let n = self.rms_norm_modulate(&x, w, shift, scale, eps)?;
        Ok((x, n))
    }

    /// One query row at a time: its `N` scores (f64), their max, then the exp-weighted sum of
    /// the values (f64) over the normaliser. Memory per row is `O(N)`.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
        let (_, nh, hd) = dims3(q, "attention q")?;
        ensure!(k.shape == q.shape && v.shape == q.shape, "attention: q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape);
        let mut out = vec![0f32; q.numel()];
        par_rows(&mut out, nh * hd, |i, row| attention_row(q, k, v, scale, i, row));
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
        let data = x.data.iter().zip(&y.data).enumerate().map(|(i, (&a, &b))| (a as f64 + b as f64 * gate.data[i % d] as f64) as f32).collect();
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

/// Query row `i` of the attention over `q`, `k`, `v` `[N, H, hd]` into `row` `[H·hd]`: per head
/// its `N` scores (f64), their max, then the exp-weighted sum of the values (f64) over the
/// normaliser.
pub fn attention_row(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, i: usize, row: &mut [f32]) {
    let (n, nh, hd) = (q.shape[0], q.shape[1], q.shape[2]);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(shape: &[usize], seed: u64) -> Tensor {
        // SplitMix64, uniform in [-1, 1): any values do, the test compares two paths bit for bit.
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        Tensor::new(shape.to_vec(), (0..shape.iter().product()).map(|_| next()).collect()).unwrap()
    }

    /// The fused ops are the unfused ones, bit for bit, on the CPU.
    #[test]
    fn fused_ops_equal_the_unfused_ones() {
        let (n, heads, hd) = (7, 3, 16);
        let d = heads * hd;
        let qkv = randn(&[n, 3 * d], 1);
        let (wq, wk) = (randn(&[hd], 2), randn(&[hd], 3));
        let (cos, sin) = (randn(&[n, hd / 2], 4), randn(&[n, hd / 2], 5));
        let part = |t: &Tensor, i: usize| Cpu.reshape(&Cpu.narrow(t, 1, i * d, d).unwrap(), &[n, heads, hd]).unwrap();
        let fused = Cpu.qkv_norm_rope(qkv.clone(), heads, &wq, &wk, &cos, &sin, 1e-6).unwrap();
        assert_eq!(part(&fused, 0).data, Cpu.qk_norm_rope(&part(&qkv, 0), &wq, &cos, &sin, 1e-6).unwrap().data);
        assert_eq!(part(&fused, 1).data, Cpu.qk_norm_rope(&part(&qkv, 1), &wk, &cos, &sin, 1e-6).unwrap().data);
        assert_eq!(part(&fused, 2).data, part(&qkv, 2).data);
        let att = Cpu.attention_packed(&fused, heads, 0.25).unwrap();
        let want = Cpu.attention(&part(&fused, 0), &part(&fused, 1), &part(&fused, 2), 0.25).unwrap();
        assert_eq!(att.shape, [n, d]);
        assert_eq!(att.data, want.data);
        let (x, y, g) = (randn(&[n, d], 6), randn(&[n, d], 7), randn(&[d], 8));
        let (w, sh, sc) = (randn(&[d], 9), randn(&[d], 10), randn(&[d], 11));
        let (x2, y2) = Cpu.gated_residual_norm_modulate(&x, &y, &g, &w, &sh, &sc, 1e-6).unwrap();
        let want_x = Cpu.gated_residual(&x, &y, &g).unwrap();
        assert_eq!(x2.data, want_x.data);
        assert_eq!(y2.data, Cpu.rms_norm_modulate(&want_x, &w, &sh, &sc, 1e-6).unwrap().data);
        assert!(Cpu.qkv_norm_rope(randn(&[n, 3 * d + 1], 1), heads, &wq, &wk, &cos, &sin, 1e-6).is_err());
    }
}
