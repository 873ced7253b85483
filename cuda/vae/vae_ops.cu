// The VAE decoder's fused ops (crates/moss-cuda/src/vae/mod.rs; math on `VaeOps` in
// crates/moss-core/src/backend/ops/vae.rs). Everything is fp32.
//
// - moss_vae_bn_unpatchify: undo the latent BatchNorm and unpatchify, one pass.
// - moss_vae_conv_tf32x3*: 2-D "same" convolution as an implicit GEMM,
//   out[o, p] = b[o] + sum_kk W[o, kk] * U[kk, p] with kk = (i, ky, kx) and U the im2col of the
//   input gathered on the fly (zero padding; the nearest-x2 upsample folded into the indexing:
//   U reads x[i, Y>>1, X>>1]). 128x128 output tiles (channels x pixels), k-steps of 16, 256
//   threads. mma.sync m16n8k8 TF32 on the tensor cores with split operands, a = a_hi + a_lo (hi = tf32(a), lo = tf32(a - hi)),
//   acc += a_lo*b_hi + a_hi*b_lo + a_hi*b_hi in fp32: fp32-level accuracy at tensor-core speed.
// - moss_vae_gn_*: GroupNorm (+SiLU): per-(group, row) f64 partials (sum, squared deviations
//   from the row's mean; no atomics, a fixed order), combined on the host in a fixed order into
//   [G, 2] (mean, variance), then the normalise pass ((x - mean) * (w * inv) + b in f64, SiLU in
//   f32 like the CPU). Split-invariant: a row strip gives the whole picture's bits.
// - moss_vae_softmax_rows: scaled, max-subtracted softmax over rows of a score block (the
//   attention's scores come from cuBLAS fp32 GEMMs in query chunks, see crates/moss-cuda/src/vae/attention.rs).
// - moss_vae_to_rgb8: clamp, scale, round half to even (rintf), HWC bytes.
// moss_ctl_vae_*: the same code with a planted bug, for `moss check`.
#include "common.cuh"
#include "mma.cuh"
#include "launch.h"

namespace moss_vae {

// ---- bn_unpatchify -------------------------------------------------------------------------
// BUG 1: dy and dx swapped.
template <int BUG>
__device__ void bn_unpatchify(float* __restrict__ out, const float* __restrict__ z, const float* __restrict__ mean,
                              const float* __restrict__ var, float eps, int n, int c, int h, int w, int ph, int pw) {
    long total = (long)n * c * h * ph * w * pw;
    int oh = h * ph, ow = w * pw, pp = ph * pw;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        int X = (int)(idx % ow);
        long r = idx / ow;
        int Y = (int)(r % oh);
        r /= oh;
        int ci = (int)(r % c);
        int ni = (int)(r / c);
        int y = Y / ph, dy = Y % ph, x = X / pw, dx = X % pw;
        int k = BUG == 1 ? ci * pp + dx * pw + dy : ci * pp + dy * pw + dx;
        float sd = sqrtf(__fadd_rn(var[k], eps));
        float v = z[(((long)ni * c * pp + k) * h + y) * w + x];
        out[idx] = __fadd_rn(__fmul_rn(v, sd), mean[k]);
    }
}

// ---- convolution ---------------------------------------------------------------------------
constexpr int BM = VAE_CONV_BM, BN = VAE_CONV_BN, BK = 16, THREADS = VAE_CONV_THREADS;
constexpr int AS = BK + 4;   // As[BM][AS]: row stride 20 words (conflict-free fragment loads)
constexpr int BS = BN + 8;   // Bs[BK][BS]: row stride 136 words

using moss_mma::tf32;

using moss_mma::mma_tf32;

