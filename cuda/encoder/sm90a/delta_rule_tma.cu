// The gated delta rule's state pass and output in one kernel on Hopper (sm_90a unit): the default
// after delta_rule_prep (cuda/encoder/delta_rule_prep.cuh) wherever the Hopper kernels are loaded and q, k, v are
// 16-byte aligned (host: `gdr_chunked` in crates/moss-cuda/src/encoder/delta_rule.rs; MOSS_KERNELS=portable
// takes gdr_seq_tc + gdr_out_tc instead, the path of every other GPU). Same chunk algebra as cuda/encoder/delta_rule.cu;
// it reads the prep's scratch (fp32, blk = c·Hv + h): Kd, Wk, U0 [blk][64][128], Wqk [blk][64][64],
// gam [blk][64], and q straight out of the (strided) conv output.
//
// One CTA per (value head h, 32 value columns j0..): grid 4·Hv; the column CTAs of a head go in
// clusters of CL = 2 and share every per-chunk tile. Per chunk c, from S = 0 (S: 128 x 32 of this
// CTA, fp32 in the accumulators of the 8 compute warps):
//   phase A:  U = U0 − Wk S,  O1 = Q S          (both K = 128, one shared B operand: Sᵀ in smem)
//   phase B:  S ← e^{γ_last} S + Kdᵀ U,  O = r ⊙ e^{γ} ⊙ O1 + Wqk U   → out (bf16)
// with r_i = rsqrt(Σ q_i² + 1e-6)/√dk: the q rows enter the product raw (bf16 is exact in TF32)
// and are normalised after it, the squares summed from the same fragments. Neither the state
// entering a chunk nor U goes through memory.
//
// Tiles: warp 8 is the producer (one lane). Each CTA loads its share (rows r0.. of 64/CL) of every
// tile by TMA tensor copies with .multicast::cluster into the same offset of both CTAs: Wk, Kd: 4
// boxes {32 floats, 64/CL rows}; Wqk: 2; Q (bf16, rows past L zero-filled by the TMA unit): 2
// boxes {64, 64/CL}; its own U0 slice: 1 box {32, 64}; γ: one 256-byte bulk copy (14 requests a
// chunk). Boxes land with the 128-byte swizzle: a tile is stored as panels of 64 rows x 128 bytes
// (8 KiB, 1024-byte aligned; the dynamic shared memory base is rounded up at run time), 16-byte
// chunk c of row r at chunk c ^ (r % 8); every read takes the swizzled address (ft_sw / ft_f).
// Maps (2-D, made on the host per call): q bf16 {Hk·dk, L} (row stride rqk); Wk, Kd, U0 f32
// {128, nb·64}; Wqk f32 {64, nb·64} (nb = chunks · Hv; box rows 64/CL, U0's 64).
// Pipeline: phase A's tiles (Wk, Q, U0 slice, γ) and phase B's (Kd, Wqk) take turns in a ring of 3
// slots (use u = 2c + phase in slot u % 3), each with a "full" mbarrier (transaction bytes of the
// copies landing in this CTA) and an "empty" one (CW·CL arrivals: every compute warp of every CTA
// of the cluster, since each CTA writes into the other's slot). The waits and the remote arrivals
// use the instructions' default semantics (acquire / release at CTA scope, as CUTLASS's cluster
// barriers): the explicit cluster-scope forms cost `membar` stalls (ncu on the H200).
// The compute warps load each k-step's operands (ldmatrix, q, Kd) one step ahead of its mma
// (register double buffer, by hand: the asm statements keep program order). Two named barriers a
// chunk (Uᵀ, Sᵀ exchanged in smem). Products on TF32 mma.sync m16n8k8 (operands rounded with
// cvt.rna as delta_rule_tc.cuh, fp32 accumulators); Sᵀ and Uᵀ are stored TF32-rounded.
// Measured on the H200: 0.225 ms a layer at 4096 tokens (Hk 16, Hv 32, dk = dv = 128) after the
// prep.
// BUG 1 (moss_ctl_enc_gdr_tma_bf16): the state read Q S forgets its decay e^{γ}.
// Needs dk % 8 == 0, dk, dv ≤ 128, q rows 16-byte aligned (the host checks).
#include "../launch.h"
#ifndef GDR_EMU  // tools/delta_rule_emu.cpp compiles the body as host code with emulated primitives
#include "elem.cuh"
#include "mma.cuh"
#endif

