// Bench-only: SiTU-GLU variants to see whether moss_situ is bound by its math (not in moss).
#include "dit.cu"
// fast: one __expf per function and approximate reciprocals.
__device__ __forceinline__ float situ_fast(float h, float g) {
    float sg = __frcp_rn(1.f + __expf(-g));
    float eg = __expf(-0.5f * fabsf(g));          // tanh(g/4) = sign·(1−e)/(1+e), e = exp(−|g|/2)
    float tg = copysignf(__fdividef(1.f - eg, 1.f + eg), g);
    float eh = __expf(-0.08f * fabsf(h));         // tanh(h/25), e = exp(−2|h|/25)
    float th = copysignf(__fdividef(1.f - eh, 1.f + eh), h);
    return (4.f * tg * sg) * (25.f * th);
}
// tanhf kept, sigmoid with __expf and __frcp_rn.
__device__ __forceinline__ float situ_mid(float h, float g) {
    return (4.f * tanhf(g * 0.25f) * __frcp_rn(1.f + __expf(-g))) * (25.f * tanhf(h * 0.04f));
}
template <int V>
__device__ void situ2_impl(bf16* __restrict__ out, const bf16* __restrict__ x, long rows, long f) {
    long per = f / 8;
    long stride = (long)gridDim.x * blockDim.x;
    for (long c = (long)blockIdx.x * blockDim.x + threadIdx.x; c < rows * per; c += stride) {
        long r = c / per, i = (c - r * per) * 8;
        float h[8], g[8];
        ld8(x, r * 2 * f + i, h);
        ld8(x, r * 2 * f + f + i, g);
#pragma unroll
        for (int k = 0; k < 8; k++) h[k] = V == 0 ? situ_fast(h[k], g[k]) : V == 1 ? situ_mid(h[k], g[k]) : h[k] + g[k];
        st8(out, r * f + i, h);
    }
}
MOSS_KERNEL void bench_situ_fast(bf16* out, const bf16* x, long rows, long f) { situ2_impl<0>(out, x, rows, f); }
MOSS_KERNEL void bench_situ_mid(bf16* out, const bf16* x, long rows, long f) { situ2_impl<1>(out, x, rows, f); }
MOSS_KERNEL void bench_situ_copy(bf16* out, const bf16* x, long rows, long f) { situ2_impl<2>(out, x, rows, f); }
