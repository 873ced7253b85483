// Quantized weights kept as stored on the GPU (crates/moss-cuda/src/ops/quant.rs), dequantized into
// a bf16 / f32 scratch matrix right before each product. The host twins are the CPU backend's
// loaders, and the kernels repeat their arithmetic operation for operation, so the values are the
// same bit for bit:
// - ggml blocks (crates/moss-core/src/checkpoint/ggml.rs, the `gguf` Python package's f32
//   arithmetic): each product and sum rounded alone (__fmul_rn / __fadd_rn / __fsub_rn), no
//   fused multiply-add. One thread makes 8 consecutive values of a block (blocks hold 32 or 256).
// - int8 rows (crates/moss-core/src/checkpoint/comfy_quant.rs): `q · scale[row]`, an f32 product.
// - int8 + ConvRot: each group of `g` values turned back by convert-to-quant's Hadamard matrix
//   (H4^{⊗k} for powers of 4, Sylvester's otherwise) as a fast transform. The host sums the f32
//   products `p = q · s` in f64; they are all multiples of u = 2^(ilogb(s) − 23) below 2^31·u, so
//   the kernel sums the integers p / u in 64 bits (exactly the host's f64 sum), then forms
//   `(sum · u) · norm` in f64 and rounds once to f32: the host's value.
// - W4A8 (comfy-kitchen's asym_w4a8_int8, comfy_quant.rs `w4a8_grid`): each 4- or 6-bit code decoded
//   to its int8 grid value `clamp(rint(level · s_rel), ±127)` (an f32 product, rounded half to even),
//   `level` from the packed table (the codebook, or the uniform levels), `s_rel` the group's scale
//   (float8 e4m3, or f32); then exactly the int8 + ConvRot path with the row scale `s_channel`.
// moss_ctl_* (check image): a planted bug per format the gates must reject.
#include <cuda_fp16.h>
#include "elem.cuh"
#include "launch.h"

using bf16 = __nv_bfloat16;
using namespace moss_elem;

