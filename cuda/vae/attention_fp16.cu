// The VAE mid block's single-head attention (D = 384) on fp16 tensor cores with hi/lo split
// operands (what runs where its shared memory fits; launch code: crates/moss-cuda/src/vae/attention_fp16.rs; the CPU twin is
// `spatial_attention` of crates/moss-core/src/backend/cpu/vae.rs).
//
// o = softmax(q kᵀ / sqrt(D)) v for q, k, v [N, L, D] fp32, no score matrix in memory.
// 1. moss_vae_f16_maxabs: max |x| of each of q, k, v (all images; atomicMax on the float bits:
//    order-independent, so deterministic). Power-of-two scale 2^s with max·2^s in [2^13, 2^14)
//    (s clamped to [-60, 60]; s = 0 when the max is 0, inf or NaN).
// 2. moss_vae_f16_prep: y = x·2^s (exact), hi = f16(y), lo = f16(y - hi) (y - hi exact in fp32),
//    written [3][N][Lq][hi 384 | lo 384] halves, Lq = L rounded up to 64, zero rows past L.
// 3. moss_vae_attn16_d384: 64 query rows a block, 8 warps = 4 row groups of 16 x 2 halves hf.
//    Per key tile of 32:
//    S = Q Kᵀ: warp (rg, hf) computes the partial S[16 rows][32 keys] over d in [192 hf, +192):
//      per k16 step and n8 tile the products lo·hi, hi·lo, hi·hi (mma.sync m16n8k16 f16, fp32
//      accumulate). The tensor cores truncate their fp32 sums, so (MODE 0) the three go into a
//      fresh tile (small terms first) that is added to the running S round-to-nearest, or
//      (MODE 1, "f16r") the two small terms accumulate in a running tile of their own (added
//      at the end) and only hi·hi goes into a fresh tile + RN add.
//      The two partials are exchanged through shared memory (one float4 per lane and n8 tile)
//      and added (p_own + p_other: fadd commutes, both warps of a row group get the same bits,
//      hence the same softmax state).
//    Scores · 2^-(sq+sk)/sqrt(D) (one fp32 multiply, exact power-of-two fold), keys past L -inf,
//    online softmax in fp32 (expf), row sums in f64.
//    P·2^15 (exact; P <= 1 so <= 32768) split into f16 hi/lo IN REGISTERS: the S accumulators of
//    n8 tiles 2kk and 2kk+1 are the A fragment of the k16 step kk of P V (no exchange for P).
//    O += P V: warp (rg, hf) owns O[16 rows][192 columns of half hf] (96 fp32 a thread); per n8
//    tile one fresh tile for the 32 keys (2 k16 steps x lo·hi, hi·lo, hi·hi), RN add. MODE 2
//    (a control since measured: moss_ctl3) accumulates the six products straight into O: the
//    tensor cores' truncating sums over L/32 tiles give ~6e-4 relative L2 on the H200, 30x the
//    fp32 bound. ptxas (sm_90a): 255 registers, 68 bytes spilled
//    (MODE 0; 5 values of O reloaded per key tile), MODE 2 248 registers, no spill.
//    Output O / l · 2^-(sv+15) (exact fold into 1/l).
//    Operands by ldmatrix from shared memory rows of [hi 384 | lo 384 | pad 8] halves (1552 B =
//    97 x 16 B: the 8 row addresses of each 8x8 matrix hit distinct bank groups): Q (A, x4),
//    K (B, x4: hi b0 b1, lo b0 b1), V (B, x4.trans: hi b0 b1, lo b0 b1).
//    K(j+1) streams in (cp.async) during softmax and P V of tile j, V(j+1) during Q K(j+1)ᵀ.
//    Shared memory: Q 64, K 32, V 32 rows of 1552 B + the exchange 8 x 4 x 32 float4 = 210 KB.
//
// BUG 1 (planted, moss_ctl_vae_attn16_d384): V's scale is not undone in the output.
// BUG 2 (planted, moss_ctl2_vae_attn16_d384): the small terms of S (lo·hi, hi·lo) are dropped.
// MODE 2 (moss_ctl3_vae_attn16_d384): P V accumulated straight into O (no fresh tiles).
#include <cuda_fp16.h>
#include "common.cuh"
#include "mma.cuh"
#include "launch.h"

