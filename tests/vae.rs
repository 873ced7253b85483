//! The FLUX.2 small VAE decoder (spec 7) on the CPU backend against diffusers'
//! `AutoencoderKLFlux2.decode` as run by golden/make_golden.py (`vae.z` → `vae.out` /
//! `vae.pixels`, `loop.latents` → `loop.out` / golden/expected/<ckpt>.png), and the fused ops
//! against plain reference loops written here.

mod common;

use common::{assert_close, checkpoint, golden, Expected, CHECKPOINTS};
use moss::backend::cpu::Cpu;
use moss::backend::ops::VaeOps;
use moss::model::vae::{Split, Strips, VaeDecoder};
use moss::tensor::{rel_l2, Tensor};

/// The bound of the issue: rel L2 < 1e-5 against diffusers' fp32 decode.
const VAE_BOUND: f64 = 1e-5;
/// "The uint8 pixels are equal (at most a few values off by 1)".
const MAX_OFF_BY_ONE: usize = 4;

fn decoder(name: &str) -> (moss::checkpoint::Checkpoint, VaeDecoder<Cpu>) {
    let ck = checkpoint(name);
    let comp = ck.open_component("vae").unwrap();
    let vae = VaeDecoder::load(&Cpu, &comp, &ck.vae).unwrap();
    (ck, vae)
}

/// Compare RGB8 buffers: none off by more than 1, at most `MAX_OFF_BY_ONE` off by 1.
fn assert_pixels(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: {} bytes vs {}", got.len(), want.len());
    let off: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    let worst = off.iter().map(|&i| (got[i] as i32 - want[i] as i32).abs()).max().unwrap_or(0);
    println!("{what}: {} of {} values differ, largest difference {worst}", off.len(), got.len());
    assert!(worst <= 1, "{what}: a value is off by {worst} (index {:?})", off.iter().find(|&&i| (got[i] as i32 - want[i] as i32).abs() > 1));
    assert!(off.len() <= MAX_OFF_BY_ONE, "{what}: {} values off by one (at most {MAX_OFF_BY_ONE} allowed)", off.len());
}

#[test]
fn decode_matches_diffusers_on_golden_z() {
    for name in CHECKPOINTS {
        let exp = Expected::load(name);
        let (_, vae) = decoder(name);
        let z = exp.tensor("vae.z");
        let want = exp.tensor("vae.out");
        let img = vae.decode(&Cpu, &z).unwrap();
        let (w, h) = (exp.json["width"].as_u64().unwrap() as usize, exp.json["height"].as_u64().unwrap() as usize);
        assert_eq!(img.shape, vec![3, h, w], "{name}: picture shape");
        assert_eq!(want.shape, img.shape, "{name}: golden picture shape");
        assert_close(&format!("{name} vae.out"), &img.data, &want.data, VAE_BOUND);
        let px = vae.decode_rgb8(&Cpu, &z).unwrap();
        assert_pixels(&format!("{name} vae.pixels"), &px, exp.raw("vae.pixels"));
    }
}

#[test]
fn decode_of_loop_latents_matches_golden_png() {
    for name in CHECKPOINTS {
        let exp = Expected::load(name);
        let (_, vae) = decoder(name);
        let lat = exp.tensor("loop.latents");
        let img = vae.decode(&Cpu, &lat).unwrap();
        assert_close(&format!("{name} loop.out"), &img.data, &exp.tensor("loop.out").data, VAE_BOUND);
        let px = vae.decode_rgb8(&Cpu, &lat).unwrap();
        let bytes = std::fs::read(golden().join("expected").join(format!("{name}.png"))).unwrap();
        let (want, w, h, _) = moss::png::decode(&bytes).unwrap();
        assert_eq!((w as usize, h as usize), (img.shape[2], img.shape[1]), "{name}: png size");
        assert_pixels(&format!("{name} {name}.png"), &px, &want);
        assert_pixels(&format!("{name} loop.pixels"), &px, exp.raw("loop.pixels"));
    }
}

