// DiT attention on Hopper, warp-specialised (sm_90a only): O = softmax(Q K^T * scale) V over all n
// tokens (bidirectional, no mask), head dim 128, bf16 in/out, fp32 scores and statistics, wgmma
// m64n128k16, the step's pieces from cuda/common/sm90a/wgmma_attention.cuh; the same contract as
// cuda/dit/flash_attention.cu (token-major rows, head h at columns [128h, 128h+128)), with the
// loads moved to a producer warp:
//
// - 384 threads = 3 warpgroups. Warpgroup 0 is the producer: one thread issues TMA tensor copies
//   (cp.async.bulk.tensor, 128-byte swizzle, rows past n zero-filled by the TMA unit) of the Q tile
//   and of K/V tiles into STAGES-deep rings, each stage with a "full" mbarrier (transaction bytes)
//   and an "empty" mbarrier (one arrival per consumer warp). setmaxnreg gives its registers to the
//   consumers (24 / 240).
// - Warpgroups 1 and 2 are consumers of 64 query rows each; they never meet at a CTA-wide barrier:
//   each waits only on the mbarriers of the tiles it reads. Each step issues S(i+1) = Q K(i+1)^T and
//   O += P(i) V(i) together and runs the softmax of S(i+1) under P V (intra-warpgroup overlap).
// - PINGPONG: the two consumers take turns issuing their GEMMs (named barriers 1 and 2, 256 threads)
//   so that one warpgroup's softmax runs while the other's GEMMs are on the tensor cores.
//   Measured on the H200, N = 4224: 0.366 ms with ping-pong, 0.331 ms
//   without (free-running consumers desynchronise by themselves); the kernel built is the one
//   without (`ws_nopp`).
//
// Arguments: three CUtensorMaps (q, k, v: 2-D bf16 {heads*128 columns, n rows}, row stride = the
// tensor's row stride in bytes, box {64, 128}, SWIZZLE_128B, made on the host by
// cuTensorMapEncodeTiled) passed by value, the output (row stride ldo elements), n, scale*log2(e).
// Launch: grid (ceil(n/128), heads), 384 threads, SMEM_BYTES of dynamic shared memory.
#include "sm90a/wgmma_attention.cuh"
#include "sm90a/tma.cuh"
#include "../launch.h"

namespace moss_ws {
using namespace moss_wg;
using namespace moss_tma;
constexpr int THREADS = DIT_FLASH_WS_THREADS;
constexpr int STAGES = 3;
constexpr int BAR_BYTES = 128;  // mbarriers + the scratch words
constexpr int SMEM_BYTES = TILE * (1 + 2 * STAGES) + BAR_BYTES + 1024;
static_assert(SMEM_BYTES == DIT_FLASH_WS_SMEM, "the host launches with DIT_FLASH_WS_SMEM (launch.h)");
static_assert(BM == DIT_FLASH_WS_ROWS && D == DIT_FLASH_HEAD_DIM, "the host's grid: ceil(n / DIT_FLASH_WS_ROWS) x heads");

// One 128 x 128 tile (two column halves) at rows row0.., columns col..
__device__ __forceinline__ void tma_tile(uint32_t dst, const TmaMap* map, int col, int row0, uint32_t bar) {
    mbar_expect_tx(bar, TILE);
    tma_load(dst, map, col, row0, bar);
    tma_load(dst + HALF, map, col + 64, row0, bar);
}
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

template <bool PINGPONG, bool CONTROL>
__device__ __forceinline__ void attn_ws(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, __nv_bfloat16* __restrict__ o,
                                        int n, int ldo, float sl2) {
    extern __shared__ char smem_raw[];
    const uint32_t raw = saddr(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint32_t sq = base, sk = base + TILE, sv = base + TILE * (1 + STAGES);
    // mbarriers: q, full_k[S], full_v[S], empty_k[S], empty_v[S]; then two scratch words
    const uint32_t bars = base + TILE * (1 + 2 * STAGES);
    const uint32_t bar_q = bars;
    auto full_k = [&](int s) { return bars + 8 * (1 + s); };
    auto full_v = [&](int s) { return bars + 8 * (1 + STAGES + s); };
    auto empty_k = [&](int s) { return bars + 8 * (1 + 2 * STAGES + s); };
    auto empty_v = [&](int s) { return bars + 8 * (1 + 3 * STAGES + s); };
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int col = blockIdx.y * D;
    const int m0 = blockIdx.x * BM;
    const int ntiles = (n + BN - 1) / BN;

    if (tid == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_k(s), 1);
            mbar_init(full_v(s), 1);
            mbar_init(empty_k(s), 8);  // one arrival per consumer warp
            mbar_init(empty_v(s), 8);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
            prefetch_map(tq);
            prefetch_map(tk);
            prefetch_map(tv);
            tma_tile(sq, tq, col, m0, bar_q);
            for (int t = 0; t < ntiles; t++) {
                const int s = t % STAGES;
                const uint32_t ph = ((t / STAGES) & 1) ^ 1;  // parity of the round that freed the stage
                if (t >= STAGES) mbar_wait(empty_k(s), ph);
                tma_tile(sk + s * TILE, tk, col, t * BN, full_k(s));
                if (t >= STAGES) mbar_wait(empty_v(s), ph);
                tma_tile(sv + s * TILE, tv, col, t * BN, full_v(s));
            }
        }
        return;
    }

