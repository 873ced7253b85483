//! Initial noise: torch's CPU `Generator().manual_seed(seed)` followed by `torch.randn(shape)` in
//! float32, bit for bit (spec section 6).
//!
//! torch seeds an MT19937 with the low 32 bits of the seed, draws one 24-bit uniform per element,
//! then turns each block of 16 uniforms into 16 normals with Box-Muller (the first 8 as `u1`, the
//! next 8 as `u2`). The arithmetic below is torch's scalar `normal_fill_16`, the path its CPU build
//! takes on AVX-512 and generic x86 hosts: float32 log/sqrt/cos/sin, the angle in float64 rounded
//! once to float32.

/// MT19937 exactly as torch's `at::mt19937` (Matsumoto-Nishimura reference generator).
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    pub fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = (seed & 0xffff_ffff) as u32;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        for i in 0..624 {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % 624] & LOWER);
            let mut v = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= MATRIX_A;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }
}

/// `torch.randn(n, generator=torch.Generator().manual_seed(seed))` in float32, for `n >= 16`
/// and `n % 16 == 0` (every latent shape: 128 channels).
pub fn torch_randn(seed: u64, n: usize) -> Vec<f32> {
    assert!(n >= 16 && n % 16 == 0, "torch_randn: n = {n} must be a multiple of 16");
    let mut rng = Mt19937::new(seed);
    // uniform_real_distribution<float>(0, 1): 24 random bits times 2^-24.
    let mut data: Vec<f32> = (0..n)
        .map(|_| (rng.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0))
        .collect();
    for block in data.chunks_exact_mut(16) {
        for j in 0..8 {
            let u1 = 1.0f32 - block[j];
            let u2 = block[j + 8];
            let radius = (-2.0f32 * u1.ln()).sqrt();
            let theta = (2.0f64 * std::f64::consts::PI * u2 as f64) as f32;
            block[j] = radius * theta.cos();
            block[j + 8] = radius * theta.sin();
        }
    }
    data
}

/// The initial latent noise `[1, 128, h, w]` in NCHW order.
pub fn latent_noise(seed: u64, h: usize, w: usize) -> Vec<f32> {
    torch_randn(seed, 128 * h * w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_vector() {
        // The 10000th output of the reference MT19937 seeded with 5489 is 4123659995
        // (C++ standard, [rand.predef]).
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }
}