/// Every latent grid the pipeline accepts decodes, including 1×1 and odd non-square grids, to
/// `[3, 16h, 16w]`, and the float and RGB8 paths agree.
#[test]
fn decode_works_for_odd_and_non_square_grids() {
    let (ck, vae) = decoder("tiny-b");
    let c = ck.vae.packed_channels();
    for (h, w) in [(1, 1), (1, 3), (3, 2), (5, 1)] {
        let z = Tensor::new(vec![1, c, h, w], rand(c * h * w, (h * 31 + w) as u64)).unwrap();
        let img = vae.decode(&Cpu, &z).unwrap();
        assert_eq!(img.shape, vec![3, 16 * h, 16 * w]);
        assert!(img.data.iter().all(|v| (-1.0..=1.0).contains(v)), "{h}x{w}: not clamped / not finite");
        let px = vae.decode_rgb8(&Cpu, &z).unwrap();
        let (hh, ww) = (16 * h, 16 * w);
        let from_float: Vec<u8> = (0..hh * ww * 3).map(|i| moss::png::to_u8(img.data[(i % 3) * hh * ww + i / 3])).collect();
        assert_eq!(px, from_float, "{h}x{w}: to_rgb8 vs the float picture");
    }
    // A wrong latent shape is refused, not decoded.
    let z = Tensor::new(vec![1, c / 2, 2, 2], rand(c * 2, 1)).unwrap();
    let e = vae.decode(&Cpu, &z).unwrap_err().to_string();
    assert!(e.contains("expected [1, 128, h, w]"), "{e}");
}

// ---- the split decode ---------------------------------------------------------------------------

/// A decode split into row strips (issue #8) is the unsplit picture bit for bit: the float
/// output and the RGB8 bytes, on both golden checkpoints (64x64 and 96x64 pictures: the strips
/// run at 16, 32 and 64/96 rows after the mid block's 8/12), for strip heights that divide the
/// heights, that do not (3, 5, 7, 13: strip edges at odd rows, so the folded ×2 upsample's halo
/// comes from the low-resolution row before), strips smaller than the halo (1 and 2 rows), and
/// one taller than the picture; with every kept picture in host memory, all on the device, and
/// some of each (the CPU keeps them all in memory, but the decoder's bookkeeping, the resnets
/// writing their output over their input included, is the same). The planted control (strips
/// without their halo rows) must differ, so the comparison can fail.
#[test]
fn strip_decode_is_bit_identical_to_whole() {
    for name in CHECKPOINTS {
        let exp = Expected::load(name);
        let (ck, vae) = decoder(name);
        let z = exp.tensor("vae.z");
        let whole = vae.decode_with(&Cpu, &z, Split::Whole).unwrap();
        let whole_px = vae.decode_rgb8_with(&Cpu, &z, Split::Whole).unwrap();
        assert_close(&format!("{name} whole vae.out"), &whole.data, &exp.tensor("vae.out").data, VAE_BOUND);
        let bits = |t: &Tensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        let all = moss::backend::cuda::vae::vae_keep_bytes(&ck.vae, z.shape[2], z.shape[3]);
        for rows in [1, 2, 3, 5, 7, 8, 13, 64, 1000] {
            for keep in [0, all / 2, usize::MAX] {
                let split = Split::strips_keeping(rows, keep);
                let img = vae.decode_with(&Cpu, &z, split).unwrap();
                assert_eq!(img.shape, whole.shape, "{name} rows {rows}: shape");
                let differ = bits(&img).iter().zip(bits(&whole)).filter(|(a, b)| **a != *b).count();
                println!("{name}: strips of {rows} rows, {keep} bytes kept: {differ} float values differ from the whole decode");
                assert_eq!(differ, 0, "{name}: strips of {rows} rows ({keep} bytes kept) differ from the whole decode");
                let (px, report) = vae.decode_rgb8_report(&Cpu, &z, split).unwrap();
                assert!(px == whole_px, "{name}: RGB8 of strips of {rows} rows ({keep} bytes kept) differs");
                let r = report.unwrap();
                assert!(r.device_pictures + r.host_pictures > 0 && r.kept_peak_bytes <= keep, "{name}: {r:?} for {keep} bytes kept");
            }
        }
        for rows in [5, 8] {
            let bad = Split::Strips(Strips { rows, keep_bytes: 0, no_halo: true });
            let img = vae.decode_with(&Cpu, &z, bad).unwrap();
            let differ = bits(&img).iter().zip(bits(&whole)).filter(|(a, b)| **a != *b).count();
            println!("{name}: control, strips of {rows} rows without halo: {differ} float values differ");
            assert!(differ > 0, "{name}: the control (no halo) was not told apart from the whole decode");
        }
    }
}

