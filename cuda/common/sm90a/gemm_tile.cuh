// The Hopper GEMM mainloop of our fused-epilogue linears (sm_90a only): u = x · Wᵀ for x [M, K]
// bf16, W [Nw, K] bf16, in tiles of 128 x rows by 256 product columns, with the tile's products
// handed to an epilogue functor in registers (u is never written by this header). Used by
// dit/sm90a/linear_situ_glu.cu (SiTU-GLU) and dit/sm90a/linear_qkv_norm_rope.cu (per-head
// RMSNorm + RoPE).
//
// - 384 threads = 3 warpgroups (the CUTLASS "warp-specialised cooperative" shape). Warpgroup 0 is
//   the producer: one thread issues TMA box copies (cp.async.bulk.tensor, 128-byte swizzle; x rows
//   past M are zeros) into a STAGES-deep ring; each stage has a "full" mbarrier (transaction bytes)
//   and an "empty" one (one arrival per consumer warp). setmaxnreg gives its registers to the
//   consumers (40 / 232).
// - A stage holds the x tile (128 rows x 64 K) and two boxes of 128 W rows (the `Tiles` policy
//   says which: `w_row0(n0)`, `w_row1(n0)` for column tile n0 / 128), together one 256-row K-major
//   operand (8-row groups 1024 bytes apart).
// - Warpgroups 1 and 2 are consumers of 64 rows each of the same tile; they share the W tiles.
//   Per K step of 64: four wgmma m64n256k16 (x rows from shared memory, K-major; W rows the same:
//   x · Wᵀ is a K-major x K-major product). One K step's products stay in flight while the next is
//   issued; a stage goes back to the producer once the products reading it are done
//   (wgmma.wait_group 1).
// - At the end of a tile the consumer warpgroup calls `epi(acc, m0, n0, c, wg_rows)`: acc the
//   m64n256 accumulator (acc[4i + 2r + e] is row 16·warp + g + 8r of the warpgroup's 64, product
//   column 8i + 2t + e; warp = (tid & 127) >> 5, g = lane >> 2, t = lane & 3), m0 the tile's first
//   x row, n0 = 128 · the column tile, c the warpgroup (rows m0 + 64c ..), wg_rows its WG_BYTES
//   of shared staging (free again once the warpgroup's threads have synchronised past its stores).
//   With EPI_WARPS (the SiTU kernels) the epilogue moves to the producer warpgroup's spare warps,
//   beside the next tile's products (see gemm_tiles).
// - Clusters of two CTAs (`__cluster_dims__(CLUSTER)` on the kernels) on the same x rows and two
//   neighbouring column tiles: each CTA loads one 64-row half of the stage's x tile and multicasts
//   it into both CTAs (the same offset, completing on both CTAs' "full" barriers), and its own W
//   boxes. A stage's "empty" barrier therefore takes the releases of both CTAs' consumer warps
//   (16 arrivals: each warp arrives on its own CTA's barrier and on the peer's), since either
//   producer's next x half lands in both. L2 → SM traffic a K step: 8 + 32 KiB a CTA instead of
//   16 + 32 (without: ~640 TFLOP/s bf16, ~1180 fp8 at the DiT's shapes on the H200, both ~7 TB/s
//   of that traffic).
// - Persistent: one block an SM (the host's grid, even), pairs of tiles in a loop (pair p =
//   blockIdx.x / 2, += gridDim.x / 2; both CTAs of a cluster walk the same pairs): the producer
//   runs ahead into the next tile while the consumers store this one. The ring's position runs on
//   across tiles. Pair p is rows (p % ⌈M/128⌉), column tiles 2·(p / ⌈M/128⌉) + rank: the blocks
//   running together share a few W tiles in L2. With an odd count of column tiles, the last
//   pairs' rank-1 tile lies past the columns: its CTA still loads and multiplies (W rows past the
//   tensor are zeros) for its x half, and stores nothing.
//
// Arguments: two CUtensorMaps (x: {K, M}, box {64, 64}: half a tile's rows; W: {K, Nw}, box
// {64, 128}; bf16, or with FP8 e4m3 codes (as bytes), box width 128; SWIZZLE_128B), M, the column
// tiles, K (a multiple of 64, FP8 128).
// SHORT_K (check image): the last K step's products left out.
#pragma once
#ifndef GEMM_EMU  // tools/gemm_tile_emu.cpp compiles the kernels on the host, with emulated primitives
#include "wgmma.cuh"
#include "tma.cuh"
#endif

