// The VAE mid block's single-head attention as one flash-style kernel (launch code:
// crates/moss-cuda/src/vae/attention.rs `spatial_attention_flash`; the CPU twin is `spatial_attention` of
// crates/moss-core/src/backend/cpu/vae.rs).
//
// moss_vae_flash_d384: o = softmax(q kᵀ / sqrt(D)) v for q, k, v [N, L, D] fp32, D = 384, with
// no score matrix in memory. Both products on the tensor cores in split TF32 (x = hi + lo,
// hi = tf32(x), lo = tf32(x - hi); 3 mma.sync m16n8k8 per tile: lo*hi, hi*lo, hi*hi, small terms
// first), fp32 accuracy: the tensor cores' accumulation truncates, so each k8 step of q kᵀ and
// each 16 keys of p v go into a fresh register tile that is then added to the running sum with
// round-to-nearest adds. Online softmax in fp32 (scores scaled, max subtracted, expf), the row
// sums in f64.
//
// Block: 64 query rows, 8 warps = 4 row groups of 16 x 2 halves. Per tile of 32 keys:
//   S = Q Kᵀ: warp (rg, h) computes S[16 rows of rg][16 keys of half h] over all of D;
//   the scaled (and masked) S goes through shared memory so that each warp holds its 16 rows x
//   32 keys as mma A fragments; both warps of a row group run the same online-softmax update
//   (same inputs, same operations: the same m and l);
//   O += P V: warp (rg, h) owns O[16 rows of rg][192 columns of half h] (96 fp32 per thread).
// Shared memory: Q (64 x 384, fp32, loaded once), one K tile and one V tile (32 x 384 each), the
// S exchange; K(j+1) streams in (cp.async) during softmax and P V of tile j, V(j+1) during
// Q K(j+1)ᵀ. Row strides are chosen so that every fragment load hits 32 banks.
// Keys past L are zero-filled and masked to -inf; query rows past L are zero and not written.
//
// BUG 1 (planted, moss_ctl_vae_flash_d384): the running output is not rescaled when the row
// maximum grows.
#include "common.cuh"
#include "mma.cuh"
#include "launch.h"

