// The chunk-parallel delta rule's state pass and output in at most 96 KiB of shared memory a block:
// what a GPU runs whose opt-in shared memory a block does not hold gdr_seq_tc / gdr_seq (182 / 177
// KiB) or gdr_out_tc / gdr_out_f32 (104 / 101 KiB): sm_86, 89, 120, 121 (99 KiB) and sm_80 (163
// KiB). Same algebra, same scratch and same prep kernels as those (cuda/encoder/delta_rule.cu's
// header; delta_rule_prep 92.5 KiB, gdr_prep_f32 84 KiB fit everywhere).
//
// gdr_seq_compact: one block per (value head h, 32 value columns j0..), in chunk order from S = 0.
// S (128 x 32, fp32) lives in registers as two 64-row halves S₀ (rows 0..63), S₁ (64..127). The
// chunk's Wk and Kd (64 x 128 each) stream in as four 64 x 64 quarters, Wk[:, 0:64], Wk[:, 64:128],
// Kd[:, 0:64], Kd[:, 64:128], through a ring of 3 slots (cp.async, two quarters ahead); the U0
// slice goes straight from global memory into registers, loaded a chunk ahead. Per quarter:
//   Wk₀:  S → Sall (the state entering the chunk);  P = Wk[:, 0:64] S₀
//   Wk₁:  P += Wk[:, 64:128] S₁;  U = U0 − P → shared (Us) and Uall
//   Kd₀:  S₀ ← e^{γ_last} S₀ + Kd[:, 0:64]ᵀ U
//   Kd₁:  S₁ ← e^{γ_last} S₁ + Kd[:, 64:128]ᵀ U;  S → shared (Ss, the next chunk's operand)
// gdr_out_compact: one block per (chunk, value head) x 32 value columns:
//   O = (e^{γ} ⊙ Q̂) S0_c + Wqk U   (Q̂: the L2-normalised q rows / √dk).
// Products: with TC (the bf16 path) TF32 mma.sync through warp_mma (delta_rule_tc.cuh), else fp32
// FMA (the fp32 path, bound 1e-4); both on one 64 x 32 output tile type, CTile.
// Shared memory (floats): seq 3·64·72 + 128·40 + 64·40 = 21504 (84 KiB); out 64·132 + 128·40 +
// 64·68 + 64·40 + 64 = 20544 (80.25 KiB); no static shared memory. One block an SM on a 99 KiB GPU.
// BUG 1 (moss_ctl_enc_gdr_out_compact_*): the state read (e^{γ} ⊙ Q̂) S0 forgets its decay e^{γ}.
#pragma once
namespace moss_gdr {

// A 64 x 32 fp32 tile over the block's 256 threads, 8 elements a thread: element e at (row(e),
// col(e)); for even e, elements e and e + 1 are adjacent columns of one row (col(e) even).
//   TC:  warp w owns rows 16(w/2).., columns 16(w%2).. as two m16n8 accumulators (e = 4·nt + r)
//   SIMT: thread t owns rows 2(t/8), 2(t/8) + 1 and columns 4(t%8)..4(t%8)+3 (e = 4·row + col)
template <bool TC>
struct CTile {
    float a[1][2][4];
    __device__ __forceinline__ float& operator[](int e) { return a[0][e >> 2][e & 3]; }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int e = 0; e < 8; e++) (*this)[e] = 0.f;
    }
    __device__ __forceinline__ void scale(float s) {
#pragma unroll
        for (int e = 0; e < 8; e++) (*this)[e] *= s;
    }
    __device__ __forceinline__ int row(int e) const {
        const int tid = threadIdx.x;
        return TC ? 16 * (tid >> 6) + ((tid & 31) >> 2) + 8 * ((e & 3) >> 1) : 2 * (tid >> 3) + (e >> 2);
    }
    __device__ __forceinline__ int col(int e) const {
        const int tid = threadIdx.x;
        return TC ? 16 * ((tid >> 5) & 1) + 8 * (e >> 2) + 2 * (tid & 3) + (e & 1) : 4 * (tid & 7) + (e & 3);
    }
    // One past the last row the thread's warp owns (how far a lower-triangular A need be read).
    __device__ __forceinline__ int rows_end() const {
        const int warp = threadIdx.x >> 5;
        return TC ? 16 * (warp >> 1) + 16 : 8 * warp + 8;
    }
    // this += A · B over k < K: A(i, k) = A[i·ars + k·acs] (64 rows), B(k, j) = B[k·brs + j] (32
    // columns, 16-byte aligned rows), fp32 in shared memory; K a multiple of 8.
    __device__ __forceinline__ void mac(const float* A, int ars, int acs, const float* B, int brs, int K) {
        const int tid = threadIdx.x;
        if constexpr (TC) {
            const int warp = tid >> 5;
            warp_mma<1, 2>(a, A + 16 * (warp >> 1) * ars, ars, acs, B + 16 * (warp & 1), brs, 1, K);
        } else {
            const float* a0 = A + 2 * (tid >> 3) * ars;
            const float* a1 = a0 + ars;
            const float* b = B + 4 * (tid & 7);
#pragma unroll 8
            for (int k = 0; k < K; k++) {
                const float x0 = a0[k * acs], x1 = a1[k * acs];
                const float4 y = *reinterpret_cast<const float4*>(b + k * brs);
                a[0][0][0] += x0 * y.x; a[0][0][1] += x0 * y.y; a[0][0][2] += x0 * y.z; a[0][0][3] += x0 * y.w;
                a[0][1][0] += x1 * y.x; a[0][1][1] += x1 * y.y; a[0][1][2] += x1 * y.z; a[0][1][3] += x1 * y.w;
            }
        }
    }
    // The tile into dst (row stride ld) at rows row0.., float2 stores.
    __device__ __forceinline__ void store(float* dst, int ld, int row0) {
#pragma unroll
        for (int e = 0; e < 8; e += 2)
            *reinterpret_cast<float2*>(dst + (row0 + row(e)) * ld + col(e)) = make_float2((*this)[e], (*this)[e + 1]);
    }
};

