// The gated delta rule's state pass and output in one kernel (MOSS_GDR_STATE=fused4 / fused2 / fused1;
// Hopper only: thread-block clusters, mbarriers and bulk copies with multicast, sm_90a unit).
// Same chunk algebra as cuda/gdr.cu; it replaces gdr_seq_tc + gdr_out_tc and reads gdr_prep's
// scratch (fp32, blk = c·Hv + h): Kd, Wk, U0 [blk][64][128], Wqk [blk][64][64], gam [blk][64].
//
// One CTA per (value head h, 32 value columns j0..): grid 4·Hv, the 4 column CTAs of a head (or
// 2 of them: CL = 2; CL = 1: no cluster, each CTA copies whole tiles, for comparison) form a cluster and share every per-chunk tile: each CTA bulk-copies 64/CL
// rows of Wk, Q, Kd and Wqk with .multicast::cluster into the same offset of every CTA of its
// cluster (a quarter of the L2 traffic of gdr_seq_tc, which streams the whole tiles into each
// column block). Per chunk c, from S = 0 (S: 128 x 32 of this CTA, fp32 in the accumulators):
//   phase A:  U = U0 − Wk S,  O1 = Q S          (both K = 128, one shared B operand: Sᵀ in smem)
//   phase B:  S ← e^{γ_last} S + Kdᵀ U,  O = r ⊙ e^{γ} ⊙ O1 + Wqk U   → out (bf16)
// with r_i = rsqrt(Σ q_i² + 1e-6)/√dk: the q rows enter the product raw (bf16 is exact in TF32)
// and are normalised after it, the squares summed from the same fragments. The state entering a
// chunk never leaves the SM (gdr_seq_tc wrote it, 134 MB a layer at 4096 tokens, for gdr_out_tc
// to read back; U likewise).
// Pipeline: warp 8 is the producer; the tiles of phase A (Wk, Q, U0 slice, γ) and of phase B
// (Kd, Wqk) take turns in a ring of 3 slots (use u = 2c + phase in slot u % 3), each with a
// "full" mbarrier (transaction bytes of the copies landing in this CTA) and an "empty" one
// (CW·CL arrivals: every compute warp of every CTA of the cluster, since every CTA writes into
// every other's slot). Warps 0-7 compute, two named barriers a chunk (Uᵀ, Sᵀ exchanged in smem).
// Products on TF32 mma.sync m16n8k8 (operands rounded with cvt.rna as gdr_tc.cuh, fp32
// accumulators); Sᵀ and Uᵀ are stored TF32-rounded; ldmatrix reads Wk, Wqk, Sᵀ, Uᵀ.
// BUG 1 (moss_ctl_enc_gdr_fused*): the state read Q S forgets its decay e^{γ} (as gdr_out's control).
// Needs dk % 8 == 0, dk, dv ≤ 128, q rows 16-byte aligned (the host checks; else gdr_seq_tc).
#pragma once  // also #included by gdr_tma.cu
#ifndef GDR_EMU  // bench/gdr_emu.cpp compiles the body as host code with emulated primitives
#include "elem.cuh"
#include "mma.cuh"
#endif

