// The encoder's causal GQA attention, head dim 256, on Hopper warpgroup tensor cores (sm_90a only;
// EncoderOps::causal_attention / causal_attention_gated at bf16, L > 256: what Hopper runs; other
// GPUs and MOSS_KERNELS=portable take the mma.sync kernel; host side crates/moss-cuda/src/encoder/mod.rs
// `causal_attention_with`). Measured on the H200 at L = 4096, 16 / 4 heads: 0.328 ms (419 TFLOP/s)
// vs 0.954 ms for the mma.sync kernel, torch SDPA 0.289 ms. Same contract and arguments as cuda/encoder/causal_flash_attention.cu
// (moss_enc_fattn_*): q [L, H, 256], k and v [L, Hkv, 256], out [L, H, 256]; query head h reads
// KV head h / (H / Hkv); fp32 scores and softmax statistics, P rounded to bf16 for P V.
//
// Launch: grid (H, ceil(L/128)) -- the query-row blocks heaviest first and the H heads of one row
// block next to each other (the heads of one KV group share K/V tiles in L2) --, 256 threads (two
// warpgroups of 64 query rows), SMEM_BYTES dynamic shared memory. Keys in steps of 64, only up to
// the block's last row; a warpgroup skips a step wholly above its rows and masks per element where
// the step crosses its diagonal. S = Q Kᵀ: m64n64k16 (Q and K from shared memory, K-major);
// O += P V: two m64n128k16 per 16 keys (P the register operand, V N-major). Tiles are stored as
// column chunks of [rows][64] bf16 (128-byte rows, 16-byte chunk index XOR (row & 7)): the wgmma
// 128-byte swizzle. Q 64 KiB + double-buffered K and V tiles (32 KiB each) = 192 KiB.
// BUG 1 (moss_ctl_enc_fattn_wg_bf16): key t + 1 leaks into query t. GATED: out = bf16(bf16(o) ·
// bf16(σ(gate))) as the mma.sync kernel; BUG 2: the gate read at the KV head.
#include "sm90a/wgmma_attention.cuh"
#include "../launch.h"

namespace moss_cwg {
using namespace moss_wg;
constexpr int D = ENC_FLASH_HD;
constexpr int BM = ENC_FLASH_WG_ROWS;
constexpr int BN = 64;
constexpr int THREADS = ENC_FLASH_WG_THREADS;
constexpr int QCH = BM * 128;                 // bytes of one 64-column chunk of the Q tile
constexpr int KCH = BN * 128;                 // of a K or V tile
constexpr int QT = 4 * QCH;                   // 64 KiB
constexpr int KT = 4 * KCH;                   // 32 KiB
constexpr int SMEM_BYTES = QT + 4 * KT + 1024;  // + slack to align the base to 1024
static_assert(SMEM_BYTES == ENC_FLASH_WG_SMEM, "the host launches with ENC_FLASH_WG_SMEM (launch.h)");

// d (m64n64 fp32, 32 per thread) = A B (+ d), both from shared memory, K-major.
__device__ __forceinline__ void wgmma_ss64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}

// rows row0 .. row0 + R - 1 (zero past n) of the 256 columns at col of a [n, ld] matrix into the
// chunked, swizzled tile at s (chunk stride R·128). Thread tid copies 16-byte chunk tid & 31 of
// rows (tid >> 5) + 8 i: a warp reads one 512-byte row.
template <int R>
__device__ __forceinline__ void load_rows(uint32_t s, const __nv_bfloat16* g, long ld, int row0, int n, long col, int tid) {
    const int r0 = tid >> 5, c = tid & 31;
    const uint32_t dst = s + (c >> 3) * (R * 128) + r0 * 128 + (((c & 7) ^ r0) << 4);
    const __nv_bfloat16* src = g + (long)(row0 + r0) * ld + col + c * 8;
#pragma unroll
    for (int i = 0; i < R / 8; i++) {
        const bool ok = row0 + r0 + 8 * i < n;
        cp16(dst + i * 1024, ok ? src + (long)(8 * i) * ld : g, ok);
    }
}

