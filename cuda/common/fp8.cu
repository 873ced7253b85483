// The fp8 linears (`--precision fp8`, src/backend/cuda/ops/fp8.rs): row-wise float8 e4m3
// quantization, the arithmetic of src/fp8.rs bit for bit, and the scaling of an FP8 product that
// cuBLASLt ran with unit scales. The moss_ctl_* twins (check image) carry a planted bug.
#include "elem.cuh"
#include <cuda_fp8.h>
#include "launch.h"

using bf16 = __nv_bfloat16;
using namespace moss_elem;

// ---- quantize ------------------------------------------------------------------------------
//   scale = max(amax(x), min_amax) / e4m3_max,  q = e4m3(x / scale),
// both divisions IEEE (__fdiv_rn), e4m3 rounded to nearest even and saturated to ±448
// (__NV_SATFINITE: cvt.rn.satfinite.e4m3x2.f32 from sm_89). e4m3_max and min_amax come from the
// host (src/fp8.rs E4M3_MAX, MIN_AMAX). fmaxf ignores a NaN operand, as Rust's f32::max does, and
// a maximum does not depend on the order it is taken in.
// K a multiple of 8 up to FP8_QUANT_MAX_K (launch.h): the register path, FP8_QUANT_WARPS(K) warps
// a row, FP8_QUANT_ROWS(K) rows a block (grid-stride over the blocks' rows); each thread loads
// its FP8_QUANT_VECS vectors of 8 once, the warps of a row exchange their maxima through shared
// memory under a named barrier of their own. Other K: one block of FP8_QUANT_THREADS a row, the
// row read twice.
// BUG 1: toward zero (the mantissa cut to e4m3's 3 bits before the conversion).
// BUG 2: the amax misses the row's last element.

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

// 8 values of a row divided by its scale, as 8 e4m3 codes at qr + i.
template <int BUG>
__device__ __forceinline__ void store_e4m3x8(unsigned char* qr, long i, const float* v, float s) {
    uint2 out;
    unsigned char* b = reinterpret_cast<unsigned char*>(&out);
#pragma unroll
    for (int j = 0; j < 8; j++) b[j] = to_e4m3<BUG>(__fdiv_rn(v[j], s));
    *reinterpret_cast<uint2*>(qr + i) = out;
}

// 8 elements of a row as loaded (16 bytes of bf16, 32 of f32): what a thread holds between
// the amax and the quantization, half the registers of their fp32 values for bf16.
template <typename T>
struct Raw8 {
    uint4 w[sizeof(T) / 2];
    __device__ __forceinline__ void load(const T* p) {
#pragma unroll
        for (int h = 0; h < (int)(sizeof(T) / 2); h++) w[h] = reinterpret_cast<const uint4*>(p)[h];
    }
    __device__ __forceinline__ void values(float* v) const { ld8(reinterpret_cast<const T*>(w), 0, v); }
};

template <typename T, int BUG>
__device__ void quantize_fp8_in_registers(unsigned char* __restrict__ q, float* __restrict__ scale,
                                          const T* __restrict__ x, long rows, long k, float e4m3_max,
                                          float min_amax) {
    // the warps' maxima, two rows deep: a warp writes row n + 1's while another still reads row n's
    __shared__ float part[2][FP8_QUANT_THREADS / 32];
    const int kk = (int)k, wpr = FP8_QUANT_WARPS(kk), threads = 32 * wpr, rpb = blockDim.x / threads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / wpr;
    const int t = threadIdx.x - group * threads;
    int parity = 0;
    for (long r = (long)blockIdx.x * rpb + group; r < rows; r += (long)gridDim.x * rpb, parity ^= 1) {
        const T* xr = x + r * k;
        Raw8<T> raw[FP8_QUANT_VECS];
#pragma unroll
        for (int u = 0; u < FP8_QUANT_VECS; u++) {
            const int i = (u * threads + t) * 8;
            if (i < kk) raw[u].load(xr + i);
        }
        float m = 0.f;
#pragma unroll
        for (int u = 0; u < FP8_QUANT_VECS; u++) {
            const int i = (u * threads + t) * 8;
            if (i >= kk) continue;
            float v[8];
            raw[u].values(v);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (BUG != 2 || i + j != kk - 1) m = fmaxf(m, fabsf(v[j]));
        }
        m = warp_max(m);
        if (wpr > 1) {
            if (lane == 0) part[parity][warp] = m;
            asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "r"(threads) : "memory");
            for (int w = 0; w < wpr; w++) m = fmaxf(m, part[parity][group * wpr + w]);
        }
        const float s = __fdiv_rn(fmaxf(m, min_amax), e4m3_max);
        if (t == 0) scale[r] = s;
        unsigned char* qr = q + r * k;
#pragma unroll
        for (int u = 0; u < FP8_QUANT_VECS; u++) {
            const int i = (u * threads + t) * 8;
            if (i >= kk) continue;
            float v[8];
            raw[u].values(v);
            store_e4m3x8<BUG>(qr, i, v, s);
        }
    }
}

