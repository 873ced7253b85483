//! The e4m3 attention of `--precision fp8` in plain Rust: the arithmetic the CUDA kernels
//! (`cuda/dit/attention_fp8_operands.cu`, `moss_dit_flash_attention_fp8` in
//! `cuda/dit/sm90a/flash_attention_ws.cu`) run on Hopper, and the reference `moss check` gates
//! them against. The CPU forward keeps [`crate::backend::ops::DitOps::attention_packed`].
//!
//! Over the packed `[n, 3·D]` projection `[q | k | v]` after QK-norm and RoPE (`D = heads·hd`):
//! - q and k as e4m3 codes over one fixed scale each, [`row_scale`]`(√hd · max|w|)` of the QK-norm
//!   weight `w`: a normed head vector times `w` has no element beyond `√hd · max|w|`, nor has it
//!   after RoPE turns its pairs, so no code saturates and no pass over the tokens is needed.
//! - v as codes over one scale a (head, [`TILE`]-token tile): `row_scale` of the tile's amax.
//! - Scores `s = scale · sq · sk · (q'·k')`, an online softmax over key tiles of [`TILE`] (as the
//!   kernel runs it): at tile `t` the running max `m_t`, the probabilities `p = e^(s − m_t)` enter
//!   the product with V as the e4m3 codes of `256·p`, the normaliser sums `256·p` unrounded, and
//!   the output so far is scaled by `e^(m_{t−1} − m_t)`.
//!
//! [`Operands::vt`] is V^T in the kernel's layout (see [`vt_token`]), for the bit-exact gate of
//! the operands kernel.

use crate::backend::cpu::dot;
use crate::fp8::{e4m3_from_f32, e4m3_to_f32, row_scale};
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// Tokens a V scale covers: the kernel's key step.
pub const TILE: usize = 128;

/// The token stored at position `p` (0..32) of a 32-token group of V^T. The e4m3 wgmma's
/// register operand A (P) holds, in thread `t` of a quad, keys `4t .. 4t+3` (and `+ 16`) of each
/// 32-key step (CUTLASS `GMMA::ALayout_64x32`), where the score accumulator holds keys `2t, 2t+1,
/// 2t+8, 2t+9` (and `+ 16`); storing V^T's keys in this order lets a thread pack its own
/// probabilities: position `16a + 4b + c` holds token `16a + 8(c >> 1) + 2b + (c & 1)`.
pub fn vt_token(p: usize) -> usize {
    (p & 16) + ((p & 2) << 2) + (((p >> 2) & 3) << 1) + (p & 1)
}

/// The e4m3 operands of one attention.
pub struct Operands {
    pub n: usize,
    pub heads: usize,
    pub hd: usize,
    /// Codes `[n, D]`.
    pub q: Vec<u8>,
    pub k: Vec<u8>,
    pub v: Vec<u8>,
    /// `[sq, sk, sv[h·tiles + t] ...]`, as the kernel writes them.
    pub scales: Vec<f32>,
}

impl Operands {
    pub fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }
    fn sv(&self, h: usize, tile: usize) -> f32 {
        self.scales[2 + h * self.tiles() + tile]
    }
    /// V^T in the kernel's layout: `[D, TILE·tiles]`, row `h·hd + d` over the tokens, each
    /// 32-token group in [`vt_token`] order, zeros past `n`.
    pub fn vt(&self) -> Vec<u8> {
        let (d_all, npad) = (self.heads * self.hd, self.tiles() * TILE);
        let mut vt = vec![0u8; d_all * npad];
        for (c, row) in vt.chunks_mut(npad).enumerate() {
            for (pos, code) in row.iter_mut().enumerate() {
                let tok = pos / 32 * 32 + vt_token(pos % 32);
                if tok < self.n {
                    *code = self.v[tok * d_all + c];
                }
            }
        }
        vt
    }
}