    // ---- consumers: warpgroup c = wg - 1 owns query rows m0 + 64c .. m0 + 64c + 63 ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int c = wg - 1, wtid = tid & 127;
    const uint32_t scratch = bars + 8 * (1 + 4 * STAGES) + 4 * c;  // written, never read
    const uint32_t sqw = sq + c * 64 * 128;
    const bool leader = lane == 0;  // one empty-barrier arrival per warp
    auto wait_k = [&](int t) { mbar_wait(full_k(t % STAGES), (t / STAGES) & 1); };
    auto wait_v = [&](int t) { mbar_wait(full_v(t % STAGES), (t / STAGES) & 1); };
    auto free_k = [&](int t) {
        if (leader) mbar_arrive(empty_k(t % STAGES));
    };
    auto free_v = [&](int t) {
        if (leader) mbar_arrive(empty_v(t % STAGES));
    };
    // ping-pong turns: consumer c issues after named barrier 1 + c, then lets the other go
    auto turn_begin = [&]() {
        if (PINGPONG) named_sync(1 + c);
    };
    auto turn_end = [&]() {
        if (PINGPONG) named_arrive(2 - c);
    };
    if (PINGPONG && c == 1) named_arrive(1);  // consumer 0 goes first

    float acc[64], s[64];
    uint32_t p[32], p2[32];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;

    mbar_wait(bar_q, 0);
    wait_k(0);
    turn_begin();
    wg_fence();
    issue_qk(s, sqw, sk);
    wg_commit();
    turn_end();
    wg_wait<0>();
    pin_all(s);
    free_k(0);
    softmax_step<0>(s, m, l, corr, 0, n, sl2);
    pack_p(p, s);

