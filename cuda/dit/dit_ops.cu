// The DiT's fused ops (crates/moss-core/src/backend/ops/dit.rs, CUDA side in crates/moss-cuda/src/dit/mod.rs): the
// norm + modulation, QK-norm + RoPE, SiTU-GLU, gated residual and the attention softmax. fp32
// inside, one rounding into the output. moss_ctl_* are the same code with a planted bug.
#include "elem.cuh"
#include "fp8.cuh"
#include "launch.h"
#include "rope.cuh"
#include "situ.cuh"

using bf16 = __nv_bfloat16;
using namespace moss_elem;
using namespace moss_fp8;
using namespace moss_rope;

// The norm and modulation of 8 values from i of a row whose rsqrt(mean(x²)+eps) is inv:
// v = x·inv·w·(one + scale) + shift (one is 1, or 0 in a planted control).
template <typename TX, typename TV>
__device__ __forceinline__ void modulate8(const TX* __restrict__ xr, const TV* __restrict__ w, const TV* __restrict__ shift,
                                          const TV* __restrict__ scale, int i, float inv, float one, float* v) {
    float g[8], sh[8], sc[8];
    ld8(xr, i, v);
    ld8(w, i, g);
    ld8(shift, i, sh);
    ld8(scale, i, sc);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = v[k] * inv * g[k] * (one + sc[k]) + sh[k];
}

// ---- rms_norm + modulate: y = x·rsqrt(mean(x²)+eps)·w·(1+scale) + shift, one warp a row -------
// Written as TY, or (FP8, `--precision fp8`) quantized per row (fp8.cuh: codes q, scales qs) from
// the values rounded to TY: what moss_quantize_fp8 makes of the TY output. The row's values are
// computed twice by the same code (for the amax, then for the codes); x stays in L1 between.
// TY is x's type, or bf16 for an f32 x (the residual stream is f32 at every precision; the
// normed activation is bf16 at bf16: kernels `..._f32_bf16_to_bf16`).
// BUG 1: the modulation forgets the 1 (y·scale + shift). BUG 2 (FP8): each lane scales its codes
// by its own amax (no warp reduction).
template <typename TY, typename TX, typename TV, int BUG, bool FP8>
__device__ void rms_mod_impl(TY* __restrict__ out, unsigned char* __restrict__ q, float* __restrict__ qs,
                             const TX* __restrict__ x, const TV* __restrict__ w, const TV* __restrict__ shift,
                             const TV* __restrict__ scale, long rows, int d, float eps, float e4m3_max,
                             float min_amax) {
    int lane = threadIdx.x & 31;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const TX* xr = x + row * d;
    TY* orow = FP8 ? nullptr : out + row * d;
    const TY* tag = nullptr;  // the output's type: what the FP8 codes are quantized from
    unsigned char* qrow = FP8 ? q + row * d : nullptr;
    const float one = BUG == 1 ? 0.f : 1.f;
    float ss = 0.f;
    if ((d & 7) == 0) {
        for (int i = lane * 8; i < d; i += 256) {
            float v[8];
            ld8(xr, i, v);
#pragma unroll
            for (int k = 0; k < 8; k++) ss += v[k] * v[k];
        }
        float inv = rsqrtf(warp_sum(ss) / (float)d + eps);
        auto y8 = [&](int i, float* v) { modulate8(xr, w, shift, scale, i, inv, one, v); };
        if (!FP8) {
            for (int i = lane * 8; i < d; i += 256) {
                float v[8];
                y8(i, v);
                st8(orow, i, v);
            }
        } else {
            warp_row_to_e4m3_8<BUG == 2 ? 2 : 0>(y8, tag, d, lane, qrow, qs + row, e4m3_max, min_amax);
        }
    } else {
        for (int i = lane; i < d; i += 32) {
            float v = ld(xr, i);
            ss += v * v;
        }
        float inv = rsqrtf(warp_sum(ss) / (float)d + eps);
        auto y1 = [&](int i) { return ld(xr, i) * inv * ld(w, i) * (one + ld(scale, i)) + ld(shift, i); };
        if (!FP8) {
            for (int i = lane; i < d; i += 32) st(orow, i, y1(i));
        } else {
            warp_row_to_e4m3_1<BUG == 2 ? 2 : 0>(y1, tag, d, lane, qrow, qs + row, e4m3_max, min_amax);
        }
    }
}
#define MOSS_RMS_MOD(NAME, BUG, TY, TX, TV)                                                          \
    MOSS_KERNEL void NAME(TY* out, const TX* x, const TV* w, const TV* shift, const TV* scale, long rows, int d, \
                          float eps) {                                                                   \
        rms_mod_impl<TY, TX, TV, BUG, false>(out, nullptr, nullptr, x, w, shift, scale, rows, d, eps, 0.f, 0.f); \
    }
