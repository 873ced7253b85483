// The VAE decoder's convolutions with split fp16 on the tensor cores (issue #8; launch code in
// crates/moss-cuda/src/vae/conv.rs `conv2d_f16`). Same features and tiling as the split-TF32
// halo kernel of cuda/vae/conv_tf32.cu (3x3 and 1x1, stride 1, zero padding, nearest-x2 upsample folded
// into the gather, bias or none, any H/W and Cin), but `mma.sync.m16n8k16` with fp16 operands:
// fp16 has TF32's 11-bit significand, so x = hi + lo with hi = f16(x), lo = f16(x - hi) keeps
// ~22 bits as the TF32 split does, and each instruction does twice the work of m16n8k8.tf32.
//
// - moss_vae_wprep16[a]_{b96,b128}_{k1,k3}: one block per (padded) output channel o: the row's
//   max |w| picks a power-of-two scale 2^s with max|w|·2^s in [2^13, 2^14) (no overflow; the lo
//   parts of the significant weights stay normal), rs[o] = 2^-s (undone exactly in the
//   epilogue); hi = f16(w·2^s), lo = f16((w·2^s - hi)·2^LS), written in the m16n8k16 A fragment
//   order [Cout/BM][Cin/16][tap][BM/16][hi|lo][lane][4 x half2]: one 128-bit shared load a
//   fragment. Rows past Cout and channels past Cin are zeros.
// - moss_vae_conv16[a]_{b96,b128}_{k1,k3}: block tile BM output channels x 8x16 output pixels,
//   8 warps (2 along channels x 4 along pixels); the reduction runs over chunks of 16 input
//   channels: per chunk the block loads the chunk's input halo ((8+k-1) x (16+k-1) pixels) once,
//   splits it into fp16 hi/lo as it stores it to shared memory (planes [hi|lo][channels 0-7 |
//   8-15][pixel][8 halves]: the B fragments are `ldmatrix.x4` loads, 8 consecutive pixels = 128
//   contiguous bytes, no bank conflict) and runs all k*k taps from it, while the next chunk's
//   weights stream in with cp.async and its halo is prefetched into registers (2 stages).
//   Activations are not scaled: |x| > 65504 (or not finite) sets the device flag `flag`
//   (warp vote, then one atomicOr a warp) and the decoder decodes again on the TF32 path.
// - Accumulation (the tensor cores truncate fp32 sums): VAR 1 (`conv16`): the activation and
//   weight lo parts are stored times 2^11 (LS = 11: exact, and they stay normal while hi is);
//   hi·hi goes into a fresh tile each k-step (16 channels x 1 tap) that is added to the running sum
//   with a round-to-nearest add; the small terms lo·hi + hi·lo go straight into one running tile
//   (2^-11 smaller: its truncation is 2^-11 below the big sum's), added as small·2^-11 at the end.
//   VAR 0 (`conv16a`, LS = 0): all 3 products into a fresh tile each k-step, then the RN add
//   (the halo kernel's scheme). Same instruction count; VAR 1 holds one more tile of registers.
//   VAR 2 (`conv16b`, LS = 0): as VAR 0 but the fresh tile spans a row of k taps (3 k-steps for
//   3x3): a third of the RN adds, three times the truncating adds into one fresh tile.
// moss_ctl_vae_conv16_*: planted: the activation lo part dropped (stored as zero).
#include "common.cuh"
#include "mma.cuh"
#include "launch.h"
#include <cuda_fp16.h>

