// SiTU-GLU's elementwise form, shared by the SiTU kernels (cuda/dit/dit_ops.cu) and any kernel that
// applies it on the way out: situ(h, g) = (4·tanh(g/4)·sigmoid(g)) · (25·tanh(h/25)), h the up half,
// g the gate half, fp32. BUG 1 (planted controls): the halves swapped.
#pragma once

// The planted bug of the controls: the up and gate halves read the other way round.
template <int BUG>
__device__ __forceinline__ void swap_halves(float& h, float& g) {
    if (BUG == 1) {
        float t = h;
        h = g;
        g = t;
    }
}

template <int BUG>
__device__ __forceinline__ float situ(float h, float g) {
    swap_halves<BUG>(h, g);
    return (4.f * tanhf(g * 0.25f) * (1.f / (1.f + expf(-g)))) * (25.f * tanhf(h * 0.04f));
}
// The bf16 kernel's form (`FAST`): two ex2 and one approximate quotient, 3 MUFU operations (the
// libm form takes 3 __expf, a reciprocal and 2 __fdividef, 6, and 85 us at
// 4224 x 16384 on the H200: math-bound, the memory traffic is 62 us). With
// e = exp(−|g|/2), e² = exp(−|g|), u = exp(−0.08·|h|):
//   tanh(g/4) = sign(g)·(1 − e)/(1 + e),  sigmoid(g) = 1/(1 + e²) (g ≥ 0), e²/(1 + e²) (g < 0),
//   tanh(h/25) = sign(h)·(1 − u)/(1 + u),
// so situ = sign(g·h) · 100·(1 − e)(1 − u)·(g < 0 ? e² : 1) / ((1 + e)(1 + e²)(1 + u)), one
// quotient whose denominator lies in [1, 8]. Emulated in f32 against f64 (h, g in [−60, 60], ex2
// ±2 ulp, rcp ±1 ulp), its error is the libm form's: ≤ 5.8e-6 relative for |h|, |g| ≥ 1, 4.1e-5
// for |h|, |g| ≥ 0.05 (the cancellation in 1 − e near 0, as before); relative L2 1.2e-7 on N(0, 16)
// pairs; 88 of 4M emulated bf16 outputs differ from the libm form's. The fp32 kernel takes
// the libm form; bf16 always takes this one.
template <int BUG>
__device__ __forceinline__ float situ_fast(float h, float g) {
    swap_halves<BUG>(h, g);
    const float e = exp2f(fabsf(g) * -0.72134752f);  // ex2.approx: exp(−|g|/2) = 2^(−|g|·log2(e)/2)
    const float u = exp2f(fabsf(h) * -0.11541560f);  // exp(−0.08·|h|) = 2^(−0.08·log2(e)·|h|)
    const float e2 = e * e;
    const float num = (1.f - e) * (1.f - u) * (g < 0.f ? e2 : 1.f);
    const float den = (1.f + e) * (1.f + e2) * (1.f + u);
    return copysignf(__fdividef(100.f * num, den), g * h);
}
