//! ggml's quantized blocks (the tensor types of GGUF files), as `ggml-quants.c` lays them out and
//! the `gguf` Python package dequantizes them: each row of `ne[0]` values is cut into blocks of 32
//! (`Q4_0` .. `Q8_0`) or 256 (the k-quants) values, each block a few scales and packed integers.
//! Dequantization repeats the Python package's f32 arithmetic operation for operation (products
//! and sums rounded one at a time, no fused multiply-add), so the values are the same bit for bit.

use half::f16;

/// The block types moss reads. F32, F16 and BF16 tensors of a GGUF file are plain
/// [`super::Dtype`]s (their bytes are laid out as safetensors lays them out).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Values a k-quant super-block holds.
pub const QK_K: usize = 256;

impl GgmlType {
    pub const ALL: [GgmlType; 8] =
        [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

    /// The type's id in a GGUF tensor descriptor (`ggml_type`).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
        }
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }

    /// Values a block holds.
    pub fn block_values(self) -> usize {
        match self {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => QK_K,
            _ => 32,
        }
    }

    /// Bytes a block takes (`GGML_QUANT_SIZES`).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4_K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// Bytes of `n` values (`n` a multiple of [`GgmlType::block_values`]).
    pub fn bytes_of(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_values()).then(|| n / self.block_values() * self.block_bytes())
    }
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The eight 6-bit scales and mins of a `Q4_K` / `Q5_K` block (`get_scale_min_k4`).
fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        if j < 4 {
            sc[j] = s[j] & 63;
            m[j] = s[j + 4] & 63;
        } else {
            sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    (sc, m)
}

/// One block's values appended to `out`.
fn block(t: GgmlType, b: &[u8], out: &mut Vec<f32>) {
    match t {
        GgmlType::Q8_0 => {
            let d = half(b, 0);
            out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let d = half(b, 0);
            let qs = if t == GgmlType::Q4_0 { &b[2..18] } else { &b[4..20] };
            let nib = |i: usize| if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 };
            if t == GgmlType::Q4_0 {
                out.extend((0..32).map(|i| d * (nib(i) as i8 - 8) as f32));
            } else {
                let m = half(b, 2);
                out.extend((0..32).map(|i| d * nib(i) as f32 + m));
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let d = half(b, 0);
            let off = if t == GgmlType::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
            let qs = &b[off + 4..off + 20];
            let q = |i: usize| {
                let lo = if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 };
                lo | ((((qh >> i) & 1) as u8) << 4)
            };
            if t == GgmlType::Q5_0 {
                out.extend((0..32).map(|i| d * (q(i) as i8 - 16) as f32));
            } else {
                let m = half(b, 2);
                out.extend((0..32).map(|i| d * q(i) as f32 + m));
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (half(b, 0), half(b, 2));
            let (sc, m) = scale_min_k4(&b[4..16]);
            let (qh, qs) = if t == GgmlType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            // sub-block j: 32 values, the low (even j) or high (odd j) nibbles of bytes 32·(j/2)..
            for j in 0..8 {
                let dl = d * sc[j] as f32;
                let ml = dmin * m[j] as f32;
                let bytes = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                for (l, &byte) in bytes.iter().enumerate() {
                    let mut q = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    if let Some(qh) = qh {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    out.push(dl * q as f32 - ml);
                }
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = half(b, 208);
            // two halves of 128 values: 64 bytes of low nibbles, 32 of 2-bit highs each
            for i in 0..QK_K {
                let (h, r) = (i / 128, i % 128);
                let lo = if r < 64 { ql[64 * h + r] & 0xF } else { ql[64 * h + r - 64] >> 4 };
                let hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                let q = (lo | (hi << 4)) as i8 - 32;
                out.push(d * scales[i / 16] as i8 as f32 * q as f32);
            }
        }
    }
}

/// The values of `bytes`, whole blocks of type `t`, as f32.
pub fn dequantize(t: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / t.block_bytes() * t.block_values());
    for b in bytes.chunks_exact(t.block_bytes()) {
        block(t, b, &mut out);
    }
    out
}

/// The index of the first block of `bytes` whose scales are not finite (f16 infinities or NaNs):
/// such a block's values are not numbers.
pub fn first_bad_block(t: GgmlType, bytes: &[u8]) -> Option<usize> {
    let scale_at: &[usize] = match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
    };
    bytes.chunks_exact(t.block_bytes()).position(|b| scale_at.iter().any(|&a| !half(b, a).is_finite()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_block_is_codes_times_scale() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2] = 0x81; // -127
        b[3] = 3;
        let v = dequantize(GgmlType::Q8_0, &b);
        assert_eq!((v.len(), v[0], v[1], v[2]), (32, -63.5, 1.5, 0.0));
    }

    #[test]
    fn q4_k_scales_unpack_as_ggml_does() {
        // byte j < 4: low 6 bits scale j, top 2 bits the high bits of scale j + 4
        let mut s = [0u8; 12];
        s[0] = 0b11_000101; // sc[0] = 5, sc[4] high bits 3
        s[8] = 0x72; // sc[4] low nibble 2, m[4] low nibble 7
        let (sc, m) = scale_min_k4(&s);
        assert_eq!((sc[0], sc[4], m[4]), (5, 2 | (3 << 4), 7));
    }

    #[test]
    fn sizes_match_ggml() {
        let sizes: Vec<usize> = GgmlType::ALL.iter().map(|t| t.block_bytes()).collect();
        assert_eq!(sizes, [18, 20, 22, 24, 34, 144, 176, 210]);
        assert_eq!(GgmlType::Q4_K.bytes_of(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_of(128), None);
    }
}