namespace moss_dequant {

__device__ __forceinline__ float f16_at(const unsigned char* b, int at) {
    return __half2float(__ushort_as_half((unsigned short)(b[at] | (b[at + 1] << 8))));
}

// ggml_type ids (crates/moss-core/src/checkpoint/ggml.rs `GgmlType::id`)
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

template <int T> struct Block;
template <> struct Block<Q4_0> { static constexpr int values = 32, bytes = 18; };
template <> struct Block<Q4_1> { static constexpr int values = 32, bytes = 20; };
template <> struct Block<Q5_0> { static constexpr int values = 32, bytes = 22; };
template <> struct Block<Q5_1> { static constexpr int values = 32, bytes = 24; };
template <> struct Block<Q8_0> { static constexpr int values = 32, bytes = 34; };
template <> struct Block<Q4_K> { static constexpr int values = 256, bytes = 144; };
template <> struct Block<Q5_K> { static constexpr int values = 256, bytes = 176; };
template <> struct Block<Q6_K> { static constexpr int values = 256, bytes = 210; };

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block (`get_scale_min_k4`).
// BUG 1: the j >= 4 ones unpacked like the first four.
template <int BUG>
__device__ __forceinline__ void scale_min_k4(int j, const unsigned char* s, int& sc, int& m) {
    if (j < 4 || BUG == 1) {
        sc = s[j & 3] & 63;
        m = s[(j & 3) + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Values i0 .. i0 + 7 (i0 a multiple of 8) of block `b` of type T. BUG: the format's planted bug.
template <int T, int BUG>
__device__ __forceinline__ void values8(const unsigned char* b, int i0, float* v) {
    if constexpr (T == Q8_0) {
        const float d = f16_at(b, 0);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            // BUG 1: the codes read unsigned
            const float q = BUG == 1 ? (float)b[2 + i0 + j] : (float)(signed char)b[2 + i0 + j];
            v[j] = __fmul_rn(q, d);
        }
    } else if constexpr (T == Q4_0 || T == Q4_1) {
        const float d = f16_at(b, 0);
        const unsigned char* qs = b + (T == Q4_0 ? 2 : 4);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = i0 + j;
            // BUG 1: the low and high nibbles exchanged
            const bool low = BUG == 1 ? i >= 16 : i < 16;
            const int nib = low ? (qs[i & 15] & 0xF) : (qs[i & 15] >> 4);
            if constexpr (T == Q4_0) v[j] = __fmul_rn(d, (float)(nib - 8));
            else v[j] = __fadd_rn(__fmul_rn(d, (float)nib), f16_at(b, 2));
        }
    } else if constexpr (T == Q5_0 || T == Q5_1) {
        const float d = f16_at(b, 0);
        const int off = T == Q5_0 ? 2 : 4;
        const unsigned qh = b[off] | (b[off + 1] << 8) | (b[off + 2] << 16) | ((unsigned)b[off + 3] << 24);
        const unsigned char* qs = b + off + 4;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = i0 + j;
            const int lo = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
            // BUG 1: the fifth bit left out
            const int q = lo | (BUG == 1 ? 0 : (int)((qh >> i) & 1) << 4);
            if constexpr (T == Q5_0) v[j] = __fmul_rn(d, (float)(q - 16));
            else v[j] = __fadd_rn(__fmul_rn(d, (float)q), f16_at(b, 2));
        }
    } else if constexpr (T == Q4_K || T == Q5_K) {
        const float d = f16_at(b, 0), dmin = f16_at(b, 2);
        const int sub = i0 / 32;  // 8 values never cross a sub-block of 32
        int sc, m;
        scale_min_k4<BUG>(sub, b + 4, sc, m);
        const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
        const unsigned char* qh = b + 16;
        const unsigned char* qs = b + (T == Q5_K ? 48 : 16) + 32 * (sub / 2);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int l = (i0 & 31) + j;
            int q = (sub & 1) ? (qs[l] >> 4) : (qs[l] & 0xF);
            if constexpr (T == Q5_K) q |= ((qh[l] >> sub) & 1) << 4;
            v[j] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    } else if constexpr (T == Q6_K) {
        const unsigned char* ql = b;
        const unsigned char* qh = b + 128;
        const signed char* sc = reinterpret_cast<const signed char*>(b + 192);
        const float d = f16_at(b, 208);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = i0 + j, h = i / 128, r = i % 128;
            const int lo = r < 64 ? (ql[64 * h + r] & 0xF) : (ql[64 * h + r - 64] >> 4);
            // BUG 1: the high bits of the first half read for both halves
            const int hi = (qh[(BUG == 1 ? 0 : 32 * h) + r % 32] >> (2 * (r / 32))) & 3;
            const int q = (lo | (hi << 4)) - 32;
            v[j] = __fmul_rn(__fmul_rn(d, (float)sc[i / 16]), (float)q);
        }
    }
}

// out[0 .. n) = the values of the whole blocks at `blocks` (n a multiple of the block's values).
template <int T, int BUG, typename O>
__device__ void ggml_impl(O* __restrict__ out, const unsigned char* __restrict__ blocks, long n) {
    constexpr int BV = Block<T>::values, BB = Block<T>::bytes;
    const long groups = n / 8;
    for (long g = blockIdx.x * (long)blockDim.x + threadIdx.x; g < groups; g += (long)gridDim.x * blockDim.x) {
        const long i = g * 8;
        float v[8];
        values8<T, BUG>(blocks + (i / BV) * BB, (int)(i % BV), v);
        st8(out, i, v);
    }
}

// int8 rows: out[r, c] = q[r, c] · scale[r]. BUG 1: the codes read unsigned.
template <int BUG, typename O>
__device__ void int8_impl(O* __restrict__ out, const unsigned char* __restrict__ codes, const float* __restrict__ scales,
                          long rows, long k) {
    const long n = rows * k;
    const long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const float q = BUG == 1 ? (float)codes[i] : (float)(signed char)codes[i];
        st(out, i, __fmul_rn(q, scales[i / k]));
    }
}

// The int8 code of element `at` of a row-major [rows, k] matrix.
// Int8Codes: stored int8. BUG 1 (the int8 + ConvRot control) is the rotation's, not the codes'.
struct Int8Codes {
    const unsigned char* codes;
    __device__ __forceinline__ int operator()(long at) const { return (signed char)codes[at]; }
};

// float8 e4m3 (e4m3fn: no infinities, S.1111.111 NaN) as f32, exactly (crates/moss-core/src/fp8.rs).
__device__ __forceinline__ float e4m3_value(unsigned char c) {
    const int e = (c >> 3) & 0xf, m = c & 7;
    const float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return (e == 15 && m == 7) ? __int_as_float(0x7fc00000) : ((c & 0x80) ? -v : v);
}

