//! CPU twins of the VAE decoder's fused ops (math and shapes on [`VaeOps`]).
//!
//! The convolution is im2col-free: per output row it packs the `Cin · k` input rows it reads
//! (as f64, zero-padded, and widened ×2 when the upsample is folded in) once, then blocks of
//! `OB` output channels × `XT` columns accumulate the `k` taps of each packed row in f64, a loop
//! over columns that vectorises. Threads split the output channels. The attention works on tiles
//! of `TQ` query rows: one `[L, TQ]` block of scores at a time. Both inner loops also get an AVX2
//! build, picked at run time, with identical results.

use super::{par_rows, silu, Cpu};
use crate::backend::ops::vae::HostPicture;
use crate::backend::ops::VaeOps;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// Run `f(first_unit, chunk)` over `out` split into contiguous runs of whole units (each
/// `unit` long), one run per core.
pub(super) fn par_units(out: &mut [f32], unit: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let units = out.len().checked_div(unit).unwrap_or(0);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(units.max(1));
    if threads <= 1 {
        f(0, out);
        return;
    }
    let per = units.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(per * unit).enumerate() {
            let f = &f;
            s.spawn(move || f(t * per, chunk));
        }
    });
}

/// Output channels computed together (they share the loads of each packed input segment).
const OB: usize = 4;
/// Output columns per tile (the `OB` accumulator rows stay in L1).
const XT: usize = 128;

/// `acc[x] += Σ_t w[t] · p[x + t]` for every `x < acc.len()` (`p` holds `acc.len() + k − 1`).
#[inline(always)]
fn taps(acc: &mut [f64], p: &[f64], w: &[f32]) {
    let n = acc.len();
    if let [w0, w1, w2] = *w {
        let (w0, w1, w2) = (w0 as f64, w1 as f64, w2 as f64);
        for (((a, &x0), &x1), &x2) in acc.iter_mut().zip(&p[..n]).zip(&p[1..n + 1]).zip(&p[2..n + 2]) {
            *a += w0 * x0 + w1 * x1 + w2 * x2;
        }
    } else {
        for (t, &wt) in w.iter().enumerate() {
            let wt = wt as f64;
            for (a, &x) in acc.iter_mut().zip(&p[t..t + n]) {
                *a += wt * x;
            }
        }
    }
}

/// `f` compiled a second time for AVX2, called where the CPU has it. The loops inside are plain
/// IEEE f64 multiplies and adds in a fixed order (no FMA contraction), so both versions give the
/// same bits; the AVX2 one only has wider vectors. (`#[inline(always)]` bodies are inlined into
/// the `target_feature` twin, so it is vectorised for AVX2.)
macro_rules! avx2_twin {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) => $body:ident) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($a: $t),*) {
                    $body($($a),*)
                }
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { avx2($($a),*) };
                }
            }
            $body($($a),*)
        }
    };
}

avx2_twin!(
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv_row_fast(
        chunk: &mut [f32],
        plane: usize,
        ws: &[f32],
        bs: &[f32],
        pack: &[f64],
        ow: usize,
        y: usize,
        cin: usize,
        k: usize,
        kys: std::ops::Range<usize>,
    ) => conv_row
);

/// Output row `y` of every channel plane in `chunk` (each `plane` long; the weights `ws` and
/// biases `bs` start at the chunk's first channel), from the packed input rows `pack`
/// (`[Cin, k, W' + k − 1]`, f64), taps `kys` only. Each output value is
/// `b + Σ_i Σ_ky Σ_kx w · u` summed in that order in f64.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_row(chunk: &mut [f32], plane: usize, ws: &[f32], bs: &[f32], pack: &[f64], ow: usize, y: usize, cin: usize, k: usize, kys: std::ops::Range<usize>) {
    let pw = ow + k - 1;
    let couts = chunk.len() / plane;
    let mut acc = [[0f64; XT]; OB];
    for o0 in (0..couts).step_by(OB) {
        let ob = OB.min(couts - o0);
        for x0 in (0..ow).step_by(XT) {
            let n = XT.min(ow - x0);
            for (j, a) in acc[..ob].iter_mut().enumerate() {
                a[..n].fill(bs[o0 + j] as f64);
            }
            for i in 0..cin {
                for ky in kys.clone() {
                    let seg = &pack[(i * k + ky) * pw + x0..][..n + k - 1];
                    for (j, a) in acc[..ob].iter_mut().enumerate() {
                        taps(&mut a[..n], seg, &ws[(((o0 + j) * cin + i) * k + ky) * k..][..k]);
                    }
                }
            }
            for (j, a) in acc[..ob].iter().enumerate() {
                let row = &mut chunk[(o0 + j) * plane + y * ow + x0..][..n];
                for (d, &v) in row.iter_mut().zip(&a[..n]) {
                    *d = v as f32;
                }
            }
        }
    }
}