/// The operands of [`attention_rows`] from the packed projection `qkv [n, 3·heads·hd]` (the
/// values the kernel reads: bf16) and the QK-norm weights `wq`, `wk` `[hd]`.
pub fn operands(qkv: &Tensor, heads: usize, wq: &Tensor, wk: &Tensor) -> Result<Operands> {
    ensure!(qkv.shape.len() == 2 && heads > 0 && qkv.shape[1].is_multiple_of(3 * heads), "attention_fp8: qkv {:?} for {heads} heads", qkv.shape);
    let (n, hd) = (qkv.shape[0], qkv.shape[1] / (3 * heads));
    ensure!(wq.data.len() == hd && wk.data.len() == hd, "attention_fp8: QK-norm weights of {} and {}, head dim {hd}", wq.data.len(), wk.data.len());
    let d_all = heads * hd;
    let sqrt_hd = (hd as f32).sqrt();
    let bound = |w: &Tensor| row_scale(sqrt_hd * w.data.iter().fold(0f32, |m, x| m.max(x.abs())));
    let (sq, sk) = (bound(wq), bound(wk));
    let codes = |part: usize, s: f32| -> Vec<u8> {
        (0..n).flat_map(|t| qkv.data[t * 3 * d_all + part * d_all..][..d_all].iter().map(move |&x| e4m3_from_f32(x / s))).collect()
    };
    let tiles = n.div_ceil(TILE);
    let mut scales = vec![sq, sk];
    let mut v = vec![0u8; n * d_all];
    let mut sv = vec![0f32; heads * tiles];
    for h in 0..heads {
        for t in 0..tiles {
            let toks = t * TILE..((t + 1) * TILE).min(n);
            let at = |tok: usize, d: usize| qkv.data[tok * 3 * d_all + 2 * d_all + h * hd + d];
            let amax = toks.clone().flat_map(|tok| (0..hd).map(move |d| at(tok, d).abs())).fold(0f32, f32::max);
            let s = row_scale(amax);
            sv[h * tiles + t] = s;
            for tok in toks {
                for d in 0..hd {
                    v[tok * d_all + h * hd + d] = e4m3_from_f32(at(tok, d) / s);
                }
            }
        }
    }
    scales.extend(sv);
    Ok(Operands { n, heads, hd, q: codes(0, sq), k: codes(1, sk), v, scales })
}