MOSS_PRODUCTION(MOSS_EACH_STREAM_NORM(MOSS_RMS_MOD, moss_rms_mod, 0))
MOSS_CONTROL(MOSS_EACH_STREAM_NORM(MOSS_RMS_MOD, moss_ctl_rms_mod, 1))
#define MOSS_RMS_MOD_FP8(NAME, BUG, TY, TX, TV)                                                        \
    MOSS_KERNEL void NAME(unsigned char* q, float* qs, const TX* x, const TV* w, const TV* shift, const TV* scale, \
                          long rows, int d, float eps, float e4m3_max, float min_amax) {                     \
        rms_mod_impl<TY, TX, TV, BUG, true>(nullptr, q, qs, x, w, shift, scale, rows, d, eps, e4m3_max, min_amax); \
    }
MOSS_PRODUCTION(MOSS_EACH_STREAM_NORM(MOSS_RMS_MOD_FP8, moss_rms_mod_fp8, 0))
MOSS_CONTROL(MOSS_EACH_STREAM_NORM(MOSS_RMS_MOD_FP8, moss_ctl_rms_mod_fp8, 2))

// ---- per-head QK-norm + rotate-half RoPE, one warp per (token, head) row of hd ------------------
// y = x·rsqrt(mean(x²)+eps)·w; out[m] = y[m]c − y[m+h]s, out[m+h] = y[m+h]c + y[m]s, h = hd/2,
// c, s = cos, sin[token, m]. BUG 1: rotates the other way (the sign of s flipped).
template <typename TX, typename TV, int BUG>
__device__ void qk_rope_impl(TX* __restrict__ out, const TX* __restrict__ x, const TV* __restrict__ w,
                             const TV* __restrict__ cs, const TV* __restrict__ sn, long rows, int heads,
                             int hd, float eps) {
    int lane = threadIdx.x & 31;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long tok = row / heads;
    int half = hd / 2;
    const TX* xr = x + row * hd;
    TX* orow = out + row * hd;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32) {
        float v = ld(xr, i);
        ss += v * v;
    }
    float inv = rms_inv(warp_sum(ss), hd, eps);
    const float sgn = BUG == 1 ? -1.f : 1.f;
    for (int m = lane; m < half; m += 32) {
        float a = MOSS_NORMED(ld(xr, m), inv, ld(w, m));
        float b = MOSS_NORMED(ld(xr, m + half), inv, ld(w, m + half));
        float c = ld(cs, tok * half + m), s = sgn * ld(sn, tok * half + m);
        st(orow, m, MOSS_ROPE_FIRST(a, b, c, s));
        st(orow, m + half, MOSS_ROPE_SECOND(b, a, c, s));
    }
}
#define MOSS_QK_ROPE(NAME, BUG, TX, SX, TV, SV)                                                         \
    MOSS_KERNEL void NAME##_##SX##_##SV(TX* out, const TX* x, const TV* w, const TV* cs, const TV* sn,   \
                                        long rows, int heads, int hd, float eps) {                      \
        qk_rope_impl<TX, TV, BUG>(out, x, w, cs, sn, rows, heads, hd, eps);                             \
    }
#define MOSS_QK_ROPE4(NAME, BUG) MOSS_EACH_TX_TV(MOSS_QK_ROPE, NAME, BUG)
MOSS_PRODUCTION(MOSS_QK_ROPE4(moss_qk_rope, 0))
MOSS_CONTROL(MOSS_QK_ROPE4(moss_ctl_qk_rope, 1))