namespace moss_va16 {

constexpr int D = VAE_ATTN_D, BQ = VAE_ATTN_ROWS, BK = 32, THREADS = VAE_ATTN_THREADS, HALF = D / 2, NT = HALF / 8;
constexpr int RS = 2 * D + 8;   // halves per shared row
constexpr int ROW16 = 2 * D / 8; // 16-byte chunks per global row
constexpr int PEXP = 15;        // P scaled by 2^15 before the split
constexpr int SMEM_BYTES = (BQ + 2 * BK) * RS * 2 + 8 * 4 * 32 * 16;
static_assert(SMEM_BYTES == VAE_ATTN_FP16_SMEM, "launch.h: VAE_ATTN_FP16_SMEM");

__device__ __forceinline__ int scale_exp(unsigned bits) {
    const float mx = __uint_as_float(bits);
    if (!(mx > 0.f) || isinf(mx)) return 0;
    int e;
    frexpf(mx, &e);  // mx in [2^(e-1), 2^e)
    return min(max(14 - e, -60), 60);
}

__device__ __forceinline__ void mma16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned h2u(__half2 h) { return *reinterpret_cast<unsigned*>(&h); }

// ldmatrix x4 (plain / transposed) at a shared-space byte address
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm4t(unsigned (&r)[4], unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// `rows` rows of 2D halves (global, contiguous) to shared rows of RS halves.
__device__ __forceinline__ void load_rows(__half* s, const __half* g, int rows) {
    for (int i = threadIdx.x; i < rows * ROW16; i += THREADS) {
        const int r = i / ROW16, c = i - r * ROW16;
        moss_mma::cp_async16(s + r * RS + 8 * c, g + (long)r * 2 * D + 8 * c, true);
    }
}

template <int BUG, int MODE>
__device__ void attn16(float* __restrict__ out, const __half* __restrict__ qkv, const unsigned* __restrict__ mxb, int L,
                       int Lq, long plane, float rsqrt_d) {
    extern __shared__ __align__(16) unsigned char smraw[];
    __half* Qs = reinterpret_cast<__half*>(smraw);
    __half* Ks = Qs + BQ * RS;
    __half* Vs = Ks + BK * RS;
    float4* Xs = reinterpret_cast<float4*>(Vs + BK * RS);  // [warp][n8 tile][lane]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rg = warp & 3, hf = warp >> 2;
    const int sq = scale_exp(mxb[0]), sk = scale_exp(mxb[1]), sv = scale_exp(mxb[2]);
    const float scale = ldexpf(rsqrt_d, -(sq + sk));
    const __half* q = qkv + (long)blockIdx.y * Lq * 2 * D;
    const __half* k = q + plane;
    const __half* v = k + plane;
    const int q0 = blockIdx.x * BQ;
    const int nk = (L + BK - 1) / BK;

    load_rows(Qs, q + (long)q0 * 2 * D, BQ);
    load_rows(Ks, k, BK);
    moss_mma::cp_async_commit();
    load_rows(Vs, v, BK);
    moss_mma::cp_async_commit();

    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[i][c] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    double l[2] = {0.0, 0.0};
    // ldmatrix row addresses of this lane (matrix lane >> 3, row lane & 7)
    // (shared-space byte addresses)
    const unsigned qa = moss_mma::smem_addr(Qs + (16 * rg + (lane & 15)) * RS + HALF * hf + 8 * (lane >> 4));
    const unsigned ka = moss_mma::smem_addr(Ks + (lane & 7) * RS + HALF * hf + 8 * ((lane >> 3) & 1) + D * (lane >> 4));
    const unsigned va = moss_mma::smem_addr(Vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * RS + HALF * hf + D * (lane >> 4));

    for (int j = 0; j < nk; j++) {
        moss_mma::cp_async_wait<1>();  // Q and K(j) are in (V(j) may still stream)
        __syncthreads();
        // ---- partial S = Q K(j)ᵀ: 16 rows x 32 keys over half of D
        float s[4][4], sm[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[nt][c] = sm[nt][c] = 0.f;
#pragma unroll 2
        for (int kk = 0; kk < HALF / 16; kk++) {
            unsigned qh[4], ql[4];
            ldsm4(qh, qa + 2 * (16 * kk));
            ldsm4(ql, qa + 2 * (16 * kk + D));
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                unsigned kb[4];  // hi b0, hi b1, lo b0, lo b1
                ldsm4(kb, ka + 2 * (8 * nt * RS + 16 * kk));
                float part[4] = {0.f, 0.f, 0.f, 0.f};
                if (BUG != 2) {
                    if (MODE == 0) {
                        mma16(part, ql, kb[0], kb[1]);
                        mma16(part, qh, kb[2], kb[3]);
                    } else {
                        mma16(sm[nt], ql, kb[0], kb[1]);
                        mma16(sm[nt], qh, kb[2], kb[3]);
                    }
                }
                mma16(part, qh, kb[0], kb[1]);
#pragma unroll
                for (int c = 0; c < 4; c++) s[nt][c] = __fadd_rn(s[nt][c], part[c]);
            }
        }
        if (MODE == 1) {
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[nt][c] = __fadd_rn(s[nt][c], sm[nt][c]);
        }
        // ---- exchange the partials with the other half's warp (same row group)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) Xs[(warp * 4 + nt) * 32 + lane] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
        __syncthreads();  // every warp is done with K(j); every partial is in
        if (j + 1 < nk) load_rows(Ks, k + (long)(j + 1) * BK * 2 * D, BK);
        moss_mma::cp_async_commit();
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const float4 x = Xs[((warp ^ 4) * 4 + nt) * 32 + lane];
            const int key = j * BK + 8 * nt + 2 * t;
            s[nt][0] = key < L ? __fmul_rn(__fadd_rn(s[nt][0], x.x), scale) : -INFINITY;
            s[nt][1] = key + 1 < L ? __fmul_rn(__fadd_rn(s[nt][1], x.y), scale) : -INFINITY;
            s[nt][2] = key < L ? __fmul_rn(__fadd_rn(s[nt][2], x.z), scale) : -INFINITY;
            s[nt][3] = key + 1 < L ? __fmul_rn(__fadd_rn(s[nt][3], x.w), scale) : -INFINITY;
        }
        // ---- online softmax: rows g (c = 0, 1) and g + 8 (c = 2, 3)
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        // rescale the running output first (program order: keeps ptxas from holding all 24 fresh
        // P V tiles live while the rescale waits)
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) alpha[r] = expf(m[r] - mx[r]);  // 0 on the first tile (m = -inf)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
        double sum[2] = {0.0, 0.0};
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                s[nt][c] = expf(s[nt][c] - mx[c >> 1]);
                sum[c >> 1] += (double)s[nt][c];
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
            l[r] = l[r] * (double)alpha[r] + sum[r];
            m[r] = mx[r];
        }
        // ---- P·2^15 split into f16 hi/lo A fragments: step kk = n8 tiles 2kk, 2kk+1:
        // a0 = (row g, keys 2t, 2t+1) = tile 2kk c0 c1, a1 = its c2 c3 (row g + 8), a2, a3 = tile 2kk+1
        unsigned ph[2][4], pl[2][4];
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int nt = 2 * kk + (i >> 1), c = 2 * (i & 1);
                const float x0 = s[nt][c] * (float)(1 << PEXP), x1 = s[nt][c + 1] * (float)(1 << PEXP);
                const __half2 h = __floats2half2_rn(x0, x1);
                const float2 hb = __half22float2(h);
                ph[kk][i] = h2u(h);
                pl[kk][i] = h2u(__floats2half2_rn(__fsub_rn(x0, hb.x), __fsub_rn(x1, hb.y)));
            }
        moss_mma::cp_async_wait<1>();  // V(j) is in (K(j+1) may still stream)
        __syncthreads();
        // ---- O += P V(j): 16 rows x 192 columns, one fresh tile per n8 tile for the 32 keys
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            // a fresh tile: zeros, but made from the O tile 3 back (0·x, not foldable) so that
            // ptxas starts at most 3 of these chains ahead (holding all 24 spilled ~270 bytes of O)
            const float z = MODE != 2 && nt >= 3 ? 0.f * o[nt - 3][0] : 0.f;
            float part[4] = {z, z, z, z};
            float(&acc)[4] = MODE == 2 ? o[nt] : part;
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                unsigned vb[4];  // hi b0, hi b1, lo b0, lo b1
                ldsm4t(vb, va + 2 * (16 * kk * RS + 8 * nt));
                mma16(acc, pl[kk], vb[0], vb[1]);
                mma16(acc, ph[kk], vb[2], vb[3]);
                mma16(acc, ph[kk], vb[0], vb[1]);
            }
            if (MODE != 2) {
#pragma unroll
                for (int c = 0; c < 4; c++) o[nt][c] = __fadd_rn(o[nt][c], part[c]);
            }
        }
        __syncthreads();  // every warp is done with V(j) (and with the exchange of tile j)
        if (j + 1 < nk) load_rows(Vs, v + (long)(j + 1) * BK * 2 * D, BK);
        moss_mma::cp_async_commit();
    }

    // ---- O / l · 2^-(sv + 15)
    const int undo = BUG == 1 ? -PEXP : -(sv + PEXP);
    const float inv[2] = {ldexpf((float)(1.0 / l[0]), undo), ldexpf((float)(1.0 / l[1]), undo)};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = q0 + 16 * rg + g + 8 * r;
        if (row >= L) continue;
        float* orow = out + ((long)blockIdx.y * L + row) * D + HALF * hf + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            *reinterpret_cast<float2*>(orow + 8 * nt) =
                make_float2(__fmul_rn(o[nt][2 * r], inv[r]), __fmul_rn(o[nt][2 * r + 1], inv[r]));
    }
}

}  // namespace moss_va16