template <typename T, int BUG>
__device__ void quantize_fp8_block_a_row(unsigned char* __restrict__ q, float* __restrict__ scale,
                                         const T* __restrict__ x, long rows, long k, float e4m3_max,
                                         float min_amax) {
    __shared__ float part[32];
    __shared__ float row_scale;
    const bool vec = (k & 7) == 0;
    const long kmax = BUG == 2 ? k - 1 : k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * k;
        float m = 0.f;
        if (vec && BUG != 2) {
            for (long i = threadIdx.x * 8L; i < k; i += blockDim.x * 8L) {
                float v[8];
                ld8(xr, i, v);
#pragma unroll
                for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
            }
        } else {
            for (long i = threadIdx.x; i < kmax; i += blockDim.x) m = fmaxf(m, fabsf(ld(xr, i)));
        }
        m = warp_max(m);
        if (lane == 0) part[warp] = m;
        __syncthreads();
        if (warp == 0) {
            m = warp_max(lane < warps ? part[lane] : 0.f);
            if (lane == 0) {
                float s = __fdiv_rn(fmaxf(m, min_amax), e4m3_max);
                row_scale = s;
                scale[r] = s;
            }
        }
        __syncthreads();
        const float s = row_scale;
        unsigned char* qr = q + r * k;
        if (vec) {
            for (long i = threadIdx.x * 8L; i < k; i += blockDim.x * 8L) {
                float v[8];
                ld8(xr, i, v);
                store_e4m3x8<BUG>(qr, i, v, s);
            }
        } else {
            for (long i = threadIdx.x; i < k; i += blockDim.x) qr[i] = to_e4m3<BUG>(__fdiv_rn(ld(xr, i), s));
        }
        // part[] and row_scale are the next row's
        __syncthreads();
    }
}

// The host launches each path with its geometry (src/backend/cuda/ops/fp8.rs).
template <typename T, int BUG>
__device__ void quantize_fp8_impl(unsigned char* q, float* scale, const T* x, long rows, long k, float e4m3_max,
                                  float min_amax) {
    if ((k & 7) == 0 && k <= FP8_QUANT_MAX_K)
        quantize_fp8_in_registers<T, BUG>(q, scale, x, rows, k, e4m3_max, min_amax);
    else
        quantize_fp8_block_a_row<T, BUG>(q, scale, x, rows, k, e4m3_max, min_amax);
}
#define MOSS_QUANTIZE_FP8(NAME, BUG)                                                                             \
    MOSS_KERNEL void NAME##_bf16(unsigned char* q, float* scale, const bf16* x, long rows, long k, float e4m3_max, \
                                 float min_amax) {                                                                \
        quantize_fp8_impl<bf16, BUG>(q, scale, x, rows, k, e4m3_max, min_amax);                                   \
    }                                                                                                             \
    MOSS_KERNEL void NAME##_f32(unsigned char* q, float* scale, const float* x, long rows, long k, float e4m3_max, \
                                float min_amax) {                                                                 \
        quantize_fp8_impl<float, BUG>(q, scale, x, rows, k, e4m3_max, min_amax);                                  \
    }
MOSS_PRODUCTION(MOSS_QUANTIZE_FP8(moss_quantize_fp8, 0))
MOSS_CONTROL(MOSS_QUANTIZE_FP8(moss_ctl_quantize_fp8_rz, 1))
MOSS_CONTROL(MOSS_QUANTIZE_FP8(moss_ctl_quantize_fp8_tail, 2))

// ---- the scaled product --------------------------------------------------------------------
// out[r, j] = acc[r, j] · (xs[r] · ws[j]): the unit-scale FP8 product (fp32) times the row's and
// the column's scales, rounded once into out's type. vec: n a multiple of 8.
// BUG 1: the two scale vectors exchanged (xs by column, ws by row: a transposed scale).
// BUG 2: the row's scale applied twice.
template <int BUG>
__device__ __forceinline__ float pair_scale(const float* xs, const float* ws, long r, long j, long rows, long n) {
    if (BUG == 1) return xs[j % rows] * ws[r % n];
    if (BUG == 2) return xs[r] * xs[r] * ws[j];
    return xs[r] * ws[j];
}

template <typename TO, int BUG>
__device__ void fp8_scale_rows_impl(TO* __restrict__ out, const float* __restrict__ acc, const float* __restrict__ xs,
                                    const float* __restrict__ ws, long rows, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((n & 7) == 0) {
        for (long c = t; c < rows * n / 8; c += stride) {
            long i = c * 8, r = i / n, j = i % n;
            float v[8];
            ld8(acc, i, v);
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] *= pair_scale<BUG>(xs, ws, r, j + u, rows, n);
            st8(out, i, v);
        }
    } else {
        for (long i = t; i < rows * n; i += stride) st(out, i, acc[i] * pair_scale<BUG>(xs, ws, i / n, i % n, rows, n));
    }
}
#define MOSS_FP8_SCALE(NAME, BUG)                                                                                   \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const float* acc, const float* xs, const float* ws, long rows, long n) { \
        fp8_scale_rows_impl<bf16, BUG>(out, acc, xs, ws, rows, n);                                                  \
    }                                                                                                               \
    MOSS_KERNEL void NAME##_f32(float* out, const float* acc, const float* xs, const float* ws, long rows, long n) { \
        fp8_scale_rows_impl<float, BUG>(out, acc, xs, ws, rows, n);                                                 \
    }
MOSS_PRODUCTION(MOSS_FP8_SCALE(moss_fp8_scale_rows, 0))
MOSS_CONTROL(MOSS_FP8_SCALE(moss_ctl_fp8_scale_swapped, 1))
MOSS_CONTROL(MOSS_FP8_SCALE(moss_ctl_fp8_scale_twice, 2))
