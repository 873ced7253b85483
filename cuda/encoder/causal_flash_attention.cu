// The encoder's causal GQA attention for head dim 256 (EncoderOps::causal_attention, bf16, long
// prompts; host side crates/moss-cuda/src/encoder/mod.rs `causal_attention_with`): flash style (online
// softmax in fp32, no L x L matrix), tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate), P
// rounded to bf16 for P V as the DiT kernel (cuda/dit/flash_attention.cu) does.
//
// q [L, H, 256], k and v [L, Hkv, 256] (row strides H·256 / Hkv·256), out [L, H, 256]; query head
// h reads KV head h / (H / Hkv). Grid (ceil(L/64), H), 128 threads (4 warps x 16 query rows),
// 32 keys per step, keys only up to the block's last query (the diagonal tiles masked per element).
// Blocks run heaviest first (the last query rows). Shared memory: the Q tile [64][256] and
// double-buffered K, V tiles [32][256], bf16, 16-byte chunks XOR-swizzled by (row & 7): 96 KiB.
// BUG 1 (moss_ctl_enc_fattn_*): key t + 1 leaks into query t (the mask is off by one).
// GATED (no kernel now: the fused-gate build was measured slower and deleted): the model's sigmoid output gate in
// the epilogue, out = bf16(bf16(o) · bf16(σ(gate))) with the unfused ops' rounding points; gate
// element (t, h, c) at gate[t·ldg + h·gh + c] (the q_proj output in place: ldg = H·512, gh = 512).
// (BUG 2 was its control: the gate read at the KV head's column instead of h.)
#include "flash_mma.cuh"
#include "launch.h"

namespace moss_fattn {
using namespace moss_mma;
constexpr int D = ENC_FLASH_HD;
constexpr int BM = ENC_FLASH_ROWS;
constexpr int BN = 32;
constexpr int THREADS = ENC_FLASH_THREADS;
constexpr int ROW_BYTES = D * 2;  // 512
constexpr int Q_BYTES = BM * ROW_BYTES;
constexpr int KV_BYTES = BN * ROW_BYTES;
constexpr int SMEM_BYTES = Q_BYTES + 4 * KV_BYTES;
static_assert(SMEM_BYTES == ENC_FLASH_SMEM, "the host launches with ENC_FLASH_SMEM (launch.h)");

__device__ __forceinline__ int swz(int row, int chunk) { return moss_flash::swz<D>(row, chunk); }

// rows row0..row0+R-1 (zero past n) of the 256 columns at col of a [n, ld] bf16 matrix
template <int R>
__device__ __forceinline__ void load_rows(char* sm, const __nv_bfloat16* g, long ld, int row0, int n, long col) {
#pragma unroll
    for (int i = threadIdx.x; i < R * (D / 8); i += THREADS) {
        int r = i / (D / 8), c = i % (D / 8);
        int gr = row0 + r;
        bool ok = gr < n;
        const __nv_bfloat16* src = g + (ok ? (long)gr * ld : 0) + col + c * 8;
        cp_async16(sm + swz(r, c), src, ok);
    }
}

template <int BUG, bool GATED>
__device__ __forceinline__ void fattn(__nv_bfloat16* __restrict__ o, const __nv_bfloat16* __restrict__ q,
                                      const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                      int n, int H, int Hkv, float scale_log2,
                                      const __nv_bfloat16* __restrict__ gate, long ldg, long gh) {
    extern __shared__ __align__(128) char smem[];
    char* sq = smem;
    char* sk = smem + Q_BYTES;
    char* sv = sk + 2 * KV_BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, kvh = h / (H / Hkv);
    const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // heaviest blocks first
    const long ldq = (long)H * D, ldk = (long)Hkv * D;
    const long qcol = (long)h * D, kcol = (long)kvh * D;
    // keys 0 .. min(n, m0 + BM) - 1 can be seen by this block
    const int kend = min(n, m0 + BM);
    const int ntiles = (kend + BN - 1) / BN;

    load_rows<BM>(sq, q, ldq, m0, n, qcol);
    load_rows<BN>(sk, k, ldk, 0, n, kcol);
    load_rows<BN>(sv, v, ldk, 0, n, kcol);
    cp_async_commit();

    float acc[32][4];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int qrow0 = m0 + warp * 16 + (lane >> 2);  // this thread's rows: qrow0, qrow0 + 8

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1;
        if (j + 1 < ntiles) {
            load_rows<BN>(sk + (buf ^ 1) * KV_BYTES, k, ldk, (j + 1) * BN, n, kcol);
            load_rows<BN>(sv + (buf ^ 1) * KV_BYTES, v, ldk, (j + 1) * BN, n, kcol);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        moss_flash::tile_step<D, BN, true, true>(
            acc, mrow, lrow, sk + buf * KV_BYTES, sv + buf * KV_BYTES, scale_log2,
            [&](int kk, unsigned(&a)[4]) { ldsm_x4(a, sq + swz(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))); },
            [&](float(&s)[BN / 8][4]) {
                // causal mask (and keys past n) where the tile reaches past this warp's first row
                const int key0 = j * BN;
                if (key0 + BN - 1 > m0 + warp * 16 || key0 + BN > n) {
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                            int row = qrow0 + 8 * (e >> 1);
                            if (key > row + BUG || key >= n) s[nt][e] = -INFINITY;
                        }
                }
            });
        __syncthreads();
    }
    // normalise and store
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float inv = moss_flash::row_inv(lrow, r);
        const int row = qrow0 + r * 8;
        if (row < n) {
            __nv_bfloat16* dst = o + (long)row * ldq + qcol + (lane & 3) * 2;
            if constexpr (GATED) {
                const __nv_bfloat16* gp = gate + (long)row * ldg + (long)(BUG == 2 ? kvh : h) * gh + (lane & 3) * 2;
#pragma unroll
                for (int dt = 0; dt < 32; dt++) {
                    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gp + dt * 8));
                    const float2 ov = __bfloat1622float2(__floats2bfloat162_rn(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv));
                    const float2 sg = __bfloat1622float2(
                        __floats2bfloat162_rn(1.0f / (1.0f + expf(-g.x)), 1.0f / (1.0f + expf(-g.y))));
                    *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) = __floats2bfloat162_rn(ov.x * sg.x, ov.y * sg.y);
                }
            } else {
                moss_flash::store_row<D>(dst, acc, r, inv);
            }
        }
    }
}
}  // namespace moss_fattn

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(ENC_FLASH_THREADS) moss_enc_fattn_bf16(__nv_bfloat16* o, const __nv_bfloat16* q,
                                                            const __nv_bfloat16* k, const __nv_bfloat16* v, int n,
                                                            int H, int Hkv, float scale_log2) {
    moss_fattn::fattn<0, false>(o, q, k, v, n, H, Hkv, scale_log2, nullptr, 0, 0);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(ENC_FLASH_THREADS) moss_ctl_enc_fattn_bf16(__nv_bfloat16* o, const __nv_bfloat16* q,
                                                                const __nv_bfloat16* k, const __nv_bfloat16* v, int n,
                                                                int H, int Hkv, float scale_log2) {
    moss_fattn::fattn<1, false>(o, q, k, v, n, H, Hkv, scale_log2, nullptr, 0, 0);
}
#endif
