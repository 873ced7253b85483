// delta_rule_prep: the bf16 delta rule's chunk-local kernel with (I + A)⁻¹ built blockwise and
// [U0 | Wk] as one tensor-core product. Same outputs, same scratch layout as the fp32 prep_impl
// (cuda/encoder/delta_rule.cu): Kd, Wk, U0 [blk][64][128], Wqk [blk][64][64], gam [blk][64] (blk = chunk·Hv + head).
//
// One block of 512 threads per chunk and PAIR of value heads 2p, 2p + 1 of one key head (Hv / Hk
// even): K, Q tiles, their norms and the raw K Kᵀ, Q Kᵀ products are shared by the two heads (they
// differ only in g and β); 93 KiB of shared memory and 64 registers (two blocks an SM):
//  1. k, q rows of the chunk as raw bf16 into shared memory with 16-byte cp.async (all loads in
//     flight at once); both heads' gates meanwhile.
//  2. r_i = rsqrt(|k_i|² + 1e-6), rq_i = rsqrt(|q_i|² + 1e-6)/√dk from the bf16 tiles.
//  3. K Kᵀ and Q Kᵀ on bf16 mma (m16n8k16, ldmatrix; 16 warps of 16x16): products of bf16 values are
//     exact, sums fp32; then per head A[i][j] = β_i r_i r_j (k_i·k_j) e^{γ_i−γ_j} (j < i, fp32,
//     shared) and Wqk[i][j] = rq_i r_j (q_i·k_j) e^{γ_i−γ_j} (j ≤ i, global).
// From here threads 256·hh.. run head hh alone (named barrier 1 + hh):
//  4. T = (I + A)⁻¹ in fp32, blockwise: the four 16x16 diagonal blocks by substitution (a thread per
//     column), then T₁₀ = −T₁₁ A₁₀ T₀₀ for the two 16-wide pairs, then the same for the 32-wide
//     halves. T₀ lives where the Q tile was. Once A's last read is behind a barrier, the head's v
//     rows are loaded (cp.async) into A's place; Kd = e^{γ_last−γ} ⊙ r ⊙ K (16-byte stores) while
//     they arrive.
//  5. U0 = T diag(β) V and Wk = T diag(β e^γ r) K on bf16 mma with the raw bf16 V, K as the B
//     operand (exact) and T' = T diag(s) split into bf16 hi + lo (A operand, two mma: ~2^-17
//     relative, well under the TF32 rounding of the other products). Rows past the diagonal block
//     skip; every warp has 5 of the 20 k-steps.
// Needs dk, dv, the row strides and the q/k/v addresses to be multiples of 8 elements / 16 bytes
// and Hv / Hk even (host check in crates/moss-cuda/src/encoder/delta_rule.rs; otherwise the one-kernel sequential
// version runs).
// BUG 1 (moss_ctl_enc_delta_rule_prep_bf16): T's lower-left 32x32 block is left at zero.
#pragma once
namespace moss_gdr {

constexpr int P3_BL = GD + 8;                   // bf16 row stride of the K, Q, V tiles (272 bytes)
constexpr int P3_TL = GC + 8;                   // fp32 row stride of A and T (≡ 8 mod 32)
constexpr int P3_TILE_B = GC * P3_BL * 2;       // bytes of one bf16 tile
constexpr int P3_MAT_B = GC * P3_TL * 4;        // bytes of one fp32 64x64 matrix (≥ a bf16 tile)
static_assert(P3_MAT_B >= P3_TILE_B, "T takes the Q tile's place, V the place of A");

#ifndef GDR_EMU
__device__ __forceinline__ float p3_bf(unsigned bits) { return __uint_as_float(bits); }
__device__ __forceinline__ unsigned p3_bits(float x) { return __float_as_uint(x); }
// two floats as bf16x2, round to nearest even; lo in the low half
__device__ __forceinline__ unsigned p3_pack(float lo, float hi) { return moss_mma::pack_bf16(lo, hi); }
#endif

// x, y (the consecutive-k pair of one A-fragment register) as hi + lo bf16x2 with x ≈ hi + lo to
// about 2^-17 relative.
__device__ __forceinline__ void p3_split(float x, float y, unsigned& hi, unsigned& lo) {
    hi = p3_pack(x, y);
    lo = p3_pack(x - p3_bf(hi << 16), y - p3_bf(hi & 0xffff0000u));
}

// Rows c0..c0+63, columns col0..col0+127 of x (row stride rs) into dst [64][P3_BL] as raw bf16;
// rows ≥ n and columns ≥ dcols are zero-filled (cp.async with 0 source bytes).
template <typename T>
__device__ __forceinline__ void p3_load_tile(unsigned short* dst, const T* x, long rs, int c0, int n, long col0,
                                             int dcols, int tid = threadIdx.x, int nthr = GT) {
    for (int p = tid; p < GC * GD / 8; p += nthr) {
        const int i = p >> 4, m = (p & 15) * 8;
        const bool ok = i < n && m < dcols;
        const T* src = ok ? x + (long)(c0 + i) * rs + col0 + m : x;
        moss_mma::cp_async16(dst + i * P3_BL + m, src, ok);
    }
}

// Step 4: Ts = (I + As)⁻¹ (As strictly lower triangular, read in its lower 16x16 blocks only).
// Starts after a barrier, ends with one.
// tid: the thread's index among the 256 that run it; bar(): a barrier of those 256.
template <int BUG, typename F, typename B>
__device__ __forceinline__ void p3_inverse(float* Ts, const float* As, F&& a_dead, int tid, B&& bar) {
    if (tid < GC) {  // diagonal blocks: column c of (I + A_bb)⁻¹, right-looking substitution
        const int o = 16 * (tid >> 4), c = tid & 15;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; i++) x[i] = i == c ? 1.f : 0.f;
#pragma unroll
        for (int k = 0; k < 15; k++) {
            const float xk = x[k];
#pragma unroll
            for (int i = k + 1; i < 16; i++) x[i] -= As[(o + i) * P3_TL + o + k] * xk;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) Ts[(o + i) * P3_TL + o + c] = x[i];
    } else {  // the zero blocks above the diagonal that the 32-wide step reads: T(0,1), T(2,3)
        for (int p = tid - GC; p < 2 * 256; p += GT - GC) {
            const int h = p >> 8, i = (p >> 4) & 15, j = p & 15;
            Ts[(32 * h + i) * P3_TL + 32 * h + 16 + j] = 0.f;
        }
    }
    bar();
    {  // T(2p+1, 2p) = −T(2p+1, 2p+1) A(2p+1, 2p) T(2p, 2p), p = 0, 1: two outputs a thread
        const int p = tid >> 7, i = (tid >> 3) & 15, j = 2 * (tid & 7);
        const int r = 32 * p + 16, c = 32 * p;
        float x0 = 0.f, x1 = 0.f;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const float a = As[(r + i) * P3_TL + c + k];
            const float2 tt = *reinterpret_cast<const float2*>(Ts + (c + k) * P3_TL + c + j);
            x0 += a * tt.x;
            x1 += a * tt.y;
        }
        *reinterpret_cast<float2*>(Ts + (r + i) * P3_TL + c + j) = make_float2(x0, x1);  // X in T(2p+1, 2p)'s place
        bar();
        float y0 = 0.f, y1 = 0.f;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const float tq = Ts[(r + i) * P3_TL + r + k];
            const float2 xx = *reinterpret_cast<const float2*>(Ts + (r + k) * P3_TL + c + j);
            y0 -= tq * xx.x;
            y1 -= tq * xx.y;
        }
        bar();
        *reinterpret_cast<float2*>(Ts + (r + i) * P3_TL + c + j) = make_float2(y0, y1);
        bar();
    }
    {  // T([32, 64), [0, 32)) = −T₁₁ A₁₀ T₀₀ on the 32-wide halves: four outputs a thread
        const int i = tid >> 3, j = 4 * (tid & 7);
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int k = 0; k < 32; k++) {
            const float a = As[(32 + i) * P3_TL + k];
            const float4 tt = *reinterpret_cast<const float4*>(Ts + k * P3_TL + j);
            x.x += a * tt.x;
            x.y += a * tt.y;
            x.z += a * tt.z;
            x.w += a * tt.w;
        }
        *reinterpret_cast<float4*>(Ts + (32 + i) * P3_TL + j) = x;
        bar();
        a_dead();  // As is not read past this barrier
        float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int k = 0; k < 32; k++) {
            const float tq = Ts[(32 + i) * P3_TL + 32 + k];
            const float4 xx = *reinterpret_cast<const float4*>(Ts + (32 + k) * P3_TL + j);
            y.x -= tq * xx.x;
            y.y -= tq * xx.y;
            y.z -= tq * xx.z;
            y.w -= tq * xx.w;
        }
        bar();
        if (BUG == 1) y = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(Ts + (32 + i) * P3_TL + j) = y;
        bar();
    }
}

