// The DiT's packed q|k|v projection with per-head RMSNorm and RoPE of q and k on the way out, on
// Hopper (sm_90a only): out = qkv_norm_rope(bf16(x · Wᵀ)) for x [M, K] bf16, W [3D, K] bf16
// (rows [q ; k ; v], D = heads · 128), out [M, 3D] bf16: what moss_qkv_rope (dit_ops.cu) does to
// the product cuBLASLt stores, without the product's round trip through memory. The product is
// rounded to bf16 in registers exactly as the unfused path stores it; the norm and the rotation
// run in fp32 from those values and round once, as moss_qkv_rope does:
//   y = a · rsqrt(mean_head(a²) + eps) · w   (w = wq on q, wk on k),
//   out[m] = y[m]·cos[r, m] − y[m + 64]·sin[r, m], out[m + 64] = y[m + 64]·cos[r, m] + y[m]·sin[r, m].
//
// The GEMM is sm90a/gemm_tile.cuh's. A tile's 256 product columns are two whole heads
// (W rows 2·n0 .. 2·n0 + 255): D % 256 == 0, so a tile is all q, all k or all v. In the accumulator
// a row's 128 columns of one head are spread over the 4 threads of a quad (columns 8i + 2t + e,
// i < 16 within the head): the sum of squares is reduced with __shfl_xor 1, 2; columns m and m + 64
// are in the same thread (groups i and i + 8). Each head is staged (rows of 128 bf16, 16-byte
// chunks XOR-swizzled by row) and stored with 16-byte coalesced stores, one head after the other
// in the 128 x 128 staging the SiTU kernel uses; v heads are stored as rounded.
//
// Arguments: CUtensorMaps of x ({K, M}) and W ({K, 3D}) (bf16, box {64, 128}, SWIZZLE_128B), out
// (row stride 3D), wq, wk [128] bf16, cos, sin [M, 64] bf16, M, D, K, eps.
// Launch: 1-D grid of min(SMs, ⌈M/128⌉ · 3D/256) blocks, DIT_SITU_GEMM_THREADS threads,
// DIT_SITU_GEMM_SMEM bytes of dynamic shared memory. Requires D % 256 == 0, K % 64 == 0 (the host
// checks). BUG 1 (check image): k normed with q's weight; BUG 2: the rotation's sign flipped.
// The e4m3 form (`moss_dit_linear_qkv_norm_rope_fp8`, `--precision fp8`): x and W are e4m3 codes
// with f32 row scales xs [M], ws [3D] (maps of bytes, box {128, 128}; K % 128 == 0), the products
// scaled by both before the bf16 rounding; the rest as above.
//
// OPERANDS (`moss_dit_linear_qkv_attention_fp8`): the e4m3 form writing the e4m3 attention's
// operands (cuda/dit/attention_fp8_operands.cu's layout and arithmetic: q and k codes of the
// bf16-rounded results over the QK-norm's fixed scales, V^T codes over a scale a (head, 128-token
// tile)) instead of the bf16 projection: moss_dit_attention_fp8_operands's pass folded into the
// product. A tile's 128 rows are one token tile: its two consumer warpgroups take the V tile's
// amax together (a 256-thread named barrier, 3), then each stages its 64 tokens of V^T ([128
// channels][64 bytes], in the A-fragment key order) and stores them. Arguments: as the e4m3 form,
// with q8, k8, vt8, scales for out, and √128, e4m3_max, min_amax. BUG 3 (check image): V^T in
// plain token order.
#include "sm90a/gemm_tile.cuh"
#include "fp8.cuh"
#include "../launch.h"

namespace moss_qkv {
using namespace moss_gemm;
constexpr int HD = 128;  // head dim
static_assert(HD == DIT_FLASH_HEAD_DIM, "the DiT's head dim");
static_assert(moss_gemm::SMEM == DIT_SITU_GEMM_SMEM && moss_gemm::THREADS == DIT_SITU_GEMM_THREADS, "the host's launch (launch.h)");
static_assert(2 * HD == DIT_QKV_GEMM_COLS, "the host's column tiles: 3D / DIT_QKV_GEMM_COLS");
static_assert(moss_gemm::BM == DIT_ATTN_FP8_TILE, "OPERANDS: a row tile is a V scale's token tile");

// Two adjacent bf16 (4-byte aligned) as floats.
__device__ __forceinline__ float2 pair(const __nv_bfloat16* p) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p)); }

