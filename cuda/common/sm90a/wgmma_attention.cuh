// DiT attention on Hopper (sm_90a only; built as its own cubin, loaded on compute capability 9.0):
// O = softmax(Q K^T * scale) V over all n tokens (bidirectional, no mask), head dim 128, bf16
// Q/K/V/O, fp32 scores and softmax statistics, with the warpgroup tensor-core instructions
// (wgmma.mma_async m64n128k16, fp32 accumulate).
//
// Same contract as cuda/dit/flash_attention.cu: token-major rows, head h at columns [128h, 128h+128), row
// strides ldq/ldk/ldv/ldo in elements (multiples of 8, bases 16-byte aligned), so Q/K/V may be column
// slices of one fused QKV projection. scale_log2 = softmax scale * log2(e).
//
// Launch: grid (ceil(n/128), heads), 256 threads (two warpgroups of 64 query rows each), SMEM_BYTES
// of dynamic shared memory. Tiles of 128 rows x 128 columns are stored as two column halves of
// [128 rows][64] bf16 (128-byte rows) with the 16-byte chunk index XOR-ed with (row & 7): the
// wgmma 128-byte-swizzle layout. Q and K are K-major operands; V is read N-major (transpose bit).
// Keys come in steps of 128 (S = Q K^T per warpgroup: 64 x 128 fp32 in registers); P is rounded
// to bf16 in registers and is the register A operand of O += P V. K/V tiles are copied with
// cp.async into 3-stage rings, two steps ahead of use.
//
// OVERLAP: the next step's S = Q K^T and this step's O += P V are issued together; the next
// step's exponentials run while the tensor cores do P V (one S and one P set in flight).
#pragma once  // the helpers of dit/sm90a/flash_attention_ws.cu and encoder/sm90a/causal_flash_attention_wgmma.cu
#include "sm90a/wgmma.cuh"

namespace moss_wg {
constexpr int D = 128;
constexpr int BM = 128;  // query rows per block
constexpr int BN = 128;  // keys per step
constexpr int THREADS = 256;
constexpr int STAGES = 3;
constexpr int TILE = 128 * D * 2;  // 32 KiB
constexpr int HALF = 128 * 128;    // bytes of one column half of a tile

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// d += A * B with A in registers (the m64k16 bf16 fragment: 4 x bf16x2 per thread) and B in shared
// memory, N-major (transpose bit set).
__device__ __forceinline__ void wgmma_rs_nmajor(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MOSS_WG_R64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : MOSS_WG_D64(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// Rows row0..row0+127 (zero past n) of columns [col, col+128) into a swizzled tile at `s`.
// Thread tid copies chunk (tid & 15) of rows (tid >> 4) + 16 i.
__device__ __forceinline__ void load_tile(uint32_t s, const __nv_bfloat16* g, int ld, int row0, int n, int col, int tid) {
    const int r0 = tid >> 4, c = tid & 15;
    const uint32_t dst = s + (c >> 3) * HALF + r0 * 128 + (((c & 7) ^ (r0 & 7)) << 4);
    const __nv_bfloat16* src = g + (long)(row0 + r0) * ld + col + c * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const bool ok = row0 + r0 + 16 * i < n;
        cp16(dst + i * 2048, ok ? src + (long)(16 * i) * ld : g, ok);
    }
}

// S = Q K^T for this warpgroup's 64 rows (Q at sq: its rows in both column halves) and 128 keys.
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t sq, uint32_t sk) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t off = (kk >> 2) * HALF + (kk & 3) * 32;
        wgmma_ss(s, desc(sq + off, 16, 1024), desc(sk + off, 16, 1024), kk > 0);
    }
}
// O += P V over 128 keys (V tile at sv, read N-major: 64-column halves HALF apart, 8-key groups 1024 apart).
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&p)[32], uint32_t sv) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma_rs_nmajor(o, a, desc(sv + kk * 2048, HALF, 1024));
    }
}

// Online softmax over one step's scores (rows g and g+8 of the thread's warp: s[4i + 2r + e] is row
// g + 8r, key key0 + 8i + 2t + e). Scores become unnormalised probabilities in place; m (scaled
// by log2 e) and l (this thread's partial row sums) are updated; corr is the factor for O.
// MASK: 0 = mask when the step runs past n (a run-time branch), 1 = never, 2 = always (no branch:
// ptxas ends a wgmma pipeline stage at a branch join, so the overlapped loop must not branch).
template <int MASK>
__device__ __forceinline__ void softmax_step(float (&s)[64], float (&m)[2], float (&l)[2], float (&corr)[2], int key0,
                                             int n, float sl2) {
    if (MASK == 2 || (MASK == 0 && key0 + BN > n)) {
        const int t = threadIdx.x & 3;
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + 8 * i + 2 * t + (e & 1) >= n) s[4 * i + e] = -INFINITY;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float mnew = fmaxf(m[r], mx * sl2);
        corr[r] = ex2(m[r] - mnew);
        m[r] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float p0 = ex2(fmaf(s[4 * i + 2 * r], sl2, -mnew));
            const float p1 = ex2(fmaf(s[4 * i + 2 * r + 1], sl2, -mnew));
            s[4 * i + 2 * r] = p0;
            s[4 * i + 2 * r + 1] = p1;
            sum += p0 + p1;
        }
        l[r] = l[r] * corr[r] + sum;
    }
}