/// The planner's count of the kept pictures' device bytes (`vae_keep_bytes`, the budget that
/// keeps every picture on the device) is what the decoder holds at its peak: with that budget
/// no picture goes to host memory and the peak is reached; a byte less sends one there. With
/// no budget every picture is in host memory, and its rows cross at least once each way.
#[test]
fn keep_budget_matches_the_planner() {
    for name in CHECKPOINTS {
        let exp = Expected::load(name);
        let (ck, vae) = decoder(name);
        let z = exp.tensor("vae.z");
        let all = moss::backend::cuda::vae::vae_keep_bytes(&ck.vae, z.shape[2], z.shape[3]);
        let report = |keep| vae.decode_rgb8_report(&Cpu, &z, Split::strips_keeping(8, keep)).unwrap().1.unwrap();
        let r = report(all);
        println!("{name}: {all} bytes kept: {r:?}");
        assert_eq!((r.host_pictures, r.kept_peak_bytes, r.host_bytes_moved), (0, all, 0), "{name}: {r:?}");
        let r = report(all - 1);
        println!("{name}: {} bytes kept: {r:?}", all - 1);
        assert!(r.host_pictures > 0 && r.kept_peak_bytes < all && r.host_bytes_moved > 0, "{name}: {r:?}");
        let r = report(0);
        assert_eq!((r.device_pictures, r.kept_peak_bytes), (0, 0), "{name}: {r:?}");
        // Every picture is written once and read at least once: at least twice its bytes cross.
        assert!(r.host_bytes_moved >= 2 * all, "{name}: {r:?}");
    }
}

