// The gated delta rule's state pass and output in one kernel, tiles by TMA *tensor* copies
// (MOSS_GDR_STATE=tma2 / tma2p / tma1 / tma2x; Hopper only, sm_90a unit). Same algebra, pipeline, cluster sharing and
// planted control as cuda/sm90a/gdr_fused.cu (read that first); what differs is how the per-chunk
// tiles reach shared memory:
//
// - gdr_fused copies one padded row per cp.async.bulk (129 requests a chunk for fused2c): its
//   measured time per chunk grew with that count (bench/notes-gdrseq.md). Here each tile share is
//   a few 2-D boxes of a tensor map (cuTensorMapEncodeTiled on the host, CUtensorMap by value):
//   Wk, Kd: 4 boxes {32 floats, 64/CL rows}; Wqk: 2; Q (bf16, straight out of the strided conv
//   output; rows past L zero-filled by the TMA unit): 2 boxes {64, 64/CL}; the U0 slice: 1 box
//   {32, 64} (this CTA's own); γ: one 256-byte bulk copy. 14 requests a chunk per CTA.
// - Boxes land with the 128-byte swizzle: a tile is stored as panels of 64 rows x 128 bytes
//   (8 KiB, 1024-byte aligned), 16-byte chunk c of row r at chunk c ^ (r % 8). Every read takes
//   the swizzled address (ft_sw): ldmatrix on Wk / Wqk and the q / U0 loads stay conflict-free,
//   the transposed Kd loads are 2-way.
// - The slots are 1024-byte aligned (the dynamic shared memory base is rounded up at run time).
// Maps (all 2-D, 128-byte swizzle): q bf16 {Hk·dk, L} (row stride rqk); Wk, Kd, U0 f32 {128,
// nb·64}; Wqk f32 {64, nb·64} (nb = chunks · Hv; box rows 64/CL, U0's 64).
// BUG 1 (moss_ctl_enc_gdr_tma*): the state read Q S forgets its decay e^{γ} (as gdr_fused's).
#ifndef GDR_EMU
#include "gdr_fused.cu"
#endif

namespace moss_gdrt {
using namespace moss_gdrf;

constexpr int PANEL = 64 * 128;  // bytes of one 64-row panel of 128-byte rows

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
static_assert(TLay<__nv_bfloat16>::BYTES == 201776, "src/backend/cuda/encoder.rs launches with 201776 bytes");
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
__device__ __forceinline__ void ft_prefetch(const TmaMap* m) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
}
// Box at (column x, row y) of map m into shared memory at dst (same offset in every CTA of mask,
// or this CTA only for mask 0), completing on barrier b (at the same offset in each).
__device__ __forceinline__ void ft_box(void* dst, const TmaMap* m, int x, int y, void* b, unsigned mask) {
    if (mask)
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(
                fz_sa(dst)),
            "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(fz_sa(b)), "h"((unsigned short)mask)
            : "memory");
    else
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                fz_sa(dst)),
            "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(fz_sa(b))
            : "memory");
}
// Hint: the box at (x, y) of map m into L2 (no shared memory, no barrier).
__device__ __forceinline__ void ft_pf(const TmaMap* m, int x, int y) {
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(reinterpret_cast<uint64_t>(m)), "r"(x),
                 "r"(y)
                 : "memory");
}
#endif

// CS: the barrier waits and the remote arrivals with the instructions' default semantics
// (acquire / release at CTA scope, as CUTLASS's ClusterBarrier issues them) instead of explicit
// cluster scope; ncu showed `membar` stalls at 0.84-0.88 cycles an issued instruction with the
// cluster-scope forms (bench/RESULTS.md, session 15).
template <bool CS>
__device__ __forceinline__ void bar_wait(void* b, unsigned parity) {
#ifndef GDR_EMU
    if constexpr (CS) {
        asm volatile(
            "{\n.reg .pred P1;\nTCW_%=:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
            "@!P1 bra TCW_%=;\n}\n" ::"r"(fz_sa(b)),
            "r"(parity)
            : "memory");
        return;
    }
#endif
    fz_wait(b, parity);  // (the emulator: the same barrier either way)
}
template <bool CS>
__device__ __forceinline__ void bar_arrive_cluster(void* b, int rank) {
#ifndef GDR_EMU
    if constexpr (CS) {
        asm volatile(
            "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
            "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(fz_sa(b)),
            "r"(rank)
            : "memory");
        return;
    }
#endif
    fz_arrive_cluster(b, rank);
}