// ---- gdr_seq_compact ----------------------------------------------------------------------------
constexpr int CS_CB = ENC_GDR_COMPACT_COLS;  // value columns a block
constexpr int CS_WL = 64 + 4;         // Wk quarter (A, row-major)
constexpr int CS_KL = 64 + 8;         // Kd quarter (A read transposed: Kdᵀ)
constexpr int CS_SLOT = GC * CS_KL;   // floats a ring slot (the larger quarter)
constexpr int CS_NSLOT = 3;
constexpr int CS_BL = CS_CB + 8;      // S and U tiles (B, row-major)
constexpr int CS_FLOATS = CS_NSLOT * CS_SLOT + GD * CS_BL + GC * CS_BL;
static_assert(CS_FLOATS * 4 <= 96 * 1024, "gdr_seq_compact: at most 96 KiB a block");
static_assert(CS_FLOATS == ENC_GDR_SEQ_COMPACT_FLOATS, "launch.h: ENC_GDR_SEQ_COMPACT_FLOATS");

// Quarter p (chunk p / 4; p % 4: Wk[:, 0:64], Wk[:, 64:128], Kd[:, 0:64], Kd[:, 64:128]) of head
// h into slot dst (row stride CS_WL or CS_KL), 16 bytes a copy. Not committed.
__device__ __forceinline__ void cs_issue(float* dst, const float* Wk, const float* Kd, int Hv, int h, int p) {
    const int kind = p & 3, ld = kind < 2 ? CS_WL : CS_KL;
    const long blk = (long)(p >> 2) * Hv + h;
    const float* src = (kind < 2 ? Wk : Kd) + blk * GC * GD + 64 * (kind & 1);
    for (int x = threadIdx.x; x < GC * 16; x += GT) {
        const int i = x >> 4, a = (x & 15) * 4;
        moss_mma::cp_async16(dst + i * ld + a, src + i * GD + a, true);
    }
}