// Column tile n0 / 128: W rows 2·n0 .. 2·n0 + 255 (two heads).
struct TwoHeadTiles {
    __device__ __forceinline__ int w_row0(int n0) const { return 2 * n0; }
    __device__ __forceinline__ int w_row1(int n0) const { return 2 * n0 + HD; }
};

// FP8: the products are of e4m3 codes, each scaled by its x row's and its W row's scale (xs [M],
// ws [3D]) first, as the unfused fp8 linear's output is before its bf16 rounding.
// The position of token w (0..31) in a 32-token group of V^T (the inverse of
// attention_fp8_operands.cu's vt_token).
__device__ __forceinline__ int vt_position(int w) { return (w & 16) + (((w >> 1) & 3) << 2) + (((w >> 3) & 1) << 1) + (w & 1); }

// Rows m0 + 64c + [0, 64) of this warpgroup's staged codes (rows of 128 bytes, 16-byte chunk i of
// row rr at chunk index i ^ (rr & 7)) stored to out[row, n0 .. n0 + 128) (row stride ld bytes).
__device__ __forceinline__ void store_staged_codes(const char* wg_rows, unsigned char* __restrict__ out, int ld, int m, int m0,
                                                   int c, int n0, int wtid) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int idx = wtid + 128 * j, rr = idx >> 3, ch = idx & 7;
        const int row = m0 + 64 * c + rr;
        if (row < m)
            *reinterpret_cast<uint4*>(out + (long)row * ld + n0 + ch * 16) =
                *reinterpret_cast<const uint4*>(wg_rows + rr * 128 + ((ch ^ (rr & 7)) << 4));
    }
}

template <int BUG, bool FP8 = false, bool OPERANDS = false>
struct NormRopeEpilogue {
    __nv_bfloat16* __restrict__ out;
    const __nv_bfloat16* __restrict__ wq;
    const __nv_bfloat16* __restrict__ wk;
    const __nv_bfloat16* __restrict__ cs;
    const __nv_bfloat16* __restrict__ sn;
    int m, d;
    float eps;
    const float* __restrict__ xs = nullptr;
    const float* __restrict__ ws = nullptr;
    // OPERANDS: the e4m3 attention's operands and their scales (sq, sk: q's and k's)
    unsigned char* __restrict__ q8 = nullptr;
    unsigned char* __restrict__ k8 = nullptr;
    unsigned char* __restrict__ vt8 = nullptr;
    float* __restrict__ scales = nullptr;
    float sq = 0.f, sk = 0.f, e4m3_max = 0.f, min_amax = 0.f;

