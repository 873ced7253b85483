//! CPU twin of the VAE encoder's stride-2 convolution (math on [`VaeEncodeOps`]).
//!
//! The stride-2 sum is computed directly: for each output row `y`, the `Cin · 9` input values
//! each output column reads (`x[i, 2y + ky, 2x + kx]`, zero past the picture) are packed once
//! as f64 rows `[Cin · 9, W']`, and the decoder's row kernel (`conv_row_fast`, blocks of output
//! channels, f64 accumulation) sums them as a 1×1 convolution over `Cin · 9` channels: the
//! weight `[Cout, Cin, 3, 3]` is already `[Cout, Cin · 9]` in that order. Each output value is
//! `b + Σ_i Σ_ky Σ_kx w · x` summed in that order in f64, the order of the stride-1 twin.

use super::vae::{conv_row_fast, par_units};
use super::Cpu;
use crate::backend::ops::vae_encode::down2_side;
use crate::backend::ops::VaeEncodeOps;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

impl VaeEncodeOps for Cpu {
    fn conv2d_down2(&self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        ensure!(x.shape.len() == 4 && w.shape.len() == 4, "conv2d_down2: input {:?}, weight {:?}", x.shape, w.shape);
        let (n, cin, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let (cout, wcin, k, k2) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
        ensure!(wcin == cin && k == 3 && k2 == 3, "conv2d_down2: weight {:?} for {cin} input channels (3x3 only)", w.shape);
        ensure!(b.numel() == cout, "conv2d_down2: bias {:?} for {cout} outputs", b.shape);
        ensure!(h >= 2 && wd >= 2, "conv2d_down2: picture {:?} (at least 2x2)", x.shape);
        let (oh, ow) = (down2_side(h), down2_side(wd));
        let taps = cin * 9;
        let plane = oh * ow;
        let mut out = vec![0f32; n * cout * plane];
        for (ni, out_img) in out.chunks_mut(cout * plane).enumerate() {
            let img = &x.data[ni * cin * h * wd..][..cin * h * wd];
            par_units(out_img, plane, |o0, chunk| {
                let mut pack = vec![0f64; taps * ow];
                for y in 0..oh {
                    for i in 0..cin {
                        for ky in 0..3 {
                            let yy = 2 * y + ky;
                            for kx in 0..3 {
                                let row = &mut pack[(i * 9 + ky * 3 + kx) * ow..][..ow];
                                for (xo, d) in row.iter_mut().enumerate() {
                                    let xx = 2 * xo + kx;
                                    *d = if yy < h && xx < wd { img[(i * h + yy) * wd + xx] as f64 } else { 0.0 };
                                }
                            }
                        }
                    }
                    let ws = &w.data[o0 * taps..];
                    conv_row_fast(chunk, plane, ws, &b.data[o0..], &pack, ow, y, taps, 1, 0..1);
                }
            });
        }
        Tensor::new(vec![n, cout, oh, ow], out)
    }
}