// Normalise, stage and store a warpgroup's 64 output rows. (An overlap variant, attn2 at commit
// 0a6bc6a -- step j's softmax during step j-1's P V -- measured 0.375 vs 0.332 ms at L = 4096 on
// the H200, bit-identical output: removed.)
template <int BUG, bool GATED>
__device__ __forceinline__ void epilogue(const float (&acc0)[64], const float (&acc1)[64], const float (&l)[2],
                                         __nv_bfloat16* __restrict__ o, int n, int H,
                                         const __nv_bfloat16* __restrict__ gate, long ldg, long gh, char* sbase, int wg,
                                         int wtid, int lane, int h, int kvh, int wrow0) {
    // Normalise, stage this warpgroup's 64 x 256 bf16 rows (512-byte rows, 16-byte chunks XOR
    // (row & 7)) in the Q tile, then 16-byte stores (with the gate, 16-byte gate loads).
    char* st = sbase + wg * (64 * 512);
    const int g = lane >> 2, t = lane & 3;
    const int wr = (wtid >> 5) * 16 + g;
    const long ldq = (long)H * D, qcol = (long)h * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float inv = moss_flash::row_inv(l, r);
        const int row = wr + 8 * r;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            *reinterpret_cast<uint32_t*>(st + row * 512 + ((i ^ (row & 7)) << 4) + 4 * t) =
                pack_bf16(acc0[4 * i + 2 * r] * inv, acc0[4 * i + 2 * r + 1] * inv);
            *reinterpret_cast<uint32_t*>(st + row * 512 + (((16 + i) ^ (row & 7)) << 4) + 4 * t) =
                pack_bf16(acc1[4 * i + 2 * r] * inv, acc1[4 * i + 2 * r + 1] * inv);
        }
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
#pragma unroll 4
    for (int i = 0; i < 16; i++) {
        const int idx = wtid + 128 * i, r = idx >> 5, c = idx & 31;
        const int row = wrow0 + r;
        if (row < n) {
            uint4 val = *reinterpret_cast<const uint4*>(st + r * 512 + ((c ^ (r & 7)) << 4));
            if constexpr (GATED) {
                const uint4 gv = *reinterpret_cast<const uint4*>(gate + (long)row * ldg + (long)(BUG == 2 ? kvh : h) * gh + c * 8);
                const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&val);
                const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
                uint4 res;
                __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&res);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 ov = __bfloat1622float2(o2[e]);
                    const float2 gg = __bfloat1622float2(g2[e]);
                    const float2 sg = __bfloat1622float2(
                        __floats2bfloat162_rn(1.0f / (1.0f + expf(-gg.x)), 1.0f / (1.0f + expf(-gg.y))));
                    r2[e] = __floats2bfloat162_rn(ov.x * sg.x, ov.y * sg.y);
                }
                val = res;
            }
            *reinterpret_cast<uint4*>(o + (long)row * ldq + qcol + c * 8) = val;
        }
    }
}