namespace moss_gdrf {

constexpr int GC = 64;         // chunk
constexpr int GD = 128;        // padded head dim
constexpr int CW = 8;          // compute warps
constexpr int THREADS = 32 * (CW + 1);
constexpr int CB = 32;         // value columns per CTA
constexpr int NSLOT = 3;
constexpr int WL = GD + 4;     // Wk rows (ldmatrix A operand)
constexpr int KL = GD + 8;     // Kd rows (A read transposed, scalar loads)
constexpr int U0L = CB + 8;    // U0 slice rows (float2 at accumulator positions)
constexpr int WQL = GC + 4;    // Wqk rows (ldmatrix A operand)
constexpr int SL = GD + 4;     // Sᵀ [CB][SL] (ldmatrix B operand)
constexpr int UL = GC + 4;     // Uᵀ [CB][UL] (ldmatrix B operand)

// Byte offsets: a slot holds phase A's tiles or phase B's.
template <typename T>
struct Lay {
    static constexpr int QL = sizeof(T) == 2 ? GD + 8 : GD + 4;  // Q rows (elements)
    static constexpr int A_WK = 0;
    static constexpr int A_Q = A_WK + GC * WL * 4;
    static constexpr int A_U0 = A_Q + GC * QL * (int)sizeof(T);
    static constexpr int A_GAM = A_U0 + GC * U0L * 4;
    static constexpr int A_END = A_GAM + GC * 4;
    static constexpr int B_KD = 0;
    static constexpr int B_WQ = GC * KL * 4;
    static constexpr int B_END = B_WQ + GC * WQL * 4;
    static constexpr int SLOT = A_END > B_END ? A_END : B_END;
    static constexpr int ST = NSLOT * SLOT;
    static constexpr int UT = ST + CB * SL * 4;
    static constexpr int BAR = UT + CB * UL * 4;
    static constexpr int BYTES = BAR + 2 * NSLOT * 8;
};
#ifndef GDR_EMU
static_assert(Lay<__nv_bfloat16>::BYTES == 210736, "src/backend/cuda/encoder.rs launches with 210736 bytes");
static_assert(Lay<__nv_bfloat16>::SLOT % 16 == 0 && Lay<__nv_bfloat16>::A_Q % 16 == 0, "bulk copies need 16-byte rows");
#endif

#ifndef GDR_EMU
#define FZ_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define FZ_SLOT_BEGIN(s)
#define FZ_SLOT_END(s)
__device__ __forceinline__ uint32_t fz_sa(const void* p) { return moss_mma::smem_addr(p); }
__device__ __forceinline__ int fz_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return (int)r;
}
__device__ __forceinline__ void fz_bar_init(void* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fz_sa(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void fz_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void fz_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void fz_named_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
// This CTA's arrival on its own barrier b, with `bytes` more transaction bytes expected.
__device__ __forceinline__ void fz_expect(void* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(fz_sa(b)), "r"(bytes) : "memory");
}
// Wait until the phase of parity `parity` of b has completed (acquire at cluster scope: the
// arrivals may come from other CTAs of the cluster).
__device__ __forceinline__ void fz_wait(void* b, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P1;\nFZW_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [%0], %1;\n"
        "@!P1 bra FZW_%=;\n}\n" ::"r"(fz_sa(b)),
        "r"(parity)
        : "memory");
}
// Arrive on barrier b (same offset) of CTA `rank` of the cluster.
__device__ __forceinline__ void fz_arrive_cluster(void* b, int rank) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(fz_sa(b)),
        "r"(rank)
        : "memory");
}
// bytes (multiple of 16) from global src to shared dst, completing on barrier b; mask != 0: to the
// same offsets in every CTA of the cluster in mask.
__device__ __forceinline__ void fz_bulk(void* dst, const void* src, unsigned bytes, void* b, unsigned mask) {
    if (mask)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(
                fz_sa(dst)),
            "l"(src), "r"(bytes), "r"(fz_sa(b)), "h"((unsigned short)mask)
            : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         fz_sa(dst)),
                     "l"(src), "r"(bytes), "r"(fz_sa(b))
                     : "memory");
}
// 16 bytes global -> shared through the LSU (cp.async); fz_cp_arrive(b): barrier b's current phase
// also waits for this thread's cp.async copies so far (pending count + 1 now, an arrival when done).
__device__ __forceinline__ void fz_cp16(void* dst, const void* src) { moss_mma::cp_async16(dst, src, true); }
__device__ __forceinline__ void fz_cp_arrive(void* b) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(fz_sa(b)) : "memory");
}
__device__ __forceinline__ unsigned fz_tf32(float x) { return __float_as_uint(moss_mma::tf32(x)); }
__device__ __forceinline__ float fz_tf32r(float x) { return moss_mma::tf32(x); }
__device__ __forceinline__ float fz_uf(unsigned u) { return __uint_as_float(u); }
using moss_mma::mma_tf32;
// A q element as a TF32 operand: bf16 is exact in TF32.
__device__ __forceinline__ float fz_qv(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ unsigned fz_qbits(const __nv_bfloat16*, float x) { return __float_as_uint(x); }
__device__ __forceinline__ void fz_st2(__nv_bfloat16* out, long i, float x, float y, bool two, bool pair) {
    if (pair && two) {
        *reinterpret_cast<__nv_bfloat162*>(out + i) = __floats2bfloat162_rn(x, y);
    } else {
        out[i] = __float2bfloat16_rn(x);
        if (two) out[i + 1] = __float2bfloat16_rn(y);
    }
}
#endif
__device__ __forceinline__ float fz_qv(float x) { return x; }
__device__ __forceinline__ unsigned fz_qbits(const float*, float x) { return fz_tf32(x); }
__device__ __forceinline__ void fz_st2(float* out, long i, float x, float y, bool two, bool) {
    out[i] = x;
    if (two) out[i + 1] = y;
}

// CPA: the U0 slice and γ (this CTA's own, 8.25 KiB a chunk) come through cp.async from the producer
// warp (16 bytes a lane, tracked by the full barrier) instead of 65 small bulk copies: 65 fewer
// TMA requests a chunk (the measured time of CPA = false grew with the bulk-copy count).
template <typename T, int CL, int BUG, bool CPA = false>
__device__ void fused_impl(T* out, const T* q, const float* Wk, const float* Kd, const float* U0, const float* Wqk,
                           const float* gam, int L, int Hk, int Hv, int dk, int dv, long rqk) {
    using Y = Lay<T>;
    FZ_SMEM(sm);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x / 4, j0 = (blockIdx.x % 4) * CB;
    const int kh = h / (Hv / Hk);
    const int nc = (L + GC - 1) / GC;
    float* St = reinterpret_cast<float*>(sm + Y::ST);
    float* Ut = reinterpret_cast<float*>(sm + Y::UT);
    unsigned char* bars = sm + Y::BAR;
    auto full = [&](int s) { return (void*)(bars + 8 * s); };
    auto empty = [&](int s) { return (void*)(bars + 8 * (NSLOT + s)); };
    if (tid == 0) {
        for (int s = 0; s < NSLOT; s++) {
            fz_bar_init(full(s), 1);
            fz_bar_init(empty(s), CW * CL);
        }
        fz_init_fence();
    }
    for (int p = tid; p < CB * SL; p += THREADS) St[p] = 0.f;
    fz_cluster_sync();  // barriers initialised in every CTA before any copy or remote arrival
    if (warp == CW) {
        // ---- producer: this CTA's share (rows r0.. of 64/CL) of every multicast tile ----------
        const int rank = fz_rank();
        const int rows = GC / CL, r0 = rank * rows;
        const unsigned mask = CL == 1 ? 0u : (1u << CL) - 1;  // CL = 1: plain bulk copies, no cluster
        const unsigned qb = (unsigned)(dk * sizeof(T));
        for (int u = 0; u < 2 * nc; u++) {
            const int s = u % NSLOT, c = u >> 1;
            if (u >= NSLOT) fz_wait(empty(s), ((u / NSLOT) - 1) & 1);
            const long blk = (long)c * Hv + h;
            const int c0 = c * GC, n = min(GC, L - c0);
            unsigned char* slot = sm + s * Y::SLOT;
            if ((u & 1) == 0) {
                if constexpr (CPA) {
                    for (int p = lane; p < GC * CB / 4; p += 32) {
                        const int i = p / (CB / 4), x = (p % (CB / 4)) * 4;
                        fz_cp16(slot + Y::A_U0 + (i * U0L + x) * 4, U0 + (blk * GC + i) * GD + j0 + x);
                    }
                    if (lane < GC / 4) fz_cp16(slot + Y::A_GAM + lane * 16, gam + blk * GC + lane * 4);
                    fz_cp_arrive(full(s));
                    __syncwarp();  // every lane's pending-count increment before the arrival below
                    if (lane == 0) fz_expect(full(s), GC * GD * 4 + n * qb);
                } else {
                    if (lane == 0) fz_expect(full(s), GC * GD * 4 + n * qb + GC * CB * 4 + GC * 4);
                }
                __syncwarp();
                for (int i = lane; i < rows; i += 32) {
                    const int r = r0 + i;
                    fz_bulk(slot + Y::A_WK + r * WL * 4, Wk + (blk * GC + r) * GD, GD * 4, full(s), mask);
                    if (r < n)
                        fz_bulk(slot + Y::A_Q + r * Y::QL * (int)sizeof(T), q + (long)(c0 + r) * rqk + (long)kh * dk, qb,
                                full(s), mask);
                }
                if constexpr (!CPA) {
                    for (int i = lane; i < GC; i += 32)
                        fz_bulk(slot + Y::A_U0 + i * U0L * 4, U0 + (blk * GC + i) * GD + j0, CB * 4, full(s), 0);
                    if (lane == 0) fz_bulk(slot + Y::A_GAM, gam + blk * GC, GC * 4, full(s), 0);
                }
            } else {
                if (lane == 0) fz_expect(full(s), GC * GD * 4 + GC * GC * 4);
                __syncwarp();
                for (int i = lane; i < rows; i += 32) {
                    const int r = r0 + i;
                    fz_bulk(slot + Y::B_KD + r * KL * 4, Kd + (blk * GC + r) * GD, GD * 4, full(s), mask);
                    fz_bulk(slot + Y::B_WQ + r * WQL * 4, Wqk + (blk * GC + r) * GC, GC * 4, full(s), mask);
                }
            }
        }
    } else {
        // ---- the 8 compute warps ------------------------------------------------------------
        const int g = lane >> 2, t = lane & 3;
        const int ur = 16 * (warp >> 1), uc = 16 * (warp & 1);  // phase A / O tile: rows ur.., cols uc..
        const float qscale = rsqrtf((float)dk);
        float S[4][4];  // rows 16·warp.., 32 columns
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) S[nt][r] = 0.f;
        // ldmatrix row addresses (lanes 8m..8m+7 give matrix m's rows)
        const float* pb = St + (uc + (lane & 7) + 8 * (lane >> 4)) * SL + 4 * ((lane >> 3) & 1);
        const float* pu = Ut + ((lane & 7) + 8 * (lane >> 4)) * UL + 4 * ((lane >> 3) & 1);
        const int arow = (lane & 7) + 8 * ((lane >> 3) & 1), acol = 4 * (lane >> 4);
        for (int c = 0; c < nc; c++) {
            const int c0 = c * GC, n = min(GC, L - c0);
            // ---- phase A ----
            int u = 2 * c, s = u % NSLOT;
            fz_wait(full(s), (u / NSLOT) & 1);
            FZ_SLOT_BEGIN(s);
            const unsigned char* slot = sm + s * Y::SLOT;
            const float* wk = reinterpret_cast<const float*>(slot + Y::A_WK);
            const T* qs = reinterpret_cast<const T*>(slot + Y::A_Q);
            const float* u0 = reinterpret_cast<const float*>(slot + Y::A_U0);
            const float* gs = reinterpret_cast<const float*>(slot + Y::A_GAM);
            float Ua[2][4], Oa[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) Ua[nt][r] = Oa[nt][r] = 0.f;
            float ss0 = 0.f, ss1 = 0.f;
            const float* pa = wk + (ur + arow) * WL + acol;
            const T* pq = qs + (ur + g) * Y::QL + t;
#pragma unroll 4
            for (int k0 = 0; k0 < GD; k0 += 8) {
                unsigned b[4], a[4];
                moss_mma::ldsm_x4(b, pb + k0);
                moss_mma::ldsm_x4(a, pa + k0);
#pragma unroll
                for (int r = 0; r < 4; r++) a[r] = fz_tf32(fz_uf(a[r]));
                mma_tf32(Ua[0], a, b[0], b[1]);
                mma_tf32(Ua[1], a, b[2], b[3]);
                if (k0 < dk) {
                    const float x0 = fz_qv(pq[k0]), x1 = fz_qv(pq[k0 + 8 * Y::QL]);
                    const float x2 = fz_qv(pq[k0 + 4]), x3 = fz_qv(pq[k0 + 8 * Y::QL + 4]);
                    ss0 += x0 * x0 + x2 * x2;
                    ss1 += x1 * x1 + x3 * x3;
                    const unsigned aq[4] = {fz_qbits(qs, x0), fz_qbits(qs, x1), fz_qbits(qs, x2), fz_qbits(qs, x3)};
                    mma_tf32(Oa[0], aq, b[0], b[1]);
                    mma_tf32(Oa[1], aq, b[2], b[3]);
                }
            }
            ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
            ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
            ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
            ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
            const float e0 = BUG == 1 ? 1.f : expf(gs[ur + g]), e1 = BUG == 1 ? 1.f : expf(gs[ur + g + 8]);
            const float sc[2] = {rsqrtf(ss0 + 1e-6f) * qscale * e0, rsqrtf(ss1 + 1e-6f) * qscale * e1};
            const float dec = expf(gs[GC - 1]);
            // U = U0 − Wk S into Uᵀ (TF32: it is only ever an mma operand)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = ur + g + 8 * hf, col = uc + 8 * nt + 2 * t;
                    const float2 v0 = *reinterpret_cast<const float2*>(u0 + row * U0L + col);
                    Ut[col * UL + row] = fz_tf32r(v0.x - Ua[nt][2 * hf]);
                    Ut[(col + 1) * UL + row] = fz_tf32r(v0.y - Ua[nt][2 * hf + 1]);
                    Oa[nt][2 * hf] *= sc[hf];
                    Oa[nt][2 * hf + 1] *= sc[hf];
                }
            FZ_SLOT_END(s);
            __syncwarp();
            if (lane < CL) fz_arrive_cluster(empty(s), lane);
            fz_named_sync();  // Uᵀ complete; every read of Sᵀ done
            // ---- phase B ----
            u = 2 * c + 1;
            s = u % NSLOT;
            fz_wait(full(s), (u / NSLOT) & 1);
            FZ_SLOT_BEGIN(s);
            const float* kd = reinterpret_cast<const float*>(sm + s * Y::SLOT + Y::B_KD);
            const float* wq = reinterpret_cast<const float*>(sm + s * Y::SLOT + Y::B_WQ);
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) S[nt][r] *= dec;
            // S += Kdᵀ U: A(a, i) = Kd[i][a], rows 16·warp..; B = U from Uᵀ
            const float* pk = kd + t * KL + 16 * warp + g;
#pragma unroll 2
            for (int k0 = 0; k0 < GC; k0 += 8) {
                const unsigned a[4] = {fz_tf32(pk[k0 * KL]), fz_tf32(pk[k0 * KL + 8]), fz_tf32(pk[(k0 + 4) * KL]),
                                       fz_tf32(pk[(k0 + 4) * KL + 8])};
                unsigned b01[4], b23[4];
                moss_mma::ldsm_x4(b01, pu + k0);
                moss_mma::ldsm_x4(b23, pu + 16 * UL + k0);
                mma_tf32(S[0], a, b01[0], b01[1]);
                mma_tf32(S[1], a, b01[2], b01[3]);
                mma_tf32(S[2], a, b23[0], b23[1]);
                mma_tf32(S[3], a, b23[2], b23[3]);
            }
            // O += Wqk U (lower triangular: k < ur + 16)
            const float* pw = wq + (ur + arow) * WQL + acol;
            const float* pu2 = pu + uc * UL;
            for (int k0 = 0; k0 < ur + 16; k0 += 8) {
                unsigned a[4], b[4];
                moss_mma::ldsm_x4(a, pw + k0);
#pragma unroll
                for (int r = 0; r < 4; r++) a[r] = fz_tf32(fz_uf(a[r]));
                moss_mma::ldsm_x4(b, pu2 + k0);
                mma_tf32(Oa[0], a, b[0], b[1]);
                mma_tf32(Oa[1], a, b[2], b[3]);
            }
            FZ_SLOT_END(s);
            __syncwarp();
            if (lane < CL) fz_arrive_cluster(empty(s), lane);
            const bool pair = (dv & 1) == 0;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int i = ur + g + 8 * hf, col = j0 + uc + 8 * nt + 2 * t;
                    if (i < n && col < dv)
                        fz_st2(out, ((long)(c0 + i) * Hv + h) * dv + col, Oa[nt][2 * hf], Oa[nt][2 * hf + 1], col + 1 < dv,
                               pair);
                }
            // the state entering chunk c + 1 as Sᵀ (TF32) for the next phase A
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int row = 16 * warp + g + 8 * (r >> 1), col = 8 * nt + 2 * t + (r & 1);
                    St[col * SL + row] = fz_tf32r(S[nt][r]);
                }
            fz_named_sync();  // Sᵀ complete; every read of Uᵀ done
        }
    }
    fz_cluster_sync();  // no CTA leaves while others may still arrive on its barriers
}

}  // namespace moss_gdrf

