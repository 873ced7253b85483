// The generic ops of the CUDA backend (crates/moss-cuda): casts, broadcast add/mul, silu,
// sigmoid, rms_norm, strided 2-D copies (narrow, cat) and permute. Every op computes in fp32
// and rounds once into the output type. Names: moss_<op>_<types>; the moss_ctl_* kernels are
// the same code compiled with a planted bug (BUG != 0), used only by `moss check` to prove
// that each gate can fail.
#include "elem.cuh"

using bf16 = __nv_bfloat16;
using namespace moss_elem;

// ---- casts ---------------------------------------------------------------------------------
// BUG 1: f32 -> bf16 by truncation instead of round-to-nearest-even.
template <typename TI, typename TO, int BUG>
__device__ void cast_impl(TO* __restrict__ out, const TI* __restrict__ in, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    long n8 = n / 8;
    for (long c = (long)blockIdx.x * blockDim.x + threadIdx.x; c < n8; c += stride) {
        float v[8];
        ld8(in, c * 8, v);
        if (BUG == 1) {
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __uint_as_float(__float_as_uint(v[k]) & 0xffff0000u);
        }
        st8(out, c * 8, v);
    }
    for (long i = n8 * 8 + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = ld(in, i);
        if (BUG == 1) v = __uint_as_float(__float_as_uint(v) & 0xffff0000u);
        st(out, i, v);
    }
}
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_cast_f32_bf16(bf16* out, const float* in, long n) { cast_impl<float, bf16, 0>(out, in, n); }
#endif
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_cast_bf16_f32(float* out, const bf16* in, long n) { cast_impl<bf16, float, 0>(out, in, n); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_cast_f32_bf16(bf16* out, const float* in, long n) { cast_impl<float, bf16, 1>(out, in, n); }
#endif
// Planted: bf16 -> f32 widening that forgets the 16-bit shift (the bits land in the low half).
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_cast_bf16_f32(float* out, const bf16* in, long n) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(in);
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = __uint_as_float((unsigned)b[i]);
}
#endif

// ---- broadcast add / mul -------------------------------------------------------------------
// out[i] = a[i] (op) b[i mod nb]; out has a's type. vec: n and nb are multiples of 8.
// BUG 1: the broadcast index is shifted by one element (by one vector on the vector path).
template <typename TA, typename TB, int OP, int BUG>
__device__ void binary_impl(TA* __restrict__ out, const TA* __restrict__ a, const TB* __restrict__ b,
                            long n, long nb, int vec) {
    long stride = (long)gridDim.x * blockDim.x;
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        for (long c = t; c < n / 8; c += stride) {
            long i = c * 8;
            long j = i % nb;
            if (BUG == 1) j = (j + 8) % nb;
            float x[8], y[8];
            ld8(a, i, x);
            ld8(b, j, y);
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = OP == 0 ? x[k] + y[k] : x[k] * y[k];
            st8(out, i, x);
        }
    } else {
        for (long i = t; i < n; i += stride) {
            long j = i % nb;
            if (BUG == 1) j = (j + 1) % nb;
            float x = ld(a, i), y = ld(b, j);
            st(out, i, OP == 0 ? x + y : x * y);
        }
    }
}
#define MOSS_BINARY(NAME, OP, BUG, TA, SA, TB, SB)                                                   \
    MOSS_KERNEL void NAME##_##SA##_##SB(TA* out, const TA* a, const TB* b, long n, long nb, int vec) { \
        binary_impl<TA, TB, OP, BUG>(out, a, b, n, nb, vec);                                         \
    }
#define MOSS_BINARY4(NAME, OP, BUG)                      \
    MOSS_BINARY(NAME, OP, BUG, bf16, bf16, bf16, bf16)   \
    MOSS_BINARY(NAME, OP, BUG, bf16, bf16, float, f32)   \
    MOSS_BINARY(NAME, OP, BUG, float, f32, bf16, bf16)   \
    MOSS_BINARY(NAME, OP, BUG, float, f32, float, f32)
