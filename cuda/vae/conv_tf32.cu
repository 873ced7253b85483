// The VAE decoder's fast convolutions (launch code: crates/moss-cuda/src/vae/conv.rs; the older
// per-k-step gather kernels stay in cuda/vae/vae_ops.cu as the fallback and the gate's comparison).
//
// - moss_vae_wprep_b{96,128}_k{1,3}: the weight [Cout, Cin, k, k] re-laid out once per call for
//   the halo kernel, already split into TF32 hi/lo (hi = tf32(w), lo = tf32(w - hi)) and in
//   mma fragment order: [Cout/BM][Cin/8][tap][BM/16][hi|lo][lane][4]. Rows past Cout are zeros.
// - moss_vae_conv_halo_b{96,128}_k{1,3}: 2-D "same" convolution (stride 1, zero padding,
//   optional nearest-x2 upsample folded into the gather) as an implicit GEMM on the tensor cores
//   with split TF32 (3 mma.sync m16n8k8 per tile: lo*hi, hi*lo, hi*hi, small terms first).
//   Block tile: BM output channels x 8x16 output pixels; 8 warps (2 along channels, 4 along
//   pixels). The reduction runs over chunks of 8 input channels; per chunk the block loads the
//   8-channel input halo ((8+k-1) x (16+k-1) pixels) once, splits it into hi/lo in shared memory,
//   and runs all k*k taps from it (the im2col is never gathered per tap), while the next chunk's
//   weights stream in with cp.async and its halo is prefetched into registers (2 stages).
//   Accuracy: the tensor cores' fp32 accumulation truncates, so each tap's 3 products go into a
//   fresh register tile (the first mma reads a zero C) that is then added to the running sum
//   with a round-to-nearest add. A null bias adds nothing (the attention's products use this
//   kernel as a GEMM).
//   With a `norm` table (GroupNorm fused into the load, moss_vae_gn_coef): each halo value is
//   normalised (+SiLU) as it goes to shared memory, with moss_vae_gn_apply's arithmetic, so the
//   conv sees the same inputs bit for bit and the normalised tensor is never written.
// - (measured slower, not built) the same conv with the weight streamed as fp32 (one copy) and
//   split into hi/lo in registers after the shared-memory load: half the weight bytes from L2
//   and in shared memory, 12 more ALU instructions per A fragment. Measured
//   on the H200: 13 % slower (160.3 vs 140.8 ms a 1024x1024 decode): the halo kernel is limited by
//   its instruction issue, not by the weight stream from L2.
//   The fused GroupNorm likewise costs more in this kernel than the separate pass (measured on the
//   H200; the host passes no `norm` table).
// - moss_vae_conv_small: Cout <= 4 (conv_out: 96 -> 3): one thread per output pixel, all
//   outputs, f64 accumulation, weights staged in shared memory 32 input channels at a time.
// moss_ctl_*: planted bugs for `moss check` (one TF32 product; mirrored taps).
#include "common.cuh"
#include "mma.cuh"
#include "launch.h"

