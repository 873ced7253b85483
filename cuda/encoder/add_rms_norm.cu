// The encoder's residual add fused with the next RMSNorm (EncoderOps::add_rms_norm, host side
// crates/moss-cuda/src/encoder/mod.rs `add_rms_norm_with`): one block per row of width d (d % 8 == 0,
// d <= 8192), x' = x + h rounded once into the activation type and stored, then the zero-centred
// RMSNorm of that stored (rounded) x': n = x' · rsqrt(mean(x'²) + eps) · (1 + w), sum of squares
// in fp32, one rounding into the output. Same rounding points as the unfused add + rms_norm.
// BUG 1 (moss_ctl_enc_add_rms_*): the weight without its 1 + (n = x' · rsqrt(..) · w).
#include "elem.cuh"
#include "launch.h"

namespace moss_enc_addnorm {
using namespace moss_elem;
constexpr int AN_T = ENC_ADD_RMS_THREADS;  // threads per row
constexpr int AN_V = ENC_ADD_RMS_VECS;     // 8-wide vectors per thread: d <= ENC_ADD_RMS_MAX_WIDTH

__device__ __forceinline__ float rnd(float v, const float*) { return v; }
__device__ __forceinline__ float rnd(float v, const __nv_bfloat16*) { return __bfloat162float(__float2bfloat16_rn(v)); }

// ADD false: the norm alone (x' = x is read, not written; h unused): the residual add already
// happened in the output projection's GEMM epilogue (EncoderOps::linear_add_rms_norm).
template <typename T, int BUG, bool ADD = true>
__device__ void add_rms_impl(T* xo, T* no, const T* x, const T* h, const float* w, int d, float eps) {
    __shared__ float red[AN_T / 32];
    const long base = (long)blockIdx.x * d;
    float v[AN_V][8];
    float ss = 0.f;
#pragma unroll
    for (int m = 0; m < AN_V; m++) {
        int i = (threadIdx.x + m * AN_T) * 8;
        if (i < d) {
            ld8(x, base + i, v[m]);
            if (ADD) {
                float b[8];
                ld8(h, base + i, b);
#pragma unroll
                for (int k = 0; k < 8; k++) v[m][k] = rnd(v[m][k] + b[k], x);
                st8(xo, base + i, v[m]);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) ss += v[m][k] * v[m][k];
        }
    }
    const float inv = rsqrtf(block_reduce<true, AN_T / 32>(ss, red) / (float)d + eps);
    const float plus = BUG == 1 ? 0.f : 1.f;
#pragma unroll
    for (int m = 0; m < AN_V; m++) {
        int i = (threadIdx.x + m * AN_T) * 8;
        if (i < d) {
            float g[8];
            ld8(w, i, g);
#pragma unroll
            for (int k = 0; k < 8; k++) v[m][k] = v[m][k] * inv * (g[k] + plus);
            st8(no, base + i, v[m]);
        }
    }
}
}  // namespace moss_enc_addnorm

#define MOSS_ADD_RMS(PFX, BUG, T, SX)                                                                         \
    MOSS_KERNEL void __launch_bounds__(ENC_ADD_RMS_THREADS) PFX##_add_rms_##SX(T* xo, T* no, const T* x, const T* h,          \
                                                               const float* w, int d, float eps) {            \
        moss_enc_addnorm::add_rms_impl<T, BUG>(xo, no, x, h, w, d, eps);                                      \
    }
MOSS_PRODUCTION(MOSS_ADD_RMS(moss_enc, 0, __nv_bfloat16, bf16))
MOSS_PRODUCTION(MOSS_ADD_RMS(moss_enc, 0, float, f32))
MOSS_CONTROL(MOSS_ADD_RMS(moss_ctl_enc, 1, __nv_bfloat16, bf16))
MOSS_CONTROL(MOSS_ADD_RMS(moss_ctl_enc, 1, float, f32))
