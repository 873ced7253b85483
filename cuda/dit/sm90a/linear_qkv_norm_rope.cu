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
// Arguments: CUtensorMaps of x ({K, M}) and W ({K, 3D}) (bf16, boxes {64, 64} (x: half a tile's rows, sm90a/gemm_tile.cuh's clusters) and {64, 128}, SWIZZLE_128B), out
// (row stride 3D), wq, wk [128] bf16, cos, sin [M, 64] bf16, M, D, K, eps.
// Launch: 1-D grid of min(SMs, ⌈M/128⌉ · 3D/256) blocks rounded down to whole clusters
// of DIT_SITU_GEMM_CLUSTER (at least one), DIT_SITU_GEMM_THREADS threads, DIT_SITU_GEMM_SMEM bytes of dynamic shared memory. Requires D % 256 == 0, K % 64 == 0 (the host
// checks). BUG 1 (check image): k normed with q's weight; BUG 2: the rotation's sign flipped.
// The e4m3 form (`moss_dit_linear_qkv_norm_rope_fp8`, `--precision fp8`): x and W are e4m3 codes
// with f32 row scales xs [M], ws [3D] (maps of bytes, boxes {128, 64} and {128, 128}; K % 128 == 0), the products
// scaled by both before the bf16 rounding; the rest as above.
#include "sm90a/gemm_tile.cuh"
#include "../launch.h"
#include "rope.cuh"

namespace moss_qkv {
using namespace moss_gemm;
constexpr int HD = 128;  // head dim
static_assert(HD == DIT_FLASH_HEAD_DIM, "the DiT's head dim");
static_assert(moss_gemm::SMEM == DIT_SITU_GEMM_SMEM && moss_gemm::THREADS == DIT_SITU_GEMM_THREADS, "the host's launch (launch.h)");
static_assert(2 * HD == DIT_QKV_GEMM_COLS, "the host's column tiles: 3D / DIT_QKV_GEMM_COLS");

// Two adjacent bf16 (4-byte aligned) as floats.
__device__ __forceinline__ float2 pair(const __nv_bfloat16* p) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p)); }

// Column tile n0 / 128: W rows 2·n0 .. 2·n0 + 255 (two heads).
struct TwoHeadTiles {
    __device__ __forceinline__ int w_row0(int n0) const { return 2 * n0; }
    __device__ __forceinline__ int w_row1(int n0) const { return 2 * n0 + HD; }
};

// FP8: the products are of e4m3 codes, each scaled by its x row's and its W row's scale (xs [M],
// ws [3D]) first, as the unfused fp8 linear's output is before its bf16 rounding.
template <int BUG, bool FP8 = false>
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
#pragma unroll
        for (int h = 0; h < 2; h++) {
            named_sync128(1 + c);  // the previous stores have read the staging rows
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = 16 * warp + g + 8 * r;
                auto a_of = [&](int i, int e) { return bf16_round(acc[64 * h + 4 * i + 2 * r + e]); };
                auto stage = [&](int i, float lo, float hi) {
                    *reinterpret_cast<uint32_t*>(wg_rows + row * 256 + ((i ^ (row & 7)) << 4) + 4 * t) = pack_bf16(lo, hi);
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
                const float inv = moss_rope::rms_inv(ss, HD, eps);
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
                        const float co = e ? co2.y : co2.x, si = (BUG == 2 ? -1.f : 1.f) * (e ? si2.y : si2.x);
                        MOSS_NORM_ROPE_PAIR(a_of(i, e), a_of(i + 8, e), e ? wa.y : wa.x, e ? wb.y : wb.x, inv, co, si, lo[e], hi[e]);
                    }
                    stage(i, lo[0], lo[1]);
                    stage(i + 8, hi[0], hi[1]);
                }
            }
            named_sync128(1 + c);
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
// The e4m3 form: x and W codes (TMA maps of bytes, boxes {128, 64} and {128, 128}), their row scales, K % 128 == 0.
template <int BUG>
__device__ __forceinline__ void linear_qkv_fp8(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out,
                                               const float* xs, const float* ws, const __nv_bfloat16* wq,
                                               const __nv_bfloat16* wk, const __nv_bfloat16* cs, const __nv_bfloat16* sn,
                                               int m, int d, int k, float eps) {
    NormRopeEpilogue<BUG, true> epi{out, wq, wk, cs, sn, m, d, eps, xs, ws};
    gemm_tiles<false, TwoHeadTiles, NormRopeEpilogue<BUG, true>, true>(tx, tw, m, 3 * d / (2 * HD), k, TwoHeadTiles{}, epi);
}
}  // namespace moss_qkv

#define MOSS_QKV_GEMM_KERNEL(NAME, BUG)                                                                           \
    MOSS_KERNEL void __cluster_dims__(moss_gemm::CLUSTER, 1, 1) __launch_bounds__(moss_gemm::THREADS, 1)                                                   \
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
    MOSS_KERNEL void __cluster_dims__(moss_gemm::CLUSTER, 1, 1) __launch_bounds__(moss_gemm::THREADS, 1)                                                     \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,             \
             __nv_bfloat16* out, const float* xs, const float* ws, const __nv_bfloat16* wq, const __nv_bfloat16* wk, \
             const __nv_bfloat16* cs, const __nv_bfloat16* sn, int m, int d, int k, float eps) {                 \
        moss_qkv::linear_qkv_fp8<BUG>(&tx, &tw, out, xs, ws, wq, wk, cs, sn, m, d, k, eps);                      \
    }

MOSS_PRODUCTION(MOSS_QKV_GEMM_FP8_KERNEL(moss_dit_linear_qkv_norm_rope_fp8, 0))
MOSS_CONTROL(MOSS_QKV_GEMM_FP8_KERNEL(moss_dit_linear_qkv_norm_rope_fp8_k_weight_control, 1))
MOSS_CONTROL(MOSS_QKV_GEMM_FP8_KERNEL(moss_dit_linear_qkv_norm_rope_fp8_sign_control, 2))
