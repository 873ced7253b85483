// SiTU-GLU into float8 codes (`--precision fp8`: the input of the ffn's down projection; host side
// crates/moss-cuda/src/dit/fp8_act.rs): x [rows, 2F] = [up | gate] → the values moss_situ_* writes
// (rounded to T), quantized per row as moss_quantize_fp8 quantizes that output (fp8.cuh: codes
// q [rows, F], scales qs [rows]). One block a row (grid-stride over rows); each thread holds up to
// DIT_SITU_FP8_VECS vectors of 8 outputs in registers between the row's amax and its codes. F % 8
// == 0 and F <= 8 · blockDim.x · DIT_SITU_FP8_VECS (the host checks; other F take moss_situ_* and
// moss_quantize_fp8). bf16 takes situ_fast (as moss_situ_fast_bf16 does), f32 the libm form.
// BUG 2: the amax of the first warp's values only.
#include "elem.cuh"
#include "fp8.cuh"
#include "launch.h"
#include "situ.cuh"

using bf16 = __nv_bfloat16;
using namespace moss_elem;
using namespace moss_fp8;

template <typename T, int BUG, bool FAST>
__device__ void situ_fp8_impl(unsigned char* __restrict__ q, float* __restrict__ qs, const T* __restrict__ x, long rows,
                              long f, float e4m3_max, float min_amax) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * 2 * f;
        float v[DIT_SITU_FP8_VECS][8];
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < DIT_SITU_FP8_VECS; j++) {
            const long i = ((long)j * blockDim.x + threadIdx.x) * 8;
            if (i < f) {
                float g[8];
                ld8(xr, i, v[j]);
                ld8(xr, f + i, g);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    v[j][k] = round_as(FAST ? situ_fast<0>(v[j][k], g[k]) : situ<0>(v[j][k], g[k]), x);
                    m = fmaxf(m, fabsf(v[j][k]));
                }
            }
        }
        m = warp_max(m);
        if (lane == 0) part[warp] = m;
        __syncthreads();
        m = part[0];
        if (BUG != 2)
            for (int u = 1; u < warps; u++) m = fmaxf(m, part[u]);
        const float s = e4m3_scale(m, e4m3_max, min_amax);
        if (threadIdx.x == 0) qs[r] = s;
#pragma unroll
        for (int j = 0; j < DIT_SITU_FP8_VECS; j++) {
            const long i = ((long)j * blockDim.x + threadIdx.x) * 8;
            if (i < f) st8_e4m3<0>(q + r * f + i, v[j], s);
        }
        // part[] is the next row's
        __syncthreads();
    }
}
#define MOSS_SITU_FP8(NAME, BUG)                                                                                      \
    MOSS_KERNEL void NAME##_situ_fast_fp8_bf16(unsigned char* q, float* qs, const bf16* x, long rows, long f,         \
                                               float e4m3_max, float min_amax) {                                      \
        situ_fp8_impl<bf16, BUG, true>(q, qs, x, rows, f, e4m3_max, min_amax);                                        \
    }                                                                                                                 \
    MOSS_KERNEL void NAME##_situ_fp8_f32(unsigned char* q, float* qs, const float* x, long rows, long f, float e4m3_max, \
                                         float min_amax) {                                                            \
        situ_fp8_impl<float, BUG, false>(q, qs, x, rows, f, e4m3_max, min_amax);                                      \
    }
MOSS_PRODUCTION(MOSS_SITU_FP8(moss, 0))
MOSS_CONTROL(MOSS_SITU_FP8(moss_ctl, 2))
