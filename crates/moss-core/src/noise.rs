//! Initial noise: torch's CPU `Generator().manual_seed(seed)` followed by `torch.randn(shape)` in
//! float32, bit for bit (spec section 6).
//!
//! torch seeds an MT19937 with the low 32 bits of the seed, draws one 24-bit uniform per element,
//! then turns each block of 16 uniforms into 16 normals with Box-Muller (the first 8 as `u1`, the
//! next 8 as `u2`). On x86-64 torch does this with its vectorised `normal_fill_16_AVX2`: float32
//! throughout, the angle `float(2*pi) * u2`, and the Cephes log/sincos polynomials of
//! avx_mathfun with their multiply-adds fused. The lane arithmetic below is that code, one lane
//! at a time; it matches torch 2.11's output bit for bit (checked on an AVX-512 host; glibc's
//! logf/cosf/sinf would differ in the last bits of about 40% of the values).

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
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
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

/// `log256_ps` of avx_mathfun (Cephes logf), lane by lane, with the multiply-adds fused where
/// torch's build fuses them.
// Cephes spells SQRTHF as a literal; it rounds to the same f32 as FRAC_1_SQRT_2.
#[allow(clippy::excessive_precision, clippy::approx_constant)]
fn log_ps(x: f32) -> f32 {
    const P: [f32; 9] = [
        7.0376836292E-2,
        -1.1514610310E-1,
        1.1676998740E-1,
        -1.2420140846E-1,
        1.4249322787E-1,
        -1.6668057665E-1,
        2.0000714765E-1,
        -2.4999993993E-1,
        3.3333331174E-1,
    ];
    let x = x.max(f32::from_bits(0x0080_0000)); // cut off denormals
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 0x7f) as f32 + 1.0;
    let mut x = f32::from_bits((bits & !0x7f80_0000) | 0x3f00_0000); // mantissa in [0.5, 1)
    let small = x < 0.707106781186547524f32;
    let tmp = if small { x } else { 0.0 };
    x -= 1.0;
    if small {
        e -= 1.0;
    }
    x += tmp;
    let z = x * x;
    let mut y = P[0];
    for p in &P[1..] {
        y = y.mul_add(x, *p);
    }
    y *= x;
    y = y.mul_add(z, e * -2.12194440e-4);
    y = (-z).mul_add(0.5, y);
    e.mul_add(0.693359375, x + y)
}

/// `sincos256_ps` of avx_mathfun (Cephes sinf/cosf), lane by lane: `(sin x, cos x)`.
#[allow(clippy::excessive_precision)]
fn sincos_ps(x: f32) -> (f32, f32) {
    let sign_in = x.to_bits() & 0x8000_0000;
    let mut x = x.abs();
    let mut j = (x * 1.27323954473516) as i32; // 4/pi, truncated
    j = (j + 1) & !1;
    let y = j as f32;
    let swap_sin = ((j & 4) as u32) << 29;
    let sin_poly_for_sin = (j & 2) == 0;
    x = y.mul_add(-0.78515625, x);
    x = y.mul_add(-2.4187564849853515625e-4, x);
    x = y.mul_add(-3.77489497744594108e-8, x);
    let sign_cos = (((!(j - 2)) & 4) as u32) << 29;
    let sign_sin = sign_in ^ swap_sin;
    let z = x * x;
    let mut yc = 2.443315711809948E-005f32;
    yc = yc.mul_add(z, -1.388731625493765E-003);
    yc = yc.mul_add(z, 4.166664568298827E-002);
    yc *= z;
    yc = yc.mul_add(z, -(z * 0.5));
    yc += 1.0;
    let mut ys = -1.9515295891E-4f32;
    ys = ys.mul_add(z, 8.3321608736E-3);
    ys = ys.mul_add(z, -1.6666654611E-1);
    ys *= z;
    ys = ys.mul_add(x, x);
    let (s, c) = if sin_poly_for_sin { (ys, yc) } else { (yc, ys) };
    (f32::from_bits(s.to_bits() ^ sign_sin), f32::from_bits(c.to_bits() ^ sign_cos))
}

/// A torch CPU generator, `torch.Generator().manual_seed(seed)`, whose successive
/// [`TorchGenerator::randn`] calls give what successive `torch.randn(n, generator=g)` calls give:
/// each consumes `n` outputs of the MT19937 (one 24-bit uniform per element).
pub struct TorchGenerator {
    rng: Mt19937,
}

impl TorchGenerator {
    pub fn new(seed: u64) -> Self {
        TorchGenerator { rng: Mt19937::new(seed) }
    }

    /// The next `torch.randn(n, generator=self)` in float32, for `n >= 16` and `n % 16 == 0`
    /// (every latent shape: 128 channels).
    pub fn randn(&mut self, n: usize) -> Vec<f32> {
        assert!(n >= 16 && n.is_multiple_of(16), "torch_randn: n = {n} must be a multiple of 16");
        // uniform_real_distribution<float>(0, 1): 24 random bits times 2^-24.
        let mut data: Vec<f32> = (0..n).map(|_| (self.rng.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)).collect();
        let two_pi = (2.0f64 * std::f64::consts::PI) as f32;
        for block in data.chunks_exact_mut(16) {
            for j in 0..8 {
                let u1 = 1.0f32 - block[j];
                let u2 = block[j + 8];
                let radius = (-2.0f32 * log_ps(u1)).sqrt();
                let (s, c) = sincos_ps(two_pi * u2);
                // torch's final `fmadd(n, std = 1, mean = 0)`: also turns -0 into +0.
                block[j] = (radius * c).mul_add(1.0, 0.0);
                block[j + 8] = (radius * s).mul_add(1.0, 0.0);
            }
        }
        data
    }
}

/// `torch.randn(n, generator=torch.Generator().manual_seed(seed))` in float32, for `n >= 16`
/// and `n % 16 == 0` (every latent shape: 128 channels).
pub fn torch_randn(seed: u64, n: usize) -> Vec<f32> {
    TorchGenerator::new(seed).randn(n)
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