MOSS_PRODUCTION(MOSS_BINARY4(moss_add, 0, 0))
MOSS_PRODUCTION(MOSS_BINARY4(moss_mul, 1, 0))
MOSS_CONTROL(MOSS_BINARY4(moss_ctl_add, 0, 1))
MOSS_CONTROL(MOSS_BINARY4(moss_ctl_mul, 1, 1))

// ---- silu / sigmoid ------------------------------------------------------------------------
// OP 0 silu x·σ(x), OP 1 sigmoid σ(x) = 1/(1+e^-x). BUG 1: the sign of the exponent flipped.
template <int OP, int BUG>
__device__ __forceinline__ float unary_op(float x) {
    float e = BUG == 1 ? expf(x) : expf(-x);
    float s = 1.0f / (1.0f + e);
    return OP == 0 ? x * s : s;
}
template <typename T, int OP, int BUG>
__device__ void unary_impl(T* __restrict__ out, const T* __restrict__ in, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    long n8 = n / 8;
    for (long c = (long)blockIdx.x * blockDim.x + threadIdx.x; c < n8; c += stride) {
        float v[8];
        ld8(in, c * 8, v);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = unary_op<OP, BUG>(v[k]);
        st8(out, c * 8, v);
    }
    for (long i = n8 * 8 + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        st(out, i, unary_op<OP, BUG>(ld(in, i)));
}
#define MOSS_UNARY(NAME, OP, BUG)                                                                           \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const bf16* in, long n) { unary_impl<bf16, OP, BUG>(out, in, n); } \
    MOSS_KERNEL void NAME##_f32(float* out, const float* in, long n) { unary_impl<float, OP, BUG>(out, in, n); }
MOSS_PRODUCTION(MOSS_UNARY(moss_silu, 0, 0))
MOSS_PRODUCTION(MOSS_UNARY(moss_sigmoid, 1, 0))
MOSS_CONTROL(MOSS_UNARY(moss_ctl_silu, 0, 1))
MOSS_CONTROL(MOSS_UNARY(moss_ctl_sigmoid, 1, 1))

// ---- rms_norm ------------------------------------------------------------------------------
// One warp per row of width d: out = x · rsqrt(mean(x²) + eps) · g, g = 1 + w (one_plus),
// w, or 1 (w null). Sum of squares in fp32; one rounding into the output type.
// BUG 1: the weight is ignored. BUG 2: g = w even when one_plus is asked for.
template <typename TX, typename TW, int BUG>
__device__ void rms_norm_impl(TX* __restrict__ out, const TX* __restrict__ x, const TW* __restrict__ w,
                              long rows, int d, float eps, int one_plus) {
    int lane = threadIdx.x & 31;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const TX* xr = x + row * d;
    TX* orow = out + row * d;
    bool vec = (d & 7) == 0;
    float ss = 0.f;
    if (vec) {
        for (int i = lane * 8; i < d; i += 256) {
            float v[8];
            ld8(xr, i, v);
#pragma unroll
            for (int k = 0; k < 8; k++) ss += v[k] * v[k];
        }
    } else {
        for (int i = lane; i < d; i += 32) {
            float v = ld(xr, i);
            ss += v * v;
        }
    }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / (float)d + eps);
    bool use_w = w != nullptr && BUG != 1;
    float plus = (one_plus && BUG != 2) ? 1.f : 0.f;
    if (vec) {
        for (int i = lane * 8; i < d; i += 256) {
            float v[8], g[8];
            ld8(xr, i, v);
            if (use_w) ld8(w, i, g);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = v[k] * inv * (use_w ? g[k] + plus : 1.f);
            st8(orow, i, v);
        }
    } else {
        for (int i = lane; i < d; i += 32) {
            float g = use_w ? ld(w, i) + plus : 1.f;
            st(orow, i, ld(xr, i) * inv * g);
        }
    }
}
#define MOSS_RMS(NAME, BUG, TX, SX, TW, SW)                                                        \
    MOSS_KERNEL void NAME##_##SX##_##SW(TX* out, const TX* x, const TW* w, long rows, int d, float eps, \
                                        int one_plus) {                                            \
        rms_norm_impl<TX, TW, BUG>(out, x, w, rows, d, eps, one_plus);                             \
    }
