//! The split decode of [`VaeDecoder`] (see the module doc of `crate::model::vae`): where the
//! pictures between layers are kept ([`Keep`], [`Pic`]), the row strips of one conv
//! ([`conv_strips`], [`input_span`]), and the resnets and the decoder in strips.

use super::{Conv, GroupNorm, Resnet, VaeDecoder};
use crate::backend::ops::vae::{group_norm_combine, picture_bytes};
use crate::backend::ops::VaeOps;
use anyhow::{ensure, Result};
use std::cell::Cell;

/// Where a split decode keeps its pictures: device memory while `budget` bytes last (pictures
/// live at once counted), host memory after; and what that cost.
pub(super) struct Keep {
    budget: usize,
    used: Cell<usize>,
    report: Cell<SplitReport>,
}

/// What a split decode kept where ([`VaeDecoder::decode_rgb8_report`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitReport {
    /// Most device bytes the kept pictures held at once.
    pub kept_peak_bytes: usize,
    /// Pictures kept in device memory / in host memory.
    pub device_pictures: usize,
    pub host_pictures: usize,
    /// Bytes copied between host pictures and the device (rows read, rows written).
    pub host_bytes_moved: usize,
}

impl Keep {
    pub(super) fn new(budget: usize) -> Keep {
        Keep { budget, used: Cell::new(0), report: Cell::new(SplitReport::default()) }
    }
    fn note(&self, f: impl FnOnce(&mut SplitReport)) {
        let mut r = self.report.get();
        f(&mut r);
        self.report.set(r);
    }
    /// A new picture `[1, c, h, w]`: on the device if it fits the budget next to those still live.
    pub(super) fn picture<'k, B: VaeOps>(&'k self, b: &B, dims: [usize; 3], groups: usize) -> Result<Pic<'k, B>> {
        let [c, h, w] = dims;
        let bytes = picture_bytes(c, h, w, groups);
        let on_device = self.used.get() + bytes <= self.budget;
        let p = b.picture(c, h, w, groups, on_device)?;
        let device = if on_device { bytes } else { 0 };
        self.used.set(self.used.get() + device);
        let used = self.used.get();
        self.note(|r| {
            r.kept_peak_bytes = r.kept_peak_bytes.max(used);
            if on_device {
                r.device_pictures += 1;
            } else {
                r.host_pictures += 1;
            }
        });
        Ok(Pic { p, dims, groups, device, keep: self })
    }
}

/// A picture kept between layers ([`VaeOps::picture`]), `dims` `[C, H, W]`, holding `device`
/// bytes of the [`Keep`] budget until dropped.
pub(super) struct Pic<'k, B: VaeOps> {
    p: B::Picture,
    pub(super) dims: [usize; 3],
    groups: usize,
    device: usize,
    keep: &'k Keep,
}

impl<B: VaeOps> Pic<'_, B> {
    fn moved(&self, b: &B, t: &B::T, rows: usize) {
        if self.device == 0 {
            let d = b.dims(t);
            let bytes = 4 * d[1] * rows * d[3];
            self.keep.note(|r| r.host_bytes_moved += bytes);
        }
    }
    pub(super) fn rows(&self, b: &B, y0: usize, y1: usize, next: Option<(usize, usize)>) -> Result<B::T> {
        let t = b.picture_rows(&self.p, y0, y1, next)?;
        self.moved(b, &t, y1 - y0);
        Ok(t)
    }
    pub(super) fn put(&mut self, b: &B, y0: usize, y1: usize, t: &B::T, skip: usize) -> Result<()> {
        b.picture_put(&mut self.p, y0, y1, t, skip)?;
        self.moved(b, t, y1 - y0);
        Ok(())
    }
    fn set_channels(&mut self, b: &B, c: usize) -> Result<()> {
        b.picture_set_channels(&mut self.p, c)?;
        self.dims[0] = c;
        Ok(())
    }
}

impl<B: VaeOps> Drop for Pic<'_, B> {
    fn drop(&mut self) {
        self.keep.used.set(self.keep.used.get() - self.device);
    }
}

/// How a decode runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every activation on the backend at once.
    Whole,
    /// After the mid block, layer by layer in row strips (see the module doc).
    Strips(Strips),
}

/// Row strips: `rows` output rows of each layer (at its own resolution) per strip; the pictures
/// kept between layers on the device while they fit in `keep_bytes`, in host memory after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strips {
    pub rows: usize,
    pub keep_bytes: usize,
    /// Planted for the tests' control: strips get no halo rows (each strip's edges then see the
    /// conv's zero padding instead of their neighbours). Never set outside tests.
    pub no_halo: bool,
}

