// The DiT FFN's up/gate projection with SiTU-GLU applied on the way out, on Hopper (sm_90a only):
// out[r, j] = situ_fast(h, g), h = bf16(u[r, j]), g = bf16(u[r, F + j]), u = x · Wᵀ, for
// x [M, K] bf16, W [2F, K] bf16 (rows [up ; gate]), out [M, F] bf16. u is never written: h and g
// are rounded to bf16 in registers exactly as the unfused path stores u (cuBLASLt, round to
// nearest), then SiTU runs in fp32 (cuda/dit/situ.cuh, the bf16 kernel's form) and rounds once.
//
// Output tiles of 128 rows x 128 F-columns. A tile's GEMM is 128 x 256: its 256 product columns
// are the 128 up rows [n0, n0 + 128) and the 128 gate rows [F + n0, F + n0 + 128) of W, so a
// thread's accumulators hold the up and the gate value of the same output element (below).
//
// - 384 threads = 3 warpgroups (the CUTLASS "warp-specialised cooperative" shape). Warpgroup 0 is
//   the producer: one thread issues TMA box copies (cp.async.bulk.tensor, 128-byte swizzle; x rows
//   past M are zeros) into a STAGES-deep ring; each stage has a "full" mbarrier (transaction bytes)
//   and an "empty" one (one arrival per consumer warp). setmaxnreg gives its registers to the
//   consumers (40 / 232).
// - Warpgroups 1 and 2 are consumers of 64 rows each of the same tile; they share the W tiles.
//   Per K step of 64: four wgmma m64n256k16 (x rows from shared memory, K-major; W rows the same:
//   x · Wᵀ is a K-major x K-major product, like Q · Kᵀ in dit/sm90a/flash_attention_ws.cu).
//   One K step's products stay in flight while the next is issued; a stage goes back to the
//   producer once the products reading it are done (wgmma.wait_group 1).
// - Epilogue (`tile_end`): at the end of a tile, SiTU from the registers, bf16 into this
//   warpgroup's staging rows (16-byte chunks XOR-swizzled by row: no bank conflicts), then
//   16-byte coalesced stores; rows past M are never stored. (An `overlap` epilogue, SiTU of a tile
//   under the next tile's products with 3 stages, measured slower on the H200 and was deleted:
//   docs/DEVELOPERS.md.)
// - Persistent: one block an SM (the host's grid), tiles in a loop (tile = blockIdx.x,
//   += gridDim.x): the producer runs ahead into the next tile while the consumers store this one.
//   The ring's position runs on across tiles. Tile t is rows (t % ⌈M/128⌉), columns (t / ⌈M/128⌉):
//   the blocks running together share a few W tiles in L2.
//
// Arguments: two CUtensorMaps (x: {K, M}, W: {K, 2F}; bf16, box {64, 128}, SWIZZLE_128B; made by
// the host's `tensor_map_2d`) passed by value, out (row stride F), M, F, K.
// Launch: 1-D grid of min(SMs, ⌈M/128⌉ · F/128) blocks, DIT_SITU_GEMM_THREADS threads,
// DIT_SITU_GEMM_SMEM bytes of dynamic shared memory. Requires F % 128 == 0, K % 64 == 0 (the host
// checks). BUG 1 (check image): up and gate swapped in the epilogue; BUG 2: the last K step's
// products left out.
#include "sm90a/wgmma.cuh"
#include "sm90a/tma.cuh"
#include "../situ.cuh"
#include "../launch.h"

