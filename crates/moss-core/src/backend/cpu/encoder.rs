//! CPU twins of the encoder's fused ops: fp32 in and out, f64 inside (reductions, the rotary
//! rotation, the gates and the whole delta-rule state).

use super::{dot, par_rows, silu, Cpu};
use crate::backend::ops::encoder::{EncoderOps, DELTA_CHUNK};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

fn dims3(x: &Tensor, what: &str) -> Result<(usize, usize, usize)> {
    ensure!(x.shape.len() == 3, "{what}: expected [L, heads, dim], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2]))
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The rotary angles of position `t` as transformers computes them in fp32 (see
/// [`EncoderOps::head_norm_rope`]): `half` values.
pub fn rope_angles(t: usize, rot: usize, theta: f64) -> Vec<f32> {
    (0..rot / 2)
        .map(|i| {
            let e = (2 * i) as f32 / rot as f32;
            let inv = 1.0f32 / (theta.powf(e as f64) as f32);
            t as f32 * inv
        })
        .collect()
}

/// Inputs of the delta rule on the host, already in `[L, heads, dim]` layout (see
/// [`EncoderOps::gated_delta_rule`]).
pub struct DeltaInputs<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub g: &'a Tensor,
    pub beta: &'a Tensor,
}

/// One value head's inputs in f64: normalised q (scaled) and k of its key head, v, g, beta.
struct Head {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    beta: Vec<f64>,
    dk: usize,
    dv: usize,
}

impl DeltaInputs<'_> {
    fn check(&self) -> Result<(usize, usize, usize, usize, usize)> {
        let (l, hk, dk) = dims3(self.q, "gated_delta_rule q")?;
        ensure!(self.k.shape == self.q.shape, "gated_delta_rule: k {:?} vs q {:?}", self.k.shape, self.q.shape);
        let (lv, hv, dv) = dims3(self.v, "gated_delta_rule v")?;
        ensure!(lv == l && hk > 0 && hv % hk == 0, "gated_delta_rule: v {:?} for q {:?}", self.v.shape, self.q.shape);
        for (n, t) in [("g", self.g), ("beta", self.beta)] {
            ensure!(t.shape == [l, hv], "gated_delta_rule: {n} {:?}, expected [{l}, {hv}]", t.shape);
        }
        Ok((l, hk, dk, hv, dv))
    }

    fn head(&self, h: usize) -> Head {
        let (l, hk, dk) = (self.q.shape[0], self.q.shape[1], self.q.shape[2]);
        let (hv, dv) = (self.v.shape[1], self.v.shape[2]);
        let kh = h / (hv / hk);
        let (mut q, mut k) = (Vec::with_capacity(l * dk), Vec::with_capacity(l * dk));
        let (mut v, mut g, mut beta) = (Vec::with_capacity(l * dv), vec![], vec![]);
        let scale = 1.0 / (dk as f64).sqrt();
        for t in 0..l {
            let off = (t * hk + kh) * dk;
            let qr = &self.q.data[off..off + dk];
            let kr = &self.k.data[off..off + dk];
            let qn = 1.0 / (dot(qr, qr) + 1e-6).sqrt() * scale;
            let kn = 1.0 / (dot(kr, kr) + 1e-6).sqrt();
            q.extend(qr.iter().map(|&x| x as f64 * qn));
            k.extend(kr.iter().map(|&x| x as f64 * kn));
            let voff = (t * hv + h) * dv;
            v.extend(self.v.data[voff..voff + dv].iter().map(|&x| x as f64));
            g.push(self.g.data[t * hv + h] as f64);
            beta.push(self.beta.data[t * hv + h] as f64);
        }
        Head { q, k, v, g, beta, dk, dv }
    }

    /// Run `per_head` (which fills `[L, dv]` for one value head) over all heads on all cores and
    /// interleave the results into `[L, Hv, dv]`.
    fn run(&self, per_head: impl Fn(&Head, &mut [f32]) + Sync) -> Result<Tensor> {
        let (l, _, _, hv, dv) = self.check()?;
        let mut heads = vec![0f32; hv * l * dv];
        par_rows(&mut heads, l * dv, |h, out| per_head(&self.head(h), out));
        let mut out = vec![0f32; l * hv * dv];
        for h in 0..hv {
            for t in 0..l {
                out[(t * hv + h) * dv..][..dv].copy_from_slice(&heads[(h * l + t) * dv..][..dv]);
            }
        }
        Tensor::new(vec![l, hv, dv], out)
    }
}

/// The plain per-token recurrence of the gated delta rule (the definition).
pub fn delta_rule_recurrent(x: &DeltaInputs) -> Result<Tensor> {
    x.run(|hd, out| {
        let (dk, dv) = (hd.dk, hd.dv);
        let mut s = vec![0f64; dk * dv]; // S[i, j], i over dk, j over dv
        for t in 0..hd.g.len() {
            let (q, k, v) = (&hd.q[t * dk..][..dk], &hd.k[t * dk..][..dk], &hd.v[t * dv..][..dv]);
            let decay = hd.g[t].exp();
            s.iter_mut().for_each(|x| *x *= decay);
            let mut u = vec![0f64; dv];
            for (i, &ki) in k.iter().enumerate() {
                for j in 0..dv {
                    u[j] += ki * s[i * dv + j];
                }
            }
            for j in 0..dv {
                u[j] = hd.beta[t] * (v[j] - u[j]);
            }
            for (i, &ki) in k.iter().enumerate() {
                for j in 0..dv {
                    s[i * dv + j] += ki * u[j];
                }
            }
            let o = &mut out[t * dv..][..dv];
            let mut acc = vec![0f64; dv];
            for (i, &qi) in q.iter().enumerate() {
                for j in 0..dv {
                    acc[j] += qi * s[i * dv + j];
                }
            }
            o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a as f32);
        }
    })
}