namespace moss_gemm {
using namespace moss_wg;
using namespace moss_tma;
constexpr int BM = 128;               // x rows a tile
constexpr int BK = 64;                // K a stage: 128 bytes of bf16, the swizzle's row
constexpr int THREADS = 384;
constexpr int CLUSTER = 2;            // CTAs a cluster: the x tile's two halves
constexpr int X_BOX_ROWS = BM / CLUSTER;  // the host's x map box: half a tile's rows
constexpr int X_BYTES = BM * BK * 2;  // 16 KiB: [128 rows][128 B]
constexpr int W_BYTES = 128 * BK * 2; // 16 KiB: one box of 128 W rows
constexpr int STAGE_BYTES = X_BYTES + 2 * W_BYTES;
constexpr int BAR_BYTES = 64;         // 2 x STAGES mbarriers
constexpr int STAGES = 4;
constexpr int WG_BYTES = 64 * 256;    // a consumer's staging: 64 rows of 256 bytes (128 bf16)
constexpr int SMEM = STAGES * STAGE_BYTES + 2 * WG_BYTES + BAR_BYTES + 1024;
static_assert(16 * STAGES <= BAR_BYTES, "the mbarriers fit their bytes");
// EPI_WARPS (see gemm_tiles): three stages, the tile's 128 x 128 staged words (64 KiB), the ring's
// mbarriers and the staging's two.
constexpr int EPI_STAGES = 3;
constexpr int EPI_STAGING = 128 * 128 * 4;
constexpr int EPI_WARPS_N = 3;        // the producer warpgroup's warps 1..3
constexpr int SMEM_EPI = EPI_STAGES * STAGE_BYTES + EPI_STAGING + BAR_BYTES + 1024;
static_assert(16 * EPI_STAGES + 16 <= BAR_BYTES, "the mbarriers fit their bytes");
static_assert(X_BYTES % 1024 == 0 && W_BYTES % 1024 == 0, "every box starts 1024-byte aligned (the swizzle's period)");

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
#ifndef GEMM_EMU
__device__ __forceinline__ void named_sync128(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
#endif

// FP8: x and W are e4m3 codes (`--precision fp8`), a stage 128 codes of K (the same 128-byte
// rows), four wgmma m64n256k32 a K step; the scales are the epilogue's.
// EPI_WARPS: the epilogue runs beside the next tile's products. At the end of a tile each consumer
// thread calls `epi.stage(acc, m0, n0, c, staging)`, which writes one 32-bit word an output
// element into the 64 KiB staging (what the epilogue reads of the products, e.g. SiTU's h and g
// as bf16), and goes on to the next tile; warps 1..3 of the producer warpgroup, otherwise idle,
// call `epi.drain(m0, n0, w, staging)` (w = 0..2) for the stored tiles in the same order. Two
// mbarriers hand the staging over: "staged" (256 arrivals, every consumer thread after its
// words) and "freed" (96, every epilogue thread after its reads); the consumers wait for "freed"
// before staging the next tile. The ring has EPI_STAGES stages to make room (SMEM_EPI bytes).
template <bool SHORT_K, class Tiles, class Epi, bool FP8 = false, bool EPI_WARPS = false>
__device__ __forceinline__ void gemm_tiles(const TmaMap* tx, const TmaMap* tw, int m, int col_tiles, int k,
                                           const Tiles& tl, Epi& epi) {
    constexpr int BK_ELEMS = FP8 ? 2 * BK : BK;  // K elements a stage: 128 bytes either way
    constexpr int STAGES = EPI_WARPS ? EPI_STAGES : moss_gemm::STAGES;
    constexpr int ROWS_BYTES = EPI_WARPS ? EPI_STAGING : 2 * WG_BYTES;
#ifdef GEMM_EMU
    char* smem_raw = gemm_emu_smem();
#else
    extern __shared__ char smem_raw[];
#endif
    const uint32_t raw = saddr(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    // stage s at base + s·STAGE_BYTES: the x tile (128 rows), then W's box 0, then its box 1.
    const uint32_t rows_at = base + STAGES * STAGE_BYTES;  // consumer c's shared rows at + c·WG_BYTES
    const uint32_t bars = rows_at + ROWS_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const uint32_t staged = bars + 16 * STAGES, freed = staged + 8;  // EPI_WARPS
    char* staging = smem_raw + (rows_at - raw);
    const int tid = threadIdx.x, wg = tid >> 7;
    const int mt = (m + BM - 1) / BM, pairs = mt * ((col_tiles + 1) / 2), nk = k / BK_ELEMS;
    // pair p's rows (its first) and this CTA's column tile; the rank is blockIdx.x % CLUSTER
    // (%cluster_ctarank: a 1-D grid's clusters are consecutive blocks; read where used, as a
    // register across the tile it made the q|k|v epilogue spill)
    auto row0 = [&](int pair) { return (pair % mt) * BM; };
    auto col_tile = [&](int pair) { return 2 * (pair / mt) + (int)(blockIdx.x % CLUSTER); };

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), 8 * CLUSTER);  // one arrival per consumer warp of each CTA
        }
        if (EPI_WARPS) {
            mbar_init(staged, 256);
            mbar_init(freed, 32 * EPI_WARPS_N);
        }
        mbar_init_fence();
    }
    cluster_sync();  // both CTAs' barriers initialised before any multicast or remote arrival

    if (wg == 0) {
        // ---- producer: k-step `it` (counted over all of this block's tiles) fills stage it % STAGES ----
        regs_dec<40>();
        if (tid == 0) {
            prefetch_map(tx);
            prefetch_map(tw);
            int it = 0;
            const int rank = (int)(blockIdx.x % CLUSTER);
            for (int pair = blockIdx.x / CLUSTER; pair < pairs; pair += gridDim.x / CLUSTER) {
                const int m0 = row0(pair), n0 = col_tile(pair) * 128;
                for (int kt = 0; kt < nk; kt++, it++) {
                    const int s = it % STAGES;
                    // both CTAs' consumers' release of round it / STAGES − 1 of this stage
                    if (it >= STAGES) mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
                    const uint32_t st = base + s * STAGE_BYTES;
                    mbar_expect_tx(full(s), STAGE_BYTES);  // both x halves (ours and the peer's) and our W
                    tma_load_multicast(st + rank * (X_BYTES / CLUSTER), tx, kt * BK_ELEMS, m0 + rank * X_BOX_ROWS, full(s),
                                       (uint16_t)((1 << CLUSTER) - 1));
                    tma_load(st + X_BYTES, tw, kt * BK_ELEMS, tl.w_row0(n0), full(s));
                    tma_load(st + X_BYTES + W_BYTES, tw, kt * BK_ELEMS, tl.w_row1(n0), full(s));
                }
            }
        }
        if constexpr (EPI_WARPS) {
            if (tid >= 32) {
                // ---- epilogue warps 1..3: the stored tiles, in the consumers' order ----
                int n = 0;
                for (int pair = blockIdx.x / CLUSTER; pair < pairs; pair += gridDim.x / CLUSTER) {
                    const int ct = col_tile(pair);
                    if (ct >= col_tiles) continue;
                    mbar_wait(staged, n & 1);
                    epi.drain(row0(pair), ct * 128, tid / 32 - 1, staging);
                    mbar_arrive(freed);
                    n++;
                }
            }
        }
        cluster_sync();  // the consumers' closing barrier: every thread of both CTAs takes part
        return;
    }

    // ---- consumers: warpgroup c = wg − 1 owns rows m0 + 64c .. m0 + 64c + 63 of each tile ----
    regs_inc<232>();
    const int c = wg - 1, lane = tid & 31;
    // a warp's release of stage s: lane r arrives on CTA r's empty barrier
    auto release = [&](int s) {
        if (lane < CLUSTER) mbar_arrive_cluster(empty(s), lane);
    };
    char* wg_rows = staging + c * WG_BYTES;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    int it = 0, n = 0;  // n: EPI_WARPS' stored tiles
    for (int pair = blockIdx.x / CLUSTER; pair < pairs; pair += gridDim.x / CLUSTER) {
        const int m0 = row0(pair), ct = col_tile(pair), n0 = ct * 128;
        const bool store = ct < col_tiles;  // the odd column tile past the columns stores nothing
        for (int kt = 0; kt < nk; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(full(s), (it / STAGES) & 1);
            const uint32_t st = base + s * STAGE_BYTES;
            wg_fence();
            if (!SHORT_K || kt + 1 < nk) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {  // 32 bytes along the swizzled row: 16 bf16, 32 e4m3
                    const uint64_t da = desc(st + c * 64 * 128 + kk * 32, 16, 1024), db = desc(st + X_BYTES + kk * 32, 16, 1024);
                    if (FP8)
                        wgmma_ss_n256_e4m3(acc, da, db, kt > 0 || kk > 0);
                    else
                        wgmma_ss_n256(acc, da, db, kt > 0 || kk > 0);
                }
            }
            wg_commit();
            // the previous k-step's products are done: its stage goes back to the producer
            wg_wait<1>();
            if (kt > 0) release((it - 1) % STAGES);
        }
        wg_wait<0>();
        pin_all(acc);
        release((it - 1) % STAGES);
        if (store) {
            if constexpr (EPI_WARPS) {
                if (n > 0) mbar_wait(freed, (n - 1) & 1);  // the epilogue warps have read the last tile
                epi.stage(acc, m0, n0, c, staging);
                mbar_arrive(staged);
                n++;
            } else {
                epi(acc, m0, n0, c, wg_rows);
            }
        }
    }
    cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
}

// Rows m0 + 64c + [0, 64) of this warpgroup's staging (rows of 128 bf16, 16-byte chunk i of row
// rr at chunk index i ^ (rr & 7)) stored to out[row, n0 .. n0 + 128) (row stride ld), rows past M
// skipped: 16-byte coalesced stores.
__device__ __forceinline__ void store_staged(const char* wg_rows, __nv_bfloat16* __restrict__ out, int ld, int m, int m0,
                                             int c, int n0, int wtid) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int idx = wtid + 128 * j, rr = idx >> 4, ch = idx & 15;
        const int row = m0 + 64 * c + rr;
        if (row < m)
            *reinterpret_cast<uint4*>(out + (long)row * ld + n0 + ch * 8) =
                *reinterpret_cast<const uint4*>(wg_rows + rr * 256 + ((ch ^ (rr & 7)) << 4));
    }
}
}  // namespace moss_gemm