template <int BUG, bool GATED>
__device__ __forceinline__ void attn(__nv_bfloat16* __restrict__ o, const __nv_bfloat16* __restrict__ q,
                                     const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v, int n,
                                     int H, int Hkv, float sl2, const __nv_bfloat16* __restrict__ gate, long ldg,
                                     long gh) {
    extern __shared__ char smem_raw[];
    const uint32_t raw = saddr(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;
    const uint32_t sq = base, sk = base + QT, sv = base + QT + 2 * KT;
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, lane = tid & 31;
    const int h = blockIdx.x, kvh = h / (H / Hkv);
    const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;  // heaviest blocks first
    const long ldq = (long)H * D, ldk = (long)Hkv * D;
    const long qcol = (long)h * D, kcol = (long)kvh * D;
    const int kend = min(n, m0 + BM);
    const int ntiles = (kend + BN - 1) / BN;
    const int wrow0 = m0 + wg * 64;                          // this warpgroup's first row
    const int g = lane >> 2, t = lane & 3;
    const int row_a = wrow0 + (wtid >> 5) * 16 + g;          // this thread's rows: row_a, row_a + 8

    load_rows<BM>(sq, q, ldq, m0, n, qcol, tid);
    load_rows<BN>(sk, k, ldk, 0, n, kcol, tid);
    load_rows<BN>(sv, v, ldk, 0, n, kcol, tid);
    cp_commit();

    float acc0[64], acc1[64], s[32];
    uint32_t p[16];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 64; i++) acc0[i] = acc1[i] = 0.f;
    const uint32_t sqw = sq + wg * 64 * 128;  // this warpgroup's rows inside each Q chunk

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1;
        if (j + 1 < ntiles) {
            load_rows<BN>(sk + (buf ^ 1) * KT, k, ldk, (j + 1) * BN, n, kcol, tid);
            load_rows<BN>(sv + (buf ^ 1) * KT, v, ldk, (j + 1) * BN, n, kcol, tid);
        }
        cp_commit();
        cp_wait<1>();
        fence_proxy_async();
        __syncthreads();
        const int key0 = j * BN;
        if (key0 <= wrow0 + 63 + BUG) {  // warpgroup-uniform: some key of the step is visible
            const uint32_t kb = sk + buf * KT, vb = sv + buf * KT;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint32_t off = (kk & 3) * 32;
                wgmma_ss64(s, desc(sqw + (kk >> 2) * QCH + off, 16, 1024), desc(kb + (kk >> 2) * KCH + off, 16, 1024),
                           kk > 0);
            }
            wg_commit();
            wg_wait<0>();
            pin_all(s);
            // s[4i + 2r + e]: row row_a + 8r, key key0 + 8i + 2t + e
            if (key0 + BN - 1 > wrow0 + BUG) {
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (key0 + 8 * i + 2 * t + (e & 1) > row_a + 8 * (e >> 1) + BUG) s[4 * i + e] = -INFINITY;
            }
            float corr[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int i = 0; i < 8; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                const float mnew = fmaxf(m[r], mx * sl2);
                // a row with no visible key yet keeps m = -inf (only rows past n): no update
                corr[r] = mnew == -INFINITY ? 1.f : ex2(m[r] - mnew);
                const float msub = mnew == -INFINITY ? 0.f : mnew;
                m[r] = mnew;
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float p0 = ex2(fmaf(s[4 * i + 2 * r], sl2, -msub));
                    const float p1 = ex2(fmaf(s[4 * i + 2 * r + 1], sl2, -msub));
                    s[4 * i + 2 * r] = p0;
                    s[4 * i + 2 * r + 1] = p1;
                    sum += p0 + p1;
                }
                l[r] = l[r] * corr[r] + sum;
            }
#pragma unroll
            for (int i = 0; i < 16; i++) {
                acc0[4 * i] *= corr[0];
                acc0[4 * i + 1] *= corr[0];
                acc0[4 * i + 2] *= corr[1];
                acc0[4 * i + 3] *= corr[1];
                acc1[4 * i] *= corr[0];
                acc1[4 * i + 1] *= corr[0];
                acc1[4 * i + 2] *= corr[1];
                acc1[4 * i + 3] *= corr[1];
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                p[4 * kk] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
                p[4 * kk + 1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
                p[4 * kk + 2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
                p[4 * kk + 3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
            }
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
                wgmma_rs_nmajor(acc0, a, desc(vb + kk * 2048, KCH, 1024));
                wgmma_rs_nmajor(acc1, a, desc(vb + 2 * KCH + kk * 2048, KCH, 1024));
            }
            wg_commit();
            wg_wait<0>();
            pin_all(acc0);
            pin_all(acc1);
            pin_all(p);
        }
        __syncthreads();  // buffer buf is free for step j + 2's copies
    }

    epilogue<BUG, GATED>(acc0, acc1, l, o, n, H, gate, ldg, gh, smem_raw + (base - raw), wg, wtid, lane, h, kvh, wrow0);
}


}  // namespace moss_cwg

#define MOSS_CWG_KERNEL(NAME, FN, BUG, GATED)                                                                           \
    MOSS_KERNEL void __launch_bounds__(moss_cwg::THREADS, 1)                                                        \
        NAME(__nv_bfloat16* o, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int n, int H, \
             int Hkv, float scale_log2) {                                                                           \
        moss_cwg::FN<BUG, GATED>(o, q, k, v, n, H, Hkv, scale_log2, nullptr, 0, 0);                               \
    }
#define MOSS_CWG_KERNEL_GATED(NAME, FN, BUG)                                                                            \
    MOSS_KERNEL void __launch_bounds__(moss_cwg::THREADS, 1)                                                        \
        NAME(__nv_bfloat16* o, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int n, int H, \
             int Hkv, float scale_log2, const __nv_bfloat16* gate, long ldg, long gh) {                              \
        moss_cwg::FN<BUG, true>(o, q, k, v, n, H, Hkv, scale_log2, gate, ldg, gh);                                \
    }
MOSS_PRODUCTION(MOSS_CWG_KERNEL(moss_enc_fattn_wg_bf16, attn, 0, false))
MOSS_CONTROL(MOSS_CWG_KERNEL(moss_ctl_enc_fattn_wg_bf16, attn, 1, false))