/// Query rows per attention tile (they share the loads of each key and value row).
const TQ: usize = 8;

/// One tile of `tq = out.len() / d ≤ TQ` query rows `q` against all keys `ks` / values `vs`
/// (`[L, d]`): one `[L, TQ]` block of scores, never `[L, L]`. f64 throughout: scores
/// `Σ_c q·k` in channel order, times `scale`; softmax with the row max subtracted; the
/// weighted sum of values in key order, divided by the row sum at the end.
#[inline(always)]
fn attention_tile(out: &mut [f32], q: &[f32], ks: &[f32], vs: &[f32], d: usize, scale: f64) {
    let tq = out.len() / d;
    let l = ks.len() / d;
    let mut qt = vec![0f64; d * TQ]; // [d][TQ], rows past tq stay zero
    for t in 0..tq {
        for c in 0..d {
            qt[c * TQ + t] = q[t * d + c] as f64;
        }
    }
    let mut s = vec![0f64; l * TQ]; // [L][TQ]
    for (sj, kj) in s.chunks_exact_mut(TQ).zip(ks.chunks_exact(d)) {
        let mut acc = [0f64; TQ];
        for (qc, &kc) in qt.chunks_exact(TQ).zip(kj) {
            let kc = kc as f64;
            for (a, &qv) in acc.iter_mut().zip(qc) {
                *a += qv * kc;
            }
        }
        for (o, a) in sj.iter_mut().zip(acc) {
            *o = a * scale;
        }
    }
    let mut m = [f64::NEG_INFINITY; TQ];
    for sj in s.chunks_exact(TQ) {
        for (mt, &v) in m.iter_mut().zip(sj) {
            *mt = mt.max(v);
        }
    }
    let mut sum = [0f64; TQ];
    let mut o = vec![0f64; tq * d];
    let mut vj64 = vec![0f64; d];
    for (sj, vj) in s.chunks_exact(TQ).zip(vs.chunks_exact(d)) {
        for (a, &v) in vj64.iter_mut().zip(vj) {
            *a = v as f64;
        }
        for t in 0..tq {
            let p = (sj[t] - m[t]).exp();
            sum[t] += p;
            for (a, &v) in o[t * d..(t + 1) * d].iter_mut().zip(&vj64) {
                *a += p * v;
            }
        }
    }
    for t in 0..tq {
        for (dst, &a) in out[t * d..(t + 1) * d].iter_mut().zip(&o[t * d..(t + 1) * d]) {
            *dst = (a / sum[t]) as f32;
        }
    }
}

avx2_twin!(
    fn attention_tile_fast(out: &mut [f32], q: &[f32], ks: &[f32], vs: &[f32], d: usize, scale: f64) => attention_tile
);

fn dims4(x: &Tensor, what: &str) -> Result<(usize, usize, usize, usize)> {
    ensure!(x.shape.len() == 4, "{what}: expected [N, C, H, W], got {:?}", x.shape);
    Ok((x.shape[0], x.shape[1], x.shape[2], x.shape[3]))
}

impl VaeOps for Cpu {
    /// Host memory, wherever the decoder asks for it.
    type Picture = HostPicture;

    fn picture(&self, c: usize, h: usize, w: usize, groups: usize, _on_device: bool) -> Result<HostPicture> {
        HostPicture::new(c, h, w, groups)
    }
    fn picture_rows(&self, p: &HostPicture, y0: usize, y1: usize, _next: Option<(usize, usize)>) -> Result<Tensor> {
        p.rows(y0, y1)
    }
    fn picture_put(&self, p: &mut HostPicture, y0: usize, y1: usize, t: &Tensor, skip: usize) -> Result<()> {
        let part = self.group_norm_row_stats(t, p.groups)?;
        p.put(y0, y1, t, skip, &part)
    }
    fn picture_row_stats(&self, p: &HostPicture) -> Result<Vec<f64>> {
        Ok(p.part.clone())
    }
    fn picture_set_channels(&self, p: &mut HostPicture, c: usize) -> Result<()> {
        p.set_channels(c)
    }