#define MOSS_RMS4(NAME, BUG) MOSS_EACH_TX_TV(MOSS_RMS, NAME, BUG)
MOSS_PRODUCTION(MOSS_RMS4(moss_rms_norm, 0))
MOSS_CONTROL(MOSS_RMS4(moss_ctl_rms_noweight, 1))
MOSS_CONTROL(MOSS_RMS4(moss_ctl_rms_noplus, 2))

// ---- strided 2-D copy (narrow, cat) --------------------------------------------------------
// dst[r·dst_stride + dst_off + c] = src[r·src_stride + src_off + c] for r < rows, c < width,
// in units U of 2, 4, 8 or 16 bytes (the host picks the widest unit that divides everything).
// BUG 1: dst_off is ignored (every cat piece lands at the start of the row).
// BUG 2: src_off is ignored (narrow always starts at 0).
template <typename U, int BUG>
__device__ void copy2d_impl(U* __restrict__ dst, const U* __restrict__ src, long rows, long width,
                            long src_stride, long src_off, long dst_stride, long dst_off) {
    long total = rows * width;
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long r = i / width, c = i - r * width;
        dst[r * dst_stride + (BUG == 1 ? 0 : dst_off) + c] = src[r * src_stride + (BUG == 2 ? 0 : src_off) + c];
    }
}
#define MOSS_COPY2D(NAME, BUG, U, S)                                                                 \
    MOSS_KERNEL void NAME##_##S(U* dst, const U* src, long rows, long width, long src_stride,       \
                                long src_off, long dst_stride, long dst_off) {                      \
        copy2d_impl<U, BUG>(dst, src, rows, width, src_stride, src_off, dst_stride, dst_off);       \
    }
#define MOSS_COPY2D4(NAME, BUG) MOSS_EACH_UNIT(MOSS_COPY2D, NAME, BUG)
MOSS_PRODUCTION(MOSS_COPY2D4(moss_copy2d, 0))
MOSS_CONTROL(MOSS_COPY2D4(moss_ctl_copy2d, 1))
MOSS_CONTROL(MOSS_COPY2D4(moss_ctlsrc_copy2d, 2))

// ---- permute -------------------------------------------------------------------------------
// out (row-major, dims out_dims) [i0..i5] = in[Σ ik · src_strides[k]], in units U (the host folds
// a last dim that stays last into 16-byte units when it can). Up to 6 dims.
// BUG 1: no permutation at all, out[i] = in[i] (a permute that forgot to move the data).
struct MossPerm {
    long out_dims[6];
    long src_strides[6];
    int nd;
};
template <typename U, int BUG>
__device__ void permute_impl(U* __restrict__ out, const U* __restrict__ in, MossPerm p, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        long rem = i, off = 0;
#pragma unroll
        for (int k = 5; k >= 0; k--) {
            if (k >= p.nd) continue;
            long q = rem / p.out_dims[k];
            off += (rem - q * p.out_dims[k]) * p.src_strides[k];
            rem = q;
        }
        out[i] = in[BUG == 1 ? i : off];
    }
}
#define MOSS_PERMUTE(NAME, BUG, U, S) \
    MOSS_KERNEL void NAME##_##S(U* out, const U* in, MossPerm p, long n) { permute_impl<U, BUG>(out, in, p, n); }
#define MOSS_PERMUTE4(NAME, BUG) MOSS_EACH_UNIT(MOSS_PERMUTE, NAME, BUG)
MOSS_PRODUCTION(MOSS_PERMUTE4(moss_permute, 0))
MOSS_CONTROL(MOSS_PERMUTE4(moss_ctl_permute, 1))