namespace moss_vaeconv {

constexpr int TH = VAE_HALO_TH, TW = VAE_HALO_TW, THREADS = VAE_HALO_THREADS;
#ifndef TAP_UNROLL
#define TAP_UNROLL 1
#endif
constexpr int TAP_UNROLL_N = TAP_UNROLL;  // taps unrolled per iteration (all of them spills)

using moss_mma::tf32;

// d = a*b + c
__device__ __forceinline__ void mma(float (&d)[4], const float4& a, float b0, float b1, const float (&c)[4]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(__float_as_uint(a.x)), "r"(__float_as_uint(a.y)), "r"(__float_as_uint(a.z)), "r"(__float_as_uint(a.w)),
          "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Halo channel stride (launch.h): the smallest cs >= hn with cs % 32 == 8 or 24, so the B
// fragment loads (4 channels x 8 consecutive pixels per instruction) hit 32 different banks.
__host__ __device__ constexpr int halo_cs(int hn) { return VAE_HALO_CS(hn); }

// ---- weight preparation ---------------------------------------------------------------------
// W32: [Cout/BM][Cin/8][tap][BM/16][lane][4] fp32 (no hi/lo: the kernel splits).
template <int BM, int KS, int W32 = 0>
__device__ void wprep(float* __restrict__ wf, const float* __restrict__ w, int cout, int cin) {
    const int mblocks = (cout + BM - 1) / BM, chunks = cin / 8;
    const long total = (long)mblocks * chunks * KS * KS * (BM / 16) * (W32 ? 1 : 2) * 128;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        int r = (int)(idx & 3), lane = (int)((idx >> 2) & 31), hl = W32 ? 0 : (int)((idx >> 7) & 1);
        long q = W32 ? idx >> 7 : idx >> 8;
        int mt = (int)(q % (BM / 16));
        q /= BM / 16;
        int tap = (int)(q % (KS * KS));
        q /= KS * KS;
        int ch = (int)(q % chunks);
        int mb = (int)(q / chunks);
        int g = lane >> 2, t = lane & 3;
        int o = mb * BM + mt * 16 + g + 8 * (r & 1);
        int i = ch * 8 + t + 4 * (r >> 1);
        float v = o < cout ? w[((long)o * cin + i) * KS * KS + tap] : 0.f;
        float hi = tf32(v);
        wf[idx] = W32 ? v : (hl ? tf32(v - hi) : hi);
    }
}

// ---- the halo conv ----------------------------------------------------------------------------
// MODE 1: split TF32 (3 products). MODE 2 (planted): hi*hi only.
// bug 1: the upsample fold reads x[(Y+1)>>1, (X+1)>>1] (clamped).
template <int MODE, int BM, int KS, int W32 = 0>
__device__ void conv_halo(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ wf,
                          const float* __restrict__ bias, int cin, int h, int w, int cout, int up, int bug,
                          int wsplit, const double* __restrict__ norm, int silu) {
    constexpr int MT = BM / 32;  // m16 tiles per warp
    constexpr int HR = TH + KS - 1, HC = TW + KS - 1, HN = HR * HC;
    constexpr int CS = halo_cs(HN);
    constexpr int NB = (8 * HN + THREADS - 1) / THREADS;  // halo values per thread per chunk
    constexpr int AST = KS * KS * BM * (W32 ? 8 : 16);    // floats of one A stage (hi and lo, or fp32)
    constexpr int PAD = KS / 2;
    extern __shared__ __align__(16) float smem[];
    float* As = smem;                 // [2][AST]
    float* Bs = smem + 2 * AST;       // [2][2 (hi, lo)][8][CS]
    static_assert(W32 || 4 * (2 * AST + 2 * 2 * 8 * CS) == VAE_HALO_SMEM(BM, KS), "launch.h: VAE_HALO_SMEM");
    // norm (GroupNorm fused into the load): per input channel (mean, w/sqrt(var+eps), bias) as
    // moss_vae_gn_coef writes them, staged here for all of cin: [cin][3] doubles.
    double* Ns = reinterpret_cast<double*>(Bs + 2 * 2 * 8 * CS);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const int oh = up ? 2 * h : h, ow = up ? 2 * w : w;
    const int tiles_x = (ow + TW - 1) / TW, tiles_y = (oh + TH - 1) / TH;
    const int mblocks = (cout + BM - 1) / BM;
    long blk = blockIdx.x;
    const int mb = (int)(blk % mblocks);
    blk /= mblocks;
    const int tx0 = (int)(blk % tiles_x) * TW;
    blk /= tiles_x;
    const int ty0 = (int)(blk % tiles_y) * TH;
    const int ni = (int)(blk / tiles_y);
    const int hw = h * w, chunks = cin / 8;
    const float* xn = x + (long)ni * cin * hw;
    // wsplit: split-K over the images -- the weight has nimg * cin input channels and image ni
    // multiplies its slice [ni * cin, (ni + 1) * cin) (the caller sums the images' outputs).
    const int nimg = (int)(gridDim.x / ((long)mblocks * tiles_x * tiles_y));
    const float* wb = wf + (wsplit ? ((long)mb * nimg + ni) * chunks : (long)mb * chunks) * AST;

    // This thread's halo elements: source offset within a chunk (-1: zero) and smem slot.
    int src[NB], dst[NB];
#pragma unroll
    for (int j = 0; j < NB; j++) {
        int e = tid + THREADS * j;
        src[j] = -1;
        dst[j] = -1;
        if (e < 8 * HN) {
            int c = e / HN, rem = e - c * HN, hy = rem / HC, hx = rem - hy * HC;
            dst[j] = c * CS + hy * HC + hx;
            int Y = ty0 + hy - PAD, X = tx0 + hx - PAD;
            if (Y >= 0 && Y < oh && X >= 0 && X < ow) {
                int sy = Y, sx = X;
                if (up) {
                    if (bug == 1) {
                        sy = min((Y + 1) >> 1, h - 1);
                        sx = min((X + 1) >> 1, w - 1);
                    } else {
                        sy = Y >> 1;
                        sx = X >> 1;
                    }
                }
                src[j] = c * hw + sy * w + sx;
            }
        }
    }
    if (norm) {
        const double* nn = norm + (long)ni * cin * 3;
        for (int i = tid; i < cin * 3; i += THREADS) Ns[i] = nn[i];
        __syncthreads();
    }
    float rb[NB];
    auto load_b = [&](int chunk) {
        const float* xc = xn + (long)chunk * 8 * hw;
#pragma unroll
        for (int j = 0; j < NB; j++) rb[j] = src[j] >= 0 ? __ldg(xc + src[j]) : 0.f;
    };
    // The halo of `chunk` into buffer `buf`, normalised first when `norm` is given (exactly
    // moss_vae_gn_apply's arithmetic; the zero padding stays zero, as after a separate pass).
    auto store_b = [&](int buf, int chunk) {
        float* b = Bs + buf * 2 * 8 * CS;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            if (dst[j] >= 0) {
                float val = rb[j];
                if (norm && src[j] >= 0) {
                    const double* cf = Ns + (chunk * 8 + dst[j] / CS) * 3;
                    float y = (float)(((double)val - cf[0]) * cf[1] + cf[2]);
                    if (silu) y = y / (1.0f + expf(-y));
                    val = y;
                }
                float hi = tf32(val);
                b[dst[j]] = hi;
                b[8 * CS + dst[j]] = tf32(val - hi);
            }
        }
    };
    auto load_a = [&](int chunk, int buf) {
        const float4* s = reinterpret_cast<const float4*>(wb + (long)chunk * AST);
        float4* d = reinterpret_cast<float4*>(As + buf * AST);
#pragma unroll 4
        for (int i = tid; i < AST / 4; i += THREADS) cp_async16(d + i, s + i);
        cp_async_commit();
    };