// MODE 0: SIMT fp32. MODE 1: 3xTF32 mma. MODE 2: 1xTF32 mma (planted: the lo parts dropped).
// bug 1 (runtime, load path only): the upsample fold reads x[(Y+1)>>1, (X+1)>>1] (clamped).
// KS: the kernel size at compile time (1 or 3; 0 = from `k`), so the im2col index math divides
// by constants.
// TAP: the weight is laid out [Cout, k, k, Cin] (K index = tap * Cin + i) and Cin % BK == 0, so
// a k-step reads one tap of BK consecutive channels: the gather's index math is done once per
// k-step, not per element.
template <int MODE, int KS, bool TAP>
__device__ void conv(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ wt,
                     const float* __restrict__ bias, int cin, int h, int w, int cout, int k_rt, int up, int bug) {
    const int k = KS ? KS : k_rt;
    // Shared tiles: [2][BM][AS] for A (hi, lo), [2][BK][BS] for B (hi, lo).
    __shared__ __align__(16) float As[2][BM][AS];
    __shared__ __align__(16) float Bs[2][BK][BS];
    const int tid = threadIdx.x;
    const int oh = up ? 2 * h : h, ow = up ? 2 * w : w;
    const long P = (long)oh * ow;
    const int K = cin * k * k, kk2 = k * k, pad = k / 2;
    // A 1-D grid: channel blocks fastest (they read the same input pixels), then pixel blocks,
    // then images.
    const int nby = (cout + BM - 1) / BM;
    const long nbx = (P + BN - 1) / BN;
    const long blk = blockIdx.x;
    const int m0 = (int)(blk % nby) * BM;
    const long n0 = (blk / nby) % nbx * BN;
    const int ni = (int)(blk / (nby * nbx));
    const float* xn = x + (long)ni * cin * h * w;
    float* on = out + (long)ni * cout * P;

    // This thread's B column (pixel) and its first k row; A: k column and first row.
    const int bc = tid % BN, br0 = tid / BN;  // rows br0 + 2j, j < 8
    const long bp = n0 + bc;
    const bool bvalid = bp < P;
    const int bY = bvalid ? (int)(bp / ow) : 0, bX = bvalid ? (int)(bp % ow) : 0;
    const int ac = tid % BK, ar0 = tid / BK;  // rows ar0 + 16j, j < 8

    float ra[8], rb[8];
    auto load = [&](int k0) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int m = m0 + ar0 + 16 * j, kk = k0 + ac;
            ra[j] = (m < cout && kk < K) ? __ldg(wt + (long)m * K + kk) : 0.f;
        }
        if (TAP) {
            int tap = k0 / cin, i0 = k0 - tap * cin;
            int ky = tap / k, kx = tap - ky * k;
            int yy = bY + ky - pad, xx = bX + kx - pad;
            bool ok = bvalid && yy >= 0 && yy < oh && xx >= 0 && xx < ow;
            int sy = yy, sx = xx;
            if (up) {
                if (bug == 1) {
                    sy = min((yy + 1) >> 1, h - 1);
                    sx = min((xx + 1) >> 1, w - 1);
                } else {
                    sy = yy >> 1;
                    sx = xx >> 1;
                }
            }
            const long hw = (long)h * w;
            const float* src = xn + (long)(i0 + br0) * hw + (ok ? (long)sy * w + sx : 0);
#pragma unroll
            for (int j = 0; j < 8; j++) rb[j] = ok ? __ldg(src + 2 * j * hw) : 0.f;
            return;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int kk = k0 + br0 + 2 * j;
            float v = 0.f;
            if (bvalid && kk < K) {
                int i = kk / kk2, r = kk - i * kk2;
                int ky = r / k, kx = r - ky * k;
                int yy = bY + ky - pad, xx = bX + kx - pad;
                if (yy >= 0 && yy < oh && xx >= 0 && xx < ow) {
                    int sy = yy, sx = xx;
                    if (up) {
                        if (bug == 1) {
                            sy = min((yy + 1) >> 1, h - 1);
                            sx = min((xx + 1) >> 1, w - 1);
                        } else {
                            sy = yy >> 1;
                            sx = xx >> 1;
                        }
                    }
                    v = __ldg(xn + ((long)i * h + sy) * w + sx);
                }
            }
            rb[j] = v;
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = ra[j];
            if (MODE == 0) {
                As[0][ar0 + 16 * j][ac] = v;
            } else {
                float hi = tf32(v);
                As[0][ar0 + 16 * j][ac] = hi;
                As[1][ar0 + 16 * j][ac] = tf32(v - hi);
            }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = rb[j];
            if (MODE == 0) {
                Bs[0][br0 + 2 * j][bc] = v;
            } else {
                float hi = tf32(v);
                Bs[0][br0 + 2 * j][bc] = hi;
                Bs[1][br0 + 2 * j][bc] = tf32(v - hi);
            }
        }
    };

    if (MODE == 0) {
        // 16x16 threads, each 8 rows (ty + 16i) x 8 columns (tx + 16j).
        const int tx = tid % 16, ty = tid / 16;
        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
        load(0);
        for (int k0 = 0; k0 < K; k0 += BK) {
            __syncthreads();
            store();
            __syncthreads();
            if (k0 + BK < K) load(k0 + BK);
#pragma unroll
            for (int kk = 0; kk < BK; kk++) {
                float a[8], b[8];
#pragma unroll
                for (int i = 0; i < 8; i++) a[i] = As[0][ty + 16 * i][kk];
#pragma unroll
                for (int j = 0; j < 8; j++) b[j] = Bs[0][kk][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int m = m0 + ty + 16 * i;
            if (m >= cout) continue;
            float bb = bias[m];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                long p = n0 + tx + 16 * j;
                if (p < P) on[(long)m * P + p] = acc[i][j] + bb;
            }
        }
    } else {
        // 8 warps: 2 (rows, 64 each) x 4 (columns, 32 each); per warp 4 m16 x 4 n8 tiles.
        const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
        const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
        float acc[4][4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[a][b][c] = 0.f;
        // The tensor cores' fp32 accumulation truncates; so each k-step's products go into a
        // fresh tile `part`, added to `acc` with ordinary round-to-nearest adds.
        load(0);
        for (int k0 = 0; k0 < K; k0 += BK) {
            __syncthreads();
            store();
            __syncthreads();
            if (k0 + BK < K) load(k0 + BK);
            float part[4][4][4];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++)
#pragma unroll
                    for (int c = 0; c < 4; c++) part[a][b][c] = 0.f;
#pragma unroll
            for (int ks = 0; ks < BK; ks += 8) {
                unsigned ah[4][4], al[4][4], bh[4][2], bl[4][2];
#pragma unroll
                for (int mt = 0; mt < 4; mt++) {
                    int r = wm + mt * 16 + g;
                    ah[mt][0] = __float_as_uint(As[0][r][ks + t]);
                    ah[mt][1] = __float_as_uint(As[0][r + 8][ks + t]);
                    ah[mt][2] = __float_as_uint(As[0][r][ks + t + 4]);
                    ah[mt][3] = __float_as_uint(As[0][r + 8][ks + t + 4]);
                    if (MODE == 1) {
                        al[mt][0] = __float_as_uint(As[1][r][ks + t]);
                        al[mt][1] = __float_as_uint(As[1][r + 8][ks + t]);
                        al[mt][2] = __float_as_uint(As[1][r][ks + t + 4]);
                        al[mt][3] = __float_as_uint(As[1][r + 8][ks + t + 4]);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    int c = wn + nt * 8 + g;
                    bh[nt][0] = __float_as_uint(Bs[0][ks + t][c]);
                    bh[nt][1] = __float_as_uint(Bs[0][ks + t + 4][c]);
                    if (MODE == 1) {
                        bl[nt][0] = __float_as_uint(Bs[1][ks + t][c]);
                        bl[nt][1] = __float_as_uint(Bs[1][ks + t + 4][c]);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 4; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        if (MODE == 1) {
                            mma_tf32(part[mt][nt], al[mt], bh[nt][0], bh[nt][1]);
                            mma_tf32(part[mt][nt], ah[mt], bl[nt][0], bl[nt][1]);
                        }
                        mma_tf32(part[mt][nt], ah[mt], bh[nt][0], bh[nt][1]);
                    }
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[a][b][c] = __fadd_rn(acc[a][b][c], part[a][b][c]);
        }
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int hlf = 0; hlf < 2; hlf++) {
                int m = m0 + wm + mt * 16 + g + 8 * hlf;
                if (m >= cout) continue;
                float bb = bias[m];
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        long p = n0 + wn + nt * 8 + 2 * t + e;
                        if (p < P) on[(long)m * P + p] = acc[mt][nt][2 * hlf + e] + bb;
                    }
            }
    }
}

// ---- group norm ----------------------------------------------------------------------------
__device__ __forceinline__ double block_sum(double v) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double s = 0;
    if (warp == 0) {
        s = lane < (int)(blockDim.x / 32) ? part[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    return s;  // valid in thread 0
}

// Split-invariant GroupNorm partials: block r = (image * groups + group) * h + y sums the
// group's cg * w values of row y, then the squared deviations from that row's own mean;
// out[2r] = sum, out[2r + 1] = squared deviations (f64). Thread t takes the row's elements
// t, t + blockDim, ... (index j * w + x, j the channel inside the group) and block_sum reduces
// in a fixed tree: the bits depend only on the row's values, never on h or on where the row
// sits, so a row strip gives exactly the pairs of the whole picture (the host combines them in
// a fixed order: group_norm_combine in crates/moss-core/src/backend/ops/vae.rs). BUG 1 (planted): the first
// element of the row is skipped.
template <int BUG>
__device__ void gn_row_stats(double* __restrict__ out, const float* __restrict__ x, int cg, int h, int w) {
    __shared__ double mean_sh;
    const long r = blockIdx.x;
    const long g = r / h;
    const int y = (int)(r - g * h);
    const long hw = (long)h * w;
    const float* base = x + g * cg * hw + (long)y * w;
    const int len = cg * w;
    double s = 0;
    for (int i = threadIdx.x + (BUG == 1 ? 1 : 0); i < len; i += blockDim.x) {
        int j = i / w, xx = i - j * w;
        s += (double)base[j * hw + xx];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) mean_sh = s / (double)len;
    __syncthreads();
    const double m = mean_sh;
    double q = 0;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        int j = i / w, xx = i - j * w;
        double d = (double)base[j * hw + xx] - m;
        q += d * d;
    }
    q = block_sum(q);
    if (threadIdx.x == 0) {
        out[2 * r] = s;
        out[2 * r + 1] = q;
    }
}

// BUG 1: the channel of an element taken as idx % C (not (idx / HW) % C).
template <int BUG>
__device__ void gn_apply(float* __restrict__ out, const float* __restrict__ x, const double* __restrict__ stats,
                         const float* __restrict__ wt, const float* __restrict__ bias, long total, int c, long hw,
                         int groups, double eps, int silu) {
    int cg = c / groups;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        long ch_all = idx / hw;  // n * C + ch
        int ch = BUG == 1 ? (int)(idx % c) : (int)(ch_all % c);
        long g = ch_all / cg;    // n * groups + group
        double mean = stats[2 * g];
        double var = stats[2 * g + 1];
        double inv = 1.0 / sqrt(var + eps);
        double gg = (double)wt[ch] * inv;
        float y = (float)(((double)x[idx] - mean) * gg + (double)bias[ch]);
        if (silu) y = y / (1.0f + expf(-y));
        out[idx] = y;
    }
}