namespace moss_vaeconv16 {

constexpr int TH = VAE_HALO_TH, TW = VAE_HALO_TW, THREADS = VAE_HALO_THREADS;
#ifndef TAP_UNROLL16
#define TAP_UNROLL16 1
#endif
constexpr int TAP_UNROLL16_N = TAP_UNROLL16;

// d = a*b + c, fp16 in, fp32 accumulate.
__device__ __forceinline__ void mma16(float (&d)[4], const uint4& a, unsigned b0, unsigned b1, const float (&c)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
// c += a*b
__device__ __forceinline__ void mma16_acc(float (&c)[4], const uint4& a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned h2u(__half2 v) { return *reinterpret_cast<unsigned*>(&v); }

// (v0, v1) -> packed fp16 hi and lo (lo times 2^LS); `bad` when a value is past the fp16 range.
template <int LS>
__device__ __forceinline__ void split2(float v0, float v1, unsigned& hi, unsigned& lo, bool& bad) {
    bad |= !(fabsf(v0) <= 65504.f) || !(fabsf(v1) <= 65504.f);
    __half2 h = __floats2half2_rn(v0, v1);
    float2 hf = __half22float2(h);
    __half2 l = __floats2half2_rn((v0 - hf.x) * (float)(1 << LS), (v1 - hf.y) * (float)(1 << LS));
    hi = h2u(h);
    lo = h2u(l);
}

// ---- weight preparation: one block (256 threads) per padded output row ----------------------
template <int BM, int KS, int LS>
__device__ void wprep16(unsigned* __restrict__ wf, float* __restrict__ rs, const float* __restrict__ w, int cout,
                        int cin) {
    constexpr int KK = KS * KS;
    __shared__ float red[THREADS / 32];
    const int o = blockIdx.x, tid = threadIdx.x;
    const long n = (long)cin * KK;
    float m = 0.f;
    if (o < cout)
        for (long i = tid; i < n; i += THREADS) m = fmaxf(m, fabsf(w[(long)o * n + i]));
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    if ((tid & 31) == 0) red[tid >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int i = 1; i < THREADS / 32; i++) m = fmaxf(m, red[i]);
    int e = 0;
    if (m > 0.f && isfinite(m)) frexpf(m, &e);  // m in [2^(e-1), 2^e)
    const int s = (m > 0.f && isfinite(m)) ? max(-100, min(100, 14 - e)) : 0;
    const float sc = ldexpf(1.f, s);
    if (tid == 0) rs[o] = ldexpf(1.f, -s);
    const int chunks = (cin + 15) / 16, mb = o / BM, r = o % BM, mt = r / 16, rr = r % 16;
    const int g = rr & 7, rh = rr >> 3;
    for (int idx = tid; idx < chunks * KK * 8; idx += THREADS) {
        const int cp = idx & 7, q = idx >> 3, tap = q % KK, ch = q / KK;
        const int t = cp & 3, kh = cp >> 2, lane = g * 4 + t, reg = rh + 2 * kh;
        const int i0 = ch * 16 + 2 * cp;
        const float v0 = (o < cout && i0 < cin) ? w[((long)o * cin + i0) * KK + tap] * sc : 0.f;
        const float v1 = (o < cout && i0 + 1 < cin) ? w[((long)o * cin + i0 + 1) * KK + tap] * sc : 0.f;
        unsigned hi, lo;
        bool bad = false;
        split2<LS>(v0, v1, hi, lo, bad);
        const long base = ((((long)mb * chunks + ch) * KK + tap) * (BM / 16) + mt) * 2;
        wf[base * 128 + lane * 4 + reg] = hi;
        wf[(base + 1) * 128 + lane * 4 + reg] = lo;
    }
}

// ---- the conv ----------------------------------------------------------------------------------
// VAR 1: big fresh tile + small running tile (LS 11); VAR 0: 3 products in a fresh tile (LS 0).
// MODE 1: as it should be; MODE 2 (planted): the activation lo parts dropped.
// bug 1: the upsample fold reads x[(Y+1)>>1, (X+1)>>1] (clamped); bug 2: output channel 5's
// weight scale not undone.
template <int VAR, int MODE, int BM, int KS>
__device__ void conv16(float* __restrict__ out, const float* __restrict__ x, const unsigned* __restrict__ wf,
                       const float* __restrict__ rs, const float* __restrict__ bias, int cin, int h, int w, int cout,
                       int up, int bug, int* __restrict__ flag) {
    constexpr int LS = VAR == 1 ? 11 : 0;
    constexpr int ST = VAR == 0 ? 1 : BM / 32;  // tiles of `sm` (VAR 1: small terms; VAR 2: the fresh tile)
    constexpr int MT = BM / 32;  // m16 tiles per warp
    constexpr int HR = TH + KS - 1, HC = TW + KS - 1, HN = HR * HC;
    constexpr int NU = 2 * HN;  // halo units: (channel half, pixel), 8 channels each
    constexpr int NB = (NU + THREADS - 1) / THREADS;
    constexpr int AST = KS * KS * (BM / 16) * 2 * 512;  // bytes of one weight stage
    constexpr int PL = HN * 16;                          // bytes of one halo plane
    constexpr int BST = 4 * PL;                          // hi/lo x channel halves
    constexpr int PAD = KS / 2;
    extern __shared__ __align__(16) unsigned char smem16[];
    unsigned char* As = smem16;
    unsigned char* Bs = smem16 + 2 * AST;
    static_assert(2 * AST + 2 * BST == VAE_CONV16_SMEM(BM, KS), "launch.h: VAE_CONV16_SMEM");

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
    const long hw = (long)h * w;
    const int chunks = (cin + 15) / 16;
    const bool ctail = (cin & 15) != 0;
    const float* xn = x + (long)ni * cin * hw;
    const unsigned char* wb = reinterpret_cast<const unsigned char*>(wf) + (long)mb * chunks * AST;

    // This thread's halo units: source offset (channel half included; -1: zero padding), the
    // shared-memory byte offset in the hi plane (-1: none), the channel half.
    long src[NB];
    int dst[NB], chh[NB];
#pragma unroll
    for (int j = 0; j < NB; j++) {
        const int u = tid + THREADS * j;
        src[j] = -1;
        dst[j] = -1;
        chh[j] = 0;
        if (u < NU) {
            const int c = u / HN, pix = u - c * HN, hy = pix / HC, hx = pix - hy * HC;
            chh[j] = c;
            dst[j] = c * PL + pix * 16;
            const int Y = ty0 + hy - PAD, X = tx0 + hx - PAD;
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
                src[j] = (long)c * 8 * hw + (long)sy * w + sx;
            }
        }
    }
    float rb[NB][8];
    auto load_b = [&](int chunk) {
        const float* xc = xn + (long)chunk * 16 * hw;
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const bool ok = src[j] >= 0 && (!ctail || chunk * 16 + chh[j] * 8 + c < cin);
                rb[j][c] = ok ? __ldg(xc + src[j] + c * hw) : 0.f;
            }
    };
    bool bad = false;
    auto store_b = [&](int buf) {
        unsigned char* b = Bs + buf * BST;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            if (dst[j] >= 0) {
                uint4 hv, lv;
                split2<LS>(rb[j][0], rb[j][1], hv.x, lv.x, bad);
                split2<LS>(rb[j][2], rb[j][3], hv.y, lv.y, bad);
                split2<LS>(rb[j][4], rb[j][5], hv.z, lv.z, bad);
                split2<LS>(rb[j][6], rb[j][7], hv.w, lv.w, bad);
                if (MODE == 2) lv = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(b + dst[j]) = hv;
                *reinterpret_cast<uint4*>(b + 2 * PL + dst[j]) = lv;
            }
        }
    };
    auto load_a = [&](int chunk, int buf) {
        const uint4* s = reinterpret_cast<const uint4*>(wb + (long)chunk * AST);
        uint4* d = reinterpret_cast<uint4*>(As + buf * AST);
#pragma unroll 4
        for (int i = tid; i < AST / 16; i += THREADS) moss_mma::cp_async16(d + i, s + i, true);
        moss_mma::cp_async_commit();
    };

