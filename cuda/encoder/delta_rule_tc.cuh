// The bf16 path's state pass and output where the Hopper kernel (cuda/encoder/sm90a/delta_rule_tma.cu) does not
// run (every other GPU, or MOSS_KERNELS=portable): gdr_seq_tc and gdr_out_tc after delta_rule_prep
// (cuda/encoder/delta_rule.cu, delta_rule_prep.cuh), every product on TF32 mma.sync (m16n8k8, operands rounded to
// TF32 with cvt.rna, fp32 accumulators); the state and the decays stay fp32. The fp32 path
// (`--precision fp32`, bound 1e-4) keeps the SIMT kernels of delta_rule.cu.
//
// Fragment layouts of m16n8k8 .tf32 (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4):
//   A 16x8: a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4)
//   B 8x8 (k x n): b0 = (t, g), b1 = (t+4, g)
//   C 16x8: c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g+8, 2t), c3 = (g+8, 2t+1)
// Shared-memory strides are chosen so that a fragment load hits 32 different banks: an operand
// read along its rows (A row-major, Bᵀ stored row-major) has a stride ≡ 4 (mod 32), one read
// down its columns (B row-major, Aᵀ stored row-major) a stride ≡ 8 (mod 32).
#pragma once
namespace moss_gdr {

#ifndef GDR_EMU
// The TF32 bits of x, ready for an mma operand register.
__device__ __forceinline__ unsigned tf32(float x) { return __float_as_uint(moss_mma::tf32(x)); }
using moss_mma::mma_tf32;
#endif

// One warp: acc (MT x NT tiles of 16x8) += A · B over k < K (K a multiple of 8), with
// A(i, k) = A[i·ars + k·acs] and B(k, j) = B[k·brs + j·bcs] (fp32 in shared memory).
// acc[mt][nt][r] is element (16mt + g + 8(r/2), 8nt + 2t + r%2).
template <int MT, int NT>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const float* A, int ars, int acs, const float* B,
                                         int brs, int bcs, int K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
    for (int k0 = 0; k0 < K; k0 += 8) {
        unsigned a[MT][4], b[NT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const float* p = A + (16 * mt + g) * ars + (k0 + t) * acs;
            a[mt][0] = tf32(p[0]);
            a[mt][1] = tf32(p[8 * ars]);
            a[mt][2] = tf32(p[4 * acs]);
            a[mt][3] = tf32(p[8 * ars + 4 * acs]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float* p = B + (k0 + t) * brs + (8 * nt + g) * bcs;
            b[nt][0] = tf32(p[0]);
            b[nt][1] = tf32(p[4 * brs]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mma_tf32(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void acc_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[mt][nt][r] = 0.f;
}

// ---- gdr_seq_tc: one block per (value head, 32 value columns), sequential over chunks ----------
// Warp w keeps rows 16w.. of S (128 x 32) in its accumulators; S also goes to shared memory as the
// B operand of U = U0 − Wk S. The next chunk's Wk, Kd, U0 stream in with cp.async.
constexpr int TQ_WL = GD + 4;     // Wk tile (A, row-major)
constexpr int TQ_KL = GD + 8;     // Kd tile (A read transposed: Kdᵀ)
constexpr int TQ_UL = SQ_CB + 4;  // U0 tile
constexpr int TQ_SL = SQ_CB + 8;  // S and U tiles (B, row-major)
constexpr int TQ_BUF = GC * TQ_WL + GC * TQ_KL + GC * TQ_UL;
constexpr int TQ_FLOATS = 2 * TQ_BUF + GD * TQ_SL + GC * TQ_SL;
static_assert(TQ_FLOATS == ENC_GDR_SEQ_TC_FLOATS, "launch.h: ENC_GDR_SEQ_TC_FLOATS");

__device__ __forceinline__ void seq_tc_issue(float* dst, const float* Wk, const float* Kd, const float* U0, long blk,
                                             int j0) {
    const float* wk = Wk + blk * GC * GD;
    const float* kd = Kd + blk * GC * GD;
    const float* u0 = U0 + blk * GC * GD + j0;
    for (int p = threadIdx.x; p < GC * GD / 4; p += GT) {
        int i = p / (GD / 4), a = (p % (GD / 4)) * 4;
        moss_mma::cp_async16(dst + i * TQ_WL + a, wk + i * GD + a, true);
        moss_mma::cp_async16(dst + GC * TQ_WL + i * TQ_KL + a, kd + i * GD + a, true);
    }
    for (int p = threadIdx.x; p < GC * SQ_CB / 4; p += GT) {
        int i = p / (SQ_CB / 4), a = (p % (SQ_CB / 4)) * 4;
        moss_mma::cp_async16(dst + GC * TQ_WL + GC * TQ_KL + i * TQ_UL + a, u0 + i * GD + a, true);
    }
    moss_mma::cp_async_commit();
}

__device__ void seq_tc_impl(float* Sall, float* Uall, const float* Wk, const float* Kd, const float* U0,
                            const float* gam, int nc, int Hv, int ncb) {
    GDR_SMEM(gdr_sm);
    float* Ss = gdr_sm + 2 * TQ_BUF;  // GD x TQ_SL
    float* Us = Ss + GD * TQ_SL;      // GC x TQ_SL
    const int h = blockIdx.x / ncb, j0 = (blockIdx.x % ncb) * SQ_CB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float S[1][4][4];
    acc_zero(S);
    for (int p = threadIdx.x; p < GD * TQ_SL; p += GT) Ss[p] = 0.f;
    seq_tc_issue(gdr_sm, Wk, Kd, U0, h, j0);
    for (int c = 0; c < nc; c++) {
        const long blk = (long)c * Hv + h;
        const float* wks = gdr_sm + (c & 1) * TQ_BUF;
        const float* kds = wks + GC * TQ_WL;
        const float* u0s = kds + GC * TQ_KL;
        if (c + 1 < nc) {
            seq_tc_issue(gdr_sm + ((c + 1) & 1) * TQ_BUF, Wk, Kd, U0, blk + Hv, j0);
            moss_mma::cp_async_wait<1>();
        } else {
            moss_mma::cp_async_wait<0>();
        }
        __syncthreads();
        // the state entering chunk c
        float* so = Sall + blk * GD * GD + j0;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int row = 16 * warp + g + 8 * hf, col = 8 * nt + 2 * t;
                *reinterpret_cast<float2*>(so + row * GD + col) = make_float2(S[0][nt][2 * hf], S[0][nt][2 * hf + 1]);
            }
        // U = U0 − Wk S: warp w owns rows 16(w/2).., columns 16(w%2)..
        {
            const int ur = 16 * (warp >> 1), uc = 16 * (warp & 1);
            float P[1][2][4];
            acc_zero(P);
            warp_mma<1, 2>(P, wks + ur * TQ_WL, TQ_WL, 1, Ss + uc, TQ_SL, 1, GD);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    int row = ur + g + 8 * hf, col = uc + 8 * nt + 2 * t;
                    float2 u = make_float2(u0s[row * TQ_UL + col] - P[0][nt][2 * hf],
                                           u0s[row * TQ_UL + col + 1] - P[0][nt][2 * hf + 1]);
                    *reinterpret_cast<float2*>(Us + row * TQ_SL + col) = u;
                    *reinterpret_cast<float2*>(Uall + blk * GC * GD + row * GD + j0 + col) = u;
                }
        }
        __syncthreads();
        // S ← e^{γ_last} S + Kdᵀ U
        const float dec = expf(gam[blk * GC + GC - 1]);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) S[0][nt][r] *= dec;
        warp_mma<1, 4>(S, kds + 16 * warp, 1, TQ_KL, Us, TQ_SL, 1, GC);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int row = 16 * warp + g + 8 * hf, col = 8 * nt + 2 * t;
                *reinterpret_cast<float2*>(Ss + row * TQ_SL + col) = make_float2(S[0][nt][2 * hf], S[0][nt][2 * hf + 1]);
            }
        __syncthreads();
    }
}

// ---- gdr_out_tc: one block per (chunk, value head) x 64 value columns --------------------------
// O = (e^{γ} ⊙ Q) S0 + Wqk U; warp w owns rows 16(w/2).., columns 32(w%2)..; Wqk is lower
// triangular, so a warp's second product stops at its last row.
constexpr int TO_SL = OC + 8;  // S0 and U tiles (B, row-major)
constexpr int TO_WL = GC + 4;  // Wqk tile (A, row-major)
constexpr int TO_FLOATS = GC * PKS + GD * TO_SL + GC * TO_WL + GC * TO_SL + GC;
static_assert(TO_FLOATS == ENC_GDR_OUT_TC_FLOATS, "launch.h: ENC_GDR_OUT_TC_FLOATS");

template <typename T, int BUG>
__device__ void out_tc_impl(T* out, const T* q, const float* Sall, const float* Uall, const float* Wqk,
                            const float* gam, int L, int Hk, int Hv, int dk, int dv, long rqk) {
    GDR_SMEM(gdr_sm);
    float* Qs = gdr_sm;          // GC x PKS
    float* Ss = Qs + GC * PKS;   // GD x TO_SL
    float* Ws = Ss + GD * TO_SL; // GC x TO_WL
    float* Us = Ws + GC * TO_WL; // GC x TO_SL
    float* es = Us + GC * TO_SL; // GC
    const long blk = blockIdx.x;
    const int c = (int)(blk / Hv), h = (int)(blk % Hv);
    const int c0 = c * GC, n = min(GC, L - c0);
    const int kh = h / (Hv / Hk);
    const int col0 = blockIdx.y * OC;
    const int tid = threadIdx.x;
    if (tid < GC) es[tid] = BUG == 1 ? 1.f : expf(gam[blk * GC + tid]);
    __syncthreads();
    load_norm(Qs, PKS, q, rqk, c0, n, kh, dk, rsqrtf((float)dk), es);
    load_state_cols(Ss, TO_SL, Sall, blk, col0);
    const float* ug = Uall + blk * GC * GD + col0;
    const float* wg = Wqk + blk * GC * GC;
    for (int p = tid; p < GC * OC / 4; p += GT) {  // OC == GC: a Wqk row is as wide as a U row
        int i = p / (OC / 4), x = (p % (OC / 4)) * 4;
        *reinterpret_cast<float4*>(Us + i * TO_SL + x) = *reinterpret_cast<const float4*>(ug + i * GD + x);
        *reinterpret_cast<float4*>(Ws + i * TO_WL + x) = *reinterpret_cast<const float4*>(wg + i * GC + x);
    }
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * (warp >> 1), wc = 32 * (warp & 1);
    float o[1][4][4];
    acc_zero(o);
    warp_mma<1, 4>(o, Qs + r0 * PKS, PKS, 1, Ss + wc, TO_SL, 1, GD);
    warp_mma<1, 4>(o, Ws + r0 * TO_WL, TO_WL, 1, Us + wc, TO_SL, 1, r0 + 16);
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int i = r0 + g + 8 * (r >> 1), col = col0 + wc + 8 * nt + 2 * t + (r & 1);
            if (i < n && col < dv) st(out, ((long)(c0 + i) * Hv + h) * dv + col, o[0][nt][r]);
        }
}

}  // namespace moss_gdr