// ---- softmax over score rows ------------------------------------------------------------------
// s [rows, n] in place: p = exp(scale*s - max) / sum, max and sum in fp32 (sum in f64).
// BUG 1: the 1/sqrt(D) scale left out.
template <int BUG>
__device__ void softmax_rows(float* s, long rows, int n, float scale) {
    __shared__ float red[32];
    __shared__ double redd[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    if (BUG == 1) scale = 1.f;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        float* row = s + r * n;
        float m = -INFINITY;
        for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, row[j] * scale);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        __syncthreads();
        if (lane == 0) red[warp] = m;
        __syncthreads();
        m = -INFINITY;
        for (int i = 0; i < nw; i++) m = fmaxf(m, red[i]);
        double sum = 0;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            float p = expf(row[j] * scale - m);
            row[j] = p;
            sum += p;
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) redd[warp] = sum;
        __syncthreads();
        sum = 0;
        for (int i = 0; i < nw; i++) sum += redd[i];
        float inv = (float)(1.0 / sum);
        for (int j = threadIdx.x; j < n; j += blockDim.x) row[j] *= inv;
    }
}

// ---- to_rgb8 ---------------------------------------------------------------------------------
// BUG 1: truncation instead of round half to even.
template <int BUG>
__device__ void to_rgb8(unsigned char* out, const float* __restrict__ x, long hw) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < 3 * hw; i += (long)gridDim.x * blockDim.x) {
        long ch = i / hw, p = i % hw;
        float v = fminf(fmaxf(x[i], -1.f), 1.f);
        v = fminf(fmaxf(__fadd_rn(v * 0.5f, 0.5f), 0.f), 1.f) * 255.f;
        float r = BUG == 1 ? truncf(v) : rintf(v);
        out[p * 3 + ch] = (unsigned char)r;
    }
}

}  // namespace moss_vae