// mx[0..3) = 0 (before moss_vae_f16_maxabs).
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_f16_zero3(unsigned* mx) {
    if (threadIdx.x < 3) mx[threadIdx.x] = 0u;
}
#endif
// mx[y] = max |x_y| as float bits, x_0 = q, x_1 = k, x_2 = v (blockIdx.y), n4 = N·L·D / 4.
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_f16_maxabs(unsigned* mx, const float* q, const float* k, const float* v, long n4) {
    const float4* x = reinterpret_cast<const float4*>(blockIdx.y == 0 ? q : blockIdx.y == 1 ? k : v);
    float a = 0.f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        const float4 e = x[i];
        a = fmaxf(a, fmaxf(fmaxf(fabsf(e.x), fabsf(e.y)), fmaxf(fabsf(e.z), fabsf(e.w))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0) atomicMax(mx + blockIdx.y, __float_as_uint(a));
}
#endif
// dst [3][N][Lq][hi D | lo D] halves from q, k, v [N][L][D] (blockIdx.y picks one), y = x·2^s,
// hi = f16(y), lo = f16(y - hi), zeros for rows past L; i over total = N·Lq·D/4 (4 columns each).
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_f16_prep(__half* dst, const float* q, const float* k, const float* v, const unsigned* mx, int L,
                                   int Lq, long total) {
    constexpr int D = moss_va16::D;
    const int y = blockIdx.y;
    const float* x = y == 0 ? q : y == 1 ? k : v;
    const float p2 = ldexpf(1.f, moss_va16::scale_exp(mx[y]));
    dst += (long)y * (total * 4 / D) * 2 * D;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const int c4 = (int)(i % (D / 4));
        const long rr = i / (D / 4);
        const int r = (int)(rr % Lq);
        const long img = rr / Lq;
        float4 e = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < L) e = reinterpret_cast<const float4*>(x + (img * L + r) * D)[c4];
        const float y0 = e.x * p2, y1 = e.y * p2, y2 = e.z * p2, y3 = e.w * p2;
        const __half2 h01 = __floats2half2_rn(y0, y1), h23 = __floats2half2_rn(y2, y3);
        const float2 b01 = __half22float2(h01), b23 = __half22float2(h23);
        const __half2 l01 = __floats2half2_rn(__fsub_rn(y0, b01.x), __fsub_rn(y1, b01.y));
        const __half2 l23 = __floats2half2_rn(__fsub_rn(y2, b23.x), __fsub_rn(y3, b23.y));
        __half* row = dst + rr * 2 * D + 4 * c4;
        *reinterpret_cast<uint2*>(row) = make_uint2(moss_va16::h2u(h01), moss_va16::h2u(h23));
        *reinterpret_cast<uint2*>(row + D) = make_uint2(moss_va16::h2u(l01), moss_va16::h2u(l23));
    }
}
#endif

#define MOSS_VA16_KERNEL(NAME, BUG, MODE)                                                                            \
    MOSS_KERNEL void __launch_bounds__(moss_va16::THREADS, 1)                                                      \
        NAME(float* out, const __half* qkv, const unsigned* mx, int L, int Lq, long plane, float rsqrt_d) {        \
        moss_va16::attn16<BUG, MODE>(out, qkv, mx, L, Lq, plane, rsqrt_d);                                         \
    }
MOSS_PRODUCTION(MOSS_VA16_KERNEL(moss_vae_attn16_d384, 0, 0))
MOSS_CONTROL(MOSS_VA16_KERNEL(moss_ctl3_vae_attn16_d384, 0, 2))
MOSS_CONTROL(MOSS_VA16_KERNEL(moss_ctl_vae_attn16_d384, 1, 0))
MOSS_CONTROL(MOSS_VA16_KERNEL(moss_ctl2_vae_attn16_d384, 2, 0))