impl Split {
    /// Strips of `rows` rows (at least 1), with the halo, every kept picture in host memory
    /// (the least device memory; `moss decode --strip-rows`).
    pub fn strips(rows: usize) -> Split {
        Split::strips_keeping(rows, 0)
    }
    /// Strips of `rows` rows, pictures kept on the device while they fit in `keep_bytes`.
    pub fn strips_keeping(rows: usize, keep_bytes: usize) -> Split {
        Split::Strips(Strips { rows: rows.max(1), keep_bytes, no_halo: false })
    }
}

/// The input rows `a..b` (of `h_in`) a conv with kernel `k` needs for its output rows
/// `y0..y1`, and where `y0` sits in the conv's output over those input rows. The halo is `k/2`
/// rows; with the folded ×2 upsample, output row `Y` reads upsampled rows `Y ± k/2`, i.e. input
/// rows `⌊(Y ± k/2)/2⌋`. Rows of the strip's own output that saw the strip's edge (zero padding
/// standing in for a neighbour row) lie outside `y0..y1` and are dropped.
pub(super) fn input_span(y0: usize, y1: usize, h_in: usize, k: usize, up: bool, halo: bool) -> (usize, usize, usize) {
    let p = if halo { k / 2 } else { 0 };
    if up {
        let a = y0.saturating_sub(p) / 2;
        let b = ((y1 - 1 + p) / 2 + 1).min(h_in);
        (a, b, y0 - 2 * a)
    } else {
        let a = y0.saturating_sub(p);
        (a, (y1 + p).min(h_in), y0 - a)
    }
}

/// One conv (optionally after a GroupNorm + SiLU with given statistics) over the kept picture
/// `x` in row strips: `out(y0, y1, strip, skip)` gets each strip's output, whose rows
/// `skip..skip + y1 − y0` are the conv's output rows `y0..y1` (the others saw the strip's edge).
#[allow(clippy::too_many_arguments)]
fn conv_strips<B: VaeOps>(
    b: &B,
    x: &Pic<B>,
    norm: Option<(&GroupNorm<B>, &[f64])>,
    conv: &Conv<B>,
    up: bool,
    sp: Strips,
    mut out: impl FnMut(usize, usize, B::T, usize) -> Result<()>,
) -> Result<()> {
    let h_in = x.dims[1];
    let k = b.dims(&conv.weight)[2];
    let oh = if up { 2 * h_in } else { h_in };
    let span = |y0: usize| input_span(y0, (y0 + sp.rows).min(oh), h_in, k, up, !sp.no_halo);
    for y0 in (0..oh).step_by(sp.rows) {
        let y1 = (y0 + sp.rows).min(oh);
        let (a, e, off) = span(y0);
        let next = (y1 < oh).then(|| span(y1)).map(|(a, e, _)| (a, e));
        let xs = x.rows(b, a, e, next)?;
        let o = match norm {
            Some((n, st)) => n.conv_with(b, &xs, st, true, conv, up)?,
            None => conv.conv(b, &xs, up)?,
        };
        drop(xs);
        out(y0, y1, o, off)?;
    }
    Ok(())
}

/// Rows `skip..skip + rows` of a strip `[1, C, r, W]` (itself when that is all of it).
fn valid_rows<B: VaeOps>(b: &B, t: B::T, skip: usize, rows: usize) -> Result<B::T> {
    if skip == 0 && b.dims(&t)[2] == rows {
        Ok(t)
    } else {
        b.narrow(&t, 2, skip, rows)
    }
}

impl<B: VaeOps> GroupNorm<B> {
    /// The (mean, variance) per group of a kept picture, from the row partials gathered as its
    /// strips were written: the same partials, combined the same way, as [`VaeOps::group_norm`]
    /// over the whole picture.
    fn stats_of(&self, b: &B, x: &Pic<B>) -> Result<Vec<f64>> {
        let [c, h, w] = x.dims;
        ensure!(x.groups == self.groups && c % self.groups == 0, "VAE split: row partials for {} groups, wanted {}", x.groups, self.groups);
        let part = b.picture_row_stats(&x.p)?;
        ensure!(part.len() == self.groups * h * 2, "VAE split: {} row partials for {} groups x {h} rows", part.len(), self.groups);
        Ok(group_norm_combine(&part, self.groups, h, c / self.groups * w))
    }
}

