// The DiT FFN's up/gate projection with SiTU-GLU applied on the way out, on Hopper (sm_90a only):
// out[r, j] = situ_fast(h, g), h = bf16(u[r, j]), g = bf16(u[r, F + j]), u = x · Wᵀ, for
// x [M, K] bf16, W [2F, K] bf16 (rows [up ; gate]), out [M, F] bf16. u is never written: h and g
// are rounded to bf16 in registers exactly as the unfused path stores u (cuBLASLt, round to
// nearest), then SiTU runs in fp32 (cuda/dit/situ.cuh, the bf16 kernel's form) and rounds once.
//
// The GEMM is sm90a/gemm_tile.cuh's (TMA ring, producer + 2 consumer warpgroups on wgmma
// m64n256k16, persistent grid). Output tiles of 128 rows x 128 F-columns: a tile's 256 product
// columns are the 128 up rows [n0, n0 + 128) and the 128 gate rows [F + n0, F + n0 + 128) of W
// (its two W boxes), so a thread's accumulators hold the up and the gate value of the same output
// element.
//
// Epilogue (`SituEpilogue`): SiTU from the registers, bf16 into this warpgroup's staging rows
// (16-byte chunks XOR-swizzled by row: no bank conflicts), then 16-byte coalesced stores; rows
// past M are never stored. (An `overlap` epilogue, SiTU of a tile under the next tile's products
// with 3 stages, measured slower on the H200 and was deleted: docs/DEVELOPERS.md.)
//
// Arguments: two CUtensorMaps (x: {K, M}, W: {K, 2F}; bf16, box {64, 128}, SWIZZLE_128B; made by
// the host's `tensor_map_2d`) passed by value, out (row stride F), M, F, K.
// The e4m3 form (`moss_dit_linear_situ_glu_fp8`, `--precision fp8`): x and W are e4m3 codes with
// f32 row scales xs [M], ws [2F] (maps of bytes, box {128, 128}; K % 128 == 0): each product is
// scaled by its two scales before the bf16 rounding (what the unfused fp8 linear stores), the rest
// as above; the host quantizes the bf16 output per row for the down projection.
// Launch: 1-D grid of min(SMs, ⌈M/128⌉ · F/128) blocks, DIT_SITU_GEMM_THREADS threads,
// DIT_SITU_GEMM_SMEM bytes of dynamic shared memory. Requires F % 128 == 0, K % 64 == 0 (the host
// checks). BUG 1 (check image): up and gate swapped in the epilogue; BUG 2: the last K step's
// products left out.
#include "sm90a/gemm_tile.cuh"
#include "../situ.cuh"
#include "../launch.h"

