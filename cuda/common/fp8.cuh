// Row-wise float8 e4m3 quantization's arithmetic (crates/moss-core/src/fp8.rs, bit for bit), shared by the
// quantize kernel (cuda/common/fp8.cu) and the kernels that write their output quantized
// (cuda/dit: the norms and SiTU-GLU of `--precision fp8`):
//   scale = max(amax(x), min_amax) / e4m3_max,  q = e4m3(x / scale),
// both divisions IEEE (__fdiv_rn), e4m3 rounded to nearest even and saturated to ±448
// (__NV_SATFINITE: cvt.rn.satfinite.e4m3x2.f32 from sm_89). e4m3_max and min_amax come from the
// host (crates/moss-core/src/fp8.rs E4M3_MAX, MIN_AMAX). fmaxf ignores a NaN operand, as Rust's f32::max does, and
// a max is the same in any order, so any reduction tree gives the host's amax.
#pragma once
#include <cuda_fp8.h>
#include "elem.cuh"

namespace moss_fp8 {

// BUG 1 (planted controls): toward zero (the mantissa cut to e4m3's 3 bits before the conversion).
template <int BUG>
__device__ __forceinline__ unsigned char to_e4m3(float v) {
    if (BUG == 1) v = __uint_as_float(__float_as_uint(v) & 0xfff00000u);
    return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

using moss_elem::warp_max;

// The scale of a row whose largest magnitude is `amax`.
__device__ __forceinline__ float e4m3_scale(float amax, float e4m3_max, float min_amax) {
    return __fdiv_rn(fmaxf(amax, min_amax), e4m3_max);
}

// The codes of 8 values over `scale`, stored at q[0..8) (8-byte aligned).
template <int BUG>
__device__ __forceinline__ void st8_e4m3(unsigned char* q, const float* v, float scale) {
    uint2 out;
    unsigned char* b = reinterpret_cast<unsigned char*>(&out);
#pragma unroll
    for (int j = 0; j < 8; j++) b[j] = to_e4m3<BUG>(__fdiv_rn(v[j], scale));
    *reinterpret_cast<uint2*>(q) = out;
}

// A warp's row of d values quantized (the FP8 sink of the one-warp-a-row norms): `val8(i, v)`
// writes the 8 values from i (d % 8 == 0; a lane's i = lane·8 + 256·j), `val1(i)` returns the
// value at i (a lane's i = lane + 32·j). Each value is rounded to TX (the type of `tag`), the
// row's amax taken over the warp, and the codes made of the values computed again by the same
// code: q the row's codes, *qs its scale (written by lane 0). BUG 1 (planted controls): codes
// toward zero. BUG 2: each lane scales by its own amax.
template <int BUG, typename TX, typename V8>
__device__ __forceinline__ void warp_row_to_e4m3_8(V8 val8, const TX* tag, int d, int lane, unsigned char* q, float* qs,
                                                   float e4m3_max, float min_amax) {
    float m = 0.f;
#pragma unroll 4
    for (int i = lane * 8; i < d; i += 256) {
        float v[8];
        val8(i, v);
#pragma unroll
        for (int k = 0; k < 8; k++) m = fmaxf(m, fabsf(moss_elem::round_as(v[k], tag)));
    }
    const float s = e4m3_scale(BUG == 2 ? m : warp_max(m), e4m3_max, min_amax);
    if (lane == 0) *qs = s;
#pragma unroll 4
    for (int i = lane * 8; i < d; i += 256) {
        float v[8];
        val8(i, v);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = moss_elem::round_as(v[k], tag);
        st8_e4m3<BUG == 1>(q + i, v, s);
    }
}
template <int BUG, typename TX, typename V1>
__device__ __forceinline__ void warp_row_to_e4m3_1(V1 val1, const TX* tag, int d, int lane, unsigned char* q, float* qs,
                                                   float e4m3_max, float min_amax) {
    float m = 0.f;
    for (int i = lane; i < d; i += 32) m = fmaxf(m, fabsf(moss_elem::round_as(val1(i), tag)));
    const float s = e4m3_scale(BUG == 2 ? m : warp_max(m), e4m3_max, min_amax);
    if (lane == 0) *qs = s;
    for (int i = lane; i < d; i += 32) q[i] = to_e4m3<BUG == 1>(__fdiv_rn(moss_elem::round_as(val1(i), tag), s));
}

}  // namespace moss_fp8
