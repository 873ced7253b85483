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
// Epilogue (`SituEpilogue`, gemm_tile.cuh's EPI_WARPS): the consumers only round h and g to bf16
// and stage them (a 32-bit word an output element) and go on to the next tile's products; the
// producer warpgroup's three idle warps run SiTU on the staged words and store the outputs, under
// those products. (An `overlap` epilogue, SiTU by the consumers under their own next products with
// 3 stages, measured slower on the H200 and was deleted: docs/DEVELOPERS.md.)
//
// Arguments: two CUtensorMaps (x: {K, M}, W: {K, 2F}; bf16, boxes {64, 64} (x: half a tile's
// rows, sm90a/gemm_tile.cuh's clusters) and {64, 128}, SWIZZLE_128B; made by the host's
// `tensor_map_2d`) passed by value, out (row stride F), M, F, K.
// The e4m3 form (`moss_dit_linear_situ_glu_fp8`, `--precision fp8`): x and W are e4m3 codes with
// f32 row scales xs [M], ws [2F] (maps of bytes, boxes {128, 64} and {128, 128}; K % 128 == 0): each product is
// scaled by its two scales before the bf16 rounding (what the unfused fp8 linear stores), the rest
// as above; the host quantizes the bf16 output per row for the down projection.
// Launch: 1-D grid of min(SMs, ⌈M/128⌉ · F/128) blocks rounded down to whole clusters
// of DIT_SITU_GEMM_CLUSTER (at least one), DIT_SITU_GEMM_THREADS threads, DIT_SITU_EPI_SMEM bytes
// of dynamic shared memory. Requires F % 128 == 0, K % 64 == 0 (the host checks). BUG 1 (check
// image): up and gate swapped in the epilogue; BUG 2: the last K step's products left out.
#include "sm90a/gemm_tile.cuh"
#include "../situ.cuh"
#include "../launch.h"

