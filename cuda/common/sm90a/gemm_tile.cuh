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
// - Persistent: one block an SM (the host's grid), tiles in a loop (tile = blockIdx.x,
//   += gridDim.x): the producer runs ahead into the next tile while the consumers store this one.
//   The ring's position runs on across tiles. Tile t is rows (t % ⌈M/128⌉), columns (t / ⌈M/128⌉):
//   the blocks running together share a few W tiles in L2.
//
// Arguments: two CUtensorMaps (x: {K, M}, W: {K, Nw}; bf16, box {64, 128}, or with FP8 e4m3 codes
// (as bytes), box {128, 128}; SWIZZLE_128B), M, the column tiles, K (a multiple of 64, FP8 128).
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
constexpr int X_BYTES = BM * BK * 2;  // 16 KiB: [128 rows][128 B]
constexpr int W_BYTES = 128 * BK * 2; // 16 KiB: one box of 128 W rows
constexpr int STAGE_BYTES = X_BYTES + 2 * W_BYTES;
constexpr int BAR_BYTES = 64;         // 2 x STAGES mbarriers
constexpr int STAGES = 4;
constexpr int WG_BYTES = 64 * 256;    // a consumer's staging: 64 rows of 256 bytes (128 bf16)
constexpr int SMEM = STAGES * STAGE_BYTES + 2 * WG_BYTES + BAR_BYTES + 1024;
static_assert(16 * STAGES <= BAR_BYTES, "the mbarriers fit their bytes");
static_assert(X_BYTES % 1024 == 0 && W_BYTES % 1024 == 0, "every box starts 1024-byte aligned (the swizzle's period)");

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
#ifndef GEMM_EMU
__device__ __forceinline__ void named_sync128(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
#endif

// FP8: x and W are e4m3 codes (`--precision fp8`), a stage 128 codes of K (the same 128-byte
// rows), four wgmma m64n256k32 a K step; the scales are the epilogue's.
template <bool SHORT_K, class Tiles, class Epi, bool FP8 = false>
__device__ __forceinline__ void gemm_tiles(const TmaMap* tx, const TmaMap* tw, int m, int col_tiles, int k,
                                           const Tiles& tl, Epi& epi) {
    constexpr int BK_ELEMS = FP8 ? 2 * BK : BK;  // K elements a stage: 128 bytes either way
#ifdef GEMM_EMU
    char* smem_raw = gemm_emu_smem();
#else
    extern __shared__ char smem_raw[];
#endif
    const uint32_t raw = saddr(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    // stage s at base + s·STAGE_BYTES: the x tile (128 rows), then W's box 0, then its box 1.
    const uint32_t rows_at = base + STAGES * STAGE_BYTES;  // consumer c's shared rows at + c·WG_BYTES
    const uint32_t bars = rows_at + 2 * WG_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const int tid = threadIdx.x, wg = tid >> 7;
    const int mt = (m + BM - 1) / BM, tiles = mt * col_tiles, nk = k / BK_ELEMS;

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
        regs_dec<40>();
        if (tid == 0) {
            prefetch_map(tx);
            prefetch_map(tw);
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % mt) * BM, n0 = (tile / mt) * 128;
                for (int kt = 0; kt < nk; kt++, it++) {
                    const int s = it % STAGES;
                    // the consumers' release of round it / STAGES − 1 of this stage
                    if (it >= STAGES) mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
                    const uint32_t st = base + s * STAGE_BYTES;
                    mbar_expect_tx(full(s), STAGE_BYTES);
                    tma_load(st, tx, kt * BK_ELEMS, m0, full(s));
                    tma_load(st + X_BYTES, tw, kt * BK_ELEMS, tl.w_row0(n0), full(s));
                    tma_load(st + X_BYTES + W_BYTES, tw, kt * BK_ELEMS, tl.w_row1(n0), full(s));
                }
            }
        }
        return;
    }

    // ---- consumers: warpgroup c = wg − 1 owns rows m0 + 64c .. m0 + 64c + 63 of each tile ----
    regs_inc<232>();
    const int c = wg - 1, lane = tid & 31;
    const bool leader = lane == 0;  // one empty-barrier arrival per warp
    char* wg_rows = smem_raw + (rows_at - raw) + c * WG_BYTES;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int m0 = (tile % mt) * BM, n0 = (tile / mt) * 128;
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
            if (kt > 0 && leader) mbar_arrive(empty((it - 1) % STAGES));
        }
        wg_wait<0>();
        pin_all(acc);
        if (leader) mbar_arrive(empty((it - 1) % STAGES));
        epi(acc, m0, n0, c, wg_rows);
    }
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
