// The gated delta rule, "v2" (MOSS_GDR=v2, bf16 only; included by cuda/gdr.cu after gdr_tc.cuh).
// Same chunk algebra as gdr.cu, with the state pass folded into one product a chunk:
//
//   S' = e^{γl} S + Kdᵀ (U0 − Wk S) = e^{γl} S + N S + B,   N = −Kdᵀ Wk,  B = Kdᵀ U0   (128 x 128)
//   O  = (e^{γ} ⊙ Q) S + Wqk (U0 − Wk S) = (e^{γ} ⊙ Q − P) S + Ou,  P = Wqk Wk,  Ou = Wqk U0
//
// gdr_prep2 (per chunk, value head): the scores and (I + A)⁻¹ as gdr_prep_tc, then Wk (then U0),
// Kd, Wqk stay in shared memory and N, B, P, Ou come out of TF32 mma.sync products (fp32
// accumulators).
// gdr_seq2 (per value head, 32 value columns, in chunk order): one product a chunk, N S, on top
// of the fp32 term e^{γl} S + B kept in the accumulators (the decay term is never rounded);
// writes the state entering each chunk. gdr_out2 (per chunk, value head, 64 columns):
// O = (e^{γ} ⊙ Q − P) S0 + Ou. N is stored already rounded to TF32 (the value its product uses).
// Scratch (fp32, blk = c·Hv + h): N, B, S [blk][128][128]; P, Ou [blk][64][128]; gam [blk][64].
// BUG 1 (moss_ctl_enc_gdr_out2_*): the state read forgets its decay e^{γ} (as gdr_out's control).
#pragma once
namespace moss_gdr {

#ifndef GDR_EMU
__device__ __forceinline__ float tf32r(float x) { return moss_mma::tf32(x); }
#else
inline float tf32r(float x) { return uf(tf32(x)); }
#endif

constexpr int V2_NL = GD + 4;     // N tile (A, row-major)
constexpr int V2_BL = SQ_CB + 4;  // B slice (read at accumulator positions)
constexpr int V2_SL = SQ_CB + 8;  // S (B operand, row-major, read down columns; plain variant)
constexpr int V2_TL = GD + 4;     // Sᵀ [32 columns][128] (B operand via ldmatrix)
constexpr int V2_BUF = GD * V2_NL + GD * V2_BL;
constexpr int V2_SEQ_FLOATS = 2 * V2_BUF + 2 * GD * V2_SL;  // ≥ 2 · SQ_CB · V2_TL as well
constexpr int V2_PREP_FLOATS = 2 * GC * PKS + 2 * GC * AS + 4 * GC;
constexpr int V2_OUT_FLOATS = GC * PKS + GD * TO_SL + GC;

// acc (16 x 8·NT tile of one warp at rows r0.., cols c0..) written to dst[row·ld + col], as
// f(value).
template <int NT, typename F>
__device__ __forceinline__ void v2_store(float* dst, int ld, int r0, int c0, const float (&acc)[1][NT][4], F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int row = r0 + g + 8 * hf, col = c0 + 8 * nt + 2 * t;
            *reinterpret_cast<float2*>(dst + (long)row * ld + col) =
                make_float2(f(acc[0][nt][2 * hf]), f(acc[0][nt][2 * hf + 1]));
        }
}