    float acc[MT][4][4];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.f;
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};

    load_a(0, 0);
    load_b(0);
    for (int chunk = 0; chunk < chunks; chunk++) {
        const int buf = chunk & 1;
        store_b(buf, chunk);
        cp_async_wait_all();
        __syncthreads();
        if (chunk + 1 < chunks) {
            load_a(chunk + 1, buf ^ 1);
            load_b(chunk + 1);
        }
        const float* A = As + buf * AST;
        const float* Bh = Bs + buf * 2 * 8 * CS;
        const float* Bl = Bh + 8 * CS;
#pragma unroll TAP_UNROLL_N
        for (int tap = 0; tap < KS * KS; tap++) {
            const int ky = tap / KS, kx = tap % KS;
            float4 ah[MT], al[MT];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (W32) {
                    const float4 a = *reinterpret_cast<const float4*>(A + (tap * (BM / 16) + wm * MT + mt) * 128 + lane * 4);
                    ah[mt] = make_float4(tf32(a.x), tf32(a.y), tf32(a.z), tf32(a.w));
                    if (MODE == 1)
                        al[mt] = make_float4(tf32(a.x - ah[mt].x), tf32(a.y - ah[mt].y), tf32(a.z - ah[mt].z),
                                             tf32(a.w - ah[mt].w));
                } else {
                    const float* p = A + ((tap * (BM / 16) + wm * MT + mt) * 2) * 128 + lane * 4;
                    ah[mt] = *reinterpret_cast<const float4*>(p);
                    if (MODE == 1) al[mt] = *reinterpret_cast<const float4*>(p + 128);
                }
            }
            float bh[4][2], bl[4][2];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                int o = t * CS + (wn * 2 + (nt >> 1) + ky) * HC + 8 * (nt & 1) + kx + g;
                bh[nt][0] = Bh[o];
                bh[nt][1] = Bh[o + 4 * CS];
                if (MODE == 1) {
                    bl[nt][0] = Bl[o];
                    bl[nt][1] = Bl[o + 4 * CS];
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    float part[4];
                    if (MODE == 1) {
                        mma(part, al[mt], bh[nt][0], bh[nt][1], zero);
                        mma(part, ah[mt], bl[nt][0], bl[nt][1], part);
                        mma(part, ah[mt], bh[nt][0], bh[nt][1], part);
                    } else {
                        mma(part, ah[mt], bh[nt][0], bh[nt][1], zero);
                    }
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[mt][nt][c] = __fadd_rn(acc[mt][nt][c], part[c]);
                }
        }
    }

    // Epilogue: + bias, straight to [N, Cout, OH, OW].
    const long P = (long)oh * ow;
    float* on = out + (long)ni * cout * P;
    const bool vec2 = (ow & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int o = mb * BM + wm * 16 * MT + mt * 16 + g + 8 * hf;
            if (o >= cout) continue;
            float bb = bias ? bias[o] : 0.f;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                int Y = ty0 + wn * 2 + (nt >> 1), X = tx0 + 8 * (nt & 1) + 2 * t;
                if (Y >= oh) continue;
                float v0 = __fadd_rn(acc[mt][nt][2 * hf], bb), v1 = __fadd_rn(acc[mt][nt][2 * hf + 1], bb);
                float* dp = on + (long)o * P + (long)Y * ow + X;
                if (vec2 && X + 1 < ow) {
                    *reinterpret_cast<float2*>(dp) = make_float2(v0, v1);
                } else {
                    if (X < ow) dp[0] = v0;
                    if (X + 1 < ow) dp[1] = v1;
                }
            }
        }
}