// Step 5: dst[i][n] = Σ_k T[i][k] s[k] B[k][n] for 16 rows and 64 columns a pass, two passes a
// warp. Warp w: side w % 2 (0: U0 from V, 1: Wk from K), columns 64((w / 2) % 2).., row blocks
// {3, 0} (w < 4) or {2, 1} (w ≥ 4): every warp has 5 k-steps (row block mb has mb + 1).
__device__ __forceinline__ void p3_apply(float* u0, float* wk, const float* Ts, const unsigned short* Vb,
                                         const unsigned short* Kb, const float* sv, const float* sk,
                                         int warp = threadIdx.x >> 5) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int side = warp & 1, n0 = 64 * ((warp >> 1) & 1), pair = warp >> 2;
    const float* s = (side ? sk : sv) + 2 * t;
    float* dst = (side ? wk : u0) + g * GD + n0 + 2 * t;
    const unsigned short* B = (side ? Kb : Vb) + ((lane & 7) + 8 * ((lane >> 3) & 1)) * P3_BL + n0 + 8 * (lane >> 4);  // B x4.trans: two n-tiles
    const float* Tg = Ts + g * P3_TL + 2 * t;
#pragma unroll 1
    for (int pass = 0; pass < 2; pass++) {
        const int mb = pass ? 1 - pair : 3 - pair;
        const float* Tr = Tg + 16 * mb * P3_TL;
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[nt][r] = 0.f;
#pragma unroll 1
        for (int kb = 0; kb <= mb; kb++) {
            const int k0 = 16 * kb;
            unsigned hi[4], lo[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {  // a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8)
                const int o = 8 * (r & 1) * P3_TL + k0 + 8 * (r >> 1), so = k0 + 8 * (r >> 1);
                const float2 tv = *reinterpret_cast<const float2*>(Tr + o);
                const float2 sc = *reinterpret_cast<const float2*>(s + so);
                p3_split(tv.x * sc.x, tv.y * sc.y, hi[r], lo[r]);
            }
#pragma unroll
            for (int qd = 0; qd < 4; qd++) {
                unsigned b[4];
                moss_mma::ldsm_x4_t(b, B + k0 * P3_BL + 16 * qd);
                moss_mma::mma_bf16(acc[2 * qd], lo, b[0], b[1]);
                moss_mma::mma_bf16(acc[2 * qd], hi, b[0], b[1]);
                moss_mma::mma_bf16(acc[2 * qd + 1], lo, b[2], b[3]);
                moss_mma::mma_bf16(acc[2 * qd + 1], hi, b[2], b[3]);
            }
        }
        float* d = dst + 16 * mb * GD;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                *reinterpret_cast<float2*>(d + 8 * hf * GD + 8 * nt) = make_float2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
    }
}