namespace moss_gsg {
using namespace moss_gemm;
constexpr int BN = 128;  // output columns a tile (up rows = gate rows of W a tile)
static_assert(moss_gemm::STAGES == DIT_SITU_GEMM_STAGES, "launch.h's stages");
static_assert(moss_gemm::STAGE_BYTES == DIT_SITU_GEMM_STAGE, "launch.h's stage");
static_assert(moss_gemm::EPI_STAGES == DIT_SITU_EPI_STAGES, "launch.h's stages of the epilogue-warps ring");
static_assert(moss_gemm::SMEM_EPI == DIT_SITU_EPI_SMEM, "the host launches with DIT_SITU_EPI_SMEM (launch.h)");
static_assert(moss_gemm::BM == DIT_SITU_GEMM_ROWS && BN == DIT_SITU_GEMM_COLS && moss_gemm::BK == DIT_SITU_GEMM_KTILE,
              "the host's tiles: ceil(M / DIT_SITU_GEMM_ROWS) x F / DIT_SITU_GEMM_COLS, K % DIT_SITU_GEMM_KTILE == 0");
static_assert(moss_gemm::THREADS == DIT_SITU_GEMM_THREADS, "the host launches DIT_SITU_GEMM_THREADS threads");
static_assert(moss_gemm::CLUSTER == DIT_SITU_GEMM_CLUSTER, "the host's grid (whole clusters) and the x map's box (BM / CLUSTER rows)");

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
// The epilogue runs on gemm_tile.cuh's epilogue warps (EPI_WARPS): `stage` (each consumer thread)
// rounds h and g to bf16 (the unfused path's stored product) and writes them as one word (h low,
// g high) an output element, the tile's rows of 128 words 512 bytes apart, 16-byte chunk q of a row
// (columns 4q..4q+3) at chunk q ^ (row & 7): a warp's 8-byte stores and a lane's 16-byte reads meet
// no bank conflicts. `drain` (warps 1..3 of the producer warpgroup, rows w, w + 3, ..) reads a
// row's chunk a lane, runs SiTU in fp32 (cuda/dit/situ.cuh, the bf16 kernel's form) and stores the
// four bf16 outputs with 8-byte coalesced stores; rows past M are never stored.
template <int SWAP, bool FP8 = false>
struct SituEpilogue {
    __nv_bfloat16* __restrict__ out;
    int m, f;
    const float* __restrict__ xs = nullptr;
    const float* __restrict__ ws = nullptr;
    __device__ __forceinline__ void stage(float (&acc)[128], int m0, int n0, int c, char* stg) {
        const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
        const int g = lane >> 2, t = lane & 3, warp = wtid >> 5;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 64 * c + 16 * warp + g + 8 * r;  // the tile's row
            // rows past M: computed from the last row's scale, never stored
            const float sx = FP8 ? xs[min(m0 + row, m - 1)] : 1.f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                uint32_t w[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float hu = acc[4 * i + 2 * r + e], gu = acc[4 * i + 2 * r + e + 64];
                    if (FP8) {
                        const int j = n0 + 8 * i + 2 * t + e;  // the output column: up row j, gate row f + j
                        hu = hu * sx * __ldg(ws + j);
                        gu = gu * sx * __ldg(ws + f + j);
                    }
                    w[e] = pack_bf16(hu, gu);
                }
                // columns 8i + 2t, + 1: chunk 2i + t/2, its words 2(t & 1), + 1
                const int q = (2 * i + (t >> 1)) ^ (row & 7);
                *reinterpret_cast<uint2*>(stg + row * 512 + q * 16 + 8 * (t & 1)) = make_uint2(w[0], w[1]);
            }
        }
    }
    __device__ __forceinline__ void drain(int m0, int n0, int w, const char* stg) const {
        const int lane = threadIdx.x & 31;
        for (int row = w; row < moss_gemm::BM; row += moss_gemm::EPI_WARPS_N) {
            const uint4 v = *reinterpret_cast<const uint4*>(stg + row * 512 + ((lane ^ (row & 7)) << 4));
            const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
            float o[4];
#pragma unroll
            for (int k = 0; k < 4; k++) o[k] = situ_fast<SWAP>(__uint_as_float(wd[k] << 16), __uint_as_float(wd[k] & 0xffff0000u));
            if (m0 + row < m)
                *reinterpret_cast<uint2*>(out + (long)(m0 + row) * f + n0 + 4 * lane) = make_uint2(pack_bf16(o[0], o[1]), pack_bf16(o[2], o[3]));
        }
    }
};

template <int BUG>
__device__ __forceinline__ void linear_situ(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out, int m,
                                            int f, int k) {
    using Epi = SituEpilogue<BUG == 1 ? 1 : 0>;
    Epi epi{out, m, f};
    gemm_tiles<BUG == 2, UpGateTiles, Epi, false, true>(tx, tw, m, f / BN, k, UpGateTiles{f}, epi);
}

// The e4m3 form: x and W codes (TMA maps of bytes, boxes {128, 64} and {128, 128}), their row scales, K % 128 == 0.
template <int BUG>
__device__ __forceinline__ void linear_situ_fp8(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out,
                                                const float* xs, const float* ws, int m, int f, int k) {
    using Epi = SituEpilogue<BUG == 1 ? 1 : 0, true>;
    Epi epi{out, m, f, xs, ws};
    gemm_tiles<BUG == 2, UpGateTiles, Epi, true, true>(tx, tw, m, f / BN, k, UpGateTiles{f}, epi);
}
}  // namespace moss_gsg
#define MOSS_GSG_FP8_KERNEL(NAME, BUG)                                                                      \
    MOSS_KERNEL void __cluster_dims__(moss_gemm::CLUSTER, 1, 1) __launch_bounds__(moss_gemm::THREADS, 1)                                              \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,     \
             __nv_bfloat16* out, const float* xs, const float* ws, int m, int f, int k) {                 \
        moss_gsg::linear_situ_fp8<BUG>(&tx, &tw, out, xs, ws, m, f, k);                                  \
    }
#define MOSS_GSG_KERNEL(NAME, BUG)                                                                          \
    MOSS_KERNEL void __cluster_dims__(moss_gemm::CLUSTER, 1, 1) __launch_bounds__(moss_gemm::THREADS, 1)                                              \
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
