// The operands of the DiT's e4m3 attention (`--precision fp8` on Hopper:
// cuda/dit/sm90a/flash_attention_ws.cu's moss_dit_flash_attention_fp8 reads them), made from the packed
// [n, 3·D] bf16 projection [q | k | v] as qkv_norm_rope leaves it (D = heads·128, row stride 3·D).
// The arithmetic is src/backend/cpu/attention_fp8.rs's, bit for bit:
// - q8, k8 [n, D]: the codes of q and k over one fixed scale each, s = e4m3_scale(√128 · max|w|)
//   of the QK-norm weight w (src/fp8.rs): an RMS-normed head vector times w has no element beyond
//   √128 · max|w|, nor has it after RoPE turns its pairs, so no code saturates and no amax pass
//   over the tokens is needed.
// - vt8 [D, 128·tiles]: V transposed (row 128h + d: head h's channel d over the tokens), codes over
//   one scale a (head, 128-token tile), e4m3_scale(the tile's amax); tokens
//   past n are 0. The scales go to scales[0] (q), scales[1] (k) and scales[2 + h·tiles + tile] (v).
//   Within each group of 32 tokens they are stored in the order of the e4m3 wgmma's
//   register A operand (P): position 16a + 4b + c holds token 16a + 8(c >> 1) + 2b + (c & 1).
// One block a (tile, head), DIT_ATTN_FP8_OPERANDS_THREADS threads; sqrt_hd is the host's f32 √128.
// BUG 1 (planted control): codes toward zero.
#include "../common/fp8.cuh"
#include "launch.h"

using bf16 = __nv_bfloat16;
using namespace moss_elem;
using namespace moss_fp8;

namespace moss_attn_fp8 {
constexpr int T = DIT_ATTN_FP8_TILE, HD = DIT_FLASH_HEAD_DIM, THREADS = DIT_ATTN_FP8_OPERANDS_THREADS;
constexpr int LDS = HD + 8;  // bf16 a row of the V tile in shared memory (16-byte rows, no bank conflicts)
static_assert(T % 32 == 0 && HD % 32 == 0 && THREADS % 32 == 0 && (HD * T / 32) % THREADS == 0, "the V^T pass's items");

// The token at position p (0..31) of a 32-token group of vt8.
__device__ __forceinline__ int vt_token(int p) { return (p & 16) + ((p & 2) << 2) + (((p >> 2) & 3) << 1) + (p & 1); }

// max|w| over the 128 weights, in every lane of the warp.
template <typename TV>
__device__ __forceinline__ float max_abs(const TV* w, int lane) {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < HD / 32; j++) m = fmaxf(m, fabsf(ld(w, lane + 32 * j)));
    return warp_max(m);
}

template <typename TV, int BUG>
__device__ void operands(unsigned char* __restrict__ q8, unsigned char* __restrict__ k8, unsigned char* __restrict__ vt8,
                         float* __restrict__ scales, const bf16* __restrict__ qkv, const TV* __restrict__ wq,
                         const TV* __restrict__ wk, int n, float sqrt_hd, float e4m3_max, float min_amax) {
    __shared__ __align__(16) bf16 vtile[T * LDS];
    __shared__ float part[THREADS / 32];
    const int tile = blockIdx.x, h = blockIdx.y, heads = gridDim.y, tiles = gridDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long d_all = (long)heads * HD, ld = 3 * d_all;
    const float sq = e4m3_scale(sqrt_hd * max_abs(wq, lane), e4m3_max, min_amax);
    const float sk = e4m3_scale(sqrt_hd * max_abs(wk, lane), e4m3_max, min_amax);

    // q and k: 8 values a thread and step, straight through; v into shared memory, with its amax
    float amax = 0.f;
    for (int i = tid; i < T * HD / 8; i += THREADS) {
        const int r = i / (HD / 8), c8 = (i % (HD / 8)) * 8, tok = tile * T + r;
        uint4 vraw = make_uint4(0, 0, 0, 0);
        if (tok < n) {
            const bf16* row = qkv + tok * ld + (long)h * HD + c8;
            float v[8];
            ld8(row, 0, v);
            st8_e4m3<BUG>(q8 + tok * d_all + (long)h * HD + c8, v, sq);
            ld8(row + d_all, 0, v);
            st8_e4m3<BUG>(k8 + tok * d_all + (long)h * HD + c8, v, sk);
            vraw = *reinterpret_cast<const uint4*>(row + 2 * d_all);
            ld8(row + 2 * d_all, 0, v);
#pragma unroll
            for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
        }
        *reinterpret_cast<uint4*>(vtile + r * LDS + c8) = vraw;
    }
    amax = warp_max(amax);
    if (lane == 0) part[warp] = amax;
    __syncthreads();
    amax = 0.f;
#pragma unroll
    for (int w = 0; w < THREADS / 32; w++) amax = fmaxf(amax, part[w]);
    const float s = e4m3_scale(amax, e4m3_max, min_amax);
    if (tid == 0) {
        scales[2 + (long)h * tiles + tile] = s;
        if (tile == 0 && h == 0) {
            scales[0] = sq;
            scales[1] = sk;
        }
    }

    // V^T: an item is (channel d, 32-token group g): 32 codes, two 16-byte stores; a warp's lanes
    // take 32 consecutive channels (shared-memory reads of one row, no conflicts)
    const long npad = (long)tiles * T;
    for (int item = tid; item < HD * T / 32; item += THREADS) {
        const int d = item % HD, g = item / HD;
        uint4 out[2];
        unsigned char* b = reinterpret_cast<unsigned char*>(out);
#pragma unroll
        for (int p = 0; p < 32; p++) b[p] = to_e4m3<BUG>(__fdiv_rn(__bfloat162float(vtile[(32 * g + vt_token(p)) * LDS + d]), s));
        uint4* dst = reinterpret_cast<uint4*>(vt8 + ((long)h * HD + d) * npad + (long)tile * T + 32 * g);
        dst[0] = out[0];
        dst[1] = out[1];
    }
}
}  // namespace moss_attn_fp8

#define MOSS_ATTN_FP8_OPERANDS(NAME, BUG, TV, SV)                                                                     \
    MOSS_KERNEL void __launch_bounds__(DIT_ATTN_FP8_OPERANDS_THREADS)                                                \
        NAME##_##SV(unsigned char* q8, unsigned char* k8, unsigned char* vt8, float* scales, const bf16* qkv, const TV* wq, \
                    const TV* wk, int n, float sqrt_hd, float e4m3_max, float min_amax) {                            \
        moss_attn_fp8::operands<TV, BUG>(q8, k8, vt8, scales, qkv, wq, wk, n, sqrt_hd, e4m3_max, min_amax);             \
    }
MOSS_PRODUCTION(MOSS_ATTN_FP8_OPERANDS(moss_dit_attention_fp8_operands, 0, bf16, bf16))
MOSS_PRODUCTION(MOSS_ATTN_FP8_OPERANDS(moss_dit_attention_fp8_operands, 0, float, f32))
MOSS_CONTROL(MOSS_ATTN_FP8_OPERANDS(moss_ctl_attention_fp8_operands_rz, 1, bf16, bf16))
MOSS_CONTROL(MOSS_ATTN_FP8_OPERANDS(moss_ctl_attention_fp8_operands_rz, 1, float, f32))