// ---- gdr_prep2: one block per (chunk, value head) ------------------------------------------------
template <typename T>
__device__ void prep2_impl(float* Nall, float* Ball, float* Pall, float* Oull, float* gamo, const T* q, const T* k,
                           const T* v, const float* g, const float* beta, int L, int Hk, int Hv, int dk, int dv,
                           long rqk, long rv) {
    GDR_SMEM(gdr_sm);
    float* Ks = gdr_sm;          // GC x PKS: K, then Kd = e^{γl−γ} ⊙ K
    float* Qs = Ks + GC * PKS;   // GC x PKS: Q, then Wk, then U0
    float* At = Qs + GC * PKS;   // GC x AS: Aᵀ
    float* Wq = At + GC * AS;    // GC x AS: Wqk
    float* gs = Wq + GC * AS;
    float* bs = gs + GC;
    float* es = bs + GC;
    float* dl = es + GC;
    float* Ws = Qs;
    const long blk = blockIdx.x;
    const int c = (int)(blk / Hv), h = (int)(blk % Hv);
    const int c0 = c * GC, n = min(GC, L - c0);
    const int kh = h / (Hv / Hk);
    const int tid = threadIdx.x, warp = tid >> 5;
    chunk_gates(gs, bs, es, dl, gamo, g, beta, blk, c0, n, h, Hv);
    load_norm_any<true>(Ks, PKS, k, rqk, c0, n, kh, dk, 1.f, nullptr);
    load_norm_any<true>(Qs, PKS, q, rqk, c0, n, kh, dk, rsqrtf((float)dk), nullptr);
    __syncthreads();
    prep_scores_tc(At, Wq, AS, Ks, Qs, gs, bs);
    // (I + A)⁻¹ on 256 right-hand sides, as prep_impl: t < 128 column t of β ⊙ V, t ≥ 128 column
    // t − 128 of β e^{γ} ⊙ K.
    float x[GC];
    if (tid < GD) {
        const bool live = tid < dv;
#pragma unroll
        for (int i = 0; i < GC; i++)
            x[i] = (live && i < n) ? bs[i] * ld(v, (long)(c0 + i) * rv + (long)h * dv + tid) : 0.f;
    } else {
#pragma unroll
        for (int i = 0; i < GC; i++) x[i] = bs[i] * es[i] * Ks[i * PKS + tid - GD];
    }
    __syncthreads();  // Qs (now free: the scores are done) becomes Ws; Ks may be scaled
#pragma unroll
    for (int j = 0; j < GC - 1; j++) {
        const float xj = x[j];
#pragma unroll
        for (int i4 = (j + 1) / 4 * 4; i4 < GC; i4 += 4) {
            float4 a = gdr_lds4(At + j * AS + i4);
            if (i4 + 0 > j) x[i4 + 0] -= a.x * xj;
            if (i4 + 1 > j) x[i4 + 1] -= a.y * xj;
            if (i4 + 2 > j) x[i4 + 2] -= a.z * xj;
            x[i4 + 3] -= a.w * xj;
        }
    }
    // Wk (threads ≥ 128) to shared memory; U0 (threads < 128) stays in registers until the
    // products with Wk are done, then takes the same buffer (103 KiB: two blocks an SM).
    if (tid >= GD) {
#pragma unroll
        for (int i = 0; i < GC; i++) Ws[i * PKS + tid - GD] = x[i];
    }
    for (int p = tid; p < GC * GD; p += GT) {
        int i = p / GD, a = p - i * GD;
        Ks[i * PKS + a] *= dl[i];
    }
    __syncthreads();
    float* nb = Nall + blk * GD * GD;
    float* bb = Ball + blk * GD * GD;
    // N = −Kdᵀ Wk (then B = Kdᵀ U0): warp w owns rows 16w.. (key index a), 32 columns a pass;
    // P = Wqk Wk (then Ou = Wqk U0): warp w owns rows 16(w/2).., columns 64(w%2).., 32 a pass;
    // Wqk is lower triangular, so those products stop at the warp's last row.
    auto products = [&](float* dkd, float* dwq, bool neg) {
#pragma unroll 1
        for (int cc = 0; cc < GD; cc += 32) {
            float acc[1][4][4];
            acc_zero(acc);
            warp_mma<1, 4>(acc, Ks + 16 * warp, 1, PKS, Ws + cc, PKS, 1, GC);
            if (neg)
                v2_store(dkd, GD, 16 * warp, cc, acc, [](float y) { return tf32r(-y); });
            else
                v2_store(dkd, GD, 16 * warp, cc, acc, [](float y) { return y; });
        }
        const int r0 = 16 * (warp >> 1);
#pragma unroll 1
        for (int cc = 64 * (warp & 1); cc < 64 * (warp & 1) + 64; cc += 32) {
            float acc[1][4][4];
            acc_zero(acc);
            warp_mma<1, 4>(acc, Wq + r0 * AS, AS, 1, Ws + cc, PKS, 1, r0 + 16);
            v2_store(dwq + blk * GC * GD, GD, r0, cc, acc, [](float y) { return y; });
        }
    };
    products(nb, Pall, true);
    __syncthreads();
    if (tid < GD) {
#pragma unroll
        for (int i = 0; i < GC; i++) Ws[i * PKS + tid] = x[i];
    }
    __syncthreads();
    products(bb, Oull, false);
}