    // step i: S(i+1) = Q K(i+1)^T and O += P(i) V(i) issued together; the softmax of S(i+1) runs
    // under P V, into the other P array (pc is in flight). No branch between issue and wait.
    auto step = [&](int i, auto mask, uint32_t(&pc)[32], uint32_t(&pn)[32]) {
        wait_k(i + 1);
        wait_v(i);
        turn_begin();
        wg_fence();
        issue_qk(s, sqw, sk + ((i + 1) % STAGES) * TILE);
        wg_commit();
        issue_pv(acc, pc, sv + (i % STAGES) * TILE);
        wg_commit();
        turn_end();
        wg_wait<1>();
        pin_all(s);
        free_k(i + 1);
        softmax_to_p<decltype(mask)::value>(s, pn, m, l, corr, (i + 1) * BN, n, sl2);
        // Keeps the exponentials above the wait for P V: ptxas schedules wgmma.wait_group as early
        // as it may (nothing in registers ties it down; without this it lands before the first exp
        // and the overlap is lost). ptxas does not hoist the wait above an earlier shared store, and
        // this one needs every exp (the row sums).
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scratch), "f"(l[0] + l[1]) : "memory");
        wg_wait<0>();
        pin_all(acc);
        pin_all(pn);
        free_v(i);
        rescale<CONTROL>(acc, corr);
    };
    auto last = [&](uint32_t(&pc)[32]) {
        wait_v(ntiles - 1);
        turn_begin();
        wg_fence();
        issue_pv(acc, pc, sv + ((ntiles - 1) % STAGES) * TILE);
        wg_commit();
        turn_end();
        wg_wait<0>();
        pin_all(acc);
        free_v(ntiles - 1);
    };
    auto tail = [&](int i, uint32_t(&pc)[32], uint32_t(&pn)[32]) {
        if (i + 1 < ntiles) {
            if (n % BN)
                step(i, Mask<2>{}, pc, pn);
            else
                step(i, Mask<1>{}, pc, pn);
            last(pn);
        } else {
            last(pc);
        }
    };
    for (int i = 0;;) {
        if (i + 2 >= ntiles) {
            tail(i, p, p2);
            break;
        }
        step(i++, Mask<1>{}, p, p2);
        if (i + 2 >= ntiles) {
            tail(i, p2, p);
            break;
        }
        step(i++, Mask<1>{}, p2, p);
    }
    // both consumers made the same number of turns; consumer 0 takes consumer 1's last arrival
    if (PINGPONG && c == 0) named_sync(1);

    // Normalise; stage this warpgroup's 64 x 128 bf16 rows in its own rows of the Q tile (only its
    // own GEMMs read them, all complete), 128-byte-swizzled like Q; store rows with 16-byte writes.
    const int g = lane >> 2, t = lane & 3, wrow = c * 64 + (wtid >> 5) * 16 + g;
    char* sm = smem_raw + (base - raw);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float inv = moss_flash::row_inv(l, r);
        const int row = wrow + 8 * r;
#pragma unroll
        for (int i = 0; i < 16; i++)
            *reinterpret_cast<uint32_t*>(sm + (i >> 3) * HALF + row * 128 + (((i & 7) ^ (row & 7)) << 4) + 4 * t) =
                pack_bf16(acc[4 * i + 2 * r] * inv, acc[4 * i + 2 * r + 1] * inv);
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + c) : "memory");
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int idx = wtid + 128 * i, r = c * 64 + (idx >> 4), ch = idx & 15;
        const int row = m0 + r;
        if (row < n)
            *reinterpret_cast<uint4*>(o + (long)row * ldo + col + ch * 8) =
                *reinterpret_cast<const uint4*>(sm + (ch >> 3) * HALF + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
    }
}
}  // namespace moss_ws

#define MOSS_WS_KERNEL(NAME, PINGPONG, CONTROL)                                                                    \
    MOSS_KERNEL void __launch_bounds__(moss_ws::THREADS, 1)                                                         \
        NAME(const __grid_constant__ moss_tma::TmaMap tq, const __grid_constant__ moss_tma::TmaMap tk,               \
             const __grid_constant__ moss_tma::TmaMap tv, __nv_bfloat16* o, int n, int ldo, float scale_log2) {    \
        moss_ws::attn_ws<PINGPONG, CONTROL>(&tq, &tk, &tv, o, n, ldo, scale_log2);                                  \
    }

// Warp-specialised without ping-pong (`ws_nopp`; the ping-pong build `ws` was measured slower and
// deleted), with its planted control (running output not rescaled when the row maximum grows).
MOSS_PRODUCTION(MOSS_WS_KERNEL(moss_dit_flash_attention_ws, false, false))
MOSS_CONTROL(MOSS_WS_KERNEL(moss_dit_flash_attention_ws_control, false, true))