/// The attention output for the query `rows`: `[rows.len(), D]` (f64 arithmetic between the
/// rounding points the module's doc names).
pub fn attention_rows(o: &Operands, scale: f64, rows: &[usize]) -> Result<Tensor> {
    let (n, heads, hd) = (o.n, o.heads, o.hd);
    let d_all = heads * hd;
    ensure!(rows.iter().all(|&r| r < n), "attention_fp8: query rows past {n}");
    let val = |c: &[u8]| c.iter().map(|&x| e4m3_to_f32(x)).collect::<Vec<f32>>();
    let (q, k, v) = (val(&o.q), val(&o.k), val(&o.v));
    let qk = scale * o.scales[0] as f64 * o.scales[1] as f64;
    let mut out = vec![0f32; rows.len() * d_all];
    crate::backend::cpu::par_rows(&mut out, d_all, |r, row| {
        let i = rows[r];
        for h in 0..heads {
            let qi = &q[i * d_all + h * hd..][..hd];
            let (mut m, mut l) = (f64::NEG_INFINITY, 0f64);
            let mut acc = vec![0f64; hd];
            for t in 0..o.tiles() {
                let toks = t * TILE..((t + 1) * TILE).min(n);
                let s: Vec<f64> = toks.clone().map(|j| qk * dot(qi, &k[j * d_all + h * hd..][..hd])).collect();
                let m_new = s.iter().copied().fold(m, f64::max);
                let corr = (m - m_new).exp();
                l *= corr;
                acc.iter_mut().for_each(|a| *a *= corr);
                let sv = o.sv(h, t) as f64;
                for (j, sj) in toks.zip(s) {
                    let p256 = 256.0 * (sj - m_new).exp();
                    l += p256;
                    let pc = e4m3_to_f32(e4m3_from_f32(p256 as f32)) as f64 * sv;
                    for (a, &x) in acc.iter_mut().zip(&v[j * d_all + h * hd..][..hd]) {
                        *a += pc * x as f64;
                    }
                }
                m = m_new;
            }
            for (y, a) in row[h * hd..][..hd].iter_mut().zip(&acc) {
                *y = (a / l) as f32;
            }
        }
    });
    Tensor::new(vec![rows.len(), d_all], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::dit::attention_row;

    /// Lane `t`'s A-fragment bytes (CUTLASS `GMMA::ALayout_64x32`: register `j`, byte `q` is K
    /// index `4t + q + 16·(j >> 1)`, row `+ 8·(j & 1)`) against the accumulator keys it holds
    /// (`8i + 2t + e`): through [`vt_token`], every K position names a key the lane holds for
    /// that row, and the positions are a permutation of the 32 keys.
    #[test]
    fn vt_order_is_the_a_fragments() {
        let mut seen = [false; 32];
        for t in 0..4 {
            for j in 0..4 {
                for q in 0..4 {
                    let pos = 4 * t + q + 16 * (j >> 1);
                    let key = vt_token(pos);
                    // the softmax packs accumulator group i = 2·(j >> 1) + (q >> 1), element e = q & 1
                    let (i, e) = (2 * (j >> 1) + (q >> 1), q & 1);
                    assert_eq!(key, 8 * i + 2 * t + e, "lane {t}, register {j}, byte {q}");
                    if j & 1 == 0 {
                        assert!(!seen[key]);
                        seen[key] = true;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    fn normed_qkv(n: usize, heads: usize, hd: usize, seed: u64) -> (Tensor, Tensor, Tensor) {
        let mut state = seed;
        let mut uniform = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let d = heads * hd;
        // Box-Muller normals
        let mut x: Vec<f32> = (0..n * 3 * d).map(|_| ((-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos()) as f32).collect();
        let wq: Vec<f32> = (0..hd).map(|i| 0.6 + 0.8 * ((i * 37 % hd) as f32 / hd as f32)).collect();
        let wk: Vec<f32> = (0..hd).map(|i| 1.4 - 0.7 * ((i * 11 % hd) as f32 / hd as f32)).collect();
        for t in 0..n {
            for (p, w) in [&wq, &wk].into_iter().enumerate() {
                for h in 0..heads {
                    let r = &mut x[t * 3 * d + p * d + h * hd..][..hd];
                    let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f32>() / hd as f32 + 1e-6).sqrt();
                    r.iter_mut().zip(w).for_each(|(v, w)| *v *= inv * w);
                }
            }
        }
        let bf = |v: Vec<f32>, shape: Vec<usize>| Tensor::new(shape, v.into_iter().map(|x| half::bf16::from_f32(x).to_f32()).collect()).unwrap();
        (bf(x, vec![n, 3 * d]), bf(wq, vec![hd]), bf(wk, vec![hd]))
    }

    /// On QK-normed inputs: no q or k code saturates, V^T holds every code once in the kernel's
    /// order, and the e4m3 attention lands within e4m3's error of the exact attention, not on it
    /// (the codes are used): measured 5.4e-2.
    #[test]
    fn e4m3_attention_against_exact() {
        let (n, heads, hd) = (300, 2, 64);
        let (qkv, wq, wk) = normed_qkv(n, heads, hd, 3);
        let o = operands(&qkv, heads, &wq, &wk).unwrap();
        assert!(o.q.iter().chain(&o.k).all(|&c| c & 0x7f != 0x7e), "a q or k code saturated");
        assert_eq!(o.scales.len(), 2 + heads * 3);
        let vt = o.vt();
        let d_all = heads * hd;
        let npad = 3 * TILE;
        for tok in [0, 1, 17, 31, 130, 299] {
            let pos = (0..32).find(|&p| vt_token(p) == tok % 32).unwrap() + tok / 32 * 32;
            assert_eq!(vt[5 * npad + pos], o.v[tok * d_all + 5]);
        }
        assert!(vt[5 * npad + 310..5 * npad + 320].iter().all(|&c| c == 0), "tokens past n are zero");
        let scale = 1.0 / (hd as f64).sqrt();
        let rows: Vec<usize> = vec![0, 7, 128, 255, 299];
        let got = attention_rows(&o, scale, &rows).unwrap();
        let split = |p: usize| {
            let data = (0..n).flat_map(|t| qkv.data[t * 3 * d_all + p * d_all..][..d_all].to_vec()).collect();
            Tensor::new(vec![n, heads, hd], data).unwrap()
        };
        let (q, k, v) = (split(0), split(1), split(2));
        let mut want = vec![0f32; rows.len() * d_all];
        for (r, &i) in rows.iter().enumerate() {
            attention_row(&q, &k, &v, scale, i, &mut want[r * d_all..][..d_all]);
        }
        let err = crate::tensor::rel_l2(&got.data, &want);
        println!("e4m3 attention against exact: rel L2 {err:.3e}");
        // e4m3 keeps 3 mantissa bits: ~3.6% rms a rounding, in q·k, P and V each (on random
        // inputs the attention is flat, so nothing averages it out)
        assert!(err > 1e-2 && err < 8e-2, "rel L2 {err}");
    }
}