// The kernel's shared memory: the K tile, the Q tile / T₀, T₁, A₀ / V₀, A₁ / V₁, 14 vectors of 64.
constexpr int P3P_BYTES = P3_TILE_B + 4 * P3_MAT_B + 14 * GC * 4;
constexpr int P3P_FLOATS = P3P_BYTES / 4;
static_assert(P3P_FLOATS == ENC_GDR_PREP_BF16_FLOATS, "launch.h: ENC_GDR_PREP_BF16_FLOATS");

#ifndef GDR_EMU
template <int ID>
__device__ __forceinline__ void p3_named_bar() { asm volatile("bar.sync %0, 256;\n" ::"n"(ID) : "memory"); }
#endif

// Step 3, both heads. Warp w (of 16) owns rows 16(w/4).., columns 16(w%4)..; the warps wholly
// above the diagonal only write Wqk's zeros. sc[hh]: head hh's γ, β (6 vectors of 64 from there).
__device__ __forceinline__ void p3p_scores(float* const* As, float* const* wq, const unsigned short* Kb,
                                           const unsigned short* Qb, float* const* sc, const float* rk,
                                           const float* rq) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * (warp >> 2), c0 = 16 * (warp & 3);
    const bool live = c0 <= r0;
    float kk[2][4], qk[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) kk[nt][r] = qk[nt][r] = 0.f;
    if (live) {
        const int ar = r0 + (lane & 15), ac = 8 * (lane >> 4);                 // A x4: 16x16 at (r0, d0)
        const int br = c0 + (lane & 7) + 8 * (lane >> 4), bc = 8 * ((lane >> 3) & 1);  // B x4: two n-tiles
#pragma unroll 4
        for (int d0 = 0; d0 < GD; d0 += 16) {
            unsigned ak[4], aq[4], b[4];
            moss_mma::ldsm_x4(ak, Kb + ar * P3_BL + d0 + ac);
            moss_mma::ldsm_x4(aq, Qb + ar * P3_BL + d0 + ac);
            moss_mma::ldsm_x4(b, Kb + br * P3_BL + d0 + bc);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                moss_mma::mma_bf16(kk[nt], ak, b[2 * nt], b[2 * nt + 1]);
                moss_mma::mma_bf16(qk[nt], aq, b[2 * nt], b[2 * nt + 1]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const float* gs = sc[hh];
        const float* bs = gs + GC;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int i = r0 + g + 8 * hf, j = c0 + 8 * nt + 2 * t;
                float a[2], w[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int jj = j + e;
                    const float dec = live && jj <= i ? expf(gs[i] - gs[jj]) : 0.f;
                    a[e] = jj < i ? bs[i] * (rk[i] * rk[jj] * kk[nt][2 * hf + e]) * dec : 0.f;
                    w[e] = rq[i] * rk[jj] * qk[nt][2 * hf + e] * dec;
                }
                if (live) *reinterpret_cast<float2*>(As[hh] + i * P3_TL + j) = make_float2(a[0], a[1]);
                *reinterpret_cast<float2*>(wq[hh] + i * GC + j) = make_float2(w[0], w[1]);
            }
    }
}