// ---- gdr_seq2: one block per (value head, 32 value columns), sequential over chunks -----------
// Warp w keeps rows 16w.. of S (128 x 32) in its accumulators (fp32); a TF32 copy of S goes to
// shared memory (double-buffered: one barrier a chunk) as the B operand of N S. The next chunk's
// N and B slice stream in with cp.async while this one computes.
// LDSM (the kernel): N (stored TF32-rounded by gdr_prep2) and Sᵀ (TF32-rounded here) are read
// with ldmatrix.x4 (a 16 x 8 TF32 A fragment is four 8 x 4-float matrices: (g, t), (g+8, t),
// (g, t+4), (g+8, t+4); B fragments of two n-tiles likewise from Sᵀ), no cvt on the critical path,
// and the even and odd k-steps accumulate apart (half the dependent mma chain). The plain variant
// (gdr_bench.py only, -DGDR_BENCH_VARIANTS) reads them with scalar loads through warp_mma.
__device__ __forceinline__ void seq2_issue(float* dst, const float* Nall, const float* Ball, long blk, int j0) {
    const float* nb = Nall + blk * GD * GD;
    const float* bb = Ball + blk * GD * GD + j0;
    for (int p = threadIdx.x; p < GD * GD / 4; p += GT) {
        int i = p / (GD / 4), a = (p % (GD / 4)) * 4;
        moss_mma::cp_async16(dst + i * V2_NL + a, nb + i * GD + a, true);
    }
    for (int p = threadIdx.x; p < GD * SQ_CB / 4; p += GT) {
        int i = p / (SQ_CB / 4), a = (p % (SQ_CB / 4)) * 4;
        moss_mma::cp_async16(dst + GD * V2_NL + i * V2_BL + a, bb + i * GD + a, true);
    }
    moss_mma::cp_async_commit();
}

template <bool LDSM>
__device__ void seq2_impl(float* Sall, const float* Nall, const float* Ball, const float* gam, int nc, int Hv,
                          int ncb) {
    GDR_SMEM(gdr_sm);
    float* Ss = gdr_sm + 2 * V2_BUF;  // 2 x GD x V2_SL (plain) or 2 x SQ_CB x V2_TL (LDSM)
    constexpr int SBUF = LDSM ? SQ_CB * V2_TL : GD * V2_SL;
    const int h = blockIdx.x / ncb, j0 = (blockIdx.x % ncb) * SQ_CB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * warp;
    float S[1][4][4];
    acc_zero(S);
    for (int p = threadIdx.x; p < SBUF; p += GT) Ss[p] = 0.f;
    seq2_issue(gdr_sm, Nall, Ball, h, j0);
    for (int c = 0; c < nc; c++) {
        const long blk = (long)c * Hv + h;
        const float* ns = gdr_sm + (c & 1) * V2_BUF;
        const float* bsl = ns + GD * V2_NL;
        const float* sin = Ss + (c & 1) * SBUF;
        float* sout = Ss + ((c + 1) & 1) * SBUF;
        moss_mma::cp_async_wait<0>();
        __syncthreads();  // chunk c's tiles and S (TF32) are in; step c − 1's readers are done
        if (c + 1 < nc) seq2_issue(gdr_sm + ((c + 1) & 1) * V2_BUF, Nall, Ball, blk + Hv, j0);
        // the state entering chunk c
        v2_store(Sall + blk * GD * GD + j0, GD, r0, 0, S, [](float y) { return y; });
        const float dec = expf(gam[blk * GC + GC - 1]);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int row = r0 + g + 8 * (r >> 1), col = 8 * nt + 2 * t + (r & 1);
                S[0][nt][r] = dec * S[0][nt][r] + bsl[row * V2_BL + col];
            }
        if constexpr (LDSM) {
            float P0[4][4], P1[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) P0[nt][r] = P1[nt][r] = 0.f;
            const float* pa = ns + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * V2_NL + 4 * (lane >> 4);
            const float* pb = sin + ((lane & 7) + 8 * (lane >> 4)) * V2_TL + 4 * ((lane >> 3) & 1);
            auto kstep = [&](float(&acc)[4][4], int k0) {
                unsigned a[4], b01[4], b23[4];
                moss_mma::ldsm_x4(a, pa + k0);
                moss_mma::ldsm_x4(b01, pb + k0);
                moss_mma::ldsm_x4(b23, pb + 16 * V2_TL + k0);
                mma_tf32(acc[0], a, b01[0], b01[1]);
                mma_tf32(acc[1], a, b01[2], b01[3]);
                mma_tf32(acc[2], a, b23[0], b23[1]);
                mma_tf32(acc[3], a, b23[2], b23[3]);
            };
#pragma unroll 2
            for (int k0 = 0; k0 < GD; k0 += 16) {
                kstep(P0, k0);
                kstep(P1, k0 + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    S[0][nt][r] += P0[nt][r] + P1[nt][r];
                    int row = r0 + g + 8 * (r >> 1), col = 8 * nt + 2 * t + (r & 1);
                    sout[col * V2_TL + row] = tf32r(S[0][nt][r]);
                }
        } else {
            warp_mma<1, 4>(S, ns + r0 * V2_NL, V2_NL, 1, sin, V2_SL, 1, GD);
            v2_store(sout, V2_SL, r0, 0, S, [](float y) { return tf32r(y); });
        }
    }
}

