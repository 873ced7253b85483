// Element helpers shared by moss kernels: typed loads/stores through fp32, and 8-wide
// vector forms (16 bytes of bf16, 32 bytes of f32). The vector forms need the index to be a
// multiple of 8 and the base pointer 16-byte aligned (every moss buffer is 256-byte aligned).
#pragma once
#include "common.cuh"

namespace moss_elem {

__device__ __forceinline__ float ld(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, long i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ void ld8(const float* p, long i, float* v) {
    float4 a = *reinterpret_cast<const float4*>(p + i);
    float4 b = *reinterpret_cast<const float4*>(p + i + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void ld8(const __nv_bfloat16* p, long i, float* v) {
    uint4 u = *reinterpret_cast<const uint4*>(p + i);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}
__device__ __forceinline__ void st8(float* p, long i, const float* v) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void st8(__nv_bfloat16* p, long i, const float* v) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<uint4*>(p + i) = u;
}

// `v` rounded to the storage type `T` of the pointer's tensor and back (what a store then a load give).
__device__ __forceinline__ float round_as(float v, const __nv_bfloat16*) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float round_as(float v, const float*) { return v; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The block's sum (SUM) or max of v, the same order on every run: each warp's (warp_sum, warp_max),
// then the warps' in warp order through part[] (shared, a float a warp); every thread gets it.
// The RMS norms' reduction: rsqrt(block_reduce<true>(Σ x², part) / d + eps). WARPS: the block's
// warps when the kernel fixes them at compile time (a sum from 0.f, unrolled), or 0: blockDim's.
template <bool SUM, int WARPS = 0>
__device__ __forceinline__ float block_reduce(float v, float* part) {
    static_assert(SUM || WARPS == 0, "a fixed warp count is for sums");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = WARPS ? WARPS : (blockDim.x + 31) >> 5;
    v = SUM ? warp_sum(v) : warp_max(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if constexpr (WARPS > 0) {
        v = 0.f;
#pragma unroll
        for (int u = 0; u < WARPS; u++) v += part[u];
    } else {
        v = part[0];
        for (int u = 1; u < warps; u++) v = SUM ? v + part[u] : fmaxf(v, part[u]);
    }
    return v;
}

}  // namespace moss_elem