impl<B: VaeOps> Resnet<B> {
    /// [`Resnet::forward`] in row strips, `x` and the result kept pictures: `h` (the first conv's
    /// output) is kept whole for the second GroupNorm's statistics; the output goes over `x`,
    /// strip by strip after its rows were read, when it has no more channels than `x`.
    pub(super) fn forward_strips<'k>(&self, b: &B, x: Pic<'k, B>, sp: Strips, keep: &'k Keep) -> Result<Pic<'k, B>> {
        let [c, hh, w] = x.dims;
        let cout = b.dims(&self.conv1.weight)[0];
        let st1 = self.norm1.stats_of(b, &x)?;
        let mut h = keep.picture(b, [cout, hh, w], x.groups)?;
        conv_strips(b, &x, Some((&self.norm1, &st1)), &self.conv1, false, sp, |y0, y1, t, skip| h.put(b, y0, y1, &t, skip))?;
        let st2 = self.norm2.stats_of(b, &h)?;
        let mut x = x;
        let mut fresh = if cout <= c { None } else { Some(keep.picture(b, [cout, hh, w], x.groups)?) };
        conv_strips(b, &h, Some((&self.norm2, &st2)), &self.conv2, false, sp, |y0, y1, t, skip| {
            let t = valid_rows(b, t, skip, y1 - y0)?;
            let next = (y1 < hh).then(|| (y1, (y1 + sp.rows).min(hh)));
            let xs = x.rows(b, y0, y1, next)?;
            let o = match &self.conv_shortcut {
                Some(s) => b.add(&s.forward(b, &xs)?, &t)?,
                None => b.add(&xs, &t)?,
            };
            drop(xs);
            match fresh.as_mut() {
                Some(f) => f.put(b, y0, y1, &o, 0),
                None => x.put(b, y0, y1, &o, 0),
            }
        })?;
        drop(h);
        match fresh {
            Some(f) => Ok(f),
            None => {
                x.set_channels(b, cout)?;
                Ok(x)
            }
        }
    }
}

impl<B: VaeOps> VaeDecoder<B> {
    /// The split decode: the mid block whole, then every layer in row strips, the pictures
    /// between layers kept as `sp` says; the last conv's strips (`[1, 3, r, W]`, on the backend,
    /// not clamped) go to `sink(y0, strip)` in order.
    pub(super) fn forward_strips(&self, b: &B, z: &B::T, sp: Strips, mut sink: impl FnMut(usize, B::T) -> Result<()>) -> Result<SplitReport> {
        let g = self.conv_norm_out.groups;
        let keep = Keep::new(sp.keep_bytes);
        let mid = self.forward_mid(b, z)?;
        let d = b.dims(&mid);
        let mut x = keep.picture(b, [d[1], d[2], d[3]], g)?;
        x.put(b, 0, d[2], &mid, 0)?;
        drop(mid);
        for up in &self.up_blocks {
            for r in &up.resnets {
                x = r.forward_strips(b, x, sp, &keep)?;
            }
            if let Some(u) = &up.upsampler {
                let [_, h, w] = x.dims;
                let mut o = keep.picture(b, [b.dims(&u.weight)[0], 2 * h, 2 * w], g)?;
                conv_strips(b, &x, None, u, true, sp, |y0, y1, t, skip| o.put(b, y0, y1, &t, skip))?;
                x = o;
            }
        }
        let st = self.conv_norm_out.stats_of(b, &x)?;
        conv_strips(b, &x, Some((&self.conv_norm_out, &st)), &self.conv_out, false, sp, |y0, y1, t, skip| sink(y0, valid_rows(b, t, skip, y1 - y0)?))?;
        drop(x);
        Ok(keep.report.get())
    }
}

#[cfg(test)]
mod tests {
    use super::input_span;

    /// Every output row of every strip sees, for each 3×3 tap, exactly what it sees in the whole
    /// picture: the same input row where the whole picture has one, zero padding where the whole
    /// picture pads; with and without the folded ×2 upsample, for all small heights and strips.
    /// Without the halo that fails (the planted control of the model's own test, here on the
    /// bookkeeping alone).
    #[test]
    fn input_span_covers_every_tap() {
        let ok = |halo: bool| -> bool {
            for up in [false, true] {
                let f = if up { 2 } else { 1 };
                for h_in in 1..12usize {
                    let oh = f * h_in;
                    for rows in 1..8usize {
                        for y0 in (0..oh).step_by(rows) {
                            let y1 = (y0 + rows).min(oh);
                            let (a, b, off) = input_span(y0, y1, h_in, 3, up, halo);
                            assert!(a < b && b <= h_in && off == y0 - f * a);
                            let u = (b - a) * f; // rows of the strip's (upsampled) input
                            for y in y0..y1 {
                                for ky in 0..3 {
                                    let yy = y as isize + ky - 1; // the whole picture's row
                                    let yl = yy - (f * a) as isize; // the strip's row
                                    let whole = (0..oh as isize).contains(&yy).then(|| yy as usize / f);
                                    let strip = (0..u as isize).contains(&yl).then(|| yl as usize / f + a);
                                    if whole != strip {
                                        return false;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            true
        };
        assert!(ok(true), "a strip reads a different row than the whole picture");
        assert!(!ok(false), "without the halo the check must fail");
    }
}