// The same online softmax for the overlapped loop, reading s without writing it (ptxas waits for
// every wgmma in flight before an accumulator register is written) and writing the bf16
// probabilities straight into pn (the next P).
template <int MASK>
__device__ __forceinline__ void softmax_to_p(const float (&s)[64], uint32_t (&pn)[32], float (&m)[2], float (&l)[2],
                                             float (&corr)[2], int key0, int n, float sl2) {
    const int t = threadIdx.x & 3;
    auto val = [&](int i, int e) -> float {
        if (MASK == 2) return key0 + 8 * i + 2 * t + (e & 1) >= n ? -INFINITY : s[4 * i + e];
        return s[4 * i + e];
    };
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; i++) mx = fmaxf(mx, fmaxf(val(i, 2 * r), val(i, 2 * r + 1)));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float mnew = fmaxf(m[r], mx * sl2);
        corr[r] = ex2(m[r] - mnew);
        m[r] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float p0 = ex2(fmaf(val(i, 2 * r), sl2, -mnew));
            const float p1 = ex2(fmaf(val(i, 2 * r + 1), sl2, -mnew));
            sum += p0 + p1;
            // s[4i + 2r + e]: n-tile i (keys 8i..8i+7), row g + 8r; A fragment register 4(i/2) + r + 2(i%2)
            pn[4 * (i >> 1) + r + 2 * (i & 1)] = pack_bf16(p0, p1);
        }
        l[r] = l[r] * corr[r] + sum;
    }
}

template <int V>
struct Mask {
    static constexpr int value = V;
};

template <bool CONTROL>
__device__ __forceinline__ void rescale(float (&o)[64], const float (&corr)[2]) {
    if (!CONTROL) {  // the planted control forgets to rescale the running output
#pragma unroll
        for (int i = 0; i < 16; i++) {
            o[4 * i] *= corr[0];
            o[4 * i + 1] *= corr[0];
            o[4 * i + 2] *= corr[1];
            o[4 * i + 3] *= corr[1];
        }
    }
}