/// `moss decode --strip-rows N` forces the split: the same PNG bytes.
#[test]
fn forced_strips_give_the_same_png() {
    let exp = Expected::load("tiny-b");
    let z = exp.tensor("vae.z");
    let dir = std::env::temp_dir().join(format!("moss-vae-strips-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lat = dir.join("z.f32");
    std::fs::write(&lat, z.data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let (h, w) = (z.shape[2] * 16, z.shape[3] * 16);
    let model = common::golden().join("tiny-b");
    let run = |rows: &str, out: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_moss"))
            .args(["decode", lat.to_str().unwrap(), "--out", dir.join(out).to_str().unwrap(), "--device", "cpu"])
            .args(["--model", model.to_str().unwrap(), "--size", &format!("{w}x{h}")])
            .args(if rows.is_empty() { vec![] } else { vec!["--strip-rows", rows] })
            .output()
            .unwrap();
        assert!(o.status.success(), "moss decode (--strip-rows {rows}): {}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(dir.join(out)).unwrap()
    };
    let whole = run("", "whole.png");
    let split = run("7", "split.png");
    assert!(whole == split, "--strip-rows 7 wrote a different PNG");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["decode", lat.to_str().unwrap(), "--out", dir.join("x.png").to_str().unwrap(), "--device", "cpu"])
        .args(["--model", model.to_str().unwrap(), "--size", &format!("{w}x{h}")])
        .args(["--strip-rows", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--strip-rows"), "a bad value was not refused");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The split invariance of the GroupNorm statistics: the row partials of a row strip are the
/// whole picture's rows, and the combine of the partials matches the two-pass definition.
#[test]
fn group_norm_row_stats_are_strip_invariant() {
    let (c, h, w, g) = (8, 11, 7, 4);
    let x = Tensor::new(vec![1, c, h, w], rand(c * h * w, 21).iter().map(|v| v * 2.0 + 5.0).collect()).unwrap();
    let whole = Cpu.group_norm_row_stats(&x, g).unwrap();
    let (y0, y1) = (3, 9);
    let mut strip = vec![];
    for ci in 0..c {
        strip.extend_from_slice(&x.data[(ci * h + y0) * w..(ci * h + y1) * w]);
    }
    let xs = Tensor::new(vec![1, c, y1 - y0, w], strip).unwrap();
    let part = Cpu.group_norm_row_stats(&xs, g).unwrap();
    for gi in 0..g {
        for r in 0..y1 - y0 {
            for k in 0..2 {
                assert_eq!(part[(gi * (y1 - y0) + r) * 2 + k].to_bits(), whole[(gi * h + y0 + r) * 2 + k].to_bits(), "group {gi} row {r}");
            }
        }
    }
    let st = moss::backend::ops::vae::group_norm_combine(&whole, g, h, c / g * w);
    let len = c / g * h * w;
    for (gi, grp) in x.data.chunks(len).enumerate() {
        let m = grp.iter().map(|&v| v as f64).sum::<f64>() / len as f64;
        let v = grp.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / len as f64;
        assert!((st[2 * gi] - m).abs() < 1e-12 * m.abs().max(1.0), "group {gi} mean {} vs {m}", st[2 * gi]);
        assert!((st[2 * gi + 1] - v).abs() < 1e-12 * v, "group {gi} variance {} vs {v}", st[2 * gi + 1]);
    }
}

// ---- the fused ops against plain loops ----------------------------------------------------------

/// Deterministic values in [-1, 1).
fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn t(shape: &[usize], seed: u64) -> Tensor {
    Tensor::new(shape.to_vec(), rand(shape.iter().product(), seed)).unwrap()
}

/// Upsample explicitly, pad explicitly, sum in f64.
fn conv_reference(x: &Tensor, w: &Tensor, b: &Tensor, up: bool) -> Vec<f32> {
    let (n, ci, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (co, k) = (w.shape[0], w.shape[2]);
    let f = if up { 2 } else { 1 };
    let (oh, ow) = (h * f, wd * f);
    let p = (k / 2) as isize;
    let mut out = vec![];
    for ni in 0..n {
        for o in 0..co {
            for y in 0..oh {
                for xx in 0..ow {
                    let mut s = b.data[o] as f64;
                    for i in 0..ci {
                        for ky in 0..k {
                            for kx in 0..k {
                                let (yy, xs) = (y as isize + ky as isize - p, xx as isize + kx as isize - p);
                                if yy < 0 || xs < 0 || yy >= oh as isize || xs >= ow as isize {
                                    continue;
                                }
                                let (sy, sx) = (yy as usize / f, xs as usize / f);
                                s += w.data[((o * ci + i) * k + ky) * k + kx] as f64 * x.data[((ni * ci + i) * h + sy) * wd + sx] as f64;
                            }
                        }
                    }
                    out.push(s as f32);
                }
            }
        }
    }
    out
}

#[test]
fn conv2d_matches_direct_convolution() {
    for (n, ci, co, h, w, k, up) in [
        (1, 5, 7, 6, 9, 3, false),
        (1, 5, 7, 6, 9, 3, true),
        (2, 3, 4, 1, 1, 3, true),
        (1, 4, 3, 2, 5, 3, false),
        (1, 6, 5, 4, 3, 1, false),
        (1, 3, 2, 3, 4, 5, false),
        // wider than one column tile of the CPU twin, and output channels not a multiple of its block
        (1, 2, 6, 2, 70, 3, true),
        (1, 3, 5, 3, 131, 3, false),
    ] {
        let x = t(&[n, ci, h, w], 1);
        let wt = t(&[co, ci, k, k], 2);
        let b = t(&[co], 3);
        let got = Cpu.conv2d(&x, &wt, &b, up).unwrap();
        let f = if up { 2 } else { 1 };
        assert_eq!(got.shape, vec![n, co, h * f, w * f]);
        let e = rel_l2(&got.data, &conv_reference(&x, &wt, &b, up));
        println!("conv2d {n}x{ci}x{h}x{w} -> {co}, k {k}, upsample {up}: rel L2 {e:.2e}");
        assert!(e < 1e-6, "conv2d rel L2 {e:.3e}");
    }
}

#[test]
fn group_norm_matches_definition() {
    let (c, h, w, g) = (8, 3, 5, 4);
    let x = Tensor::new(vec![2, c, h, w], rand(2 * c * h * w, 4).iter().map(|v| v * 3.0 + 0.7).collect()).unwrap();
    let (wt, b) = (t(&[c], 5), t(&[c], 6));
    for silu in [false, true] {
        let got = Cpu.group_norm(&x, &wt, &b, g, 1e-6, silu).unwrap();
        let len = c / g * h * w;
        let mut want = vec![];
        for grp in x.data.chunks(len) {
            let m = grp.iter().map(|&v| v as f64).sum::<f64>() / len as f64;
            let v = grp.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / len as f64;
            want.extend(grp.iter().map(|&x| (x as f64 - m) / (v + 1e-6).sqrt()));
        }
        for (i, y) in want.iter_mut().enumerate() {
            let ch = (i / (h * w)) % c;
            *y = *y * wt.data[ch] as f64 + b.data[ch] as f64;
            if silu {
                *y /= 1.0 + (-*y).exp();
            }
        }
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        let e = rel_l2(&got.data, &want);
        println!("group_norm silu={silu}: rel L2 {e:.2e}");
        assert!(e < 1e-6, "group_norm rel L2 {e:.3e}");
    }
}

#[test]
fn spatial_attention_matches_full_softmax() {
    for (n, l, d) in [(1, 7, 4), (2, 37, 16), (1, 300, 8)] {
        let (q, k, v) = (t(&[n, l, d], 7), t(&[n, l, d], 8), t(&[n, l, d], 9));
        let q = Tensor::new(q.shape.clone(), q.data.iter().map(|x| x * 4.0).collect()).unwrap(); // peaky softmax
        let got = Cpu.spatial_attention(&q, &k, &v).unwrap();
        let mut want = vec![0f32; n * l * d];
        for ni in 0..n {
            // The whole [L, L] score matrix, as the reference does.
            let at = |m: &Tensor, i: usize, j: usize| m.data[(ni * l + i) * d + j] as f64;
            let s: Vec<Vec<f64>> =
                (0..l).map(|i| (0..l).map(|j| (0..d).map(|c| at(&q, i, c) * at(&k, j, c)).sum::<f64>() / (d as f64).sqrt()).collect()).collect();
            for i in 0..l {
                let m = s[i].iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s[i].iter().map(|x| (x - m).exp()).sum();
                for c in 0..d {
                    want[(ni * l + i) * d + c] = ((0..l).map(|j| (s[i][j] - m).exp() * at(&v, j, c)).sum::<f64>() / z) as f32;
                }
            }
        }
        let e = rel_l2(&got.data, &want);
        println!("spatial_attention {n}x{l}x{d}: rel L2 {e:.2e}");
        assert!(e < 1e-6, "spatial_attention rel L2 {e:.3e}");
    }
}

#[test]
fn bn_unpatchify_index_and_scale() {
    let (c, h, w) = (3, 2, 3);
    let z = t(&[1, c * 4, h, w], 10);
    let mean = t(&[c * 4], 11);
    let var = Tensor::new(vec![c * 4], rand(c * 4, 12).iter().map(|v| v + 1.5).collect()).unwrap();
    let eps = 1e-4;
    let got = Cpu.bn_unpatchify(&z, &mean, &var, eps, [2, 2]).unwrap();
    assert_eq!(got.shape, vec![1, c, 2 * h, 2 * w]);
    for ci in 0..c {
        for y in 0..2 * h {
            for x in 0..2 * w {
                let k = ci * 4 + (y % 2) * 2 + x % 2;
                let want = z.data[(k * h + y / 2) * w + x / 2] * (var.data[k] + eps as f32).sqrt() + mean.data[k];
                assert_eq!(got.data[(ci * 2 * h + y) * 2 * w + x], want, "c {ci} y {y} x {x}");
            }
        }
    }
}

#[test]
fn to_rgb8_clamps_and_rounds() {
    // 0 → 127.5 → 128 (half to even), ±1 and beyond → 255 / 0, NaN → 0, HWC order.
    let x = Tensor::new(vec![1, 3, 1, 2], vec![0.0, 1.0, -1.0, 7.0, -3.0, f32::NAN]).unwrap();
    assert_eq!(Cpu.to_rgb8(&x).unwrap(), vec![128, 0, 0, 255, 255, 0]);
    // Values whose f32 scaling lands exactly on k + 0.5 (found with torch float32, which rounds
    // them to 64, 66, 76): half to even, not half away from zero.
    let ties = [0xbefcfcfb_u32, 0xbef8f8f9, 0xbecccccd].map(f32::from_bits);
    let x = Tensor::new(vec![1, 3, 1, 1], ties.to_vec()).unwrap();
    assert_eq!(Cpu.to_rgb8(&x).unwrap(), vec![64, 66, 76]);
}