template <bool TC>
__device__ void seq_compact_impl(float* Sall, float* Uall, const float* Wk, const float* Kd, const float* U0,
                                 const float* gam, int nc, int Hv, int ncb) {
    GDR_SMEM(gdr_sm);
    float* Ss = gdr_sm + CS_NSLOT * CS_SLOT;  // GD x CS_BL: the state entering the chunk
    float* Us = Ss + GD * CS_BL;              // GC x CS_BL
    const int h = blockIdx.x / ncb, j0 = (blockIdx.x % ncb) * CS_CB;
    CTile<TC> S0, S1, P;
    S0.zero();
    S1.zero();
    for (int x = threadIdx.x; x < GD * CS_BL; x += GT) Ss[x] = 0.f;
    float u0[8];  // this thread's elements of the chunk's U0 slice
    auto load_u0 = [&](int c) {
        const float* src = U0 + ((long)c * Hv + h) * GC * GD + j0;
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const float2 v = *reinterpret_cast<const float2*>(src + P.row(e) * GD + P.col(e));
            u0[e] = v.x;
            u0[e + 1] = v.y;
        }
    };
    load_u0(0);
    const int np = 4 * nc;
    cs_issue(gdr_sm, Wk, Kd, Hv, h, 0);
    moss_mma::cp_async_commit();
    if (np > 1) cs_issue(gdr_sm + CS_SLOT, Wk, Kd, Hv, h, 1);
    moss_mma::cp_async_commit();
    int p = 0;
    // The next quarter, landed and visible to every thread; the slot of the one before it is free
    // for the quarter two ahead. One commit group a quarter (empty past the last).
    auto next = [&]() -> const float* {
        moss_mma::cp_async_wait<1>();
        __syncthreads();
        if (p + 2 < np) cs_issue(gdr_sm + ((p + 2) % CS_NSLOT) * CS_SLOT, Wk, Kd, Hv, h, p + 2);
        moss_mma::cp_async_commit();
        return gdr_sm + (p++ % CS_NSLOT) * CS_SLOT;
    };
    for (int c = 0; c < nc; c++) {
        const long blk = (long)c * Hv + h;
        const float* t = next();  // Wk[:, 0:64]
        float* so = Sall + blk * GD * GD + j0;
        S0.store(so, GD, 0);
        S1.store(so, GD, 64);
        P.zero();
        P.mac(t, CS_WL, 1, Ss, CS_BL, 64);
        t = next();  // Wk[:, 64:128]
        P.mac(t, CS_WL, 1, Ss + 64 * CS_BL, CS_BL, 64);
#pragma unroll
        for (int e = 0; e < 8; e++) P[e] = u0[e] - P[e];
        P.store(Us, CS_BL, 0);
        P.store(Uall + blk * GC * GD + j0, GD, 0);
        if (c + 1 < nc) load_u0(c + 1);
        const float dec = expf(gam[blk * GC + GC - 1]);
        t = next();  // Kd[:, 0:64]
        S0.scale(dec);
        S0.mac(t, 1, CS_KL, Us, CS_BL, GC);
        t = next();  // Kd[:, 64:128]
        S1.scale(dec);
        S1.mac(t, 1, CS_KL, Us, CS_BL, GC);
        S0.store(Ss, CS_BL, 0);
        S1.store(Ss, CS_BL, 64);
    }
}

// ---- gdr_out_compact ----------------------------------------------------------------------------
constexpr int CO_CB = ENC_GDR_COMPACT_COLS;  // value columns a block
constexpr int CO_BL = CO_CB + 8;  // S0 and U tiles (B, row-major)
constexpr int CO_WL = GC + 4;     // Wqk (A, row-major)
constexpr int CO_FLOATS = GC * PKS + GD * CO_BL + GC * CO_WL + GC * CO_BL + GC;
static_assert(CO_FLOATS * 4 <= 96 * 1024, "gdr_out_compact: at most 96 KiB a block");
static_assert(CO_FLOATS == ENC_GDR_OUT_COMPACT_FLOATS, "launch.h: ENC_GDR_OUT_COMPACT_FLOATS");