    float acc[MT][4][4], sm[ST][4][4];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                acc[a][b][c] = 0.f;
                if (VAR != 0) sm[a < ST ? a : 0][b][c] = 0.f;
            }
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};
    // ldmatrix.x4 row address of this lane: matrix j = lane / 8 (channel half j & 1, pixels
    // 8·(j >> 1) .. +7 of the warp's row pair), row = lane % 8.
    const int j4 = lane >> 3, r8 = lane & 7;
    const int boff = (j4 & 1) * PL + ((wn * 2) * HC + 8 * (j4 >> 1) + r8) * 16;

    load_a(0, 0);
    load_b(0);
    for (int chunk = 0; chunk < chunks; chunk++) {
        const int buf = chunk & 1;
        store_b(buf);
        moss_mma::cp_async_wait<0>();
        __syncthreads();
        if (chunk + 1 < chunks) {
            load_a(chunk + 1, buf ^ 1);
            load_b(chunk + 1);
        }
        const unsigned char* A = As + buf * AST;
        const unsigned char* B = Bs + buf * BST;
#pragma unroll TAP_UNROLL16_N
        for (int tap = 0; tap < KS * KS; tap++) {
            const int ky = tap / KS, kx = tap % KS;
            uint4 ah[MT], al[MT];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const unsigned char* p = A + ((tap * (BM / 16) + wm * MT + mt) * 2) * 512 + lane * 16;
                ah[mt] = *reinterpret_cast<const uint4*>(p);
                al[mt] = *reinterpret_cast<const uint4*>(p + 512);
            }
            unsigned bh[4][2], bl[4][2];
#pragma unroll
            for (int pr = 0; pr < 2; pr++) {
                const unsigned char* q = B + boff + ((pr + ky) * HC + kx) * 16;
                unsigned r[4];
                moss_mma::ldsm_x4(r, q);
                bh[2 * pr][0] = r[0];
                bh[2 * pr][1] = r[1];
                bh[2 * pr + 1][0] = r[2];
                bh[2 * pr + 1][1] = r[3];
                moss_mma::ldsm_x4(r, q + 2 * PL);
                bl[2 * pr][0] = r[0];
                bl[2 * pr][1] = r[1];
                bl[2 * pr + 1][0] = r[2];
                bl[2 * pr + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    float part[4];
                    if (VAR == 2) {
                        float (&f)[4] = sm[mt < ST ? mt : 0][nt];
                        if (kx == 0)
                            mma16(f, al[mt], bh[nt][0], bh[nt][1], zero);
                        else
                            mma16_acc(f, al[mt], bh[nt][0], bh[nt][1]);
                        mma16_acc(f, ah[mt], bl[nt][0], bl[nt][1]);
                        mma16_acc(f, ah[mt], bh[nt][0], bh[nt][1]);
                        if (kx == KS - 1)
#pragma unroll
                            for (int c = 0; c < 4; c++) acc[mt][nt][c] = __fadd_rn(acc[mt][nt][c], f[c]);
                        continue;
                    }
                    if (VAR == 1) {
                        mma16_acc(sm[mt < ST ? mt : 0][nt], al[mt], bh[nt][0], bh[nt][1]);
                        mma16_acc(sm[mt < ST ? mt : 0][nt], ah[mt], bl[nt][0], bl[nt][1]);
                        mma16(part, ah[mt], bh[nt][0], bh[nt][1], zero);
                    } else {
                        mma16(part, al[mt], bh[nt][0], bh[nt][1], zero);
                        mma16(part, ah[mt], bl[nt][0], bl[nt][1], part);
                        mma16(part, ah[mt], bh[nt][0], bh[nt][1], part);
                    }
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[mt][nt][c] = __fadd_rn(acc[mt][nt][c], part[c]);
                }
        }
    }
    if (__any_sync(0xffffffffu, bad) && lane == 0) atomicOr(flag, 1);

    // Epilogue: (+ small·2^-11), · 2^-s, + bias, straight to [N, Cout, OH, OW].
    const long P = (long)oh * ow;
    float* on = out + (long)ni * cout * P;
    const bool vec2 = (ow & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int o = mb * BM + wm * 16 * MT + mt * 16 + g + 8 * hf;
            if (o >= cout) continue;
            const float bb = bias ? bias[o] : 0.f;
            const float sc = (bug == 2 && o == 5) ? 1.f : rs[o];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int Y = ty0 + wn * 2 + (nt >> 1), X = tx0 + 8 * (nt & 1) + 2 * t;
                if (Y >= oh) continue;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float a = acc[mt][nt][2 * hf + e];
                    if (VAR == 1) a = __fmaf_rn(sm[mt < ST ? mt : 0][nt][2 * hf + e], 1.f / 2048.f, a);
                    v[e] = __fadd_rn(__fmul_rn(a, sc), bb);
                }
                float* dp = on + (long)o * P + (long)Y * ow + X;
                if (vec2 && X + 1 < ow) {
                    *reinterpret_cast<float2*>(dp) = make_float2(v[0], v[1]);
                } else {
                    if (X < ow) dp[0] = v[0];
                    if (X + 1 < ow) dp[1] = v[1];
                }
            }
        }
}

}  // namespace moss_vaeconv16

