// DiT attention: O = softmax(Q K^T * scale) V over all n tokens (bidirectional, no mask), head
// dim 128, bf16 Q/K/V/O, fp32 scores, online softmax in fp32 (flash-style: no n x n matrix),
// tensor cores (mma.sync m16n8k16).
//
// Layout: token-major rows; head h occupies columns [128h, 128h+128) of each row; row strides
// ldq/ldk/ldv/ldo in elements (multiples of 8; bases 16-byte aligned), so Q, K, V may be column
// slices of one fused QKV projection. Grid (ceil(n/64), heads), 128 threads, 80 KiB dynamic
// shared memory (Q tile + double-buffered K/V tiles).
//
// Tiles: 64 query rows per block (4 warps x 16 rows), 64 keys per step; the step is
// flash_mma.cuh's (shared tiles [64][128] bf16, 16-byte chunks XOR-swizzled by (row & 7)).
#include "flash_mma.cuh"
#include "launch.h"

namespace moss_attn {
using namespace moss_mma;
constexpr int D = DIT_FLASH_HEAD_DIM;
constexpr int BM = DIT_FLASH_ROWS;
constexpr int BN = 64;
constexpr int THREADS = DIT_FLASH_THREADS;
constexpr int TILE_BYTES = 64 * D * 2;  // 16 KiB
constexpr int SMEM_BYTES_V2 = 4 * TILE_BYTES;  // Q aliased into a K buffer
static_assert(SMEM_BYTES_V2 == DIT_FLASH_SMEM, "the host launches with DIT_FLASH_SMEM (launch.h)");
static_assert(BM == 64 && THREADS == 128, "4 warps of 16 query rows");

__device__ __forceinline__ int swz(int row, int chunk) { return moss_flash::swz<D>(row, chunk); }

// rows row0..row0+63 (zero past n) of columns [col, col+128)
__device__ __forceinline__ void load_tile(char* sm, const __nv_bfloat16* g, long ld, int row0, int n, int col,
                                          int tid) {
#pragma unroll
    for (int i = tid; i < 64 * 16; i += THREADS) {
        int r = i >> 4, c = i & 15;
        int gr = row0 + r;
        bool ok = gr < n;
        const __nv_bfloat16* src = g + (ok ? (long)gr * ld : 0) + col + c * 8;
        cp_async16(sm + swz(r, c), src, ok);
    }
}

// scale_log2 = softmax scale * log2(e).
// QALIAS (the `_v2` kernels): the Q tile lives in the second K buffer — Q is read into registers
// before the first prefetch overwrites it — so the kernel needs 64 KiB of shared memory instead
// of 80 and three blocks fit on an SM (with __launch_bounds__(128, 3): at most 168 registers), not two.
template <bool CONTROL, bool QALIAS = false>
__device__ __forceinline__ void attn_d128(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                          const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ o, int n,
                                          int ldq, int ldk, int ldv, int ldo, float scale_log2) {
    extern __shared__ __align__(128) char smem[];
    char* sq = QALIAS ? smem + TILE_BYTES : smem;
    char* sk = QALIAS ? smem : smem + TILE_BYTES;
    char* sv = QALIAS ? smem + 2 * TILE_BYTES : smem + 3 * TILE_BYTES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int col = blockIdx.y * D;
    const int m0 = blockIdx.x * BM;

    load_tile(sq, q, ldq, m0, n, col, tid);
    load_tile(sk, k, ldk, 0, n, col, tid);
    load_tile(sv, v, ldv, 0, n, col, tid);
    cp_async_commit();

    unsigned qf[8][4];
    if (QALIAS) {
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) ldsm_x4(qf[kk], sq + swz(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
        __syncthreads();  // every warp has its Q before tile 1 overwrites it
    }
    float acc[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};

    const int ntiles = (n + BN - 1) / BN;
    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1;
        if (j + 1 < ntiles) {
            load_tile(sk + (buf ^ 1) * TILE_BYTES, k, ldk, (j + 1) * BN, n, col, tid);
            load_tile(sv + (buf ^ 1) * TILE_BYTES, v, ldv, (j + 1) * BN, n, col, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (!QALIAS && j == 0) {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) ldsm_x4(qf[kk], sq + swz(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
        }
        moss_flash::tile_step<D, BN, false, !CONTROL>(
            acc, mrow, lrow, sk + buf * TILE_BYTES, sv + buf * TILE_BYTES, scale_log2,
            [&](int kk, unsigned(&a)[4]) {
#pragma unroll
                for (int e = 0; e < 4; e++) a[e] = qf[kk][e];
            },
            [&](float(&s)[BN / 8][4]) {
                // keys past n do not exist
                if ((j + 1) * BN > n) {
#pragma unroll
                    for (int nt = 0; nt < 8; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (j * BN + nt * 8 + (lane & 3) * 2 + (e & 1) >= n) s[nt][e] = -INFINITY;
                }
            });
        __syncthreads();
    }
    // normalise and store
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float inv = moss_flash::row_inv(lrow, r);
        const int row = m0 + warp * 16 + (lane >> 2) + r * 8;
        if (row < n) moss_flash::store_row<D>(o + (long)row * ldo + col + (lane & 3) * 2, acc, r, inv);
    }
}
}  // namespace moss_attn

// The kernel with Q aliased into the second K buffer (64 KiB of dynamic shared memory; the
// variant without the alias, `v1`, was deleted as slower), and its planted control for `moss check`
// (forgets to rescale the running output when the row maximum grows; the same gate must reject it).
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(DIT_FLASH_THREADS, 3) moss_dit_flash_attention(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                               const __nv_bfloat16* v, __nv_bfloat16* o, int n,
                                                               int ldq, int ldk, int ldv, int ldo, float scale_log2) {
    moss_attn::attn_d128<false, true>(q, k, v, o, n, ldq, ldk, ldv, ldo, scale_log2);
}
#endif

#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(DIT_FLASH_THREADS, 3) moss_dit_flash_attention_control(const __nv_bfloat16* q,
                                                                       const __nv_bfloat16* k,
                                                                       const __nv_bfloat16* v, __nv_bfloat16* o,
                                                                       int n, int ldq, int ldk, int ldv, int ldo,
                                                                       float scale_log2) {
    moss_attn::attn_d128<true, true>(q, k, v, o, n, ldq, ldk, ldv, ldo, scale_log2);
}
#endif