// ---- QK-norm + RoPE on the q and k parts of a packed projection, in place ------------------------
// qkv [n, 3·H·hd] = [q | k | v]; the q and k heads are normed and rotated as qk_rope_impl does,
// v is not touched. Each thread takes 8 elements of each half of a head (16-byte loads of x, the
// weight and the cos/sin row), so tpr = hd/16 threads own one (token, part, head) row (tpr a power
// of two ≤ 32: hd ∈ {16, .., 512}; the host checks) and reduce its sum of squares by shuffles.
// BUG 1: the k heads normed with the q weight.
template <typename TX, typename TV, int BUG>
__device__ void qkv_rope_impl(TX* __restrict__ qkv, const TV* __restrict__ wq, const TV* __restrict__ wk,
                              const TV* __restrict__ cs, const TV* __restrict__ sn, long n, int heads, int hd,
                              float eps) {
    const int half = hd >> 1, tpr = half >> 3;
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long g = t / tpr;  // (token, part, head); a group never straddles a warp (tpr divides 32)
    if (g >= n * 2 * heads) return;  // whole groups leave together
    const int m0 = (int)(t - g * tpr) * 8;
    const unsigned lane = threadIdx.x & 31;
    const unsigned mask = tpr == 32 ? 0xffffffffu : (((1u << tpr) - 1u) << (lane & ~(unsigned)(tpr - 1)));
    long tok = g / (2 * heads);
    int ph = (int)(g - tok * 2 * heads);  // part·heads + head
    TX* row = qkv + tok * 3L * heads * hd + (long)ph * hd;
    const TV* w = (ph < heads || BUG == 1) ? wq : wk;
    float a[8], b[8];
    ld8(row, m0, a);
    ld8(row, half + m0, b);
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) ss += a[k] * a[k] + b[k] * b[k];
    for (int o = tpr >> 1; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o);
    float inv = rms_inv(ss, hd, eps);
    float wa[8], wb[8], c[8], s[8];
    ld8(w, m0, wa);
    ld8(w, half + m0, wb);
    ld8(cs, tok * half + m0, c);
    ld8(sn, tok * half + m0, s);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        MOSS_NORM_ROPE_PAIR(a[k], b[k], wa[k], wb[k], inv, c[k], s[k], a[k], b[k]);
    }
    st8(row, m0, a);
    st8(row, half + m0, b);
}
#define MOSS_QKV_ROPE(NAME, BUG, TX, SX, TV, SV)                                                       \
    MOSS_KERNEL void NAME##_##SX##_##SV(TX* qkv, const TV* wq, const TV* wk, const TV* cs, const TV* sn, \
                                        long n, int heads, int hd, float eps) {                        \
        qkv_rope_impl<TX, TV, BUG>(qkv, wq, wk, cs, sn, n, heads, hd, eps);                            \
    }
#define MOSS_QKV_ROPE4(NAME, BUG) MOSS_EACH_TX_TV(MOSS_QKV_ROPE, NAME, BUG)
MOSS_PRODUCTION(MOSS_QKV_ROPE4(moss_qkv_rope, 0))
MOSS_CONTROL(MOSS_QKV_ROPE4(moss_ctl_qkv_rope, 1))