#define MOSS_VAE_CONV16(sfx, bm, ks)                                                                             \
    MOSS_KERNEL void __launch_bounds__(256) moss_vae_wprep16_##sfx(unsigned* wf, float* rs, const float* w,     \
                                                                   int cout, int cin) {                          \
        moss_vaeconv16::wprep16<bm, ks, 11>(wf, rs, w, cout, cin);                                               \
    }                                                                                                            \
    MOSS_KERNEL void __launch_bounds__(moss_vaeconv16::THREADS, 1)                                               \
        moss_vae_conv16_##sfx(float* out, const float* x, const unsigned* wf, const float* rs, const float* b,   \
                              int cin, int h, int wd, int cout, int up, int* flag) {                             \
        moss_vaeconv16::conv16<1, 1, bm, ks>(out, x, wf, rs, b, cin, h, wd, cout, up, 0, flag);                  \
    }
// The planted controls: the activation lo parts dropped (`moss_ctl_vae_conv16_*`), the upsample
// fold off by one (`_fold_`, bug 1), output channel 5's weight scale not undone (`_scale_`, bug 2).
#define MOSS_VAE_CONV16_CONTROL_AS(name, mode, bug, bm, ks)                                                      \
    MOSS_KERNEL void __launch_bounds__(moss_vaeconv16::THREADS, 1)                                               \
        name(float* out, const float* x, const unsigned* wf, const float* rs, const float* b, int cin, int h,    \
             int wd, int cout, int up, int* flag) {                                                              \
        moss_vaeconv16::conv16<1, mode, bm, ks>(out, x, wf, rs, b, cin, h, wd, cout, up, bug, flag);             \
    }
