// The VAE mid block's single-head attention as one flash-style kernel (launch code:
// src/backend/cuda/vae.rs `spatial_attention_flash`; the CPU twin is `spatial_attention` of
// src/backend/cpu/vae.rs).
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

namespace moss_vaeattn {

constexpr int D = 384, BQ = 64, BK = 32, THREADS = 256;
constexpr int QST = D + 4;   // Q rows: a fragment (row g, column t) at 4g + t: 32 banks
constexpr int KST = D + 4;   // K rows: b fragment (key g, d t) at 4g + t
constexpr int VST = D + 8;   // V rows: b fragment (key t, column g) at 8t + g
constexpr int SST = BK + 4;  // S rows: a fragment (row g, key t) at 4g + t
constexpr int HALF = D / 2, NT = HALF / 8;  // O columns per warp, n8 tiles per warp

__host__ __device__ constexpr int smem_floats() { return BQ * QST + BK * KST + BK * VST + BQ * SST; }

__device__ __forceinline__ float tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

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

MOSS_KERNEL void __launch_bounds__(moss_vaeattn::THREADS, 1)
    moss_vae_flash_d384(float* out, const float* q, const float* k, const float* v, int L, float scale) {
    moss_vaeattn::flash<0>(out, q, k, v, L, scale);
}
MOSS_KERNEL void __launch_bounds__(moss_vaeattn::THREADS, 1)
    moss_ctl_vae_flash_d384(float* out, const float* q, const float* k, const float* v, int L, float scale) {
    moss_vaeattn::flash<1>(out, q, k, v, L, scale);
}

// ---------------------------------------------------------------------------------------------
// moss_vae_flash2_d384 (opt-in, MOSS_VAE_ATTN=flash2): the same attention with K and V split
// into hi/lo ONCE by a prep pass (moss_vae_split_hilo: hi = tf32(x), lo = tf32(x - hi), the
// same arithmetic as the register split), so the kernel loads pre-split B fragments instead of
// converting every fragment in every warp for every query block. The pre-split K and V tiles take
// twice the shared memory, so the key tile is 16 and the Q Kᵀ work of a tile is split over D:
// warp (rg, h) computes the partial S[16 rows of rg][16 keys] over d in [192 h, 192 h + 192)
// (Q fragments still split in registers, half of D per warp), both partials go to shared memory
// and every warp adds them (p0 + p1, round to nearest: the same sum in both warps of a row
// group), scales and masks. Online softmax and O += P V as in moss_vae_flash_d384 (a fresh tile
// per 16 keys, RN add; warp (rg, h) owns 192 columns of O); the running output is rescaled only
// when some row maximum of the warp grew (a warp-uniform skip; a multiplication by 1 changes no bit).
// Shared memory: Q 64 x 388, K hi/lo 2 x 16 x 388, V hi/lo 2 x 16 x 392, S partials 2 x 64 x 20
// (fp32): 204.5 KB. Every fragment load hits 32 banks (rows 388: 4g + t; 392: 8t + g; 20: 20g + t).
// K(j+1) streams in during softmax and P V of tile j, V(j+1) during Q K(j+1)ᵀ, as before.
//
// BUG 1 (planted, moss_ctl_vae_flash2_d384): the two D-half partials of S are not added (each
// warp pair uses only partial 0).
namespace moss_vaeattn2 {
using namespace moss_vaeattn;
constexpr int BK = 16;
constexpr int SST = BK + 4;  // S partial rows: a fragment (row g, key t) at 20g + t: 32 banks

__host__ __device__ constexpr int smem_floats() { return BQ * QST + 2 * BK * KST + 2 * BK * VST + 2 * BQ * SST; }

template <int BUG>
__device__ void flash2(float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ kh,
                       const float* __restrict__ kl, const float* __restrict__ vh, const float* __restrict__ vl,
                       int L, float scale) {
    extern __shared__ __align__(16) float sm[];
    float* Qs = sm;
    float* Kh = Qs + BQ * QST;
    float* Kl = Kh + BK * KST;
    float* Vh = Kl + BK * KST;
    float* Vl = Vh + BK * VST;
    float* Ss = Vl + BK * VST;  // [2][BQ][SST]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int rg = warp & 3, hf = warp >> 2;
    const long base = (long)blockIdx.y * L * D;
    q += base;
    kh += base;
    kl += base;
    vh += base;
    vl += base;
    out += base;
    const int q0 = blockIdx.x * BQ;
    const int nk = (L + BK - 1) / BK;

    load_rows(Qs, QST, q, q0, BQ, L);
    load_rows(Kh, KST, kh, 0, BK, L);
    load_rows(Kl, KST, kl, 0, BK, L);
    commit();
    load_rows(Vh, VST, vh, 0, BK, L);
    load_rows(Vl, VST, vl, 0, BK, L);
    commit();

    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) o[i][c] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    double l[2] = {0.0, 0.0};
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};
    const float* Qw = Qs + (16 * rg) * QST + HALF * hf;
    const int koff = HALF * hf;

