// The gated full-attention layer's small ops on the joined projection y = x · [q_proj | k_proj |
// v_proj]ᵀ (host side crates/moss-cuda/src/encoder/attention_qkv_gate.rs; EncoderOps::attn_qkv_norm_rope and
// causal_attention_gated_y): y row t holds the H query heads (each hd query values then hd gate
// values: q_proj's layout), then the Hkv k heads, then the Hkv v heads. Activations bf16 or f32
// (T), fp32 inside, one rounding into the output. moss_ctl_enc_* are the same code with a planted bug.
#include "elem.cuh"
#include "launch.h"
#include "rope.cuh"

namespace moss_enca {
using namespace moss_elem;
using namespace moss_rope;

constexpr int QK_WARPS = ENC_QK_WARPS;     // rows (one warp each) per 256-thread block
constexpr int QK_MAXHD = ENC_QK_MAXHD;   // 8 columns a lane

// ---- q and k: per-head zero-centred RMSNorm + partial rotate-half RoPE, read in place out of y;
// v copied. One warp per (token, slot), slots 0..H-1 the q heads, H..H+Hkv-1 the k heads, then the
// Hkv v heads; lane l owns columns 8l..8l+7 (hd % 8 == 0, hd <= 256). The inverse frequencies are
// made in the block as the CPU twin makes them: e = f32(2i) / f32(rot) (IEEE), f32(theta^e) from an
// fp64 pow, then an IEEE f32 reciprocal; angle = f32(t) · inv. The row through shared memory for the
// rotate-half partner. BUG 1: position t + 1.
// TAB (qkrope_t, the default): the sines and cosines come from a table [L, rot/2] of (cos, sin)
// made once per call by rope_tab (the same inverse frequencies, angles and sincosf, so the output
// is bit-identical to the in-kernel version): without it, qkrope is issue-bound on the 8 divergent
// sincosf a lane (ncu at L = 4096: 74.9 us, 79 % issue slots busy, 1.08 TB/s). BUG 1 lives in
// rope_tab for TAB. ------------------------------------------------------------------------------
// One (token, slot) row of a warp; `inv` the block's inverse frequencies (inline) or `tab` the
// table (TAB), `buf` the warp's shared scratch.
template <typename T, int BUG, bool TAB>
__device__ __forceinline__ void qkrope_row(long row, T* qo, T* ko, T* vo, const T* y, const T* wq, const T* wk,
                                           int nh, int nkv, int hd, long ld, long qhs, long koff, long voff,
                                           float eps, int rot, const float* inv, const float2* tab, float* buf) {
    const int lane = threadIdx.x & 31;
    const int half = rot / 2;
    const int slots = nh + 2 * nkv;
    const long t = row / slots;
    const int s = (int)(row - t * slots);
    const int c = lane * 8;
    const bool act = c < hd;
    float v[8];
    if (s >= nh + nkv) {  // a v head: copy
        const int h = s - nh - nkv;
        if (act) {
            ld8(y, t * ld + voff + (long)h * hd + c, v);
            st8(vo, (t * nkv + h) * hd + c, v);
        }
        return;
    }
    const bool isq = s < nh;
    const int h = isq ? s : s - nh;
    const long src = t * ld + (isq ? (long)h * qhs : koff + (long)h * hd);
    T* dst = isq ? qo + (t * nh + h) * hd : ko + (t * nkv + h) * hd;
    float w[8];
    float ss = 0.f;
    if (act) {
        ld8(y, src + c, v);
        ld8(isq ? wq : wk, c, w);
#pragma unroll
        for (int e = 0; e < 8; e++) ss += v[e] * v[e];
    }
    const float r = rms_inv(warp_sum(ss), hd, eps);
    if (act) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            v[e] = MOSS_NORMED(v[e], r, 1.f + w[e]);
            buf[c + e] = v[e];
        }
    }
    const float pos = (float)(t + BUG);
    __syncwarp();
    if (act && c < rot) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int i = c + e;
            if (i < rot) {
                const bool lo = i < half;
                const int m = lo ? i : i - half;
                const float p = buf[lo ? i + half : i - half];
                float sn, cs;
                if constexpr (TAB) {
                    const float2 a = tab[t * half + m];
                    cs = a.x;
                    sn = a.y;
                } else {
                    sincosf(pos * inv[m], &sn, &cs);
                }
                v[e] = lo ? MOSS_ROPE_FIRST(v[e], p, cs, sn) : MOSS_ROPE_SECOND(v[e], p, cs, sn);
            }
        }
    }
    if (act) st8(dst, c, v);
    __syncwarp();  // the scratch is rewritten by the warp's next row
}

// The inverse frequencies as the CPU twin makes them, into inv[0, rot/2) (a block's threads).
__device__ __forceinline__ void rope_inv(float* inv, int rot, double theta) {
    for (int i = threadIdx.x; i < rot / 2; i += blockDim.x) {
        const float e = __fdiv_rn((float)(2 * i), (float)rot);
        inv[i] = __fdiv_rn(1.f, (float)pow(theta, (double)e));
    }
    __syncthreads();
}

