//! A host tensor: row-major f32 data and its shape. The CPU backend computes on these directly;
//! the CUDA backend uploads and downloads them.

use anyhow::{ensure, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor> {
        ensure!(shape.iter().product::<usize>() == data.len(), "tensor shape {shape:?} does not hold {} values", data.len());
        Ok(Tensor { shape, data })
    }
    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    /// Size of the last dimension.
    pub fn last_dim(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }
    /// Number of rows when viewed as `[rows, last_dim]`.
    pub fn rows(&self) -> usize {
        self.numel() / self.last_dim().max(1)
    }
    /// Every value rounded to bf16 and back (the precision of a bf16 stage boundary).
    pub fn round_bf16(&self) -> Tensor {
        Tensor { shape: self.shape.clone(), data: self.data.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect() }
    }
}

/// ‖a − b‖ / ‖b‖, accumulated in f64 (NaN if either holds a NaN).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "rel_l2: lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        num += d * d;
        den += (y as f64) * (y as f64);
    }
    if num.is_nan() || den.is_nan() {
        return f64::NAN;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// A decoded picture value in [-1, 1] to an 8-bit channel: `round(clamp(x/2 + 0.5, 0, 1) * 255)`
/// with round-half-to-even (numpy's rounding).
pub fn to_u8(x: f32) -> u8 {
    let v = ((x / 2.0 + 0.5).clamp(0.0, 1.0)) * 255.0;
    v.round_ties_even() as u8
}

/// Refuse a tensor holding a NaN or an infinity, naming `what` (a stage's output or a tensor) and
/// the first bad element: a run never turns non-finite values into a picture.
pub fn ensure_finite(what: &str, data: &[f32]) -> anyhow::Result<()> {
    match data.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => anyhow::bail!("{what} holds a non-finite value ({} at element {i} of {}); nothing was written", data[i], data.len()),
    }
}