#ifndef GDR_EMU
// out [L, Hv, dv] bf16; q read with row stride rqk (may be a column slice of the conv output).
// Launch: grid 4·Hv (a multiple of the cluster size), 288 threads, 210736 bytes of shared memory.
#define MOSS_GDR_FUSED(NAME, CL, BUG, CPA)                                                                      \
    MOSS_KERNEL void __cluster_dims__(CL, 1, 1) __launch_bounds__(moss_gdrf::THREADS, 1)                        \
        NAME(__nv_bfloat16* out, const __nv_bfloat16* q, const float* Wk, const float* Kd, const float* U0,       \
             const float* Wqk, const float* gam, int L, int Hk, int Hv, int dk, int dv, long rqk) {              \
        moss_gdrf::fused_impl<__nv_bfloat16, CL, BUG, CPA>(out, q, Wk, Kd, U0, Wqk, gam, L, Hk, Hv, dk, dv, rqk); \
    }
MOSS_GDR_FUSED(moss_enc_gdr_fused4_bf16, 4, 0, false)
MOSS_GDR_FUSED(moss_ctl_enc_gdr_fused4_bf16, 4, 1, false)
MOSS_GDR_FUSED(moss_enc_gdr_fused2_bf16, 2, 0, false)
MOSS_GDR_FUSED(moss_ctl_enc_gdr_fused2_bf16, 2, 1, false)
MOSS_GDR_FUSED(moss_enc_gdr_fused1_bf16, 1, 0, false)
MOSS_GDR_FUSED(moss_ctl_enc_gdr_fused1_bf16, 1, 1, false)
// the U0 slice and γ through cp.async (not measured on the device)
MOSS_GDR_FUSED(moss_enc_gdr_fused4c_bf16, 4, 0, true)
MOSS_GDR_FUSED(moss_ctl_enc_gdr_fused4c_bf16, 4, 1, true)
MOSS_GDR_FUSED(moss_enc_gdr_fused2c_bf16, 2, 0, true)
MOSS_GDR_FUSED(moss_ctl_enc_gdr_fused2c_bf16, 2, 1, true)
#endif