// ---- few output channels ------------------------------------------------------------------------
// out[n, o, Y, X] = b[o] + sum_{i, ky, kx} w[o, i, ky, kx] * U[i, Y + ky - p, X + kx - p], f64
// sums; cout <= 4, k*k <= 9. BUG 1: taps mirrored in x (w[.., k-1-kx]).
constexpr int SMALL_CH = 32;
template <int BUG>
__device__ void conv_small(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ wt,
                           const float* __restrict__ bias, int cin, int h, int w, int cout, int k, int up, int n) {
    __shared__ float ws[SMALL_CH * 9 * 4];
    const int oh = up ? 2 * h : h, ow = up ? 2 * w : w, pad = k / 2, kk = k * k;
    const long P = (long)oh * ow, total = (long)n * P;
    const long hw = (long)h * w;
    for (long base = (long)blockIdx.x * blockDim.x; base < total; base += (long)gridDim.x * blockDim.x) {
        const long idx = base + threadIdx.x;
        const bool valid = idx < total;
        const long ni = valid ? idx / P : 0, p = valid ? idx % P : 0;
        const int Y = (int)(p / ow), X = (int)(p % ow);
        const float* xn = x + ni * cin * hw;
        double acc[4] = {0, 0, 0, 0};
        for (int c0 = 0; c0 < cin; c0 += SMALL_CH) {
            const int nc = min(SMALL_CH, cin - c0);
            __syncthreads();
            for (int e = threadIdx.x; e < nc * kk * cout; e += blockDim.x) {
                int o = e % cout, r = e / cout, tap = r % kk, c = r / kk;
                int ky = tap / k, kx = tap % k;
                if (BUG == 1) kx = k - 1 - kx;
                ws[(c * 9 + tap) * 4 + o] = wt[(((long)o * cin + c0 + c) * k + ky) * k + kx];
            }
            __syncthreads();
            if (!valid) continue;
            for (int c = 0; c < nc; c++) {
                const float* xc = xn + (long)(c0 + c) * hw;
                for (int ky = 0; ky < k; ky++) {
                    int yy = Y + ky - pad;
                    if (yy < 0 || yy >= oh) continue;
                    int sy = up ? yy >> 1 : yy;
                    for (int kx = 0; kx < k; kx++) {
                        int xx = X + kx - pad;
                        if (xx < 0 || xx >= ow) continue;
                        int sx = up ? xx >> 1 : xx;
                        double v = (double)__ldg(xc + (long)sy * w + sx);
                        const float* wv = ws + (c * 9 + ky * k + kx) * 4;
#pragma unroll
                        for (int o = 0; o < 4; o++)
                            if (o < cout) acc[o] += v * (double)wv[o];
                    }
                }
            }
        }
        if (valid) {
            float* on = out + ni * cout * P + p;
            for (int o = 0; o < cout; o++) on[(long)o * P] = (float)(acc[o] + (double)bias[o]);
        }
    }
}

}  // namespace moss_vaeconv