    // OPERANDS, a v tile (two heads): the V tile's amax with the other consumer warpgroup, its
    // scale, then this warpgroup's 64 tokens of V^T for each head.
    __device__ __forceinline__ void v_operands(const float (&acc)[128], int m0, int col0, int c, char* wg_rows) {
        __shared__ float part_max[2][8];
        const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
        const int g = lane >> 2, t = lane & 3, warp = wtid >> 5;
        float am[2] = {0.f, 0.f};
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int v = 0; v < 64; v++) am[h] = fmaxf(am[h], fabsf(bf16_round(acc[64 * h + v])));
        const float w0 = moss_fp8::warp_max(am[0]), w1 = moss_fp8::warp_max(am[1]);
        if (lane == 0) {
            part_max[0][4 * c + warp] = w0;
            part_max[1][4 * c + warp] = w1;
        }
        asm volatile("bar.sync 3, 256;\n" ::: "memory");
#pragma unroll
        for (int h = 0; h < 2; h++) {
            am[h] = 0.f;
#pragma unroll
            for (int w = 0; w < 8; w++) am[h] = fmaxf(am[h], part_max[h][w]);
        }
        asm volatile("bar.sync 3, 256;\n" ::: "memory");  // read by all before the next v tile writes
        const int head0 = (col0 - 2 * d) / HD, tiles = (m + moss_gemm::BM - 1) / moss_gemm::BM;
        const long npad = (long)tiles * moss_gemm::BM;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float s = moss_fp8::e4m3_scale(am[h], e4m3_max, min_amax);
            if (c == 0 && wtid == 0) scales[2 + (head0 + h) * tiles + m0 / moss_gemm::BM] = s;
            named_sync128(1 + c);  // the previous stores have read the staging
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = 16 * warp + g + 8 * r;  // this warpgroup's token 0..63
                const int pos = BUG == 3 ? row : (row & 32) + vt_position(row & 31);
#pragma unroll
                for (int i = 0; i < 16; i++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        wg_rows[(8 * i + 2 * t + e) * 64 + pos] =
                            moss_fp8::to_e4m3<0>(__fdiv_rn(bf16_round(acc[64 * h + 4 * i + 2 * r + e]), s));
            }
            named_sync128(1 + c);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int idx = wtid + 128 * j, ch = idx >> 2, q = idx & 3;
                *reinterpret_cast<uint4*>(vt8 + ((long)(head0 + h) * HD + ch) * npad + m0 + 64 * c + 16 * q) =
                    *reinterpret_cast<const uint4*>(wg_rows + ch * 64 + 16 * q);
            }
        }
    }

    __device__ __forceinline__ void operator()(float (&acc)[128], int m0, int n0, int c, char* wg_rows) {
        const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
        const int g = lane >> 2, t = lane & 3, warp = wtid >> 5;
        const int col0 = 2 * n0, part = col0 / d;  // 0 q, 1 k, 2 v
        const __nv_bfloat16* w = (part == 0 || BUG == 1) ? wq : wk;
        if (FP8) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                // rows past M: scaled by the last row's scale, never stored
                const float sx = xs[min(m0 + 64 * c + 16 * warp + g + 8 * r, m - 1)];
#pragma unroll
                for (int i = 0; i < 32; i++)
#pragma unroll
                    for (int e = 0; e < 2; e++) acc[4 * i + 2 * r + e] *= sx * __ldg(ws + col0 + 8 * i + 2 * t + e);
            }
        }
        if constexpr (OPERANDS) {
            if (part == 2) {
                v_operands(acc, m0, col0, c, wg_rows);
                return;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            named_sync128(1 + c);  // the previous stores have read the staging rows
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = 16 * warp + g + 8 * r;
                auto a_of = [&](int i, int e) { return bf16_round(acc[64 * h + 4 * i + 2 * r + e]); };
                auto stage = [&](int i, float lo, float hi) {
                    if constexpr (OPERANDS) {  // codes of the bf16-rounded values; rows of 128 bytes
                        const float sc = part == 0 ? sq : sk;
                        const float2 v = make_float2(__fdiv_rn(bf16_round(lo), sc), __fdiv_rn(bf16_round(hi), sc));
                        *reinterpret_cast<uint16_t*>(wg_rows + row * 128 + (((i >> 1) ^ (row & 7)) << 4) + 8 * (i & 1) + 2 * t) =
                            __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3);
                    } else {
                        *reinterpret_cast<uint32_t*>(wg_rows + row * 256 + ((i ^ (row & 7)) << 4) + 4 * t) = pack_bf16(lo, hi);
                    }
                };
                if (part == 2) {
#pragma unroll
                    for (int i = 0; i < 16; i++) stage(i, a_of(i, 0), a_of(i, 1));
                    continue;
                }
                float ss = 0.f;
#pragma unroll
                for (int i = 0; i < 16; i++) ss += a_of(i, 0) * a_of(i, 0) + a_of(i, 1) * a_of(i, 1);
                ss += __shfl_xor_sync(0xffffffffu, ss, 1);
                ss += __shfl_xor_sync(0xffffffffu, ss, 2);
                const float inv = rsqrtf(ss / (float)HD + eps);
                const long tok = min(m0 + 64 * c + row, m - 1);  // rows past M: computed, never stored
                const __nv_bfloat16* ct = cs + tok * (HD / 2);
                const __nv_bfloat16* st = sn + tok * (HD / 2);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const int j = 8 * i + 2 * t;  // columns j, j + 1 of the first half (0 .. 63)
                    const float2 wa = pair(w + j), wb = pair(w + j + HD / 2), co2 = pair(ct + j), si2 = pair(st + j);
                    float lo[2], hi[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float ya = a_of(i, e) * inv * (e ? wa.y : wa.x), yb = a_of(i + 8, e) * inv * (e ? wb.y : wb.x);
                        const float co = e ? co2.y : co2.x, si = (BUG == 2 ? -1.f : 1.f) * (e ? si2.y : si2.x);
                        lo[e] = ya * co - yb * si;
                        hi[e] = yb * co + ya * si;
                    }
                    stage(i, lo[0], lo[1]);
                    stage(i + 8, hi[0], hi[1]);
                }
            }
            named_sync128(1 + c);
            if constexpr (OPERANDS)
                store_staged_codes(wg_rows, part == 0 ? q8 : k8, d, m, m0, c, col0 + HD * h - part * d, wtid);
            else
                store_staged(wg_rows, out, 3 * d, m, m0, c, col0 + HD * h, wtid);
        }
    }
};

