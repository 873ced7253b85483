//! The row-wise int8 quantization of `--precision int8` (W8A8): the host side of what the CUDA
//! kernels do (`cuda/dit/int8.cu`), and the readable reference of its product.
//!
//! A row `x` (a weight's output channel, or an activation's token) is stored as codes `q` in
//! `-127..=127` and one f32 scale: `scale = max(amax(x), MIN_AMAX) / 127` (f32 division),
//! `q = round_half_even(x / scale)` (f32 division) clamped to ±127, so `x ≈ q · scale`. A linear
//! over quantized rows is `y[r, n] = s_x[r] · s_w[n] · Σ_k q_x[r, k] · q_w[n, k]`, the sum exact
//! in 32-bit integers (`K · 127² < 2³¹` for `K` up to 133 143).
//!
//! A matrix stored by ConvRot ([`crate::checkpoint::comfy_quant`]) holds the codes of
//! `W_rot = W · H` (`H` the normalized Hadamard matrix of each group of `g` columns, symmetric and
//! orthogonal), so `x · Wᵀ = (x · H) · W_rotᵀ`: the activation's groups are turned by `H`
//! ([`turn`]) before its row is quantized.

use crate::checkpoint::comfy_quant;

/// The largest code.
pub const INT8_MAX: f32 = 127.0;

/// The smallest amax a scale is computed from (an all-zero row gets a tiny positive scale, and
/// its codes are all 0).
pub const MIN_AMAX: f32 = 1e-12;

/// The scale of a row whose largest magnitude is `amax`.
pub fn row_scale(amax: f32) -> f32 {
    amax.max(MIN_AMAX) / INT8_MAX
}

/// The code of `v` (a value already divided by its row's scale): nearest, ties to even, clamped.
pub fn code(v: f32) -> i8 {
    v.round_ties_even().clamp(-INT8_MAX, INT8_MAX) as i8
}

/// Quantize one row: the codes into `q`, the scale returned.
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = row_scale(amax);
    for (o, &v) in q.iter_mut().zip(x) {
        *o = code(v / scale);
    }
    scale
}

/// `x ← x · H` on each group of `g` values of the row `x` (`H` convert-to-quant's normalized
/// Hadamard matrix of size `g`, [`comfy_quant::hadamard_signs`]): the turn ConvRot gave the
/// weight's columns, given to the activation. Summed in f64 ([`comfy_quant::turn_back`]: `H` is
/// symmetric, so `x · H` and `x · Hᵀ` are one transform), rounded once to f32.
pub fn turn(x: &mut [f32], g: usize) {
    comfy_quant::turn_groups_back(x, g);
}

/// `Σ_k a[k] · b[k]` of two code rows, exact.
pub fn dot(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// One output of the int8 product: `s_x · s_w · acc`, in f64, rounded once to f32.
pub fn scaled(acc: i32, sx: f32, sw: f32) -> f32 {
    (acc as f64 * sx as f64 * sw as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Halves round to the even code, the largest magnitude is ±127, and a zero row has codes 0.
    #[test]
    fn codes_round_half_even_and_clamp() {
        assert_eq!([code(0.5), code(1.5), code(2.5), code(-2.5), code(126.5)], [0, 2, 2, -2, 126]);
        assert_eq!([code(127.4), code(200.0), code(-1e9)], [127, 127, -127]);
        let mut q = [1i8; 3];
        assert_eq!(quantize_row(&[0.0; 3], &mut q), MIN_AMAX / 127.0);
        assert_eq!(q, [0; 3]);
        let s = quantize_row(&[-2.54, 1.0, 0.01], &mut q);
        assert_eq!(s, 2.54f32 / 127.0);
        assert_eq!(q, [-127, 50, 0]);
    }

    /// The turn is `x · H / √g` with `H` written out ([`comfy_quant::hadamard_signs`]), and turning
    /// twice gives `x` back (`H` orthogonal and symmetric).
    #[test]
    fn turn_is_the_normalized_hadamard_product() {
        let g = 16;
        let h = comfy_quant::hadamard_signs(g);
        let x: Vec<f32> = (0..2 * g).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        let mut t = x.clone();
        turn(&mut t, g);
        for (gi, group) in x.chunks(g).enumerate() {
            for j in 0..g {
                let want: f64 = (0..g).map(|k| group[k] as f64 * h[k * g + j] as f64).sum::<f64>() / 4.0;
                assert!((t[gi * g + j] as f64 - want).abs() < 1e-6, "group {gi} column {j}");
            }
        }
        turn(&mut t, g);
        assert!(t.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5));
    }
}