namespace moss_gsg {
using namespace moss_gemm;
constexpr int BN = 128;  // output columns a tile (up rows = gate rows of W a tile)
static_assert(moss_gemm::STAGES == DIT_SITU_GEMM_STAGES, "launch.h's stages");
static_assert(moss_gemm::STAGE_BYTES == DIT_SITU_GEMM_STAGE, "launch.h's stage");
static_assert(moss_gemm::SMEM == DIT_SITU_GEMM_SMEM, "the host launches with DIT_SITU_GEMM_SMEM (launch.h)");
static_assert(moss_gemm::BM == DIT_SITU_GEMM_ROWS && BN == DIT_SITU_GEMM_COLS && moss_gemm::BK == DIT_SITU_GEMM_KTILE,
              "the host's tiles: ceil(M / DIT_SITU_GEMM_ROWS) x F / DIT_SITU_GEMM_COLS, K % DIT_SITU_GEMM_KTILE == 0");
static_assert(moss_gemm::THREADS == DIT_SITU_GEMM_THREADS, "the host launches DIT_SITU_GEMM_THREADS threads");

// Column tile n0 / 128: up rows n0 .., gate rows F + n0 .. of W.
struct UpGateTiles {
    int f;
    __device__ __forceinline__ int w_row0(int n0) const { return n0; }
    __device__ __forceinline__ int w_row1(int n0) const { return f + n0; }
};

// acc[q] (up, q < 64) and acc[q + 64] (gate) are the two halves of output column n0 + 8i + 2t + e
// (q = 4i + 2r + e).
// FP8: the products are of e4m3 codes; each is scaled by its x row's scale and its W row's
// (xs [M], ws [2F], f32) before the rounding, as the unfused fp8 linear's output is.
template <int SWAP, bool FP8 = false>
struct SituEpilogue {
    __nv_bfloat16* __restrict__ out;
    int m, f;
    const float* __restrict__ xs = nullptr;
    const float* __restrict__ ws = nullptr;
    __device__ __forceinline__ void operator()(float (&acc)[128], int m0, int n0, int c, char* wg_rows) {
        const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
        const int g = lane >> 2, t = lane & 3, warp = wtid >> 5;
        // SiTU of (h, g) = (acc[q], acc[q + 64]), both rounded to bf16 first; staged as
        // bf16 rows of 256 bytes, chunk i (columns 8i..8i+7) at chunk index i ^ (row & 7).
        named_sync128(1 + c);  // the previous tile's stores have read the staging rows
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * warp + g + 8 * r;
            // rows past M: computed from the last row's scale, never stored
            const float sx = FP8 ? xs[min(m0 + 64 * c + row, m - 1)] : 1.f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                float o[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float hu = acc[4 * i + 2 * r + e], gu = acc[4 * i + 2 * r + e + 64];
                    if (FP8) {
                        const int j = n0 + 8 * i + 2 * t + e;  // the output column: up row j, gate row f + j
                        hu = hu * sx * __ldg(ws + j);
                        gu = gu * sx * __ldg(ws + f + j);
                    }
                    o[e] = situ_fast<SWAP>(bf16_round(hu), bf16_round(gu));
                }
                *reinterpret_cast<uint32_t*>(wg_rows + row * 256 + ((i ^ (row & 7)) << 4) + 4 * t) = pack_bf16(o[0], o[1]);
            }
        }
        named_sync128(1 + c);
        store_staged(wg_rows, out, f, m, m0, c, n0, wtid);
    }
};

template <int BUG>
__device__ __forceinline__ void linear_situ(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out, int m,
                                            int f, int k) {
    SituEpilogue<BUG == 1 ? 1 : 0> epi{out, m, f};
    gemm_tiles<BUG == 2>(tx, tw, m, f / BN, k, UpGateTiles{f}, epi);
}

// The e4m3 form: x and W codes (TMA maps of bytes, box {128, 128}), their row scales, K % 128 == 0.
template <int BUG>
__device__ __forceinline__ void linear_situ_fp8(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out,
                                                const float* xs, const float* ws, int m, int f, int k) {
    SituEpilogue<BUG == 1 ? 1 : 0, true> epi{out, m, f, xs, ws};
    gemm_tiles<BUG == 2, UpGateTiles, SituEpilogue<BUG == 1 ? 1 : 0, true>, true>(tx, tw, m, f / BN, k, UpGateTiles{f}, epi);
}
}  // namespace moss_gsg
#define MOSS_GSG_FP8_KERNEL(NAME, BUG)                                                                      \
    MOSS_KERNEL void __launch_bounds__(moss_gemm::THREADS, 1)                                              \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,     \
             __nv_bfloat16* out, const float* xs, const float* ws, int m, int f, int k) {                 \
        moss_gsg::linear_situ_fp8<BUG>(&tx, &tw, out, xs, ws, m, f, k);                                  \
    }
#define MOSS_GSG_KERNEL(NAME, BUG)                                                                          \
    MOSS_KERNEL void __launch_bounds__(moss_gemm::THREADS, 1)                                              \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,     \
             __nv_bfloat16* out, int m, int f, int k) {                                                  \
        moss_gsg::linear_situ<BUG>(&tx, &tw, out, m, f, k);                                              \
    }

MOSS_PRODUCTION(MOSS_GSG_KERNEL(moss_dit_linear_situ_glu, 0))
MOSS_CONTROL(MOSS_GSG_KERNEL(moss_dit_linear_situ_glu_swapped_control, 1))
MOSS_CONTROL(MOSS_GSG_KERNEL(moss_dit_linear_situ_glu_short_k_control, 2))
MOSS_PRODUCTION(MOSS_GSG_FP8_KERNEL(moss_dit_linear_situ_glu_fp8, 0))
MOSS_CONTROL(MOSS_GSG_FP8_KERNEL(moss_dit_linear_situ_glu_fp8_swapped_control, 1))
MOSS_CONTROL(MOSS_GSG_FP8_KERNEL(moss_dit_linear_situ_glu_fp8_short_k_control, 2))