#define MOSS_VAE_CONV16_CONTROL(sfx, bm, ks)                                                                     \
    MOSS_VAE_CONV16_CONTROL_AS(moss_ctl_vae_conv16_##sfx, 2, 0, bm, ks)                                          \
    MOSS_VAE_CONV16_CONTROL_AS(moss_ctl_vae_conv16_fold_##sfx, 1, 1, bm, ks)                                     \
    MOSS_VAE_CONV16_CONTROL_AS(moss_ctl_vae_conv16_scale_##sfx, 1, 2, bm, ks)
MOSS_PRODUCTION(MOSS_VAE_CONV16(b128_k3, 128, 3))
MOSS_CONTROL(MOSS_VAE_CONV16_CONTROL(b128_k3, 128, 3))
MOSS_PRODUCTION(MOSS_VAE_CONV16(b96_k3, 96, 3))
MOSS_CONTROL(MOSS_VAE_CONV16_CONTROL(b96_k3, 96, 3))
MOSS_PRODUCTION(MOSS_VAE_CONV16(b128_k1, 128, 1))
MOSS_CONTROL(MOSS_VAE_CONV16_CONTROL(b128_k1, 128, 1))
MOSS_PRODUCTION(MOSS_VAE_CONV16(b96_k1, 96, 1))
MOSS_CONTROL(MOSS_VAE_CONV16_CONTROL(b96_k1, 96, 1))
