// What the host emulators (tools/*_emu.cpp) compile kernel source against in place of the CUDA
// headers: the kernel qualifiers as nothing, the launch indices as thread-locals (each emulated CUDA
// thread is a std::thread), and bf16 with its bit casts (round to nearest even, finite inputs).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#define __device__
#define __forceinline__ inline
#define __restrict__
#define MOSS_KERNEL extern "C"
#define MOSS_PRODUCTION(...) __VA_ARGS__
#define MOSS_CONTROL(...) __VA_ARGS__
using std::min;

struct dim3e {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local dim3e threadIdx, blockIdx;
inline dim3e gridDim;

struct __nv_bfloat16 {
    uint16_t bits;
};
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.bits << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    uint32_t u = __float_as_uint(x);
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}