namespace moss_gsg {
using namespace moss_wg;
using namespace moss_tma;
constexpr int BM = 128;               // x rows a tile
constexpr int BN = 128;               // output columns a tile (up rows = gate rows of W a tile)
constexpr int BK = 64;                // K a stage: 128 bytes of bf16, the swizzle's row
constexpr int THREADS = 384;
constexpr int X_BYTES = BM * BK * 2;  // 16 KiB: [128 rows][128 B]
constexpr int W_BYTES = BN * BK * 2;  // 16 KiB: one of the up / gate boxes
constexpr int STAGE_BYTES = X_BYTES + 2 * W_BYTES;
constexpr int BAR_BYTES = 64;         // 2 x STAGES mbarriers
constexpr int STAGES = 4;
constexpr int ROW_BYTES = BN * 2;     // a consumer's staging row: 128 bf16 outputs
constexpr int WG_BYTES = 64 * ROW_BYTES;
constexpr int SMEM = STAGES * STAGE_BYTES + 2 * WG_BYTES + BAR_BYTES + 1024;
static_assert(16 * STAGES <= BAR_BYTES, "the mbarriers fit their bytes");
static_assert(STAGES == DIT_SITU_GEMM_STAGES, "launch.h's stages");
static_assert(STAGE_BYTES == DIT_SITU_GEMM_STAGE, "launch.h's stage");
static_assert(SMEM == DIT_SITU_GEMM_SMEM, "the host launches with DIT_SITU_GEMM_SMEM (launch.h)");
static_assert(BM == DIT_SITU_GEMM_ROWS && BN == DIT_SITU_GEMM_COLS && BK == DIT_SITU_GEMM_KTILE,
              "the host's tiles: ceil(M / DIT_SITU_GEMM_ROWS) x F / DIT_SITU_GEMM_COLS, K % DIT_SITU_GEMM_KTILE == 0");
static_assert(THREADS == DIT_SITU_GEMM_THREADS, "the host launches DIT_SITU_GEMM_THREADS threads");
static_assert(X_BYTES % 1024 == 0 && W_BYTES % 1024 == 0, "every box starts 1024-byte aligned (the swizzle's period)");

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ void named_sync128(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

template <int BUG>
__device__ __forceinline__ void linear_situ(const TmaMap* tx, const TmaMap* tw, __nv_bfloat16* __restrict__ out, int m,
                                            int f, int k) {
    constexpr int SWAP = BUG == 1 ? 1 : 0;
    extern __shared__ char smem_raw[];
    const uint32_t raw = saddr(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    // stage s at base + s·STAGE_BYTES: the x tile (128 rows), then W's up rows, then its gate rows
    // (128 each: together one 256-row K-major operand, 8-row groups 1024 bytes apart).
    const uint32_t rows_at = base + STAGES * STAGE_BYTES;  // consumer c's shared rows at + c·WG_BYTES
    const uint32_t bars = rows_at + 2 * WG_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const int tid = threadIdx.x, wg = tid >> 7;
    const int mt = (m + BM - 1) / BM, tiles = mt * (f / BN), nk = k / BK;

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), 8);  // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer: k-step `it` (counted over all of this block's tiles) fills stage it % STAGES ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            prefetch_map(tx);
            prefetch_map(tw);
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % mt) * BM, n0 = (tile / mt) * BN;
                for (int kt = 0; kt < nk; kt++, it++) {
                    const int s = it % STAGES;
                    // the consumers' release of round it / STAGES − 1 of this stage
                    if (it >= STAGES) mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
                    const uint32_t st = base + s * STAGE_BYTES;
                    mbar_expect_tx(full(s), STAGE_BYTES);
                    tma_load(st, tx, kt * BK, m0, full(s));
                    tma_load(st + X_BYTES, tw, kt * BK, n0, full(s));
                    tma_load(st + X_BYTES + W_BYTES, tw, kt * BK, f + n0, full(s));
                }
            }
        }
        return;
    }

    // ---- consumers: warpgroup c = wg − 1 owns rows m0 + 64c .. m0 + 64c + 63 of each tile ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1, wtid = tid & 127, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3, warp = wtid >> 5;
    const bool leader = lane == 0;  // one empty-barrier arrival per warp
    char* wg_rows = smem_raw + (rows_at - raw) + c * WG_BYTES;
    // acc (the m64n256 accumulator): acc[4i + 2r + e] is row 16·warp + g + 8r of this warpgroup's
    // 64, product column 8i + 2t + e: for i < 16 the up value of output column n0 + 8i + 2t + e,
    // for i >= 16 the gate value of output column n0 + 8(i − 16) + 2t + e. So acc[q] (up) and
    // acc[q + 64] (gate) are the two halves of one output element.
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int m0 = (tile % mt) * BM, n0 = (tile / mt) * BN;
        for (int kt = 0; kt < nk; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(full(s), (it / STAGES) & 1);
            const uint32_t st = base + s * STAGE_BYTES;
            wg_fence();
            if (BUG != 2 || kt + 1 < nk) {
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++)  // 16 bf16 = 32 bytes along the swizzled row
                    wgmma_ss_n256(acc, desc(st + c * 64 * 128 + kk * 32, 16, 1024), desc(st + X_BYTES + kk * 32, 16, 1024),
                                  kt > 0 || kk > 0);
            }
            wg_commit();
            // the previous k-step's products are done: its stage goes back to the producer
            wg_wait<1>();
            if (kt > 0 && leader) mbar_arrive(empty((it - 1) % STAGES));
        }
        wg_wait<0>();
        pin_all(acc);
        if (leader) mbar_arrive(empty((it - 1) % STAGES));

        // SiTU of (h, g) = (acc[q], acc[q + 64]), both rounded to bf16 first; staged as
        // bf16 rows of 256 bytes, chunk i (columns 8i..8i+7) at chunk index i ^ (row & 7).
        named_sync128(1 + c);  // the previous tile's stores have read the staging rows
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * warp + g + 8 * r;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                float o[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float h = bf16_round(acc[4 * i + 2 * r + e]), gt = bf16_round(acc[4 * i + 2 * r + e + 64]);
                    o[e] = situ_fast<SWAP>(h, gt);
                }
                *reinterpret_cast<uint32_t*>(wg_rows + row * ROW_BYTES + ((i ^ (row & 7)) << 4) + 4 * t) = pack_bf16(o[0], o[1]);
            }
        }
        named_sync128(1 + c);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int idx = wtid + 128 * j, rr = idx >> 4, ch = idx & 15;
            const int row = m0 + 64 * c + rr;
            if (row < m)
                *reinterpret_cast<uint4*>(out + (long)row * f + n0 + ch * 8) =
                    *reinterpret_cast<const uint4*>(wg_rows + rr * ROW_BYTES + ((ch ^ (rr & 7)) << 4));
        }
    }
}
}  // namespace moss_gsg

#define MOSS_GSG_KERNEL(NAME, BUG)                                                                          \
    MOSS_KERNEL void __launch_bounds__(moss_gsg::THREADS, 1)                                              \
        NAME(const __grid_constant__ moss_tma::TmaMap tx, const __grid_constant__ moss_tma::TmaMap tw,     \
             __nv_bfloat16* out, int m, int f, int k) {                                                  \
        moss_gsg::linear_situ<BUG>(&tx, &tw, out, m, f, k);                                              \
    }

MOSS_PRODUCTION(MOSS_GSG_KERNEL(moss_dit_linear_situ_glu, 0))
MOSS_CONTROL(MOSS_GSG_KERNEL(moss_dit_linear_situ_glu_swapped_control, 1))
MOSS_CONTROL(MOSS_GSG_KERNEL(moss_dit_linear_situ_glu_short_k_control, 2))
