// SiTU-GLU's elementwise form, shared by the SiTU kernels (cuda/dit/dit_ops.cu) and any kernel that
// applies it on the way out: situ(h, g) = (4·tanh(g/4)·sigmoid(g)) · (25·tanh(h/25)), h the up half,
// g the gate half, fp32. BUG 1 (planted controls): the halves swapped.
#pragma once

template <int BUG>
__device__ __forceinline__ float situ(float h, float g) {
    if (BUG == 1) {
        float t = h;
        h = g;
        g = t;
    }
    return (4.f * tanhf(g * 0.25f) * (1.f / (1.f + expf(-g)))) * (25.f * tanhf(h * 0.04f));
}
// The bf16 kernel's form (`FAST`): one __expf per tanh and a reciprocal for the sigmoid, as
// tanh(a) = sign(a)·(1 − e)/(1 + e) with e = exp(−2|a|). Its fp32 value is within ~1e-6
// relative of the libm form (measured on the H200 at the DiT's shape: 0.017 % of the bf16 outputs
// differ by one bf16 ulp, the same 1.657e-3 relative L2 against float64) and it takes 85 us
// instead of 100 (the math, not the 62 us of memory traffic, bounded the libm form).
// bf16 always takes it (the bf16 libm kernel was deleted, git keeps it: 2abea24); fp32 takes the
// libm form.
template <int BUG>
__device__ __forceinline__ float situ_fast(float h, float g) {
    if (BUG == 1) {
        float t = h;
        h = g;
        g = t;
    }
    float sg = __frcp_rn(1.f + __expf(-g));
    float eg = __expf(-0.5f * fabsf(g));  // tanh(g/4)
    float tg = copysignf(__fdividef(1.f - eg, 1.f + eg), g);
    float eh = __expf(-0.08f * fabsf(h));  // tanh(h/25)
    float th = copysignf(__fdividef(1.f - eh, 1.f + eh), h);
    return (4.f * tg * sg) * (25.f * th);
}
