//! float8 e4m3 (`float8_e4m3fn`: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no
//! infinities, NaN `S.1111.111`, largest finite 448) and the row-wise quantization of
//! `--precision fp8`: the host side of what the CUDA kernels do, bit for bit.
//!
//! A row `x` (a weight's output channel, or an activation's token) is stored as codes `q` and one
//! f32 scale: `scale = max(amax(x), MIN_AMAX) / 448` (f32 division), `q = e4m3(x / scale)`
//! (f32 division, rounded to nearest even, saturated to ±448 as CUDA's `__NV_SATFINITE`), so
//! `x ≈ q · scale`. A linear over quantized rows is
//! `y[r, n] = s_x[r] · s_w[n] · Σ_k q_x[r, k] · q_w[n, k]`.

/// Largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The smallest amax a scale is computed from (an all-zero row gets a tiny positive scale, and
/// its codes are all 0).
pub const MIN_AMAX: f32 = 1e-12;

/// The e4m3 code nearest `x` (ties to even), saturated to ±448; NaN gives the NaN code `0x7f`.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // The spacing of e4m3 values around `a`: 2^(e-3) in the binade [2^e, 2^(e+1)), e >= -6;
    // 2^-9 below 2^-6 (subnormals). Dividing by a power of two is exact, so the rounding
    // happens once, in `round_ties_even`.
    let e = if a < f32::powi(2.0, -6) { -6 } else { ((a.to_bits() >> 23) as i32) - 127 };
    let quantum = f32::powi(2.0, e - 3);
    let v = (a / quantum).round_ties_even() * quantum;
    if v == 0.0 {
        return sign;
    }
    if v < f32::powi(2.0, -6) {
        // Subnormal: v = m · 2^-9, m in 1..8, and the code is m (the codes run on into the normals).
        return sign | (v / f32::powi(2.0, -9)) as u8;
    }
    let bits = v.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    let mant = (bits >> 20) & 7;
    sign | ((exp as u8) << 3) | mant as u8
}

/// The value of an e4m3 code.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0xf) as i32;
    let m = (code & 7) as f32;
    if e == 15 && code & 7 == 7 {
        return f32::NAN;
    }
    sign * if e == 0 { m * f32::powi(2.0, -9) } else { (1.0 + m / 8.0) * f32::powi(2.0, e - 7) }
}

/// The scale of a row whose largest magnitude is `amax`.
pub fn row_scale(amax: f32) -> f32 {
    amax.max(MIN_AMAX) / E4M3_MAX
}

/// Quantize one row: the codes' values into `q` (each exactly an e4m3 value), the scale returned.
pub fn quantize_row(x: &[f32], q: &mut [f32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = row_scale(amax);
    for (o, &v) in q.iter_mut().zip(x) {
        *o = e4m3_to_f32(e4m3_from_f32(v / scale));
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code's value, from the format's definition written out independently: the largest
    /// finite, the smallest normal and subnormal, and a few codes by hand.
    #[test]
    fn codes_decode_to_the_formats_values() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x3c), 1.5);
        assert_eq!(e4m3_to_f32(0x40), 2.0);
        assert!(e4m3_to_f32(0x7f).is_nan());
        assert!(e4m3_to_f32(0xff).is_nan());
    }

    /// Every finite code round-trips, and the encoder picks the nearest value (ties to the even
    /// code) for points between neighbours, found by brute force over all codes.
    #[test]
    fn encoder_rounds_to_nearest_even_and_saturates() {
        let finite: Vec<(u8, f32)> = (0u8..=255).filter(|c| c & 0x7f != 0x7f).map(|c| (c, e4m3_to_f32(c))).collect();
        for &(c, v) in &finite {
            let back = e4m3_from_f32(v);
            assert_eq!(e4m3_to_f32(back), v, "code {c:#x}");
        }
        let mut pos: Vec<(u8, f32)> = finite.iter().copied().filter(|&(c, _)| c < 0x80).collect();
        pos.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
        for w in pos.windows(2) {
            let ((c0, v0), (c1, v1)) = (w[0], w[1]);
            let mid = (v0 + v1) / 2.0;
            let even = if c0 % 2 == 0 { c0 } else { c1 };
            assert_eq!(e4m3_from_f32(mid), even, "tie between {v0} and {v1}");
            assert_eq!(e4m3_from_f32(v0 + (v1 - v0) * 0.26), c0);
            assert_eq!(e4m3_from_f32(v0 + (v1 - v0) * 0.74), c1);
            assert_eq!(e4m3_from_f32(-(v0 + (v1 - v0) * 0.74)), c1 | 0x80);
        }
        assert_eq!(e4m3_from_f32(1e6), 0x7e);
        assert_eq!(e4m3_from_f32(-460.0), 0xfe);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7e);
        assert_eq!(e4m3_from_f32(1e-5), 0);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
    }

    #[test]
    fn a_row_quantizes_to_its_scale() {
        let x = [0.5f32, -3.0, 0.001, 2.9];
        let mut q = [0f32; 4];
        let s = quantize_row(&x, &mut q);
        assert_eq!(s, 3.0 / 448.0);
        assert_eq!(q[1], -448.0);
        for (a, b) in q.iter().zip(&x) {
            assert!((a * s - b).abs() <= b.abs() / 16.0 + 2f32.powi(-9) * s, "{a} {b}");
        }
        let z = quantize_row(&[0.0; 3], &mut q[..3]);
        assert_eq!(z, MIN_AMAX / 448.0);
        assert_eq!(&q[..3], &[0.0; 3]);
    }
}
