// The encoder's causal depthwise conv1d + SiLU (EncoderOps::causal_conv1d_silu), bf16, K <= 4
// taps, C % 8 == 0, with register reuse along time (host side src/backend/cuda/encoder.rs
// `causal_conv1d_silu_with`, MOSS_ENC_CONV=t8): a thread computes 8 channels x TT consecutive
// tokens, loads its 8 x K taps once and the TT + K - 1 input rows once (16-byte loads; the
// grid-stride conv8 kernel of cuda/encoder.cu loads K rows and K tap vectors per output vector).
// Same arithmetic and order as conv8: acc = Σ_j w[j]·x[t-(K-1)+j] in fp32 from j = 0 (rows
// before 0 skipped), SiLU, one rounding. Taps transposed, wt [K, C] f32.
// BUG 1 (moss_ctl_enc_conv8t_bf16): taps reversed.
#include "elem.cuh"

namespace moss_encconv {
using namespace moss_elem;
constexpr int TT = 8;    // tokens per thread
constexpr int KMAX = 4;  // taps

__device__ __forceinline__ float silu_c(float x) { return x / (1.f + expf(-x)); }

template <int BUG>
__device__ void conv8t_impl(__nv_bfloat16* out, const __nv_bfloat16* x, const float* wt, long L, int C, int K) {
    const int c8 = C / 8;
    const long gid = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long tb = gid / c8;
    const int c = (int)(gid - tb * c8) * 8;
    const long t0 = tb * TT;
    if (t0 >= L) return;
    // w[jj] is tap jj - (KMAX - K) (jj >= KMAX - K), applied to token t - (KMAX-1) + jj: static
    // register indices below
    float w[KMAX][8];
#pragma unroll
    for (int jj = 0; jj < KMAX; jj++) {
        const int j = jj - (KMAX - K);
        const int tap = BUG == 1 ? K - 1 - j : j;
        if (j >= 0) {
            ld8(wt, (long)tap * C + c, w[jj]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) w[jj][e] = 0.f;
        }
    }
    // rows t0 - (K-1) .. t0 + TT - 1 as raw 16-byte vectors; row r of xr is token t0 - (KMAX-1) + r
    uint4 xr[TT + KMAX - 1];
#pragma unroll
    for (int r = 0; r < TT + KMAX - 1; r++) {
        const long s = t0 - (KMAX - 1) + r;
        xr[r] = make_uint4(0, 0, 0, 0);
        if (s >= 0 && s < L && s >= t0 - (K - 1)) xr[r] = *reinterpret_cast<const uint4*>(x + s * C + c);
    }
#pragma unroll
    for (int i = 0; i < TT; i++) {
        const long t = t0 + i;
        if (t >= L) break;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int jj = 0; jj < KMAX; jj++) {
            // tap j = jj - (KMAX - K) on token s = t - (K-1) + j = t - (KMAX-1) + jj = xr[i + jj]
            if (jj < KMAX - K || t - (KMAX - 1) + jj < 0) continue;
            const uint4 raw = xr[i + jj];
            const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(b2[e]);
                acc[2 * e] += w[jj][2 * e] * f.x;
                acc[2 * e + 1] += w[jj][2 * e + 1] * f.y;
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = silu_c(acc[e]);
        st8(out, t * C + c, acc);
    }
}
}  // namespace moss_encconv

MOSS_KERNEL void __launch_bounds__(256) moss_enc_conv8t_bf16(__nv_bfloat16* out, const __nv_bfloat16* x, const float* wt,
                                                             long L, int C, int K) {
    moss_encconv::conv8t_impl<0>(out, x, wt, L, C, K);
}
MOSS_KERNEL void __launch_bounds__(256) moss_ctl_enc_conv8t_bf16(__nv_bfloat16* out, const __nv_bfloat16* x,
                                                                 const float* wt, long L, int C, int K) {
    moss_encconv::conv8t_impl<1>(out, x, wt, L, C, K);
}