template <int BUG>
__device__ __forceinline__ void linear_qkv(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out,
                                           const __nv_bfloat16* wq, const __nv_bfloat16* wk, const __nv_bfloat16* cs,
                                           const __nv_bfloat16* sn, int m,
                                           int d, int k, float eps) {
    NormRopeEpilogue<BUG> epi{out, wq, wk, cs, sn, m, d, eps};
    gemm_tiles<false>(tx, tw, m, 3 * d / (2 * HD), k, TwoHeadTiles{}, epi);
}
// The e4m3 form: x and W codes (TMA maps of bytes, box {128, 128}), their row scales, K % 128 == 0.
template <int BUG>
__device__ __forceinline__ void linear_qkv_fp8(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out,
                                               const float* xs, const float* ws, const __nv_bfloat16* wq,
                                               const __nv_bfloat16* wk, const __nv_bfloat16* cs, const __nv_bfloat16* sn,
                                               int m, int d, int k, float eps) {
    NormRopeEpilogue<BUG, true> epi{out, wq, wk, cs, sn, m, d, eps, xs, ws};
    gemm_tiles<false, TwoHeadTiles, NormRopeEpilogue<BUG, true>, true>(tx, tw, m, 3 * d / (2 * HD), k, TwoHeadTiles{}, epi);
}
// OPERANDS: the e4m3 attention's operands (q8, k8 [M, D], vt8 [D, 128·tiles], scales [2 + heads·tiles]).
template <int BUG>
__device__ __forceinline__ void linear_qkv_attention_fp8(const TmaMap* tx, const TmaMap* tw, unsigned char* q8, unsigned char* k8,
                                                         unsigned char* vt8, float* scales, const float* xs, const float* ws,
                                                         const __nv_bfloat16* wq, const __nv_bfloat16* wk,
                                                         const __nv_bfloat16* cs, const __nv_bfloat16* sn, int m, int d, int k,
                                                         float eps, float sqrt_hd, float e4m3_max, float min_amax) {
    float mq = 0.f, mk = 0.f;
    for (int i = 0; i < HD; i++) {
        mq = fmaxf(mq, fabsf(__bfloat162float(wq[i])));
        mk = fmaxf(mk, fabsf(__bfloat162float(wk[i])));
    }
    const float sq = moss_fp8::e4m3_scale(sqrt_hd * mq, e4m3_max, min_amax), sk = moss_fp8::e4m3_scale(sqrt_hd * mk, e4m3_max, min_amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        scales[0] = sq;
        scales[1] = sk;
    }
    NormRopeEpilogue<BUG, true, true> epi{nullptr, wq, wk, cs, sn, m, d, eps, xs, ws, q8, k8, vt8, scales, sq, sk, e4m3_max, min_amax};
    gemm_tiles<false, TwoHeadTiles, NormRopeEpilogue<BUG, true, true>, true>(tx, tw, m, 3 * d / (2 * HD), k, TwoHeadTiles{}, epi);
}
}  // namespace moss_qkv