    fn bn_unpatchify(&self, z: &Tensor, mean: &Tensor, var: &Tensor, eps: f64, patch: [usize; 2]) -> Result<Tensor> {
        let (n, ck, h, w) = dims4(z, "bn_unpatchify")?;
        let [ph, pw] = patch;
        let pp = ph * pw;
        ensure!(pp > 0 && ck % pp == 0, "bn_unpatchify: {ck} channels do not split into {ph}x{pw} patches");
        ensure!(mean.numel() == ck && var.numel() == ck, "bn_unpatchify: statistics {:?} / {:?} for {ck} channels", mean.shape, var.shape);
        let c = ck / pp;
        let (oh, ow) = (h * ph, w * pw);
        let std: Vec<f32> = var.data.iter().map(|&v| (v + eps as f32).sqrt()).collect();
        let mut out = vec![0f32; n * ck * h * w];
        for ni in 0..n {
            for (k, &sd) in std.iter().enumerate() {
                let (ci, dy, dx) = (k / pp, (k % pp) / pw, k % pw);
                let src = &z.data[(ni * ck + k) * h * w..][..h * w];
                let dst = (ni * c + ci) * oh * ow;
                for y in 0..h {
                    for x in 0..w {
                        out[dst + (ph * y + dy) * ow + pw * x + dx] = src[y * w + x] * sd + mean.data[k];
                    }
                }
            }
        }
        Tensor::new(vec![n, c, oh, ow], out)
    }

    fn conv2d(&self, x: &Tensor, w: &Tensor, b: &Tensor, upsample2x: bool) -> Result<Tensor> {
        let (n, cin, h, wd) = dims4(x, "conv2d input")?;
        let (cout, wcin, k, k2) = dims4(w, "conv2d weight")?;
        ensure!(wcin == cin, "conv2d: weight {:?} for {cin} input channels", w.shape);
        ensure!(k == k2 && k % 2 == 1, "conv2d: kernel {k}x{k2} (odd square kernels only)");
        ensure!(b.numel() == cout, "conv2d: bias {:?} for {cout} outputs", b.shape);
        ensure!(h > 0 && wd > 0, "conv2d: empty picture {:?}", x.shape);
        let (oh, ow) = if upsample2x { (2 * h, 2 * wd) } else { (h, wd) };
        let pad = k / 2;
        let pw = ow + 2 * pad; // a packed row: `pad` zeros, the (widened) input row, `pad` zeros
        let plane = oh * ow;
        let mut out = vec![0f32; n * cout * plane];
        for (ni, out_img) in out.chunks_mut((cout * plane).max(1)).enumerate() {
            let img = &x.data[ni * cin * h * wd..][..cin * h * wd];
            par_units(out_img, plane, |o0, chunk| {
                let mut pack = vec![0f64; cin * k * pw];
                for y in 0..oh {
                    // Taps ky whose input row Y = y + ky − pad lies inside the (upsampled) picture.
                    let ky0 = pad.saturating_sub(y);
                    let ky1 = k.min(oh + pad - y);
                    for i in 0..cin {
                        for ky in ky0..ky1 {
                            let yy = y + ky - pad;
                            let src = &img[(i * h + if upsample2x { yy / 2 } else { yy }) * wd..][..wd];
                            let dst = &mut pack[(i * k + ky) * pw + pad..][..ow];
                            for (j, d) in dst.iter_mut().enumerate() {
                                *d = src[if upsample2x { j / 2 } else { j }] as f64;
                            }
                        }
                    }
                    let ws = &w.data[o0 * cin * k * k..];
                    conv_row_fast(chunk, plane, ws, &b.data[o0..], &pack, ow, y, cin, k, ky0..ky1);
                }
            });
        }
        Tensor::new(vec![n, cout, oh, ow], out)
    }