// ---- gdr_out2: one block per (chunk, value head) x 64 value columns ------------------------------
template <typename T, int BUG>
__device__ void out2_impl(T* out, const T* q, const float* Sall, const float* Pall, const float* Oull,
                          const float* gam, int L, int Hk, int Hv, int dk, int dv, long rqk) {
    GDR_SMEM(gdr_sm);
    float* Qs = gdr_sm;          // GC x PKS: e^{γ} ⊙ Q − P
    float* Ss = Qs + GC * PKS;   // GD x TO_SL
    float* es = Ss + GD * TO_SL; // GC
    const long blk = blockIdx.x;
    const int c = (int)(blk / Hv), h = (int)(blk % Hv);
    const int c0 = c * GC, n = min(GC, L - c0);
    const int kh = h / (Hv / Hk);
    const int col0 = blockIdx.y * OC;
    const int tid = threadIdx.x;
    if (tid < GC) es[tid] = BUG == 1 ? 1.f : expf(gam[blk * GC + tid]);
    __syncthreads();
    load_norm_any<true>(Qs, PKS, q, rqk, c0, n, kh, dk, rsqrtf((float)dk), es);
    load_state_cols(Ss, TO_SL, Sall, blk, col0);
    __syncthreads();
    const float* pg = Pall + blk * GC * GD;
    for (int p = tid; p < GC * GD / 4; p += GT) {
        int i = p / (GD / 4), a = (p % (GD / 4)) * 4;
        float4 pv = *reinterpret_cast<const float4*>(pg + i * GD + a);
        float* d = Qs + i * PKS + a;
        d[0] -= pv.x;
        d[1] -= pv.y;
        d[2] -= pv.z;
        d[3] -= pv.w;
    }
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * (warp >> 1), wc = 32 * (warp & 1);
    float o[1][4][4];
    acc_zero(o);
    warp_mma<1, 4>(o, Qs + r0 * PKS, PKS, 1, Ss + wc, TO_SL, 1, GD);
    const float* og = Oull + blk * GC * GD;
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int i = r0 + g + 8 * (r >> 1), col = col0 + wc + 8 * nt + 2 * t + (r & 1);
            if (i < n && col < dv) st(out, ((long)(c0 + i) * Hv + h) * dv + col, o[0][nt][r] + og[i * GD + col]);
        }
}

}  // namespace moss_gdr