// PF > 0: with chunk c's phase-A tiles, the producer also asks L2 to prefetch this CTA's shares of
// chunk c + PF (the slots hold one chunk ahead; the prep's scratch is past L2 at 4096 tokens).
// PIPE: the compute warps load each k-step's operands (ldmatrix, q, Kd) one step ahead of its mma
// (register double buffer; the asm statements keep program order, so the code does it by hand).
// PIPE = false is the measured code, unchanged.
template <typename T, int CL, int BUG, int PF = 0, bool PIPE = false, bool CS = false>
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
            fz_bar_init(full(s), 1);
            fz_bar_init(empty(s), CW * CL);
        }
        fz_init_fence();
    }
    for (int p = tid; p < CB * SL; p += THREADS) St[p] = 0.f;
    fz_cluster_sync();  // barriers initialised in every CTA before any copy or remote arrival
    if (warp == CW) {
        // ---- producer (one lane): this CTA's share (rows r0.. of 64/CL) of every multicast tile ----
        if (lane == 0) {
            const int rank = fz_rank();
            const int r0 = rank * (GC / CL);
            const unsigned mask = CL == 1 ? 0u : (1u << CL) - 1;
            ft_prefetch(mq), ft_prefetch(mwk), ft_prefetch(mkd), ft_prefetch(mu0), ft_prefetch(mwq);
            for (int u = 0; u < 2 * nc; u++) {
                const int s = u % NSLOT, c = u >> 1;
                if (u >= NSLOT) bar_wait<CS>(empty(s), ((u / NSLOT) - 1) & 1);
                const int row0 = (c * Hv + h) * GC;  // the chunk's first scratch row
                unsigned char* slot = sm + s * Y::SLOT;
                if constexpr (PF > 0) {
                    if ((u & 1) == 0 && c + PF < nc) {
                        const int f0 = ((c + PF) * Hv + h) * GC;
                        for (int p = 0; p < 4; p++) ft_pf(mwk, 32 * p, f0 + r0), ft_pf(mkd, 32 * p, f0 + r0);
                        for (int p = 0; p < 2; p++) ft_pf(mwq, 32 * p, f0 + r0);
                        for (int p = 0; p < GD / Y::QP; p++) ft_pf(mq, kh * dk + Y::QP * p, (c + PF) * GC + r0);
                        ft_pf(mu0, j0, f0);
                    }
                }
                if ((u & 1) == 0) {
                    fz_expect(full(s), Y::TX_A);
                    for (int p = 0; p < 4; p++) ft_box(slot + Y::A_WK + p * PANEL + r0 * 128, mwk, 32 * p, row0 + r0, full(s), mask);
                    for (int p = 0; p < GD / Y::QP; p++)
                        ft_box(slot + Y::A_Q + p * PANEL + r0 * 128, mq, kh * dk + Y::QP * p, c * GC + r0, full(s), mask);
                    ft_box(slot + Y::A_U0, mu0, j0, row0, full(s), 0);
                    fz_bulk(slot + Y::A_GAM, gam + row0, GC * 4, full(s), 0);
                } else {
                    fz_expect(full(s), Y::TX_B);
                    for (int p = 0; p < 4; p++) ft_box(slot + Y::B_KD + p * PANEL + r0 * 128, mkd, 32 * p, row0 + r0, full(s), mask);
                    for (int p = 0; p < 2; p++) ft_box(slot + Y::B_WQ + p * PANEL + r0 * 128, mwq, 32 * p, row0 + r0, full(s), mask);
                }
            }
        }
    } else {
        // ---- the 8 compute warps (as gdr_fused.cu, reads at swizzled addresses) ----------------
        const int g = lane >> 2, t = lane & 3;
        const int ur = 16 * (warp >> 1), uc = 16 * (warp & 1);
        const float qscale = rsqrtf((float)dk);
        float S[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) S[nt][r] = 0.f;
        const float* pb = St + (uc + (lane & 7) + 8 * (lane >> 4)) * SL + 4 * ((lane >> 3) & 1);
        const float* pu = Ut + ((lane & 7) + 8 * (lane >> 4)) * UL + 4 * ((lane >> 3) & 1);
        // ldmatrix A rows: row ar, 16-byte chunk (k0 % 32)/4 + ah of panel k0/32
        const int ar = ur + (lane & 7) + 8 * ((lane >> 3) & 1), ah = lane >> 4;
        const int qr = ur + g;  // q rows qr, qr + 8 (same swizzle phase)
        for (int c = 0; c < nc; c++) {
            const int c0 = c * GC, n = min(GC, L - c0);
            // ---- phase A ----
            int u = 2 * c, s = u % NSLOT;
            bar_wait<CS>(full(s), (u / NSLOT) & 1);
            FZ_SLOT_BEGIN(s);
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
            if constexpr (PIPE) {
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
                    o.x[0] = fz_qv(q1[0]), o.x[1] = fz_qv(q1[8 * 128 / (int)sizeof(T)]);
                    o.x[2] = fz_qv(q2[0]), o.x[3] = fz_qv(q2[8 * 128 / (int)sizeof(T)]);
                }
            };
            auto mma_a = [&](int k0, OpA& o) {
#pragma unroll
                for (int r = 0; r < 4; r++) o.a[r] = fz_tf32(fz_uf(o.a[r]));
                mma_tf32(Ua[0], o.a, o.b[0], o.b[1]);
                mma_tf32(Ua[1], o.a, o.b[2], o.b[3]);
                if (k0 < dk) {
                    ss0 += o.x[0] * o.x[0] + o.x[2] * o.x[2];
                    ss1 += o.x[1] * o.x[1] + o.x[3] * o.x[3];
                    const unsigned aq[4] = {fz_qbits((const T*)qs, o.x[0]), fz_qbits((const T*)qs, o.x[1]),
                                            fz_qbits((const T*)qs, o.x[2]), fz_qbits((const T*)qs, o.x[3])};
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
            } else {
#pragma unroll
            for (int k0 = 0; k0 < GD; k0 += 8) {
                unsigned b[4], a[4];
                moss_mma::ldsm_x4(b, pb + k0);
                moss_mma::ldsm_x4(a, wk + (k0 >> 5) * PANEL + ft_sw(ar, ((k0 & 31) >> 2) + ah));
#pragma unroll
                for (int r = 0; r < 4; r++) a[r] = fz_tf32(fz_uf(a[r]));
                mma_tf32(Ua[0], a, b[0], b[1]);
                mma_tf32(Ua[1], a, b[2], b[3]);
                if (k0 < dk) {
                    // q elements k0 + t and k0 + 4 + t of rows qr, qr + 8
                    const int k1 = k0 + t, k2 = k0 + 4 + t;
                    const int o1 = (k1 / Y::QP) * PANEL + ft_sw(qr, (k1 % Y::QP) / Y::QE) + (k1 % Y::QE) * (int)sizeof(T);
                    const int o2 = (k2 / Y::QP) * PANEL + ft_sw(qr, (k2 % Y::QP) / Y::QE) + (k2 % Y::QE) * (int)sizeof(T);
                    const T* q1 = reinterpret_cast<const T*>(qs + o1);
                    const T* q2 = reinterpret_cast<const T*>(qs + o2);
                    const float x0 = fz_qv(q1[0]), x1 = fz_qv(q1[8 * 128 / (int)sizeof(T)]);
                    const float x2 = fz_qv(q2[0]), x3 = fz_qv(q2[8 * 128 / (int)sizeof(T)]);
                    ss0 += x0 * x0 + x2 * x2;
                    ss1 += x1 * x1 + x3 * x3;
                    const unsigned aq[4] = {fz_qbits(q1, x0), fz_qbits(q1, x1), fz_qbits(q1, x2), fz_qbits(q1, x3)};
                    mma_tf32(Oa[0], aq, b[0], b[1]);
                    mma_tf32(Oa[1], aq, b[2], b[3]);
                }
            }
            }
            ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
            ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
            ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
            ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
            const float e0 = BUG == 1 ? 1.f : expf(gs[ur + g]), e1 = BUG == 1 ? 1.f : expf(gs[ur + g + 8]);
            const float sc[2] = {rsqrtf(ss0 + 1e-6f) * qscale * e0, rsqrtf(ss1 + 1e-6f) * qscale * e1};
            const float dec = expf(gs[GC - 1]);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = ur + g + 8 * hf, col = uc + 8 * nt + 2 * t;
                    const float2 v0 = *reinterpret_cast<const float2*>(u0 + ft_sw(row, col >> 2) + (col & 3) * 4);
                    Ut[col * UL + row] = fz_tf32r(v0.x - Ua[nt][2 * hf]);
                    Ut[(col + 1) * UL + row] = fz_tf32r(v0.y - Ua[nt][2 * hf + 1]);
                    Oa[nt][2 * hf] *= sc[hf];
                    Oa[nt][2 * hf + 1] *= sc[hf];
                }
            FZ_SLOT_END(s);
            __syncwarp();
            if (lane < CL) bar_arrive_cluster<CS>(empty(s), lane);
            fz_named_sync();  // Uᵀ complete; every read of Sᵀ done
            // ---- phase B ----
            u = 2 * c + 1;
            s = u % NSLOT;
            bar_wait<CS>(full(s), (u / NSLOT) & 1);
            FZ_SLOT_BEGIN(s);
            const unsigned char* kd = sm + s * Y::SLOT + Y::B_KD;
            const unsigned char* wq = sm + s * Y::SLOT + Y::B_WQ;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) S[nt][r] *= dec;
            if constexpr (PIPE) {
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
                const unsigned a[4] = {fz_tf32(o.a[0]), fz_tf32(o.a[1]), fz_tf32(o.a[2]), fz_tf32(o.a[3])};
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
                for (int r = 0; r < 4; r++) o.a[r] = fz_tf32(fz_uf(o.a[r]));
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
            } else {
            // S += Kdᵀ U: A(a, i) = Kd[i][a], a = 16·warp + g (+8), i = k0 + t (+4)
            const int ka = 16 * warp + g;
#pragma unroll 2
            for (int k0 = 0; k0 < GC; k0 += 8) {
                auto kv = [&](int i, int a) { return *reinterpret_cast<const float*>(kd + ft_f(i, a)); };
                const unsigned a[4] = {fz_tf32(kv(k0 + t, ka)), fz_tf32(kv(k0 + t, ka + 8)), fz_tf32(kv(k0 + t + 4, ka)),
                                       fz_tf32(kv(k0 + t + 4, ka + 8))};
                unsigned b01[4], b23[4];
                moss_mma::ldsm_x4(b01, pu + k0);
                moss_mma::ldsm_x4(b23, pu + 16 * UL + k0);
                mma_tf32(S[0], a, b01[0], b01[1]);
                mma_tf32(S[1], a, b01[2], b01[3]);
                mma_tf32(S[2], a, b23[0], b23[1]);
                mma_tf32(S[3], a, b23[2], b23[3]);
            }
            // O += Wqk U (lower triangular: k < ur + 16)
            const float* pu2 = pu + uc * UL;
            for (int k0 = 0; k0 < ur + 16; k0 += 8) {
                unsigned a[4], b[4];
                moss_mma::ldsm_x4(a, wq + (k0 >> 5) * PANEL + ft_sw(ar, ((k0 & 31) >> 2) + ah));
#pragma unroll
                for (int r = 0; r < 4; r++) a[r] = fz_tf32(fz_uf(a[r]));
                moss_mma::ldsm_x4(b, pu2 + k0);
                mma_tf32(Oa[0], a, b[0], b[1]);
                mma_tf32(Oa[1], a, b[2], b[3]);
            }
            }
            FZ_SLOT_END(s);
            __syncwarp();
            if (lane < CL) bar_arrive_cluster<CS>(empty(s), lane);
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

}  // namespace moss_gdrt