#define MOSS_VAE_HALO(sfx, bm, ks)                                                                              \
    MOSS_KERNEL void moss_vae_wprep_##sfx(float* wf, const float* w, int cout, int cin) {                      \
        moss_vaeconv::wprep<bm, ks>(wf, w, cout, cin);                                                         \
    }                                                                                                          \
    MOSS_KERNEL void __launch_bounds__(moss_vaeconv::THREADS, 1)                                               \
        moss_vae_conv_halo_##sfx(float* out, const float* x, const float* wf, const float* b, int cin, int h,  \
                                 int wd, int cout, int up, int wsplit, const double* norm, int silu) {         \
        moss_vaeconv::conv_halo<1, bm, ks>(out, x, wf, b, cin, h, wd, cout, up, 0, wsplit, norm, silu);        \
    }
// The planted controls: one TF32 product (the lo parts dropped; `moss_ctl_vae_conv_halo_*`), the
// upsample fold off by one (`_fold_`, bug 1).
#define MOSS_VAE_HALO_CONTROL_AS(name, mode, bug, bm, ks)                                                      \
    MOSS_KERNEL void __launch_bounds__(moss_vaeconv::THREADS, 1)                                               \
        name(float* out, const float* x, const float* wf, const float* b, int cin, int h, int wd, int cout,    \
             int up, int wsplit, const double* norm, int silu) {                                               \
        moss_vaeconv::conv_halo<mode, bm, ks>(out, x, wf, b, cin, h, wd, cout, up, bug, wsplit, norm, silu);   \
    }
#define MOSS_VAE_HALO_CONTROL(sfx, bm, ks)                                                                     \
    MOSS_VAE_HALO_CONTROL_AS(moss_ctl_vae_conv_halo_##sfx, 2, 0, bm, ks)                                       \
    MOSS_VAE_HALO_CONTROL_AS(moss_ctl_vae_conv_halo_fold_##sfx, 1, 1, bm, ks)
MOSS_PRODUCTION(MOSS_VAE_HALO(b128_k3, 128, 3))
MOSS_CONTROL(MOSS_VAE_HALO_CONTROL(b128_k3, 128, 3))
MOSS_PRODUCTION(MOSS_VAE_HALO(b96_k3, 96, 3))
MOSS_CONTROL(MOSS_VAE_HALO_CONTROL(b96_k3, 96, 3))
MOSS_PRODUCTION(MOSS_VAE_HALO(b128_k1, 128, 1))
MOSS_CONTROL(MOSS_VAE_HALO_CONTROL(b128_k1, 128, 1))
MOSS_PRODUCTION(MOSS_VAE_HALO(b96_k1, 96, 1))
MOSS_CONTROL(MOSS_VAE_HALO_CONTROL(b96_k1, 96, 1))

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_conv_small(float* out, const float* x, const float* w, const float* b, int cin, int h,
                                     int wd, int cout, int k, int up, int n) {
    moss_vaeconv::conv_small<0>(out, x, w, b, cin, h, wd, cout, k, up, n);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_conv_small(float* out, const float* x, const float* w, const float* b, int cin, int h,
                                         int wd, int cout, int k, int up, int n) {
    moss_vaeconv::conv_small<1>(out, x, w, b, cin, h, wd, cout, k, up, n);
}
#endif