template <typename T, bool TC, int BUG>
__device__ void out_compact_impl(T* out, const T* q, const float* Sall, const float* Uall, const float* Wqk,
                                 const float* gam, int L, int Hk, int Hv, int dk, int dv, long rqk) {
    GDR_SMEM(gdr_sm);
    // Q̂ [GC][PKS], S0 [GD][CO_BL], Wqk [GC][CO_WL], U [GC][CO_BL], e^γ [GC]
    float *Qs = gdr_sm, *Ss = Qs + GC * PKS, *Ws = Ss + GD * CO_BL, *Us = Ws + GC * CO_WL, *es = Us + GC * CO_BL;
    const long blk = blockIdx.x;  // chunk blk / Hv, value head h
    const int h = (int)(blk % Hv), c0 = (int)(blk / Hv) * GC, n = min(GC, L - c0);
    const int col0 = blockIdx.y * CO_CB, tid = threadIdx.x;
    if (tid < GC) es[tid] = BUG == 1 ? 1.f : expf(gam[blk * GC + tid]);  // the state read's decay e^γ
    __syncthreads();
    load_norm(Qs, PKS, q, rqk, c0, n, h / (Hv / Hk), dk, rsqrtf((float)dk), es);  // Q̂ rows times e^γ
    const float* sg = Sall + blk * GD * GD + col0;
    for (int x = tid; x < GD * CO_CB / 4; x += GT) {
        const int d = x / (CO_CB / 4), a = (x % (CO_CB / 4)) * 4;
        *reinterpret_cast<float4*>(Ss + d * CO_BL + a) = *reinterpret_cast<const float4*>(sg + d * GD + a);
    }
    const float* ug = Uall + blk * GC * GD + col0;
    for (int x = tid; x < GC * CO_CB / 4; x += GT) {
        const int i = x / (CO_CB / 4), a = (x % (CO_CB / 4)) * 4;
        *reinterpret_cast<float4*>(Us + i * CO_BL + a) = *reinterpret_cast<const float4*>(ug + i * GD + a);
    }
    const float* wg = Wqk + blk * GC * GC;
    for (int x = tid; x < GC * GC / 4; x += GT) {
        const int i = x / (GC / 4), a = (x % (GC / 4)) * 4;
        *reinterpret_cast<float4*>(Ws + i * CO_WL + a) = *reinterpret_cast<const float4*>(wg + i * GC + a);
    }
    __syncthreads();
    CTile<TC> o;
    o.zero();
    o.mac(Qs, PKS, 1, Ss, CO_BL, GD);
    o.mac(Ws, CO_WL, 1, Us, CO_BL, o.rows_end());  // Wqk is lower triangular
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int i = o.row(e), col = col0 + o.col(e);
        if (i < n && col < dv) st(out, ((long)(c0 + i) * Hv + h) * dv + col, o[e]);
    }
}

}  // namespace moss_gdr

#ifndef GDR_EMU
// Same arguments as gdr_seq_tc / gdr_out_tc_bf16 (rv unused); grids: Hv·⌈dv/32⌉ and (chunks·Hv, ⌈dv/32⌉).
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) moss_enc_gdr_seq_compact_tc(float* S, float* U, const float* Wk,
                                                                    const float* Kd, const float* U0,
                                                                    const float* gam, int nc, int Hv, int ncb) {
    moss_gdr::seq_compact_impl<true>(S, U, Wk, Kd, U0, gam, nc, Hv, ncb);
}
MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) moss_enc_gdr_seq_compact_f32(float* S, float* U, const float* Wk,
                                                                     const float* Kd, const float* U0,
                                                                     const float* gam, int nc, int Hv, int ncb) {
    moss_gdr::seq_compact_impl<false>(S, U, Wk, Kd, U0, gam, nc, Hv, ncb);
}
#endif
#define MOSS_GDR_OUT_COMPACT(PFX, BUG)                                                                        \
    MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) PFX##_gdr_out_compact_tc_bf16(                                    \
        __nv_bfloat16* out, const __nv_bfloat16* q, const float* S, const float* U, const float* Wqk,         \
        const float* gam, int L, int Hk, int Hv, int dk, int dv, long rqk, long rv) {                          \
        moss_gdr::out_compact_impl<__nv_bfloat16, true, BUG>(out, q, S, U, Wqk, gam, L, Hk, Hv, dk, dv, rqk); \
    }                                                                                                         \
    MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) PFX##_gdr_out_compact_f32(                                        \
        float* out, const float* q, const float* S, const float* U, const float* Wqk, const float* gam, int L,  \
        int Hk, int Hv, int dk, int dv, long rqk, long rv) {                                                   \
        moss_gdr::out_compact_impl<float, false, BUG>(out, q, S, U, Wqk, gam, L, Hk, Hv, dk, dv, rqk);         \
    }
MOSS_PRODUCTION(MOSS_GDR_OUT_COMPACT(moss_enc, 0))
MOSS_CONTROL(MOSS_GDR_OUT_COMPACT(moss_ctl_enc, 1))
#endif