#define MOSS_QKV_GEMM_KERNEL(NAME, BUG)                                                                           \
    MOSS_KERNEL void __launch_bounds__(moss_gemm::THREADS, 1)                                                   \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,           \
             __nv_bfloat16* out, const __nv_bfloat16* wq, const __nv_bfloat16* wk, const __nv_bfloat16* cs,           \
             const __nv_bfloat16* sn, int m, int d,                                                                \
             int k, float eps) {                                                                                \
        moss_qkv::linear_qkv<BUG>(&tx, &tw, out, wq, wk, cs, sn, m, d, k, eps);                                \
    }

MOSS_PRODUCTION(MOSS_QKV_GEMM_KERNEL(moss_dit_linear_qkv_norm_rope, 0))
MOSS_CONTROL(MOSS_QKV_GEMM_KERNEL(moss_dit_linear_qkv_norm_rope_k_weight_control, 1))
MOSS_CONTROL(MOSS_QKV_GEMM_KERNEL(moss_dit_linear_qkv_norm_rope_sign_control, 2))

#define MOSS_QKV_GEMM_FP8_KERNEL(NAME, BUG)                                                                         \
    MOSS_KERNEL void __launch_bounds__(moss_gemm::THREADS, 1)                                                     \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,             \
             __nv_bfloat16* out, const float* xs, const float* ws, const __nv_bfloat16* wq, const __nv_bfloat16* wk, \
             const __nv_bfloat16* cs, const __nv_bfloat16* sn, int m, int d, int k, float eps) {                 \
        moss_qkv::linear_qkv_fp8<BUG>(&tx, &tw, out, xs, ws, wq, wk, cs, sn, m, d, k, eps);                      \
    }

MOSS_PRODUCTION(MOSS_QKV_GEMM_FP8_KERNEL(moss_dit_linear_qkv_norm_rope_fp8, 0))
MOSS_CONTROL(MOSS_QKV_GEMM_FP8_KERNEL(moss_dit_linear_qkv_norm_rope_fp8_k_weight_control, 1))
MOSS_CONTROL(MOSS_QKV_GEMM_FP8_KERNEL(moss_dit_linear_qkv_norm_rope_fp8_sign_control, 2))

#define MOSS_QKV_ATTN_FP8_KERNEL(NAME, BUG)                                                                            \
    MOSS_KERNEL void __launch_bounds__(moss_gemm::THREADS, 1)                                                        \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,                \
             unsigned char* q8, unsigned char* k8, unsigned char* vt8, float* scales, const float* xs, const float* ws, \
             const __nv_bfloat16* wq, const __nv_bfloat16* wk, const __nv_bfloat16* cs, const __nv_bfloat16* sn, int m, \
             int d, int k, float eps, float sqrt_hd, float e4m3_max, float min_amax) {                                 \
        moss_qkv::linear_qkv_attention_fp8<BUG>(&tx, &tw, q8, k8, vt8, scales, xs, ws, wq, wk, cs, sn, m, d, k, eps,     \
                                                sqrt_hd, e4m3_max, min_amax);                                          \
    }

MOSS_PRODUCTION(MOSS_QKV_ATTN_FP8_KERNEL(moss_dit_linear_qkv_attention_fp8, 0))
MOSS_CONTROL(MOSS_QKV_ATTN_FP8_KERNEL(moss_dit_linear_qkv_attention_fp8_k_weight_control, 1))
MOSS_CONTROL(MOSS_QKV_ATTN_FP8_KERNEL(moss_dit_linear_qkv_attention_fp8_order_control, 3))