template <typename T, int BUG>
__device__ void prep3p_impl(float* Kd, float* Wk, float* U0, float* Wqk, float* gamo, const T* q, const T* k,
                            const T* v, const float* g, const float* beta, int L, int Hk, int Hv, int dk, int dv,
                            long rqk, long rv) {
    GDR_SMEM(gdr_sm);
    char* base = reinterpret_cast<char*>(gdr_sm);
    const int tid = threadIdx.x, hh = tid >> 8, ltid = tid & 255;
    unsigned short* Kb = reinterpret_cast<unsigned short*>(base);
    unsigned short* Qb = reinterpret_cast<unsigned short*>(base + P3_TILE_B);
    // head x: T over Q (x = 0) or its own; A, then V, in its own
    auto Tx = [&](int x) { return reinterpret_cast<float*>(base + P3_TILE_B + (x ? 2 : 0) * P3_MAT_B); };
    auto Ax = [&](int x) { return reinterpret_cast<float*>(base + P3_TILE_B + (x ? 3 : 1) * P3_MAT_B); };
    float* rk = reinterpret_cast<float*>(base + P3_TILE_B + 4 * P3_MAT_B);  // 1/|k|
    float* rq = rk + GC;                                                         // 1/(|q| √dk)
    auto Sx = [&](int x) { return rq + GC + 6 * GC * x; };  // γ, β, e^γ, e^{γ_last − γ}, β, β e^γ / |k|
    const int nph = Hv >> 1;
    const int c = (int)(blockIdx.x / nph), h0 = 2 * (int)(blockIdx.x % nph);
    const long blk0 = (long)c * Hv + h0;  // the scratch's block of head h0 (h0 + 1: the next)
    const int c0 = c * GC, n = min(GC, L - c0);
    const int kh = h0 / (Hv / Hk);
    p3_load_tile(Kb, k, rqk, c0, n, (long)kh * dk, dk, tid, 2 * GT);
    p3_load_tile(Qb, q, rqk, c0, n, (long)kh * dk, dk, tid, 2 * GT);
    moss_mma::cp_async_commit();
    {  // the gates of both heads (chunk_gates for two heads at once)
        const int r = tid & 63, x = tid >> 6;
        float* gs = Sx(x & 1);
        if (tid < 2 * GC) {
            const long gi = (long)(c0 + r) * Hv + h0 + x;
            gs[r] = r < n ? g[gi] : 0.f;
            gs[GC + r] = r < n ? beta[gi] : 0.f;
        }
        __syncthreads();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp < 2) {  // inclusive scan of 64 values, two per lane
            float* gw = Sx(warp);
            const float a = gw[2 * lane], b = gw[2 * lane + 1];
            float sum = a + b;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float t = __shfl_up_sync(0xffffffffu, sum, o);
                if (lane >= o) sum += t;
            }
            const float ex = sum - (a + b);
            gw[2 * lane] = ex + a;
            gw[2 * lane + 1] = ex + a + b;
        }
        __syncthreads();
        if (tid < 2 * GC) {
            gs[2 * GC + r] = expf(gs[r]);
            gs[3 * GC + r] = expf(gs[GC - 1] - gs[r]);
            gamo[(blk0 + x) * GC + r] = gs[r];
        }
    }
    moss_mma::cp_async_wait<0>();
    __syncthreads();
    {  // row norms: four threads a row (k rows, then q rows), 32 columns each, 16 bytes a read
        const int row = tid >> 2, qd = tid & 3;
        const unsigned short* src = (row < GC ? Kb + row * P3_BL : Qb + (row - GC) * P3_BL) + 32 * qd;
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint4 u = *reinterpret_cast<const uint4*>(src + 8 * ((m + qd) & 3));
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float a = p3_bf(w[e] << 16), b = p3_bf(w[e] & 0xffff0000u);
                ss += a * a;
                ss += b * b;
            }
        }
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        if (qd == 0) {
            if (row < GC)
                rk[row] = rsqrtf(ss + 1e-6f);
            else
                rq[row - GC] = rsqrtf(ss + 1e-6f) * rsqrtf((float)dk);
        }
    }
    __syncthreads();
    if (tid < 2 * GC) {
        float* gs = Sx(tid >> 6);
        const int r = tid & 63;
        gs[4 * GC + r] = gs[GC + r];
        gs[5 * GC + r] = gs[GC + r] * gs[2 * GC + r] * rk[r];
    }
    {
        float* as[2] = {Ax(0), Ax(1)};
        float* wq[2] = {Wqk + blk0 * GC * GC, Wqk + (blk0 + 1) * GC * GC};
        float* sc[2] = {Sx(0), Sx(1)};
        p3p_scores(as, wq, Kb, Qb, sc, rk, rq);
    }
    __syncthreads();
    // from here on, head hh on threads 256·hh.. alone
    float* Ts = Tx(hh);
    float* As = Ax(hh);
    unsigned short* Vb = reinterpret_cast<unsigned short*>(As);
    const float* gs = Sx(hh);
    const long blk = blk0 + hh;
    const int h = h0 + hh;
    p3_inverse<BUG>(
        Ts, As,
        [&] {  // A is dead: V into its place, in flight through the rest
            p3_load_tile(Vb, v, rv, c0, n, (long)h * dv, dv, ltid, GT);
            moss_mma::cp_async_commit();
        },
        ltid, [&] { hh ? p3_named_bar<2>() : p3_named_bar<1>(); });
    float* kd = Kd + blk * GC * GD;  // Kd while V arrives
    const float* dl = gs + 3 * GC;
    for (int p = ltid; p < GC * GD / 4; p += GT) {
        const int i = p >> 5, a = (p & 31) * 4;
        const uint2 u = *reinterpret_cast<const uint2*>(Kb + i * P3_BL + a);
        const float r = rk[i], d = dl[i];
        const float4 o = make_float4(p3_bf(u.x << 16) * r * d, p3_bf(u.x & 0xffff0000u) * r * d,
                                     p3_bf(u.y << 16) * r * d, p3_bf(u.y & 0xffff0000u) * r * d);
        *reinterpret_cast<float4*>(kd + i * GD + a) = o;
    }
    moss_mma::cp_async_wait<0>();
    hh ? p3_named_bar<2>() : p3_named_bar<1>();
    p3_apply(U0 + blk * GC * GD, Wk + blk * GC * GD, Ts, Vb, Kb, gs + 4 * GC, gs + 5 * GC, ltid >> 5);
}

}  // namespace moss_gdr