// W4A8 codes (the file's head): rows of k / 2 bytes of nibbles (even column low), at 6 bits followed
// by k / 4 bytes of the top 2 bits (column c in byte c / 4 at bit 2 · (c % 4)); group scales s_rel
// [rows, k / group] (e4m3 bytes, or f32 when srel_f32); levels[2^bits] f32.
// BUG 2: the nibbles exchanged (even columns read from the high nibble).
template <int BUG>
struct W4a8Codes {
    const unsigned char* codes;
    const unsigned char* s_rel;
    const float* levels;
    long k;
    int bits, group, srel_f32;
    __device__ __forceinline__ int operator()(long at) const {
        const long r = at / k, c = at % k;
        const unsigned char* row = codes + r * (k * bits / 8);
        const int shift = ((c & 1) ^ (BUG == 2 ? 1 : 0)) * 4;
        int q = (row[c >> 1] >> shift) & 0xf;
        if (bits == 6) q |= ((row[k / 2 + c / 4] >> (2 * (c % 4))) & 3) << 4;
        const long gi = r * (k / group) + c / group;
        const float s = srel_f32 ? reinterpret_cast<const float*>(s_rel)[gi] : e4m3_value(s_rel[gi]);
        return (int)fminf(fmaxf(rintf(__fmul_rn(levels[q], s)), -127.0f), 127.0f);
    }
};

// int8 grid codes + ConvRot (see the file's head): out = turn_back(code(at) · scale[row]). A block
// turns DIT_DEQ_ROT_TILE / g groups (at least one) a step, in shared memory. radix4: g is a power
// of 4 (H4^{⊗k}), else a power of 2 (H2^{⊗k}).
// BUG 1: the rotation left out (the codes' values as stored, rotated).
template <int BUG, typename Codes, typename O>
__device__ void rot_impl(O* __restrict__ out, const Codes code, const float* __restrict__ scales, long rows, long k, int g, int radix4,
                         double norm) {
    __shared__ long long t[DIT_DEQ_ROT_TILE];
    const int per = g >= DIT_DEQ_ROT_TILE ? 1 : DIT_DEQ_ROT_TILE / g;  // groups a step
    const long groups = rows * (k / g);
    for (long g0 = (long)blockIdx.x * per; g0 < groups; g0 += (long)gridDim.x * per) {
        const int here = (int)min((long)per, groups - g0);
        const int n = here * g;
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const long at = g0 * g + e;
            const float s = scales[at / k];
            const float p = __fmul_rn((float)code(at), s);
            const int ue = max(ilogbf(fabsf(s)) - 23, -149);
            t[e] = s == 0.0f ? 0 : __float2ll_rn(scalbnf(p, -ue));
        }
        __syncthreads();
        if (BUG != 1) {
            const int r = radix4 ? 4 : 2;
            for (int stride = 1; stride < g; stride *= r) {
                const int quads = n / r;
                for (int idx = threadIdx.x; idx < quads; idx += blockDim.x) {
                    const int grp = idx / (g / r), w = idx % (g / r);
                    const int base = grp * g + (w / stride) * stride * r + w % stride;
                    if (radix4) {
                        const long long x0 = t[base], x1 = t[base + stride], x2 = t[base + 2 * stride], x3 = t[base + 3 * stride];
                        // y_a = Σ_b x_b · H4[b][a], H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]
                        t[base] = x0 + x1 + x2 - x3;
                        t[base + stride] = x0 + x1 - x2 + x3;
                        t[base + 2 * stride] = x0 - x1 + x2 + x3;
                        t[base + 3 * stride] = -x0 + x1 + x2 + x3;
                    } else {
                        const long long x0 = t[base], x1 = t[base + stride];
                        t[base] = x0 + x1;
                        t[base + stride] = x0 - x1;
                    }
                }
                __syncthreads();
            }
        }
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const long at = g0 * g + e;
            const float s = scales[at / k];
            const int ue = max(ilogbf(fabsf(s)) - 23, -149);
            const double sum = (double)t[e] * scalbn(1.0, ue);
            st(out, at, __double2float_rn(__dmul_rn(sum, BUG == 1 ? 1.0 : norm)));
        }
        __syncthreads();
    }
}

}  // namespace moss_dequant