// P (bf16 A fragments, 8 steps of 16 keys) from the probabilities in s.
__device__ __forceinline__ void pack_p(uint32_t (&p)[32], const float (&s)[64]) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        p[4 * kk] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
        p[4 * kk + 1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        p[4 * kk + 2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        p[4 * kk + 3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

template <bool OVERLAP, bool CONTROL>
__device__ __forceinline__ void attn(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                     const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ o, int n, int ldq,
                                     int ldk, int ldv, int ldo, float sl2) {
    extern __shared__ char smem_raw[];
    const uint32_t raw = saddr(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint32_t sq = base, sk = base + TILE, sv = base + TILE * (1 + STAGES);
    const uint32_t scratch = base + TILE * (1 + 2 * STAGES);  // a word of the alignment slack: written, never read
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, lane = tid & 31;
    const int col = blockIdx.y * D;
    const int m0 = blockIdx.x * BM;
    const int ntiles = (n + BN - 1) / BN;
    // K runs one step ahead of V in the overlapped schedule.
    constexpr int LK = OVERLAP ? 3 : 2;
    auto load_k = [&](int t) {
        if (t < ntiles) load_tile(sk + (t % STAGES) * TILE, k, ldk, t * BN, n, col, tid);
    };
    auto load_v = [&](int t) {
        if (t < ntiles) load_tile(sv + (t % STAGES) * TILE, v, ldv, t * BN, n, col, tid);
    };
    // Copy groups: G(-2) = {Q, K 0..LK-2, V0}, G(-1) = {K LK-1, V1}, G(i) = {K i+LK, V i+2}, issued
    // at step i into the buffers of tiles i+LK-3 / i-1, which step i-1 finished with.
    load_tile(sq, q, ldq, m0, n, col, tid);
    for (int t = 0; t <= LK - 2; t++) load_k(t);
    load_v(0);
    cp_commit();
    load_k(LK - 1);
    load_v(1);
    cp_commit();

    const uint32_t sqw = sq + wg * 64 * 128;  // this warpgroup's 64 rows inside each column half
    float acc[64], s[64];
    uint32_t p[32];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;

    if (OVERLAP) {
        cp_wait<1>();
        fence_proxy_async();
        __syncthreads();
        wg_fence();
        issue_qk(s, sqw, sk);
        wg_commit();
        wg_wait<0>();
        pin_all(s);
        softmax_step<0>(s, m, l, corr, 0, n, sl2);
        pack_p(p, s);
        // One step: S(i+1) = Q K(i+1)^T and O += P(i) V(i) issued together; the softmax of S(i+1)
        // runs while P V is on the tensor cores, into the other P array (pc is in flight: no
        // register of it may be written before the wait). No branch between issue and wait.
        auto step = [&](int i, auto mask, uint32_t(&pc)[32], uint32_t(&pn)[32]) {
            cp_wait<1>();
            fence_proxy_async();
            __syncthreads();
            wg_fence();
            issue_qk(s, sqw, sk + ((i + 1) % STAGES) * TILE);
            wg_commit();
            issue_pv(acc, pc, sv + (i % STAGES) * TILE);
            wg_commit();
            // the copies for later steps go out under the GEMMs (their buffers are not read by them)
            load_k(i + LK);
            load_v(i + 2);
            cp_commit();
            wg_wait<1>();
            pin_all(s);
            softmax_to_p<decltype(mask)::value>(s, pn, m, l, corr, (i + 1) * BN, n, sl2);
            // Keep the exponentials above the wait: ptxas schedules wgmma.wait_group as early as
            // it may (nothing in registers ties it down; without this it lands before the first
            // exp and the overlap is lost, as measured: 0.532 ms vs 0.535 ms serial). ptxas does
            // not hoist the wait above an earlier shared store, and this one needs every exp (the
            // row sums).
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scratch), "f"(l[0] + l[1]) : "memory");
            wg_wait<0>();
            pin_all(acc);
            pin_all(pn);
            rescale<CONTROL>(acc, corr);
        };
        // the last step: P V only
        auto last = [&](uint32_t(&pc)[32]) {
            cp_wait<1>();
            fence_proxy_async();
            __syncthreads();
            wg_fence();
            issue_pv(acc, pc, sv + ((ntiles - 1) % STAGES) * TILE);
            wg_commit();
            wg_wait<0>();
            pin_all(acc);
        };
        // steps 0 .. ntiles-3 bring whole key tiles; step ntiles-2 brings the last (maybe partial) one
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
        uint32_t p2[32];
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
    } else {
        for (int i = 0; i < ntiles; i++) {
            cp_wait<1>();
            fence_proxy_async();
            __syncthreads();
            load_k(i + LK);
            load_v(i + 2);
            cp_commit();
            wg_fence();
            issue_qk(s, sqw, sk + (i % STAGES) * TILE);
            wg_commit();
            wg_wait<0>();
            pin_all(s);
            softmax_step<0>(s, m, l, corr, i * BN, n, sl2);
            rescale<CONTROL>(acc, corr);
            pack_p(p, s);
            wg_fence();
            issue_pv(acc, p, sv + (i % STAGES) * TILE);
            wg_commit();
            wg_wait<0>();
            pin_all(acc);
        }
    }

    // Normalise, stage this warpgroup's 64 x 128 bf16 rows in the (now unused) Q tile, store rows
    // of 256 bytes with 16-byte writes.
    __syncthreads();  // every warpgroup is done reading Q
    char* st = smem_raw + (base - raw) + wg * (64 * 256);
    const int g = lane >> 2, t = lane & 3, wrow = (wtid >> 5) * 16 + g;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        const float inv = 1.f / sum;
        const int row = wrow + 8 * r;
#pragma unroll
        for (int i = 0; i < 16; i++)
            *reinterpret_cast<uint32_t*>(st + row * 256 + ((i ^ (row & 7)) << 4) + 4 * t) =
                pack_bf16(acc[4 * i + 2 * r] * inv, acc[4 * i + 2 * r + 1] * inv);
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int idx = wtid + 128 * i, r = idx >> 4, c = idx & 15;
        const int row = m0 + wg * 64 + r;
        if (row < n)
            *reinterpret_cast<uint4*>(o + (long)row * ldo + col + c * 8) =
                *reinterpret_cast<const uint4*>(st + r * 256 + ((c ^ (r & 7)) << 4));
    }
}
}  // namespace moss_wg

#define MOSS_WG_KERNEL(NAME, OVERLAP, CONTROL)                                                                      \
    MOSS_KERNEL void __launch_bounds__(moss_wg::THREADS, 1)                                                                     \
        NAME(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, int n, int ldq, \
             int ldk, int ldv, int ldo, float scale_log2) {                                                        \
        moss_wg::attn<OVERLAP, CONTROL>(q, k, v, o, n, ldq, ldk, ldv, ldo, scale_log2);                            \
    }

// No kernel of its own any more (the `wgmma` / `wgmma_serial` DiT kernels were measured slower
// than the warp-specialised one and deleted): its helpers serve dit/sm90a/flash_attention_ws.cu and
// encoder/sm90a/causal_flash_attention_wgmma.cu.
