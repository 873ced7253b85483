// The int8 linears (`--precision int8`, crates/moss-cuda/src/ops/int8.rs): row-wise int8
// quantization of the activations (plain, or each group of a row turned by ConvRot's normalized
// Hadamard matrix first: the input of a matrix stored as the codes of W·H), and the epilogue
// that scales cuBLASLt's exact int32 product (IMMA) into bf16 / f32. The host twins are
// crates/moss-core/src/int8.rs and the CPU backend's `quantize_rows_int8` / `linear_int8_quantized`:
//   scale = max(amax(x), min_amax) / 127 (__fdiv_rn), q = rint(x / scale) (__fdiv_rn, ties to
//   even) clamped to ±127,
// so the codes and scales are the host's bit for bit. The turn sums in f64 with the host's
// butterfly (crates/moss-core/src/checkpoint/comfy_quant.rs `turn_back`: the same additions in the
// same order, no products), then multiplies by 1/√g in f64 and rounds once to f32: the host's
// values. The epilogue computes acc·(xs·ws) in f32 (the host in f64: a few f32 roundings apart).
// moss_ctl_* (check image): planted bugs the gates must reject.
#include "elem.cuh"
#include "fp8.cuh"
#include "launch.h"

using bf16 = __nv_bfloat16;
using namespace moss_elem;

namespace moss_int8 {

// The code of v / s. BUG 1: toward zero.
template <int BUG>
__device__ __forceinline__ unsigned char code(float v, float s) {
    const float d = __fdiv_rn(v, s);
    const float r = BUG == 1 ? truncf(d) : rintf(d);
    return (unsigned char)(signed char)(int)fminf(fmaxf(r, -127.f), 127.f);
}

// The block's max of each thread's `m`; thread 0's result is broadcast through `out`.
__device__ __forceinline__ float block_max(float m, float* part, float* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    m = moss_fp8::warp_max(m);
    if (lane == 0) part[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = moss_fp8::warp_max(lane < warps ? part[lane] : 0.f);
        if (lane == 0) *out = m;
    }
    __syncthreads();
    return *out;
}

// One block a row (grid-stride over rows). BUG 1: codes toward zero. BUG 2: the amax misses the
// row's last element.
template <typename T, int BUG>
__device__ void quantize_impl(unsigned char* __restrict__ q, float* __restrict__ scale, const T* __restrict__ x, long rows, long k,
                              float min_amax) {
    __shared__ float part[32];
    __shared__ float amax;
    const bool vec = (k & 7) == 0;
    const long kmax = BUG == 2 ? k - 1 : k;
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
        const float s = __fdiv_rn(fmaxf(block_max(m, part, &amax), min_amax), 127.f);
        if (threadIdx.x == 0) scale[r] = s;
        unsigned char* qr = q + r * k;
        if (vec) {
            for (long i = threadIdx.x * 8L; i < k; i += blockDim.x * 8L) {
                float v[8];
                ld8(xr, i, v);
                uint2 out;
                unsigned char* b = reinterpret_cast<unsigned char*>(&out);
#pragma unroll
                for (int j = 0; j < 8; j++) b[j] = code<BUG>(v[j], s);
                *reinterpret_cast<uint2*>(qr + i) = out;
            }
        } else {
            for (long i = threadIdx.x; i < k; i += blockDim.x) qr[i] = code<BUG>(ld(xr, i), s);
        }
        // part[] and amax are the next row's
        __syncthreads();
    }
}

// t[0..n) (whole groups of g) ← each group times the unnormalized Hadamard matrix: the host's
// butterfly, stage by stage. BUG 1: the last stage left out.
template <int BUG>
__device__ void turn(double* t, int n, int g, int radix4) {
    const int r = radix4 ? 4 : 2;
    for (int stride = 1; stride < g; stride *= r) {
        if (BUG == 1 && stride * r >= g) break;
        const int sets = n / r;
        for (int idx = threadIdx.x; idx < sets; idx += blockDim.x) {
            const int grp = idx / (g / r), w = idx % (g / r);
            const int base = grp * g + (w / stride) * stride * r + w % stride;
            if (radix4) {
                const double x0 = t[base], x1 = t[base + stride], x2 = t[base + 2 * stride], x3 = t[base + 3 * stride];
                // y_a = Σ_b x_b · H4[b][a], H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]
                t[base] = x0 + x1 + x2 - x3;
                t[base + stride] = x0 + x1 - x2 + x3;
                t[base + 2 * stride] = x0 - x1 + x2 + x3;
                t[base + 3 * stride] = -x0 + x1 + x2 + x3;
            } else {
                const double x0 = t[base], x1 = t[base + stride];
                t[base] = x0 + x1;
                t[base + stride] = x0 - x1;
            }
        }
        __syncthreads();
    }
}