// qkrope: a row per warp (grid = rows / 8); inline: the block's inverse frequencies first.
template <typename T, int BUG, bool TAB>
__device__ void qkrope_impl(T* qo, T* ko, T* vo, const T* y, const T* wq, const T* wk, long L, int nh, int nkv,
                            int hd, long ld, long qhs, long koff, long voff, float eps, int rot, double theta,
                            const float2* tab) {
    __shared__ float inv[TAB ? 1 : QK_MAXHD / 2];
    __shared__ float rowbuf[QK_WARPS][QK_MAXHD];
    if constexpr (!TAB) rope_inv(inv, rot, theta);
    const int warp = threadIdx.x >> 5;
    const long rows = L * (nh + 2 * nkv);
    const long row = (long)blockIdx.x * QK_WARPS + warp;
    if (row < rows)
        qkrope_row<T, BUG, TAB>(row, qo, ko, vo, y, wq, wk, nh, nkv, hd, ld, qhs, koff, voff, eps, rot, inv, tab,
                                rowbuf[warp]);
}

// rope_tab: tab[t, m] = (cos, sin)(f32(t + BUG) · inv[m]) for t < L, m < rot/2 (grid-stride).
template <int BUG>
__device__ void rope_tab_impl(float2* tab, long L, int rot, double theta) {
    __shared__ float inv[QK_MAXHD / 2];
    rope_inv(inv, rot, theta);
    const int half = rot / 2;
    const long n = L * half;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long t = i / half;
        const int m = (int)(i - t * half);
        float sn, cs;
        sincosf((float)(t + BUG) * inv[m], &sn, &cs);
        tab[i] = make_float2(cs, sn);
    }
}

// ---- the attention's output gate with the gate read in place out of y:
// out[t, h·hd + c] = o[t, h·hd + c] · sigmoid(gate[t·ldt + h·ghs + c]) (hd, ldt, ghs multiples of 8;
// gate = y + the first gate column). BUG 1: the gate of head h + 1 (mod H). -------------------------
template <typename T, int BUG>
__device__ void gmulh_impl(T* out, const T* o, const T* gate, long L, int nh, int hd, long ldt, long ghs) {
    const int d8 = hd / 8;
    const long n = L * nh * d8;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long r = i / d8;  // (t, h)
        const int c = (int)(i - r * d8) * 8;
        const long t = r / nh;
        const int h = (int)(r - t * nh);
        const int hg = BUG == 1 ? (h + 1) % nh : h;
        float a[8], b[8];
        ld8(o, r * hd + c, a);
        ld8(gate, t * ldt + (long)hg * ghs + c, b);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] *= 1.f / (1.f + expf(-b[e]));
        st8(out, r * hd + c, a);
    }
}
}  // namespace moss_enca

#define MOSS_ENC_ATTN_OPS(PFX, BUG, T, SX)                                                                      \
    MOSS_KERNEL void PFX##_gmulh_##SX(T* out, const T* o, const T* gate, long L, int nh, int hd, long ldt,        \
                                      long ghs) {                                                               \
        moss_enca::gmulh_impl<T, BUG>(out, o, gate, L, nh, hd, ldt, ghs);                                       \
    }

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_enc_rope_tab(float2* tab, long L, int rot, long theta_bits) {
    moss_enca::rope_tab_impl<0>(tab, L, rot, __longlong_as_double(theta_bits));
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_enc_rope_tab(float2* tab, long L, int rot, long theta_bits) {
    moss_enca::rope_tab_impl<1>(tab, L, rot, __longlong_as_double(theta_bits));
}
#endif
// qkrope_t: qkrope reading the (cos, sin) table of rope_tab; no control of its own (the planted
// position bug is moss_ctl_enc_rope_tab's).
#define MOSS_ENC_QKROPE_T(T, SX)                                                                                \
    MOSS_KERNEL void __launch_bounds__(ENC_QK_WARPS * 32) moss_enc_qkrope_t_##SX(T* qo, T* ko, T* vo, const T* y, const T* wq, \
                                                                   const T* wk, long L, int nh, int nkv, int hd, \
                                                                   long ld, long qhs, long koff, long voff,     \
                                                                   float eps, int rot, const float2* tab) {     \
        moss_enca::qkrope_impl<T, 0, true>(qo, ko, vo, y, wq, wk, L, nh, nkv, hd, ld, qhs, koff, voff, eps, rot,  \
                                           0.0, tab);                                                            \
    }
MOSS_PRODUCTION(MOSS_ENC_QKROPE_T(__nv_bfloat16, bf16))
MOSS_PRODUCTION(MOSS_ENC_QKROPE_T(float, f32))
MOSS_PRODUCTION(MOSS_ENC_ATTN_OPS(moss_enc, 0, __nv_bfloat16, bf16))
MOSS_PRODUCTION(MOSS_ENC_ATTN_OPS(moss_enc, 0, float, f32))
MOSS_CONTROL(MOSS_ENC_ATTN_OPS(moss_ctl_enc, 1, __nv_bfloat16, bf16))
MOSS_CONTROL(MOSS_ENC_ATTN_OPS(moss_ctl_enc, 1, float, f32))