// ---- gated residual fused with the next rms_norm + modulate, one block a row --------------------
// xo = x + y·gate (rounded to TX, as moss_gres writes it); no = rms_mod(xo) computed from the
// rounded xo, as moss_rms_mod would read it, written as TY; or (FP8) no quantized per row as
// rms_mod_impl's FP8 form does (codes q, scales qs). TY (y and the normed output) is x's type, or
// bf16 for an f32 stream x (kernels `..._f32_bf16_to_bf16`). The row stays in registers between
// the residual, the norm's sum of squares and the codes' amax: one read of x, y and gate and one
// write of xo and the output, the block's partial sums in shared memory. Thread t holds the 8
// values from 8t (~48 registers); the host launches ⌈d/8⌉ threads rounded up to a warp and checks
// d ≤ 8·DIT_ROW_THREADS. BUG 1: the norm taken of the old x. BUG 2 (FP8): the codes rounded toward zero.
template <typename T>
__device__ __forceinline__ void ld8_row(const T* p, long i, int d, float* v) {
    if ((d & 7) == 0) {
        ld8(p, i, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = i + k < d ? ld(p, i + k) : 0.f;
    }
}
template <typename T>
__device__ __forceinline__ void st8_row(T* p, long i, int d, const float* v) {
    if ((d & 7) == 0) {
        st8(p, i, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i + k < d) st(p, i + k, v[k]);
    }
}
template <typename TY, typename TX, typename TV, int BUG, bool FP8>
__device__ void gres_rms_mod_impl(TX* __restrict__ xo, TY* __restrict__ no, unsigned char* __restrict__ q,
                                  float* __restrict__ qs, const TX* __restrict__ x, const TY* __restrict__ y,
                                  const TV* __restrict__ gate, const TV* __restrict__ w,
                                  const TV* __restrict__ shift, const TV* __restrict__ scale, long rows, int d,
                                  float eps, float e4m3_max, float min_amax) {
    __shared__ float part_ss[32], part_max[32];
    const long row = blockIdx.x;
    if (row >= rows) return;  // the whole block
    const long base = row * d, i = threadIdx.x * 8L;
    const bool mine = i < d;
    const TY* tag = nullptr;  // the normed output's type: what the FP8 codes are quantized from
    float v[8] = {};          // the residual's values the norm reads, then the normed ones
    float ss = 0.f;
    if (mine) {
        float a[8], b[8], g[8];
        ld8_row(x + base, i, d, a);
        ld8_row(y + base, i, d, b);
        ld8_row(gate, i, d, g);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float old = a[k];
            a[k] = round_as(a[k] + b[k] * g[k], xo);
            v[k] = BUG == 1 ? old : a[k];
            ss += v[k] * v[k];
        }
        st8_row(xo + base, i, d, a);
    }
    const float inv = rsqrtf(block_reduce<true>(ss, part_ss) / (float)d + eps);
    float m = 0.f;
    if (mine) {
        float g[8], sh[8], sc[8];
        ld8_row(w, i, d, g);
        ld8_row(shift, i, d, sh);
        ld8_row(scale, i, d, sc);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            v[k] = round_as(v[k] * inv * g[k] * (1.f + sc[k]) + sh[k], tag);
            m = fmaxf(m, i + k < d ? fabsf(v[k]) : 0.f);
        }
        if (!FP8) st8_row(no + base, i, d, v);
    }
    if (!FP8) return;
    const float s = e4m3_scale(block_reduce<false>(m, part_max), e4m3_max, min_amax);
    if (threadIdx.x == 0) qs[row] = s;
    if (!mine) return;
    if ((d & 7) == 0) {
        st8_e4m3<BUG == 2 ? 1 : 0>(q + base + i, v, s);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i + k < d) q[base + i + k] = to_e4m3<BUG == 2 ? 1 : 0>(__fdiv_rn(v[k], s));
    }
}
#define MOSS_GRES_MOD(NAME, BUG, TY, TX, TV)                                                            \
    MOSS_KERNEL void __launch_bounds__(DIT_ROW_THREADS) NAME(TX* xo, TY* no, const TX* x, const TY* y, const TV* gate, const TV* w, const TV* shift, \
                          const TV* scale, long rows, int d, float eps) {                                  \
        gres_rms_mod_impl<TY, TX, TV, BUG, false>(xo, no, nullptr, nullptr, x, y, gate, w, shift, scale, rows, d, eps, 0.f, 0.f); \
    }
MOSS_PRODUCTION(MOSS_EACH_STREAM_NORM(MOSS_GRES_MOD, moss_gres_mod, 0))
MOSS_CONTROL(MOSS_EACH_STREAM_NORM(MOSS_GRES_MOD, moss_ctl_gres_mod, 1))
#define MOSS_GRES_MOD_FP8(NAME, BUG, TY, TX, TV)                                                        \
    MOSS_KERNEL void __launch_bounds__(DIT_ROW_THREADS) NAME(TX* xo, unsigned char* q, float* qs, const TX* x, const TY* y, const TV* gate, const TV* w, \
                          const TV* shift, const TV* scale, long rows, int d, float eps, float e4m3_max,      \
                          float min_amax) {                                                                  \
        gres_rms_mod_impl<TY, TX, TV, BUG, true>(xo, nullptr, q, qs, x, y, gate, w, shift, scale, rows, d, eps, \
                                                 e4m3_max, min_amax);                                        \
    }
MOSS_PRODUCTION(MOSS_EACH_STREAM_NORM(MOSS_GRES_MOD_FP8, moss_gres_mod_fp8, 0))
MOSS_CONTROL(MOSS_EACH_STREAM_NORM(MOSS_GRES_MOD_FP8, moss_ctl_gres_mod_fp8, 2))