#ifndef GDR_EMU
// out [L, Hv, dv] bf16. Launch: grid 4·Hv (a multiple of CL), 288 threads, TLay<bf16>::BYTES
// (201776) bytes of dynamic shared memory; the maps as described at the top.
#define MOSS_GDR_TMA(NAME, CL, BUG, PF, PIPE, CS)                                                                                     \
    MOSS_KERNEL void __cluster_dims__(CL, 1, 1) __launch_bounds__(moss_gdrf::THREADS, 1)                                   \
        NAME(const __grid_constant__ moss_gdrt::TmaMap mq, const __grid_constant__ moss_gdrt::TmaMap mwk,                  \
             const __grid_constant__ moss_gdrt::TmaMap mkd, const __grid_constant__ moss_gdrt::TmaMap mu0,                 \
             const __grid_constant__ moss_gdrt::TmaMap mwq, __nv_bfloat16* out, const float* gam, int L, int Hk, int Hv,   \
             int dk, int dv) {                                                                                             \
        moss_gdrt::tma_impl<__nv_bfloat16, CL, BUG, PF, PIPE, CS>(&mq, &mwk, &mkd, &mu0, &mwq, out, gam, L, Hk, Hv, dk, dv);             \
    }
MOSS_GDR_TMA(moss_enc_gdr_tma2_bf16, 2, 0, 0, false, false)
MOSS_GDR_TMA(moss_ctl_enc_gdr_tma2_bf16, 2, 1, 0, false, false)
// + L2 prefetch two chunks ahead
MOSS_GDR_TMA(moss_enc_gdr_tma2p_bf16, 2, 0, 2, false, false)
MOSS_GDR_TMA(moss_ctl_enc_gdr_tma2p_bf16, 2, 1, 2, false, false)
// no cluster: each CTA loads whole tiles (boxes of 64 rows), no cross-CTA slot release
MOSS_GDR_TMA(moss_enc_gdr_tma1_bf16, 1, 0, 0, false, false)
MOSS_GDR_TMA(moss_ctl_enc_gdr_tma1_bf16, 1, 1, 0, false, false)
// operands loaded one k-step ahead (the default)
MOSS_GDR_TMA(moss_enc_gdr_tma2x_bf16, 2, 0, 0, true, false)
MOSS_GDR_TMA(moss_ctl_enc_gdr_tma2x_bf16, 2, 1, 0, true, false)
// tma2x with the barrier operations at CTA scope (CS above)
MOSS_GDR_TMA(moss_enc_gdr_tma2y_bf16, 2, 0, 0, true, true)
MOSS_GDR_TMA(moss_ctl_enc_gdr_tma2y_bf16, 2, 1, 0, true, true)
#endif