    fn group_norm_row_stats(&self, x: &Tensor, groups: usize) -> Result<Vec<f64>> {
        let (n, c, h, wd) = dims4(x, "group_norm")?;
        ensure!(groups > 0 && c % groups == 0, "group_norm: {c} channels in {groups} groups");
        let cg = c / groups;
        let per_row = (cg * wd) as f64;
        let mut out = vec![0f64; n * groups * h * 2];
        // One (image, group, row) at a time: the sum in (channel, column) order, then the squared
        // deviations from the row's mean in the same order.
        let one = |r: usize, o: &mut [f64]| {
            let (ng, y) = (r / h, r % h);
            let row = |j: usize| &x.data[((ng * cg + j) * h + y) * wd..][..wd];
            let mut s = 0f64;
            for j in 0..cg {
                s += row(j).iter().map(|&v| v as f64).sum::<f64>();
            }
            let m = s / per_row;
            let mut m2 = 0f64;
            for j in 0..cg {
                m2 += row(j).iter().map(|&v| (v as f64 - m) * (v as f64 - m)).sum::<f64>();
            }
            o[0] = s;
            o[1] = m2;
        };
        let units = n * groups * h;
        let threads = std::thread::available_parallelism().map(|t| t.get()).unwrap_or(1).min(units.max(1));
        let per = units.div_ceil(threads).max(1);
        std::thread::scope(|sc| {
            for (t, chunk) in out.chunks_mut(per * 2).enumerate() {
                let one = &one;
                sc.spawn(move || {
                    for (i, o) in chunk.chunks_exact_mut(2).enumerate() {
                        one(t * per + i, o);
                    }
                });
            }
        });
        Ok(out)
    }

    fn group_norm_apply(&self, x: &Tensor, w: &Tensor, b: &Tensor, groups: usize, stats: &[f64], eps: f64, silu_after: bool) -> Result<Tensor> {
        let (n, c, h, wd) = dims4(x, "group_norm")?;
        ensure!(groups > 0 && c % groups == 0, "group_norm: {c} channels in {groups} groups");
        ensure!(w.numel() == c && b.numel() == c, "group_norm: affine {:?} / {:?} for {c} channels", w.shape, b.shape);
        ensure!(stats.len() == n * groups * 2, "group_norm: {} statistics for {n}x{groups} groups", stats.len());
        let (cg, hw) = (c / groups, h * wd);
        let len = cg * hw;
        let mut out = vec![0f32; x.numel()];
        par_rows(&mut out, len, |r, row| {
            let xs = &x.data[r * len..(r + 1) * len];
            let (mean, var) = (stats[2 * r], stats[2 * r + 1]);
            let inv = 1.0 / (var + eps).sqrt();
            for j in 0..cg {
                let ch = (r % groups) * cg + j;
                let (g, bias) = (w.data[ch] as f64 * inv, b.data[ch] as f64);
                for (o, &v) in row[j * hw..(j + 1) * hw].iter_mut().zip(&xs[j * hw..(j + 1) * hw]) {
                    let y = ((v as f64 - mean) * g + bias) as f32;
                    *o = if silu_after { silu(y) } else { y };
                }
            }
        });
        Tensor::new(x.shape.clone(), out)
    }

    fn spatial_attention(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (_, l, d) = crate::backend::ops::vae::attention_dims(&q.shape, &k.shape, &v.shape)?;
        let scale = 1.0 / (d as f64).sqrt();
        let mut out = vec![0f32; q.numel()];
        for (ni, out_n) in out.chunks_mut((l * d).max(1)).enumerate() {
            let span = ni * l * d..(ni + 1) * l * d;
            let (qs, ks, vs) = (&q.data[span.clone()], &k.data[span.clone()], &v.data[span]);
            par_units(out_n, TQ * d, |u0, chunk| {
                for (ti, tile) in chunk.chunks_mut(TQ * d).enumerate() {
                    let r0 = (u0 + ti) * TQ;
                    attention_tile_fast(tile, &qs[r0 * d..r0 * d + tile.len()], ks, vs, d, scale);
                }
            });
        }
        Tensor::new(q.shape.clone(), out)
    }

    fn to_rgb8(&self, x: &Tensor) -> Result<Vec<u8>> {
        let (n, c, h, w) = dims4(x, "to_rgb8")?;
        ensure!(n == 1 && c == 3, "to_rgb8: expected one RGB picture [1, 3, H, W], got {:?}", x.shape);
        let hw = h * w;
        let mut rgb = vec![0u8; hw * 3];
        for ch in 0..3 {
            for (i, &v) in x.data[ch * hw..(ch + 1) * hw].iter().enumerate() {
                rgb[i * 3 + ch] = crate::tensor::to_u8(v.clamp(-1.0, 1.0));
            }
        }
        Ok(rgb)
    }
}
