// The Hopper flash-attention pieces (sm_90a only) shared by the DiT's warp-specialised kernel
// (cuda/dit/sm90a/flash_attention_ws.cu) and the encoder's causal kernel
// (cuda/encoder/sm90a/causal_flash_attention_wgmma.cu): cp.async copies, the ex2 exponential, the
// register-A wgmma of O += P V, and the DiT's step over 128 keys (head dim 128): S = Q K^T, the
// online softmax (fp32 scores and statistics, base 2, P rounded to bf16 in registers as the A
// operand of O += P V), the rescale of O and the packing of P.
//
// DiT tiles of 128 rows x 128 columns are stored as two column halves of [128 rows][64] bf16
// (128-byte rows) with the 16-byte chunk index XOR-ed with (row & 7): the wgmma 128-byte-swizzle
// layout. Q and K are K-major operands; V is read N-major (transpose bit). A warpgroup owns 64
// query rows; S = Q K^T per warpgroup is 64 x 128 fp32 in registers.
#pragma once
#include "flash_mma.cuh"
#include "sm90a/wgmma.cuh"

namespace moss_wg {
constexpr int D = 128;
constexpr int BM = 128;  // query rows per block
constexpr int BN = 128;  // keys per step
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
}  // namespace moss_wg