using namespace moss_vae;

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_bn_unpatchify(float* out, const float* z, const float* mean, const float* var, float eps,
                                        int n, int c, int h, int w, int ph, int pw) {
    bn_unpatchify<0>(out, z, mean, var, eps, n, c, h, w, ph, pw);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_bn_unpatchify(float* out, const float* z, const float* mean, const float* var,
                                            float eps, int n, int c, int h, int w, int ph, int pw) {
    bn_unpatchify<1>(out, z, mean, var, eps, n, c, h, w, ph, pw);
}
#endif

// `bug` is a compile-time constant of each build: 0 in production, 1 (the upsample fold off by
// one) in the `_fold` controls of the check image.
#define MOSS_VAE_CONV_T(name, mode, ks, tap, bug)                                                           \
    MOSS_KERNEL void __launch_bounds__(THREADS) name(float* out, const float* x, const float* w, const float* b, \
                                                     int cin, int h, int wd, int cout, int k, int up) {     \
        conv<mode, ks, tap>(out, x, w, b, cin, h, wd, cout, k, up, bug);                                    \
    }
#define MOSS_VAE_CONV(name, mode, ks) MOSS_VAE_CONV_T(name, mode, ks, false, 0)
MOSS_PRODUCTION(MOSS_VAE_CONV_T(moss_vae_conv_tf32x3t_k1, 1, 1, true, 0))
MOSS_PRODUCTION(MOSS_VAE_CONV_T(moss_vae_conv_tf32x3t_k3, 1, 3, true, 0))
MOSS_PRODUCTION(MOSS_VAE_CONV(moss_vae_conv_tf32x3, 1, 0))
MOSS_PRODUCTION(MOSS_VAE_CONV(moss_vae_conv_tf32x3_k1, 1, 1))
MOSS_PRODUCTION(MOSS_VAE_CONV(moss_vae_conv_tf32x3_k3, 1, 3))
MOSS_CONTROL(MOSS_VAE_CONV(moss_ctl_vae_conv_tf32x1, 2, 0))
MOSS_CONTROL(MOSS_VAE_CONV(moss_ctl_vae_conv_tf32x1_k1, 2, 1))
MOSS_CONTROL(MOSS_VAE_CONV(moss_ctl_vae_conv_tf32x1_k3, 2, 3))
MOSS_CONTROL(MOSS_VAE_CONV_T(moss_ctl_vae_conv_tf32x3t_fold_k1, 1, 1, true, 1))
MOSS_CONTROL(MOSS_VAE_CONV_T(moss_ctl_vae_conv_tf32x3t_fold_k3, 1, 3, true, 1))
MOSS_CONTROL(MOSS_VAE_CONV_T(moss_ctl_vae_conv_tf32x3_fold, 1, 0, false, 1))
MOSS_CONTROL(MOSS_VAE_CONV_T(moss_ctl_vae_conv_tf32x3_fold_k1, 1, 1, false, 1))
MOSS_CONTROL(MOSS_VAE_CONV_T(moss_ctl_vae_conv_tf32x3_fold_k3, 1, 3, false, 1))

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_gn_row_stats(double* out, const float* x, int cg, int h, int w) {
    gn_row_stats<0>(out, x, cg, h, w);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_gn_row_stats(double* out, const float* x, int cg, int h, int w) {
    gn_row_stats<1>(out, x, cg, h, w);
}
#endif
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_gn_apply(float* out, const float* x, const double* stats, const float* w, const float* b,
                                   long total, int c, long hw, int groups, long eps_bits, int silu) {
    gn_apply<0>(out, x, stats, w, b, total, c, hw, groups, __longlong_as_double(eps_bits), silu);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_gn_apply(float* out, const float* x, const double* stats, const float* w,
                                       const float* b, long total, int c, long hw, int groups, long eps_bits,
                                       int silu) {
    gn_apply<1>(out, x, stats, w, b, total, c, hw, groups, __longlong_as_double(eps_bits), silu);
}
#endif

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_softmax_rows(float* s, long rows, int n, float scale) { softmax_rows<0>(s, rows, n, scale); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_softmax_rows(float* s, long rows, int n, float scale) {
    softmax_rows<1>(s, rows, n, scale);
}
#endif

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_to_rgb8(unsigned char* out, const float* x, long hw) { to_rgb8<0>(out, x, hw); }
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_to_rgb8(unsigned char* out, const float* x, long hw) { to_rgb8<1>(out, x, hw); }
#endif