#define MOSS_DEQUANT_GGML(NAME, T, BUG)                                                                                \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const unsigned char* blocks, long n) {                                    \
        moss_dequant::ggml_impl<moss_dequant::T, BUG>(out, blocks, n);                                                \
    }                                                                                                                  \
    MOSS_KERNEL void NAME##_f32(float* out, const unsigned char* blocks, long n) { moss_dequant::ggml_impl<moss_dequant::T, BUG>(out, blocks, n); }
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q4_0, Q4_0, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q4_1, Q4_1, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q5_0, Q5_0, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q5_1, Q5_1, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q8_0, Q8_0, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q4_k, Q4_K, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q5_k, Q5_K, 0))
MOSS_PRODUCTION(MOSS_DEQUANT_GGML(moss_dequant_q6_k, Q6_K, 0))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q4_0, Q4_0, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q4_1, Q4_1, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q5_0, Q5_0, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q5_1, Q5_1, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q8_0, Q8_0, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q4_k, Q4_K, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q5_k, Q5_K, 1))
MOSS_CONTROL(MOSS_DEQUANT_GGML(moss_ctl_dequant_q6_k, Q6_K, 1))

#define MOSS_DEQUANT_INT8(NAME, BUG)                                                                                   \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const unsigned char* codes, const float* scales, long rows, long k) {     \
        moss_dequant::int8_impl<BUG>(out, codes, scales, rows, k);                                                    \
    }                                                                                                                  \
    MOSS_KERNEL void NAME##_f32(float* out, const unsigned char* codes, const float* scales, long rows, long k) {    \
        moss_dequant::int8_impl<BUG>(out, codes, scales, rows, k);                                                    \
    }
MOSS_PRODUCTION(MOSS_DEQUANT_INT8(moss_dequant_int8, 0))
MOSS_CONTROL(MOSS_DEQUANT_INT8(moss_ctl_dequant_int8, 1))

#define MOSS_DEQUANT_INT8_ROT(NAME, BUG)                                                                              \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const unsigned char* codes, const float* scales, long rows, long k, int g, \
                                 int radix4, double norm) {                                                          \
        moss_dequant::rot_impl<BUG>(out, moss_dequant::Int8Codes{codes}, scales, rows, k, g, radix4, norm);          \
    }                                                                                                                 \
    MOSS_KERNEL void NAME##_f32(float* out, const unsigned char* codes, const float* scales, long rows, long k, int g, \
                                int radix4, double norm) {                                                           \
        moss_dequant::rot_impl<BUG>(out, moss_dequant::Int8Codes{codes}, scales, rows, k, g, radix4, norm);          \
    }
MOSS_PRODUCTION(MOSS_DEQUANT_INT8_ROT(moss_dequant_int8_rot, 0))
MOSS_CONTROL(MOSS_DEQUANT_INT8_ROT(moss_ctl_dequant_int8_rot, 1))

// BUG 2: the nibbles exchanged (W4a8Codes).
#define MOSS_DEQUANT_W4A8(NAME, BUG)                                                                                    \
    MOSS_KERNEL void NAME##_bf16(bf16* out, const unsigned char* codes, const float* scales, const unsigned char* s_rel, \
                                 const float* levels, long rows, long k, int bits, int group, int srel_f32, int g,     \
                                 int radix4, double norm) {                                                            \
        const moss_dequant::W4a8Codes<BUG> code{codes, s_rel, levels, k, bits, group, srel_f32};                       \
        moss_dequant::rot_impl<0>(out, code, scales, rows, k, g, radix4, norm);                                         \
    }                                                                                                                   \
    MOSS_KERNEL void NAME##_f32(float* out, const unsigned char* codes, const float* scales, const unsigned char* s_rel, \
                                const float* levels, long rows, long k, int bits, int group, int srel_f32, int g,      \
                                int radix4, double norm) {                                                             \
        const moss_dequant::W4a8Codes<BUG> code{codes, s_rel, levels, k, bits, group, srel_f32};                       \
        moss_dequant::rot_impl<0>(out, code, scales, rows, k, g, radix4, norm);                                         \
    }
MOSS_PRODUCTION(MOSS_DEQUANT_W4A8(moss_dequant_w4a8, 0))
MOSS_CONTROL(MOSS_DEQUANT_W4A8(moss_ctl_dequant_w4a8, 2))
