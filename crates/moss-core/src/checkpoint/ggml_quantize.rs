//! Writing ggml blocks ([`super::ggml`]) for `moss quantize`. `Q8_0` and `Q4_0` repeat the `gguf`
//! Python package's quantizers operation for operation (its `Q8_0` is bit-exact with ggml's
//! reference), so moss's blocks are the package's bytes. The k-quants have no quantizer in that
//! package; moss's is the direct one of ggml's layout (each sub-block's scale from its range, the
//! super-block's scales from the largest sub-block scale, values rounded to the nearest level)
//! without ggml's iterative scale search, so its error is somewhat larger than llama.cpp's.

use super::ggml::{GgmlType, QK_K};
use anyhow::{bail, Result};
use half::f16;

fn put_half(out: &mut Vec<u8>, v: f32) {
    out.extend(f16::from_f32(v).to_le_bytes());
}

/// The reciprocal the Python quantizers take: 0 for a zero scale.
fn inv(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The value of largest magnitude (the first such), with its sign.
fn signed_max(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inv(d);
    put_half(out, d);
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

fn q4_0(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_max(x) / -8.0;
    let id = inv(d);
    let q: Vec<u8> = x.iter().map(|v| ((v * id + 8.5).trunc() as u8).min(15)).collect();
    put_half(out, d);
    out.extend((0..16).map(|i| q[i] | (q[i + 16] << 4)));
}

/// A k-quant super-block's 6-bit scales (`scales`) and mins (`mins`) packed as
/// `get_scale_min_k4` reads them.
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = m[j];
        } else {
            s[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (m[j] >> 4) << 6;
        }
    }
    s
}

/// `Q4_K` (`levels` 15) or `Q5_K` (31): eight sub-blocks of 32, `x ≈ d·sc_j·q − dmin·m_j`.
fn q45_k(x: &[f32], levels: f32, out: &mut Vec<u8>) {
    let (mut scale, mut min) = ([0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let s = &x[32 * j..32 * j + 32];
        let lo = s.iter().fold(0f32, |a, &v| a.min(v));
        let hi = s.iter().fold(f32::MIN, |a, &v| a.max(v));
        scale[j] = (hi - lo) / levels;
        min[j] = -lo;
    }
    let d = scale.iter().fold(0f32, |a, &v| a.max(v)) / 63.0;
    let dmin = min.iter().fold(0f32, |a, &v| a.max(v)) / 63.0;
    let (d16, dmin16) = (f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32());
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        sc[j] = (scale[j] * inv(d16)).round().clamp(0.0, 63.0) as u8;
        m[j] = (min[j] * inv(dmin16)).round().clamp(0.0, 63.0) as u8;
    }
    let mut q = [0u8; QK_K];
    for j in 0..8 {
        let (dl, ml) = (d16 * sc[j] as f32, dmin16 * m[j] as f32);
        for l in 0..32 {
            q[32 * j + l] = ((x[32 * j + l] + ml) * inv(dl)).round().clamp(0.0, levels) as u8;
        }
    }
    put_half(out, d);
    put_half(out, dmin);
    out.extend(pack_scale_min_k4(&sc, &m));
    if levels > 15.0 {
        out.extend((0..32).map(|l| (0..8).fold(0u8, |h, j| h | ((q[32 * j + l] >> 4) << j))));
    }
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4)));
    }
}

/// `Q6_K`: sixteen sub-blocks of 16, `x ≈ d·sc_j·(q − 32)`, `sc_j` a signed byte.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut scale = [0f32; 16];
    for (j, s) in scale.iter_mut().enumerate() {
        *s = signed_max(&x[16 * j..16 * j + 16]) / -32.0;
    }
    let d = signed_max(&scale) / -128.0;
    let d16 = f16::from_f32(d).to_f32();
    let sc: Vec<i8> = scale.iter().map(|s| (s * inv(d16)).round().clamp(-128.0, 127.0) as i8).collect();
    let q: Vec<u8> = (0..QK_K).map(|i| ((x[i] * inv(d16 * sc[i / 16] as f32)).round() + 32.0).clamp(0.0, 63.0) as u8).collect();
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for i in 0..QK_K {
        let (h, r) = (i / 128, i % 128);
        if r < 64 {
            ql[64 * h + r] |= q[i] & 0xF;
        } else {
            ql[64 * h + r - 64] |= (q[i] & 0xF) << 4;
        }
        qh[32 * h + r % 32] |= (q[i] >> 4) << (2 * (r / 32));
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as u8));
    put_half(out, d);
}

/// `values` (whole rows of `row` values) as blocks of `t`.
pub fn quantize(t: GgmlType, values: &[f32], row: usize) -> Result<Vec<u8>> {
    let n = t.block_values();
    if !row.is_multiple_of(n) {
        bail!("{} takes rows of a multiple of {n} values, not {row}", t.name());
    }
    let mut out = Vec::with_capacity(values.len() / n * t.block_bytes());
    for x in values.chunks_exact(n) {
        match t {
            GgmlType::Q8_0 => q8_0(x, &mut out),
            GgmlType::Q4_0 => q4_0(x, &mut out),
            GgmlType::Q4_K => q45_k(x, 15.0, &mut out),
            GgmlType::Q5_K => q45_k(x, 31.0, &mut out),
            GgmlType::Q6_K => q6_k(x, &mut out),
            _ => bail!("moss does not write {}", t.name()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::ggml::dequantize;
    use super::*;

    fn wave(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0 + (i as f32 * 0.013).sin()).collect()
    }

    /// Each writer's blocks read back (by the reader) close to the values: a packing that puts a
    /// value's bits in another value's place lands far off.
    #[test]
    fn blocks_read_back_near_the_values() {
        let x = wave(2 * QK_K);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (t, bound) in [(GgmlType::Q8_0, 0.01), (GgmlType::Q4_0, 0.15), (GgmlType::Q4_K, 0.12), (GgmlType::Q5_K, 0.06), (GgmlType::Q6_K, 0.03)] {
            let b = quantize(t, &x, x.len()).unwrap();
            assert_eq!(b.len(), t.bytes_of(x.len()).unwrap(), "{}", t.name());
            let y = dequantize(t, &b);
            let worst = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < bound * amax, "{}: worst error {worst} of {amax}", t.name());
        }
        assert!(quantize(GgmlType::Q4_K, &x[..64], 64).is_err());
    }
}