// ---- SiTU-GLU: x [rows, 2F] = [up | gate] → (4·tanh(g/4)·σ(g)) · (25·tanh(h/25)) [rows, F] ------
// BUG 1: the halves swapped (gate read as up).
template <typename T, int BUG, bool FAST = false>
__device__ void situ_impl(T* __restrict__ out, const T* __restrict__ x, long rows, long f) {
    long stride = (long)gridDim.x * blockDim.x;
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((f & 7) == 0) {
        long per = f / 8;
        for (long c = t; c < rows * per; c += stride) {
            long r = c / per, i = (c - r * per) * 8;
            float h[8], g[8];
            ld8(x, r * 2 * f + i, h);
            ld8(x, r * 2 * f + f + i, g);
#pragma unroll
            for (int k = 0; k < 8; k++) h[k] = FAST ? situ_fast<BUG>(h[k], g[k]) : situ<BUG>(h[k], g[k]);
            st8(out, r * f + i, h);
        }
    } else {
        for (long c = t; c < rows * f; c += stride) {
            long r = c / f, i = c - r * f;
            float hv = ld(x, r * 2 * f + i), gv = ld(x, r * 2 * f + f + i);
            st(out, c, FAST ? situ_fast<BUG>(hv, gv) : situ<BUG>(hv, gv));
        }
    }
}
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_situ_f32(float* out, const float* x, long rows, long f) { situ_impl<float, 0>(out, x, rows, f); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_situ_f32(float* out, const float* x, long rows, long f) { situ_impl<float, 1>(out, x, rows, f); }
#endif
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_situ_fast_bf16(bf16* out, const bf16* x, long rows, long f) { situ_impl<bf16, 0, true>(out, x, rows, f); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_situ_fast_bf16(bf16* out, const bf16* x, long rows, long f) { situ_impl<bf16, 1, true>(out, x, rows, f); }
#endif

// ---- gated residual: out = x + y·gate[i mod d] (x, y of one type) ------------------------------
// BUG 1: the gate applied as 1 + gate.
template <typename TX, typename TG, int BUG>
__device__ void gres_impl(TX* __restrict__ out, const TX* __restrict__ x, const TX* __restrict__ y,
                          const TG* __restrict__ gate, long n, long d) {
    long stride = (long)gridDim.x * blockDim.x;
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const float one = BUG == 1 ? 1.f : 0.f;
    if ((d & 7) == 0) {
        for (long c = t; c < n / 8; c += stride) {
            long i = c * 8;
            float a[8], b[8], g[8];
            ld8(x, i, a);
            ld8(y, i, b);
            ld8(gate, i % d, g);
#pragma unroll
            for (int k = 0; k < 8; k++) a[k] = a[k] + b[k] * (one + g[k]);
            st8(out, i, a);
        }
    } else {
        for (long i = t; i < n; i += stride) st(out, i, ld(x, i) + ld(y, i) * (one + ld(gate, i % d)));
    }
}
#define MOSS_GRES(NAME, BUG, TX, SX, TG, SG)                                                           \
    MOSS_KERNEL void NAME##_##SX##_##SG(TX* out, const TX* x, const TX* y, const TG* g, long n, long d) { \
        gres_impl<TX, TG, BUG>(out, x, y, g, n, d);                                                    \
    }
#define MOSS_GRES4(NAME, BUG) MOSS_EACH_TX_TV(MOSS_GRES, NAME, BUG)
MOSS_PRODUCTION(MOSS_GRES4(moss_gres, 0))
MOSS_CONTROL(MOSS_GRES4(moss_ctl_gres, 1))

// ---- attention softmax: one block per row of n fp32 scores (already scaled) → p in TP --------
// p = exp(s − max) / Σ exp(s − max), fp32. BUG 1: the normaliser leaves out the row's last
// 64 scores.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = sh[0];
    for (int i = 1; i < nw; i++) r = is_max ? fmaxf(r, sh[i]) : r + sh[i];
    return r;
}
template <typename TP, int BUG>
__device__ void softmax_impl(TP* __restrict__ p, const float* __restrict__ s, long n) {
    __shared__ float sh[32];
    const float* sr = s + blockIdx.x * n;
    TP* pr = p + blockIdx.x * n;
    float m = -INFINITY;
    for (long j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, sr[j]);
    m = block_reduce(m, true, sh);
    long lim = BUG == 1 ? n - 64 : n;
    float sum = 0.f;
    for (long j = threadIdx.x; j < lim; j += blockDim.x) sum += expf(sr[j] - m);
    sum = block_reduce(sum, false, sh);
    float inv = 1.f / sum;
    for (long j = threadIdx.x; j < n; j += blockDim.x) st(pr, j, expf(sr[j] - m) * inv);
}
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_softmax_bf16(bf16* p, const float* s, long n) { softmax_impl<bf16, 0>(p, s, n); }
#endif
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_softmax_f32(float* p, const float* s, long n) { softmax_impl<float, 0>(p, s, n); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_softmax_bf16(bf16* p, const float* s, long n) { softmax_impl<bf16, 1>(p, s, n); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_softmax_f32(float* p, const float* s, long n) { softmax_impl<float, 1>(p, s, n); }
#endif