namespace moss_gdrt {

constexpr int GC = ENC_GDR_CHUNK;    // chunk
constexpr int GD = ENC_GDR_MAX_DIM;  // padded head dim
constexpr int CW = 8;                // compute warps
constexpr int THREADS = 32 * (CW + 1);
static_assert(THREADS == ENC_GDR_TMA_THREADS, "launch.h: ENC_GDR_TMA_THREADS");
constexpr int CB = ENC_GDR_TMA_COLS;  // value columns per CTA
constexpr int CL = 2;          // CTAs a cluster (column CTAs of one head)
constexpr int NSLOT = 3;
constexpr int SL = GD + 4;     // Sᵀ [CB][SL] (ldmatrix B operand)
constexpr int UL = GC + 4;     // Uᵀ [CB][UL] (ldmatrix B operand)
constexpr int PANEL = 64 * 128;  // bytes of one 64-row panel of 128-byte rows

// Byte offsets: a slot holds phase A's tiles or phase B's.
template <typename T>
struct TLay {
    static constexpr int QP = 128 / (int)sizeof(T);  // q elements a panel row
    static constexpr int QE = 16 / (int)sizeof(T);   // q elements a 16-byte chunk
    static constexpr int A_WK = 0;
    static constexpr int A_Q = A_WK + 4 * PANEL;
    static constexpr int A_U0 = A_Q + (GD / QP) * PANEL;
    static constexpr int A_GAM = A_U0 + PANEL;
    static constexpr int A_END = A_GAM + GC * 4;
    static constexpr int B_KD = 0;
    static constexpr int B_WQ = 4 * PANEL;
    static constexpr int B_END = B_WQ + 2 * PANEL;
    static constexpr int SLOT = ((A_END > B_END ? A_END : B_END) + 1023) / 1024 * 1024;
    static constexpr int ST = NSLOT * SLOT;
    static constexpr int UT = ST + CB * SL * 4;
    static constexpr int BAR = UT + CB * UL * 4;
    static constexpr int BYTES = BAR + 2 * NSLOT * 8 + 1024;  // + the base's rounding to 1024
    static constexpr unsigned TX_A = 4 * PANEL + (GD / QP) * PANEL + PANEL + GC * 4;
    static constexpr unsigned TX_B = 6 * PANEL;
};
#ifndef GDR_EMU
static_assert(TLay<__nv_bfloat16>::BYTES == ENC_GDR_TMA_BYTES, "launch.h: ENC_GDR_TMA_BYTES");
#endif

// Byte offset of 16-byte chunk ch of row r in a 128-byte-swizzled panel.
__device__ __forceinline__ int ft_sw(int r, int ch) { return r * 128 + ((ch ^ (r & 7)) << 4); }
// Byte offset of f32 element (row r, column k) in a tile of 32-column panels.
__device__ __forceinline__ int ft_f(int r, int k) { return (k >> 5) * PANEL + ft_sw(r, (k & 31) >> 2) + (k & 3) * 4; }

#ifndef GDR_EMU
struct alignas(64) TmaMap {
    uint64_t opaque[16];
};
#define FT_SMEM(name)                                     \
    extern __shared__ __align__(1024) unsigned char raw_[]; \
    unsigned char* name = raw_ + ((1024u - (moss_mma::smem_addr(raw_) & 1023u)) & 1023u)
#define FT_SLOT_BEGIN(s)
#define FT_SLOT_END(s)
__device__ __forceinline__ uint32_t ft_sa(const void* p) { return moss_mma::smem_addr(p); }
__device__ __forceinline__ int ft_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return (int)r;
}
__device__ __forceinline__ void ft_bar_init(void* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ft_sa(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void ft_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void ft_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void ft_named_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
// This CTA's arrival on its own barrier b, with `bytes` more transaction bytes expected.
__device__ __forceinline__ void ft_expect(void* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ft_sa(b)), "r"(bytes) : "memory");
}
// Wait until the phase of parity `parity` of b has completed (the default semantics: acquire at
// CTA scope).
__device__ __forceinline__ void ft_wait(void* b, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P1;\nTCW_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@!P1 bra TCW_%=;\n}\n" ::"r"(ft_sa(b)),
        "r"(parity)
        : "memory");
}
// Arrive on barrier b (same offset) of CTA `rank` of the cluster (default semantics: release at
// CTA scope).
__device__ __forceinline__ void ft_arrive_cluster(void* b, int rank) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(ft_sa(b)),
        "r"(rank)
        : "memory");
}
// bytes (multiple of 16) from global src to this CTA's shared dst, completing on barrier b.
__device__ __forceinline__ void ft_bulk(void* dst, const void* src, unsigned bytes, void* b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     ft_sa(dst)),
                 "l"(src), "r"(bytes), "r"(ft_sa(b))
                 : "memory");
}
__device__ __forceinline__ void ft_prefetch(const TmaMap* m) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
}
// Box at (column x, row y) of map m into shared memory at dst (same offset in every CTA of mask,
// or this CTA only for mask 0), completing on barrier b (at the same offset in each).
__device__ __forceinline__ void ft_box(void* dst, const TmaMap* m, int x, int y, void* b, unsigned mask) {
    if (mask)
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(
                ft_sa(dst)),
            "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(ft_sa(b)), "h"((unsigned short)mask)
            : "memory");
    else
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                ft_sa(dst)),
            "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(ft_sa(b))
            : "memory");
}
__device__ __forceinline__ unsigned ft_tf32(float x) { return __float_as_uint(moss_mma::tf32(x)); }
__device__ __forceinline__ float ft_tf32r(float x) { return moss_mma::tf32(x); }
__device__ __forceinline__ float ft_uf(unsigned u) { return __uint_as_float(u); }
using moss_mma::mma_tf32;
// A q element as a TF32 operand: bf16 is exact in TF32.
__device__ __forceinline__ float ft_qv(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ unsigned ft_qbits(const __nv_bfloat16*, float x) { return __float_as_uint(x); }
__device__ __forceinline__ void ft_st2(__nv_bfloat16* out, long i, float x, float y, bool two, bool pair) {
    if (pair && two) {
        *reinterpret_cast<__nv_bfloat162*>(out + i) = __floats2bfloat162_rn(x, y);
    } else {
        out[i] = __float2bfloat16_rn(x);
        if (two) out[i + 1] = __float2bfloat16_rn(y);
    }
}
#endif
// The emulator's fp32 data (tools/delta_rule_emu.cpp): q rounded to TF32 like every other operand.
__device__ __forceinline__ float ft_qv(float x) { return x; }
__device__ __forceinline__ unsigned ft_qbits(const float*, float x) { return ft_tf32(x); }
__device__ __forceinline__ void ft_st2(float* out, long i, float x, float y, bool two, bool) {
    out[i] = x;
    if (two) out[i + 1] = y;
}

template <typename T, int BUG>
__device__ void tma_impl(const TmaMap* mq, const TmaMap* mwk, const TmaMap* mkd, const TmaMap* mu0, const TmaMap* mwq,
                         T* out, const float* gam, int L, int Hk, int Hv, int dk, int dv) {
    using Y = TLay<T>;
    FT_SMEM(sm);
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
            ft_bar_init(full(s), 1);
            ft_bar_init(empty(s), CW * CL);
        }
        ft_init_fence();
    }
    for (int p = tid; p < CB * SL; p += THREADS) St[p] = 0.f;
    ft_cluster_sync();  // barriers initialised in every CTA before any copy or remote arrival
    if (warp == CW) {
        // ---- producer (one lane): this CTA's share (rows r0.. of 64/CL) of every multicast tile ----
        if (lane == 0) {
            const int rank = ft_rank();
            const int r0 = rank * (GC / CL);
            const unsigned mask = (1u << CL) - 1;
            ft_prefetch(mq), ft_prefetch(mwk), ft_prefetch(mkd), ft_prefetch(mu0), ft_prefetch(mwq);
            for (int u = 0; u < 2 * nc; u++) {
                const int s = u % NSLOT, c = u >> 1;
                if (u >= NSLOT) ft_wait(empty(s), ((u / NSLOT) - 1) & 1);
                const int row0 = (c * Hv + h) * GC;  // the chunk's first scratch row
                unsigned char* slot = sm + s * Y::SLOT;
                if ((u & 1) == 0) {
                    ft_expect(full(s), Y::TX_A);
                    for (int p = 0; p < 4; p++) ft_box(slot + Y::A_WK + p * PANEL + r0 * 128, mwk, 32 * p, row0 + r0, full(s), mask);
                    for (int p = 0; p < GD / Y::QP; p++)
                        ft_box(slot + Y::A_Q + p * PANEL + r0 * 128, mq, kh * dk + Y::QP * p, c * GC + r0, full(s), mask);
                    ft_box(slot + Y::A_U0, mu0, j0, row0, full(s), 0);
                    ft_bulk(slot + Y::A_GAM, gam + row0, GC * 4, full(s));
                } else {
                    ft_expect(full(s), Y::TX_B);
                    for (int p = 0; p < 4; p++) ft_box(slot + Y::B_KD + p * PANEL + r0 * 128, mkd, 32 * p, row0 + r0, full(s), mask);
                    for (int p = 0; p < 2; p++) ft_box(slot + Y::B_WQ + p * PANEL + r0 * 128, mwq, 32 * p, row0 + r0, full(s), mask);
                }
            }
        }
    } else {
        // ---- the 8 compute warps (reads at swizzled addresses) ---------------------------------
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
        // ldmatrix A rows: row ar, 16-byte chunk (k0 % 32)/4 + ah of panel k0/32
        const int ar = ur + (lane & 7) + 8 * ((lane >> 3) & 1), ah = lane >> 4;
        const int qr = ur + g;  // q rows qr, qr + 8 (same swizzle phase)
        for (int c = 0; c < nc; c++) {
            const int c0 = c * GC, n = min(GC, L - c0);
            // ---- phase A ----
            int u = 2 * c, s = u % NSLOT;
            ft_wait(full(s), (u / NSLOT) & 1);
            FT_SLOT_BEGIN(s);
            const unsigned char* slot = sm + s * Y::SLOT;
            const unsigned char* wk = slot + Y::A_WK;
            const unsigned char* qs = slot + Y::A_Q;
            const unsigned char* u0 = slot + Y::A_U0;
            const float* gs = reinterpret_cast<const float*>(slot + Y::A_GAM);
            float Ua[2][4], Oa[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) Ua[nt][r] = Oa[nt][r] = 0.f;
            float ss0 = 0.f, ss1 = 0.f;
            {
            // k-step operands: Sᵀ (B), Wk (A) by ldmatrix; q elements k0 + t, k0 + 4 + t of rows qr, qr + 8
            struct OpA {
                unsigned b[4], a[4];
                float x[4];
            };
            auto load_a = [&](int k0, OpA& o) {
                moss_mma::ldsm_x4(o.b, pb + k0);
                moss_mma::ldsm_x4(o.a, wk + (k0 >> 5) * PANEL + ft_sw(ar, ((k0 & 31) >> 2) + ah));
                if (k0 < dk) {
                    const int k1 = k0 + t, k2 = k0 + 4 + t;
                    const int o1 = (k1 / Y::QP) * PANEL + ft_sw(qr, (k1 % Y::QP) / Y::QE) + (k1 % Y::QE) * (int)sizeof(T);
                    const int o2 = (k2 / Y::QP) * PANEL + ft_sw(qr, (k2 % Y::QP) / Y::QE) + (k2 % Y::QE) * (int)sizeof(T);
                    const T* q1 = reinterpret_cast<const T*>(qs + o1);
                    const T* q2 = reinterpret_cast<const T*>(qs + o2);
                    o.x[0] = ft_qv(q1[0]), o.x[1] = ft_qv(q1[8 * 128 / (int)sizeof(T)]);
                    o.x[2] = ft_qv(q2[0]), o.x[3] = ft_qv(q2[8 * 128 / (int)sizeof(T)]);
                }
            };
            auto mma_a = [&](int k0, OpA& o) {
#pragma unroll
                for (int r = 0; r < 4; r++) o.a[r] = ft_tf32(ft_uf(o.a[r]));
                mma_tf32(Ua[0], o.a, o.b[0], o.b[1]);
                mma_tf32(Ua[1], o.a, o.b[2], o.b[3]);
                if (k0 < dk) {
                    ss0 += o.x[0] * o.x[0] + o.x[2] * o.x[2];
                    ss1 += o.x[1] * o.x[1] + o.x[3] * o.x[3];
                    const unsigned aq[4] = {ft_qbits((const T*)qs, o.x[0]), ft_qbits((const T*)qs, o.x[1]),
                                            ft_qbits((const T*)qs, o.x[2]), ft_qbits((const T*)qs, o.x[3])};
                    mma_tf32(Oa[0], aq, o.b[0], o.b[1]);
                    mma_tf32(Oa[1], aq, o.b[2], o.b[3]);
                }
            };
                OpA o[2];
                load_a(0, o[0]);
#pragma unroll
                for (int k0 = 0; k0 < GD; k0 += 8) {
                    if (k0 + 8 < GD) load_a(k0 + 8, o[((k0 >> 3) + 1) & 1]);
                    mma_a(k0, o[(k0 >> 3) & 1]);
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
                    const float2 v0 = *reinterpret_cast<const float2*>(u0 + ft_sw(row, col >> 2) + (col & 3) * 4);
                    Ut[col * UL + row] = ft_tf32r(v0.x - Ua[nt][2 * hf]);
                    Ut[(col + 1) * UL + row] = ft_tf32r(v0.y - Ua[nt][2 * hf + 1]);
                    Oa[nt][2 * hf] *= sc[hf];
                    Oa[nt][2 * hf + 1] *= sc[hf];
                }
            FT_SLOT_END(s);
            __syncwarp();
            if (lane < CL) ft_arrive_cluster(empty(s), lane);
            ft_named_sync();  // Uᵀ complete; every read of Sᵀ done
            // ---- phase B ----
            u = 2 * c + 1;
            s = u % NSLOT;
            ft_wait(full(s), (u / NSLOT) & 1);
            FT_SLOT_BEGIN(s);
            const unsigned char* kd = sm + s * Y::SLOT + Y::B_KD;
            const unsigned char* wq = sm + s * Y::SLOT + Y::B_WQ;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) S[nt][r] *= dec;
            {
            // S += Kdᵀ U: A(a, i) = Kd[i][a], a = 16·warp + g (+8), i = k0 + t (+4); B = U from Uᵀ
            const int kap = 16 * warp + g;
            struct OpB {
                float a[4];
                unsigned b01[4], b23[4];
            };
            auto load_s = [&](int k0, OpB& o) {
                auto kv = [&](int i, int a) { return *reinterpret_cast<const float*>(kd + ft_f(i, a)); };
                o.a[0] = kv(k0 + t, kap), o.a[1] = kv(k0 + t, kap + 8), o.a[2] = kv(k0 + t + 4, kap), o.a[3] = kv(k0 + t + 4, kap + 8);
                moss_mma::ldsm_x4(o.b01, pu + k0);
                moss_mma::ldsm_x4(o.b23, pu + 16 * UL + k0);
            };
            auto mma_s = [&](OpB& o) {
                const unsigned a[4] = {ft_tf32(o.a[0]), ft_tf32(o.a[1]), ft_tf32(o.a[2]), ft_tf32(o.a[3])};
                mma_tf32(S[0], a, o.b01[0], o.b01[1]);
                mma_tf32(S[1], a, o.b01[2], o.b01[3]);
                mma_tf32(S[2], a, o.b23[0], o.b23[1]);
                mma_tf32(S[3], a, o.b23[2], o.b23[3]);
            };
            // O += Wqk U (lower triangular: k < ur + 16)
            const float* pup = pu + uc * UL;
            struct OpO {
                unsigned a[4], b[4];
            };
            auto load_o = [&](int k0, OpO& o) {
                moss_mma::ldsm_x4(o.a, wq + (k0 >> 5) * PANEL + ft_sw(ar, ((k0 & 31) >> 2) + ah));
                moss_mma::ldsm_x4(o.b, pup + k0);
            };
            auto mma_o = [&](OpO& o) {
#pragma unroll
                for (int r = 0; r < 4; r++) o.a[r] = ft_tf32(ft_uf(o.a[r]));
                mma_tf32(Oa[0], o.a, o.b[0], o.b[1]);
                mma_tf32(Oa[1], o.a, o.b[2], o.b[3]);
            };
                OpB o[2];
                load_s(0, o[0]);
#pragma unroll
                for (int k0 = 0; k0 < GC; k0 += 8) {
                    if (k0 + 8 < GC) load_s(k0 + 8, o[((k0 >> 3) + 1) & 1]);
                    mma_s(o[(k0 >> 3) & 1]);
                }
                OpO p[2];
                load_o(0, p[0]);
#pragma unroll
                for (int k0 = 0; k0 < GC; k0 += 8) {
                    if (k0 < ur + 16) {
                        if (k0 + 8 < ur + 16) load_o(k0 + 8, p[((k0 >> 3) + 1) & 1]);
                        mma_o(p[(k0 >> 3) & 1]);
                    }
                }
            }
            FT_SLOT_END(s);
            __syncwarp();
            if (lane < CL) ft_arrive_cluster(empty(s), lane);
            const bool pair = (dv & 1) == 0;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int i = ur + g + 8 * hf, col = j0 + uc + 8 * nt + 2 * t;
                    if (i < n && col < dv)
                        ft_st2(out, ((long)(c0 + i) * Hv + h) * dv + col, Oa[nt][2 * hf], Oa[nt][2 * hf + 1], col + 1 < dv,
                               pair);
                }
            // the state entering chunk c + 1 as Sᵀ (TF32) for the next phase A
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int row = 16 * warp + g + 8 * (r >> 1), col = 8 * nt + 2 * t + (r & 1);
                    St[col * SL + row] = ft_tf32r(S[nt][r]);
                }
            ft_named_sync();  // Sᵀ complete; every read of Uᵀ done
        }
    }
    ft_cluster_sync();  // no CTA leaves while others may still arrive on its barriers
}

}  // namespace moss_gdrt