/// The chunked form (transformers' `torch_chunk_gated_delta_rule`, the form the GPU kernel
/// follows). Inside a chunk of `n ≤ chunk` tokens starting from state `S0`, with `γ_i` the
/// cumulative sum of `g` in the chunk:
/// - `A[i,j] = beta_i (k_i·k_j) e^{γ_i−γ_j}` for `j < i`;
/// - `U = (I + A)⁻¹ (beta ⊙ V − (beta e^{γ} ⊙ K) S0)` by forward substitution (the UT transform);
/// - `o_i = e^{γ_i} S0ᵀ q_i + Σ_{j ≤ i} (q_i·k_j) e^{γ_i−γ_j} u_j`;
/// - `S ← e^{γ_{n−1}} S0 + Σ_j e^{γ_{n−1}−γ_j} k_j u_jᵀ`.
///
/// A last chunk shorter than `chunk` is the same as transformers' zero padding.
pub fn delta_rule_chunked(x: &DeltaInputs, chunk: usize) -> Result<Tensor> {
    ensure!(chunk > 0, "chunk size must be positive");
    x.run(|hd, out| {
        let (dk, dv, l) = (hd.dk, hd.dv, hd.g.len());
        let mut s = vec![0f64; dk * dv];
        for c0 in (0..l).step_by(chunk) {
            let n = chunk.min(l - c0);
            let (q, k, v) = (&hd.q[c0 * dk..][..n * dk], &hd.k[c0 * dk..][..n * dk], &hd.v[c0 * dv..][..n * dv]);
            let beta = &hd.beta[c0..c0 + n];
            let mut gam = vec![0f64; n];
            let mut acc = 0.0;
            for i in 0..n {
                acc += hd.g[c0 + i];
                gam[i] = acc;
            }
            let kk = |i: usize, j: usize| k[i * dk..][..dk].iter().zip(&k[j * dk..][..dk]).map(|(a, b)| a * b).sum::<f64>();
            let qk = |i: usize, j: usize| q[i * dk..][..dk].iter().zip(&k[j * dk..][..dk]).map(|(a, b)| a * b).sum::<f64>();
            // r_i = beta_i (v_i − e^{γ_i} S0ᵀ k_i), then u_i = r_i − Σ_{j<i} A[i,j] u_j.
            let mut u = vec![0f64; n * dv];
            for i in 0..n {
                let eg = gam[i].exp();
                let mut sk = vec![0f64; dv];
                for (a, &ka) in k[i * dk..][..dk].iter().enumerate() {
                    for j in 0..dv {
                        sk[j] += ka * s[a * dv + j];
                    }
                }
                let mut ui: Vec<f64> = (0..dv).map(|j| beta[i] * (v[i * dv + j] - eg * sk[j])).collect();
                for j in 0..i {
                    let a = beta[i] * kk(i, j) * (gam[i] - gam[j]).exp();
                    for m in 0..dv {
                        ui[m] -= a * u[j * dv + m];
                    }
                }
                u[i * dv..][..dv].copy_from_slice(&ui);
            }
            // Outputs: the read of the incoming state plus the intra-chunk attention.
            for i in 0..n {
                let eg = gam[i].exp();
                let mut o = vec![0f64; dv];
                for (a, &qa) in q[i * dk..][..dk].iter().enumerate() {
                    for j in 0..dv {
                        o[j] += qa * s[a * dv + j];
                    }
                }
                o.iter_mut().for_each(|x| *x *= eg);
                for j in 0..=i {
                    let w = qk(i, j) * (gam[i] - gam[j]).exp();
                    for m in 0..dv {
                        o[m] += w * u[j * dv + m];
                    }
                }
                out[(c0 + i) * dv..][..dv].iter_mut().zip(&o).for_each(|(o, &x)| *o = x as f32);
            }
            // The state after the chunk.
            let last = gam[n - 1];
            s.iter_mut().for_each(|x| *x *= last.exp());
            for j in 0..n {
                let w = (last - gam[j]).exp();
                for (a, &ka) in k[j * dk..][..dk].iter().enumerate() {
                    for m in 0..dv {
                        s[a * dv + m] += w * ka * u[j * dv + m];
                    }
                }
            }
        }
    })
}

