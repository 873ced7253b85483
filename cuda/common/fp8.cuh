// Row-wise float8 e4m3 quantization's arithmetic (src/fp8.rs, bit for bit), shared by the
// quantize kernel (cuda/common/fp8.cu) and the kernels that write their output quantized
// (cuda/dit: the norms and SiTU-GLU of `--precision fp8`):
//   scale = max(amax(x), min_amax) / e4m3_max,  q = e4m3(x / scale),
// both divisions IEEE (__fdiv_rn), e4m3 rounded to nearest even and saturated to ±448
// (__NV_SATFINITE: cvt.rn.satfinite.e4m3x2.f32 from sm_89). e4m3_max and min_amax come from the
// host (src/fp8.rs E4M3_MAX, MIN_AMAX). fmaxf ignores a NaN operand, as Rust's f32::max does, and
// a max is the same in any order, so any reduction tree gives the host's amax.
#pragma once
#include <cuda_fp8.h>

namespace moss_fp8 {

// BUG 1 (planted controls): toward zero (the mantissa cut to e4m3's 3 bits before the conversion).
template <int BUG>
__device__ __forceinline__ unsigned char to_e4m3(float v) {
    if (BUG == 1) v = __uint_as_float(__float_as_uint(v) & 0xfff00000u);
    return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

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

}  // namespace moss_fp8
