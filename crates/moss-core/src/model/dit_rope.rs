//! The 4-axis RoPE of spec 4.3: positions and the fp32 cos/sin table, in one place.
//!
//! Each token has a position `p = (r, t, y, x)`; for a head of `hd` dims, `hd/2 = 4·bands`
//! angles `θ[a·bands + j] = f32(p_a · band_j)` with `band_j = f32(1 / f32(base^(j/bands)))`,
//! and the table holds `cos θ`, `sin θ` (of the fp32 angle, rounded to f32) as `[N, hd/2]`;
//! the rotation pairs dims `(m, m + hd/2)` ([`crate::backend::ops::DitOps::qk_norm_rope`]).

use crate::tensor::Tensor;

/// Position axes: r (always 0), t, y, x.
pub const AXES: usize = 4;

/// `band_j = 1 / base^(j/bands)` for `j < bands`, in f32 (the stored bf16 `rope.bands` is
/// ignored, spec 4.2).
pub fn bands(base: f64, bands: usize) -> Vec<f32> {
    (0..bands).map(|j| 1.0f32 / (base as f32).powf(j as f32 / bands as f32)).collect()
}

/// Text token `i`: `(0, i, 0, 0)`.
pub fn text_positions(len: usize) -> Vec<[f32; AXES]> {
    (0..len).map(|i| [0.0, i as f32, 0.0, 0.0]).collect()
}

/// The joint stream of one forward: image token `(y, x)` of the `h×w` grid (row-major) at
/// `(0, L, y − (h−1)/2, x − (w−1)/2)`, where `L` is the text length of *this* forward, then
/// the `L` text tokens.
pub fn joint_positions(h: usize, w: usize, text_len: usize) -> Vec<[f32; AXES]> {
    let (cy, cx) = ((h as f32 - 1.0) / 2.0, (w as f32 - 1.0) / 2.0);
    let mut p = Vec::with_capacity(h * w + text_len);
    for y in 0..h {
        for x in 0..w {
            p.push([0.0, text_len as f32, y as f32 - cy, x as f32 - cx]);
        }
    }
    p.extend(text_positions(text_len));
    p
}

/// `(cos, sin)`, each `[N, half]` with `half = AXES · bands`.
///
/// An axis value's `bands` angles depend on that value alone, and a joint stream has few
/// distinct values (`h + w + L + 1` or so for `N = h·w + L` tokens), so each distinct value's
/// cos/sin run is computed once (keyed by its bits: the same fp32 phases, the same results)
/// and copied: ~100x fewer `cos`/`sin` calls than per token at 1024x1024.
pub fn table(pos: &[[f32; AXES]], base: f64, half: usize) -> (Tensor, Tensor) {
    assert!(half.is_multiple_of(AXES), "rope: {half} angles do not split over {AXES} axes");
    let bands = bands(base, half / AXES);
    let nb = bands.len();
    let mut memo: std::collections::HashMap<u32, Vec<f32>> = std::collections::HashMap::new();
    let (mut cos, mut sin) = (Vec::with_capacity(pos.len() * half), Vec::with_capacity(pos.len() * half));
    for p in pos {
        for pa in p {
            let run = memo.entry(pa.to_bits()).or_insert_with(|| {
                let mut r = Vec::with_capacity(2 * nb);
                for b in &bands {
                    let theta = (pa * b) as f64; // the fp32 phase
                    r.push(theta.cos() as f32);
                }
                for b in &bands {
                    r.push(((pa * b) as f64).sin() as f32);
                }
                r
            });
            cos.extend_from_slice(&run[..nb]);
            sin.extend_from_slice(&run[nb..]);
        }
    }
    let shape = vec![pos.len(), half];
    (Tensor { shape: shape.clone(), data: cos }, Tensor { shape, data: sin })
}
