// The fp8 linears (`--precision fp8`, crates/moss-cuda/src/ops/fp8.rs): row-wise float8 e4m3
// quantization, the arithmetic of crates/moss-core/src/fp8.rs bit for bit, and the scaling of an FP8 product that
// cuBLASLt ran with unit scales. The moss_ctl_* twins (check image) carry a planted bug.
#include "elem.cuh"
#include "fp8.cuh"

using bf16 = __nv_bfloat16;
using namespace moss_elem;
using namespace moss_fp8;

// ---- quantize ------------------------------------------------------------------------------
// One block a row (grid-stride over rows; any block size up to 1024 threads), the arithmetic of
// fp8.cuh. BUG 1: toward zero (the mantissa cut to e4m3's 3 bits before the conversion).
// BUG 2: the amax misses the row's last element.

template <typename T, int BUG>
__device__ void quantize_fp8_impl(unsigned char* __restrict__ q, float* __restrict__ scale, const T* __restrict__ x,
                                  long rows, long k, float e4m3_max, float min_amax) {
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
                float s = e4m3_scale(m, e4m3_max, min_amax);
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
                st8_e4m3<BUG>(qr + i, v, s);
            }
        } else {
            for (long i = threadIdx.x; i < k; i += blockDim.x) qr[i] = to_e4m3<BUG>(__fdiv_rn(ld(xr, i), s));
        }
        // part[] and row_scale are the next row's
        __syncthreads();
    }
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