    for (int j = 0; j < nk; j++) {
        wait_but_one();  // Q and K(j) are in (V(j) may still stream)
        __syncthreads();
        // ---- partial S = Q K(j)ᵀ over half of D, 16 rows x 16 keys
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[nt][c] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < HALF / 8; kk++) {
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
                const int kb = (8 * nt + g) * KST + koff + 8 * kk + t;
                const float bh0 = Kh[kb], bh1 = Kh[kb + 4], bl0 = Kl[kb], bl1 = Kl[kb + 4];
                float part[4];
                mma(part, al[0], al[1], al[2], al[3], bh0, bh1, zero);
                mma(part, ah[0], ah[1], ah[2], ah[3], bl0, bl1, part);
                mma(part, ah[0], ah[1], ah[2], ah[3], bh0, bh1, part);
#pragma unroll
                for (int c = 0; c < 4; c++) s[nt][c] = __fadd_rn(s[nt][c], part[c]);
            }
        }
        // ---- the partial to shared memory (Ss[hf]); the previous tile's reads of Ss ended
        // before the barriers around P V
        float* Sw = Ss + hf * (BQ * SST);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int col = 8 * nt + 2 * t;
            *reinterpret_cast<float2*>(Sw + (16 * rg + g) * SST + col) = make_float2(s[nt][0], s[nt][1]);
            *reinterpret_cast<float2*>(Sw + (16 * rg + g + 8) * SST + col) = make_float2(s[nt][2], s[nt][3]);
        }
        __syncthreads();  // every warp is done with K(j); both partials are in
        if (j + 1 < nk) {
            load_rows(Kh, KST, kh, (j + 1) * BK, BK, L);
            load_rows(Kl, KST, kl, (j + 1) * BK, BK, L);
        }
        commit();
        // ---- p0 + p1, scaled and masked, on rows g and g + 8 (A fragment layout)
        float p[2][4];
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            const int o0 = (16 * rg + g) * SST + 8 * kk + t;
            const int offs[4] = {o0, o0 + 8 * SST, o0 + 4, o0 + 8 * SST + 4};
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int key = j * BK + 8 * kk + t + 4 * (c >> 1);
                const float x = BUG == 1 ? Ss[offs[c]] : __fadd_rn(Ss[offs[c]], Ss[BQ * SST + offs[c]]);
                p[kk][c] = key < L ? __fmul_rn(x, scale) : -INFINITY;
            }
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
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
        for (int kk = 0; kk < 2; kk++)
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
            alpha[r] = expf(m[r] - mx[r]);  // 0 on the first tile (m = -inf), 1 when no maximum grew
            l[r] = l[r] * (double)alpha[r] + sum[r];
            m[r] = mx[r];
        }
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                o[nt][0] *= alpha[0];
                o[nt][1] *= alpha[0];
                o[nt][2] *= alpha[1];
                o[nt][3] *= alpha[1];
            }
        }
        float ph[2][4], pl[2][4];
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                ph[kk][c] = tf32(p[kk][c]);
                pl[kk][c] = tf32(p[kk][c] - ph[kk][c]);
            }
        wait_but_one();  // V(j) is in (K(j+1) may still stream)
        __syncthreads();
        // ---- O += P V(j) for 16 rows x 192 columns: one fresh tile for the 16 keys
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int vb = t * VST + HALF * hf + 8 * nt + g;
            float part[4];
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                const float bh0 = Vh[vb + (8 * kk) * VST], bh1 = Vh[vb + (8 * kk + 4) * VST];
                const float bl0 = Vl[vb + (8 * kk) * VST], bl1 = Vl[vb + (8 * kk + 4) * VST];
                if (kk == 0) {
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
        __syncthreads();  // every warp is done with V(j) (and with Ss of tile j)
        if (j + 1 < nk) {
            load_rows(Vh, VST, vh, (j + 1) * BK, BK, L);
            load_rows(Vl, VST, vl, (j + 1) * BK, BK, L);
        }
        commit();
    }

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

}  // namespace moss_vaeattn2

// hi = tf32(x), lo = tf32(x - hi) for n values (the flash2 prep pass).
MOSS_KERNEL void moss_vae_split_hilo(float* hi, float* lo, const float* x, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float v = x[i], h = moss_vaeattn::tf32(v);
        hi[i] = h;
        lo[i] = moss_vaeattn::tf32(v - h);
    }
}
MOSS_KERNEL void __launch_bounds__(moss_vaeattn::THREADS, 1)
    moss_vae_flash2_d384(float* out, const float* q, const float* kh, const float* kl, const float* vh, const float* vl,
                         int L, float scale) {
    moss_vaeattn2::flash2<0>(out, q, kh, kl, vh, vl, L, scale);
}
MOSS_KERNEL void __launch_bounds__(moss_vaeattn::THREADS, 1)
    moss_ctl_vae_flash2_d384(float* out, const float* q, const float* kh, const float* kl, const float* vh,
                             const float* vl, int L, float scale) {
    moss_vaeattn2::flash2<1>(out, q, kh, kl, vh, vl, L, scale);
}