impl EncoderOps for Cpu {
    fn embed(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        ensure!(table.shape.len() == 2, "embed: table must be [vocab, hidden], got {:?}", table.shape);
        let (vocab, h) = (table.shape[0], table.shape[1]);
        let mut data = Vec::with_capacity(ids.len() * h);
        for &id in ids {
            ensure!((id as usize) < vocab, "token id {id} is outside the embedding table of {vocab}");
            data.extend_from_slice(&table.data[id as usize * h..][..h]);
        }
        Tensor::new(vec![ids.len(), h], data)
    }

    fn head_norm_rope(&self, x: &Tensor, w: &Tensor, eps: f64, rot: usize, theta: f64) -> Result<Tensor> {
        let (_, nh, hd) = dims3(x, "head_norm_rope")?;
        ensure!(w.numel() == hd, "head_norm_rope: weight {:?} for head_dim {hd}", w.shape);
        ensure!(rot.is_multiple_of(2) && rot <= hd, "head_norm_rope: rotary dim {rot} of head_dim {hd}");
        let half = rot / 2;
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, nh * hd, |t, row| {
            let ang = rope_angles(t, rot, theta);
            for h in 0..nh {
                let xr = &x.data[(t * nh + h) * hd..][..hd];
                let inv = 1.0 / (dot(xr, xr) / hd as f64 + eps).sqrt();
                let y: Vec<f64> = xr.iter().zip(&w.data).map(|(&a, &wi)| a as f64 * inv * (1.0 + wi as f64)).collect();
                let o = &mut row[h * hd..][..hd];
                for i in 0..half {
                    let (c, s) = ((ang[i] as f64).cos(), (ang[i] as f64).sin());
                    o[i] = (y[i] * c - y[i + half] * s) as f32;
                    o[i + half] = (y[i + half] * c + y[i] * s) as f32;
                }
                for i in rot..hd {
                    o[i] = y[i] as f32;
                }
            }
        });
        Tensor::new(x.shape.clone(), out)
    }

    fn causal_attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
        let (l, nh, hd) = dims3(q, "causal_attention q")?;
        let (lk, nkv, hdk) = dims3(k, "causal_attention k")?;
        ensure!(lk == l && hdk == hd && v.shape == k.shape, "causal_attention: q {:?} k {:?} v {:?}", q.shape, k.shape, v.shape);
        ensure!(nkv > 0 && nh % nkv == 0, "causal_attention: {nh} query heads over {nkv} KV heads");
        let mut out = vec![0f32; q.numel()];
        par_rows(&mut out, nh * hd, |t, row| causal_attention_row(q, k, v, scale, t, row));
        Tensor::new(q.shape.clone(), out)
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        ensure!(gate.shape == up.shape, "silu_mul: {:?} vs {:?}", gate.shape, up.shape);
        let data = gate.data.iter().zip(&up.data).map(|(&g, &u)| (silu(g) as f64 * u as f64) as f32).collect();
        Tensor::new(gate.shape.clone(), data)
    }

    fn causal_conv1d_silu(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        ensure!(x.shape.len() == 2, "causal_conv1d_silu: x must be [L, C], got {:?}", x.shape);
        let c = x.shape[1];
        ensure!(w.shape.len() == 3 && w.shape[0] == c && w.shape[1] == 1, "causal_conv1d_silu: weight {:?} for {c} channels", w.shape);
        let kk = w.shape[2];
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, c, |t, row| {
            for (ch, o) in row.iter_mut().enumerate() {
                let mut acc = 0f64;
                for j in 0..kk {
                    // input position t − (K−1) + j
                    if let Some(s) = (t + j).checked_sub(kk - 1) {
                        acc += w.data[ch * kk + j] as f64 * x.data[s * c + ch] as f64;
                    }
                }
                *o = (acc / (1.0 + (-acc).exp())) as f32;
            }
        });
        Tensor::new(x.shape.clone(), out)
    }

    fn gdn_gates(&self, a: &Tensor, b: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<(Tensor, Tensor)> {
        let hv = a.last_dim();
        ensure!(a.shape == b.shape, "gdn_gates: a {:?} vs b {:?}", a.shape, b.shape);
        ensure!(a_log.numel() == hv && dt_bias.numel() == hv, "gdn_gates: A_log {:?} / dt_bias {:?} for {hv} heads", a_log.shape, dt_bias.shape);
        let g = a
            .data
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let h = i % hv;
                (-(a_log.data[h] as f64).exp() * softplus(x as f64 + dt_bias.data[h] as f64)) as f32
            })
            .collect();
        let beta = b.data.iter().map(|&x| (1.0 / (1.0 + (-(x as f64)).exp())) as f32).collect();
        Ok((Tensor::new(a.shape.clone(), g)?, Tensor::new(b.shape.clone(), beta)?))
    }

    fn gated_delta_rule(&self, q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor, beta: &Tensor) -> Result<Tensor> {
        delta_rule_chunked(&DeltaInputs { q, k, v, g, beta }, DELTA_CHUNK)
    }

    fn gated_rms_norm(&self, x: &Tensor, z: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
        ensure!(x.shape == z.shape, "gated_rms_norm: x {:?} vs z {:?}", x.shape, z.shape);
        let d = x.last_dim();
        ensure!(w.numel() == d, "gated_rms_norm: weight {:?} for width {d}", w.shape);
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, d, |r, row| {
            let xr = &x.data[r * d..][..d];
            let zr = &z.data[r * d..][..d];
            let inv = 1.0 / (dot(xr, xr) / d as f64 + eps).sqrt();
            for i in 0..d {
                let zi = zr[i] as f64;
                let gate = zi / (1.0 + (-zi).exp());
                row[i] = (xr[i] as f64 * inv * w.data[i] as f64 * gate) as f32;
            }
        });
        Tensor::new(x.shape.clone(), out)
    }
}