// One block a row: the row is turned chunk by chunk (whole groups, DIT_INT8_ROT_TILE values at
// most) twice, once for its amax and once for its codes. g divides k, g <= DIT_INT8_ROT_TILE.
template <typename T, int BUG>
__device__ void quantize_rot_impl(unsigned char* __restrict__ q, float* __restrict__ scale, const T* __restrict__ x, long rows, long k,
                                  int g, int radix4, double norm, float min_amax) {
    __shared__ double t[DIT_INT8_ROT_TILE];
    __shared__ float part[32];
    __shared__ float amax;
    const long chunk = (long)(DIT_INT8_ROT_TILE / g) * g;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * k;
        float m = 0.f, s = 0.f;
        for (int pass = 0; pass < 2; pass++) {
            for (long c0 = 0; c0 < k; c0 += chunk) {
                const int n = (int)min(chunk, k - c0);
                for (int e = threadIdx.x; e < n; e += blockDim.x) t[e] = (double)ld(xr, c0 + e);
                __syncthreads();
                turn<BUG>(t, n, g, radix4);
                for (int e = threadIdx.x; e < n; e += blockDim.x) {
                    const float v = __double2float_rn(__dmul_rn(t[e], norm));
                    if (pass == 0) {
                        m = fmaxf(m, fabsf(v));
                    } else {
                        q[r * k + c0 + e] = code<0>(v, s);
                    }
                }
                __syncthreads();
            }
            if (pass == 0) {
                s = __fdiv_rn(fmaxf(block_max(m, part, &amax), min_amax), 127.f);
                if (threadIdx.x == 0) scale[r] = s;
            }
        }
        __syncthreads();
    }
}

// out[r, j] = acc[r, j] · (xs[r] · ws[j]), in f32, rounded once into out's type.
// BUG 1: the two scale vectors exchanged (xs by column, ws by row). BUG 2: the row's scale twice.
template <typename TO, int BUG>
__device__ void scale_rows_impl(TO* __restrict__ out, const int* __restrict__ acc, const float* __restrict__ xs, const float* __restrict__ ws,
                                long rows, long n) {
    const long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * n; i += stride) {
        const long r = i / n, j = i % n;
        float f = BUG == 1 ? xs[j % rows] * ws[r % n] : __fmul_rn(xs[r], ws[j]);
        if (BUG == 2) f = __fmul_rn(f, xs[r]);
        st(out, i, __fmul_rn(__int2float_rn(acc[i]), f));
    }
}

}  // namespace moss_int8

#define MOSS_QUANTIZE_INT8(NAME, BUG)                                                                                         \
    MOSS_KERNEL void NAME##_bf16(unsigned char* q, float* scale, const bf16* x, long rows, long k, float min_amax) {          \
        moss_int8::quantize_impl<bf16, BUG>(q, scale, x, rows, k, min_amax);                                                \
    }                                                                                                                        \
    MOSS_KERNEL void NAME##_f32(unsigned char* q, float* scale, const float* x, long rows, long k, float min_amax) {         \
        moss_int8::quantize_impl<float, BUG>(q, scale, x, rows, k, min_amax);                                               \
    }
MOSS_PRODUCTION(MOSS_QUANTIZE_INT8(moss_quantize_int8, 0))
MOSS_CONTROL(MOSS_QUANTIZE_INT8(moss_ctl_quantize_int8_rz, 1))
MOSS_CONTROL(MOSS_QUANTIZE_INT8(moss_ctl_quantize_int8_tail, 2))

#define MOSS_QUANTIZE_INT8_ROT(NAME, BUG)                                                                                     \
    MOSS_KERNEL void NAME##_bf16(unsigned char* q, float* scale, const bf16* x, long rows, long k, int g, int radix4,         \
                                 double norm, float min_amax) {                                                              \
        moss_int8::quantize_rot_impl<bf16, BUG>(q, scale, x, rows, k, g, radix4, norm, min_amax);                           \
    }                                                                                                                        \
    MOSS_KERNEL void NAME##_f32(unsigned char* q, float* scale, const float* x, long rows, long k, int g, int radix4,        \
                                double norm, float min_amax) {                                                               \
        moss_int8::quantize_rot_impl<float, BUG>(q, scale, x, rows, k, g, radix4, norm, min_amax);                          \
    }
MOSS_PRODUCTION(MOSS_QUANTIZE_INT8_ROT(moss_quantize_int8_rot, 0))
MOSS_CONTROL(MOSS_QUANTIZE_INT8_ROT(moss_ctl_quantize_int8_rot_short, 1))

#define MOSS_INT8_SCALE(NAME, BUG)                                                                                            \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const int* acc, const float* xs, const float* ws, long rows, long n) {           \
        moss_int8::scale_rows_impl<bf16, BUG>(out, acc, xs, ws, rows, n);                                                   \
    }                                                                                                                        \
    MOSS_KERNEL void NAME##_f32(float* out, const int* acc, const float* xs, const float* ws, long rows, long n) {           \
        moss_int8::scale_rows_impl<float, BUG>(out, acc, xs, ws, rows, n);                                                  \
    }
MOSS_PRODUCTION(MOSS_INT8_SCALE(moss_int8_scale_rows, 0))
MOSS_CONTROL(MOSS_INT8_SCALE(moss_ctl_int8_scale_swapped, 1))
MOSS_CONTROL(MOSS_INT8_SCALE(moss_ctl_int8_scale_twice, 2))