#ifndef GDR_EMU
// out [L, Hv, dv] bf16. Launch: grid 4·Hv (a multiple of CL), 288 threads, TLay<bf16>::BYTES
// (201776) bytes of dynamic shared memory; the maps as described at the top.
#define MOSS_GDR_TMA(NAME, BUG)                                                                                      \
    MOSS_KERNEL void __cluster_dims__(moss_gdrt::CL, 1, 1) __launch_bounds__(moss_gdrt::THREADS, 1)                  \
        NAME(const __grid_constant__ moss_gdrt::TmaMap mq, const __grid_constant__ moss_gdrt::TmaMap mwk,            \
             const __grid_constant__ moss_gdrt::TmaMap mkd, const __grid_constant__ moss_gdrt::TmaMap mu0,           \
             const __grid_constant__ moss_gdrt::TmaMap mwq, __nv_bfloat16* out, const float* gam, int L, int Hk,     \
             int Hv, int dk, int dv) {                                                                               \
        moss_gdrt::tma_impl<__nv_bfloat16, BUG>(&mq, &mwk, &mkd, &mu0, &mwq, out, gam, L, Hk, Hv, dk, dv);           \
    }
MOSS_PRODUCTION(MOSS_GDR_TMA(moss_enc_gdr_tma_bf16, 0))
MOSS_CONTROL(MOSS_GDR_TMA(moss_ctl_enc_gdr_tma_bf16, 1))
#endif