/// One query position `t` of the causal GQA attention (the twin of `causal_attention`), all heads:
/// `row` is `[H·hd]`; query head h reads KV head `h / (H / Hkv)`; f64 softmax over keys `0..=t`.
pub fn causal_attention_row(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, t: usize, row: &mut [f32]) {
    let (nh, hd) = (q.shape[1], q.shape[2]);
    let nkv = k.shape[1];
    let rep = nh / nkv;
    let mut p = vec![0f64; t + 1];
    for h in 0..nh {
        let kv = h / rep;
        let qr = &q.data[(t * nh + h) * hd..][..hd];
        let mut m = f64::NEG_INFINITY;
        for (s, ps) in p.iter_mut().enumerate() {
            *ps = scale * dot(qr, &k.data[(s * nkv + kv) * hd..][..hd]);
            m = m.max(*ps);
        }
        let mut z = 0.0;
        p.iter_mut().for_each(|ps| {
            *ps = (*ps - m).exp();
            z += *ps;
        });
        let mut acc = vec![0f64; hd];
        for (s, &ps) in p.iter().enumerate() {
            for (a, &vv) in acc.iter_mut().zip(&v.data[(s * nkv + kv) * hd..][..hd]) {
                *a += ps * vv as f64;
            }
        }
        for (o, a) in row[h * hd..][..hd].iter_mut().zip(&acc) {
            *o = (a / z) as f32;
        }
    }
}