namespace moss_vaeattn {

constexpr int D = VAE_ATTN_D, BQ = VAE_ATTN_ROWS, BK = 32, THREADS = VAE_ATTN_THREADS;
constexpr int QST = D + 4;   // Q rows: a fragment (row g, column t) at 4g + t: 32 banks
constexpr int KST = D + 4;   // K rows: b fragment (key g, d t) at 4g + t
constexpr int VST = D + 8;   // V rows: b fragment (key t, column g) at 8t + g
constexpr int SST = BK + 4;  // S rows: a fragment (row g, key t) at 4g + t
constexpr int HALF = D / 2, NT = HALF / 8;  // O columns per warp, n8 tiles per warp

// The dynamic shared memory: Q, K, V and S tiles, as the kernel carves it.
static_assert(4 * (BQ * QST + BK * KST + BK * VST + BQ * SST) == VAE_ATTN_TF32_SMEM, "launch.h: VAE_ATTN_TF32_SMEM");

using moss_mma::tf32;

// d = a*b + c, a = {a0..a3}
__device__ __forceinline__ void mma(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1,
                                    const float (&c)[4]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), "r"(__float_as_uint(a3)),
          "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// part (fresh or running) += a*b in split TF32: lo*hi, hi*lo, hi*hi.
__device__ __forceinline__ void mma3(float (&part)[4], const float (&ah)[4], const float (&al)[4], float bh0,
                                     float bh1, float bl0, float bl1) {
    mma(part, al[0], al[1], al[2], al[3], bh0, bh1, part);
    mma(part, ah[0], ah[1], ah[2], ah[3], bl0, bl1, part);
    mma(part, ah[0], ah[1], ah[2], ah[3], bh0, bh1, part);
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; ok == false writes zeros (reads nothing).
__device__ __forceinline__ void cp16(float* dst, const float* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void wait_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// rows r0.. of x [L, D] into s (row stride st): `rows` rows, zeros past L.
__device__ __forceinline__ void load_rows(float* s, int st, const float* x, int r0, int rows, int L) {
    for (int i = threadIdx.x; i < rows * (D / 4); i += THREADS) {
        int r = i / (D / 4), c = (i - r * (D / 4)) * 4, row = r0 + r;
        bool ok = row < L;
        cp16(s + r * st + c, x + (long)(ok ? row : 0) * D + c, ok);
    }
}

template <int BUG>
__device__ void flash(float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ k,
                      const float* __restrict__ v, int L, float scale) {
    extern __shared__ __align__(16) float sm[];
    float* Qs = sm;
    float* Ks = Qs + BQ * QST;
    float* Vs = Ks + BK * KST;
    float* Ss = Vs + BK * VST;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int rg = warp & 3, hf = warp >> 2;
    const long base = (long)blockIdx.y * L * D;
    q += base;
    k += base;
    v += base;
    out += base;
    const int q0 = blockIdx.x * BQ;
    const int nk = (L + BK - 1) / BK;

    load_rows(Qs, QST, q, q0, BQ, L);
    load_rows(Ks, KST, k, 0, BK, L);
    commit();
    load_rows(Vs, VST, v, 0, BK, L);
    commit();

    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[i][c] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    double l[2] = {0.0, 0.0};
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};
    const float* Qw = Qs + (16 * rg) * QST;

    for (int j = 0; j < nk; j++) {
        wait_but_one();  // Q and K(j) are in (V(j) may still stream)
        __syncthreads();
        // ---- S = Q K(j)ᵀ for 16 rows x 16 keys
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[nt][c] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < D / 8; kk++) {
            float ah[4], al[4];
            const float* qa = Qw + g * QST + 8 * kk + t;
            ah[0] = qa[0];
            ah[1] = qa[8 * QST];
            ah[2] = qa[4];
            ah[3] = qa[8 * QST + 4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float x = ah[c];
                ah[c] = tf32(x);
                al[c] = tf32(x - ah[c]);
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const float* kb = Ks + (16 * hf + 8 * nt + g) * KST + 8 * kk + t;
                float b0 = kb[0], b1 = kb[4];
                float bh0 = tf32(b0), bh1 = tf32(b1);
                float bl0 = tf32(b0 - bh0), bl1 = tf32(b1 - bh1);
                float part[4];
                mma(part, al[0], al[1], al[2], al[3], bh0, bh1, zero);
                mma(part, ah[0], ah[1], ah[2], ah[3], bl0, bl1, part);
                mma(part, ah[0], ah[1], ah[2], ah[3], bh0, bh1, part);
#pragma unroll
                for (int c = 0; c < 4; c++) s[nt][c] = __fadd_rn(s[nt][c], part[c]);
            }
        }
        __syncthreads();  // every warp is done with K(j)
        if (j + 1 < nk) load_rows(Ks, KST, k, (j + 1) * BK, BK, L);
        commit();
        // ---- scaled, masked S to shared memory
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            int col = 16 * hf + 8 * nt + 2 * t, key = j * BK + col;
            float2 lo = make_float2(key < L ? __fmul_rn(s[nt][0], scale) : -INFINITY,
                                    key + 1 < L ? __fmul_rn(s[nt][1], scale) : -INFINITY);
            float2 hi = make_float2(key < L ? __fmul_rn(s[nt][2], scale) : -INFINITY,
                                    key + 1 < L ? __fmul_rn(s[nt][3], scale) : -INFINITY);
            *reinterpret_cast<float2*>(Ss + (16 * rg + g) * SST + col) = lo;
            *reinterpret_cast<float2*>(Ss + (16 * rg + g + 8) * SST + col) = hi;
        }
        __syncthreads();
        // ---- online softmax on rows g and g + 8 of the row group (A fragment layout)
        float p[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const float* sa = Ss + (16 * rg + g) * SST + 8 * kk + t;
            p[kk][0] = sa[0];
            p[kk][1] = sa[8 * SST];
            p[kk][2] = sa[4];
            p[kk][3] = sa[8 * SST + 4];
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            mx[0] = fmaxf(mx[0], fmaxf(p[kk][0], p[kk][2]));
            mx[1] = fmaxf(mx[1], fmaxf(p[kk][1], p[kk][3]));
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        double sum[2] = {0.0, 0.0};
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                p[kk][c] = expf(p[kk][c] - mx[c & 1]);
                sum[c & 1] += (double)p[kk][c];
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
            alpha[r] = expf(m[r] - mx[r]);  // 0 on the first tile (m = -inf)
            l[r] = l[r] * (double)alpha[r] + sum[r];
            m[r] = mx[r];
        }
        if (BUG != 1) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                o[nt][0] *= alpha[0];
                o[nt][1] *= alpha[0];
                o[nt][2] *= alpha[1];
                o[nt][3] *= alpha[1];
            }
        }
        float ph[4][4], pl[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                ph[kk][c] = tf32(p[kk][c]);
                pl[kk][c] = tf32(p[kk][c] - ph[kk][c]);
            }
        wait_but_one();  // V(j) is in (K(j+1) may still stream)
        __syncthreads();
        // ---- O += P V(j) for 16 rows x 192 columns, a fresh tile per 16 keys
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float* vb = Vs + t * VST + HALF * hf + 8 * nt + g;
#pragma unroll
            for (int k2 = 0; k2 < 2; k2++) {
                float part[4];
#pragma unroll
                for (int kk = 2 * k2; kk < 2 * k2 + 2; kk++) {
                    float b0 = vb[(8 * kk) * VST], b1 = vb[(8 * kk + 4) * VST];
                    float bh0 = tf32(b0), bh1 = tf32(b1);
                    float bl0 = tf32(b0 - bh0), bl1 = tf32(b1 - bh1);
                    if (kk == 2 * k2) {
                        mma(part, pl[kk][0], pl[kk][1], pl[kk][2], pl[kk][3], bh0, bh1, zero);
                    } else {
                        mma(part, pl[kk][0], pl[kk][1], pl[kk][2], pl[kk][3], bh0, bh1, part);
                    }
                    mma(part, ph[kk][0], ph[kk][1], ph[kk][2], ph[kk][3], bl0, bl1, part);
                    mma(part, ph[kk][0], ph[kk][1], ph[kk][2], ph[kk][3], bh0, bh1, part);
                }
#pragma unroll
                for (int c = 0; c < 4; c++) o[nt][c] = __fadd_rn(o[nt][c], part[c]);
            }
        }
        __syncthreads();  // every warp is done with V(j)
        if (j + 1 < nk) load_rows(Vs, VST, v, (j + 1) * BK, BK, L);
        commit();
    }

    // ---- O / l
    const float inv[2] = {(float)(1.0 / l[0]), (float)(1.0 / l[1])};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = q0 + 16 * rg + g + 8 * r;
        if (row >= L) continue;
        float* orow = out + (long)row * D + HALF * hf + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            *reinterpret_cast<float2*>(orow + 8 * nt) =
                make_float2(__fmul_rn(o[nt][2 * r], inv[r]), __fmul_rn(o[nt][2 * r + 1], inv[r]));
    }
}

}  // namespace moss_vaeattn

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(moss_vaeattn::THREADS, 1)
    moss_vae_flash_d384(float* out, const float* q, const float* k, const float* v, int L, float scale) {
    moss_vaeattn::flash<0>(out, q, k, v, L, scale);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(moss_vaeattn::THREADS, 1)
    moss_ctl_vae_flash_d384(float* out, const float* q, const float* k, const float* v, int L, float scale) {
    moss_vaeattn::flash<1>(out, q, k, v, L, scale);
}
#endif
