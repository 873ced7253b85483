// The DiT's o and ffn_down products with the gated residual on the way out, on Hopper (sm_90a
// only): out = x + gate ⊙ bf16(a · Wᵀ) for a [M, K] bf16, W [D, K] bf16, x [M, D] bf16 (the
// stream), gate [D] bf16, out [M, D] bf16: what moss_gres (dit_ops.cu) does to the product
// cuBLASLt stores, without the product's round trip through memory. The product is rounded to
// bf16 in registers exactly as the unfused path stores it; x + y·gate runs in fp32 and rounds
// once, as moss_gres does.
//
// The GEMM is sm90a/gemm_tile.cuh's; a tile's 256 product columns are W rows 2·n0 .. 2·n0 + 255.
// Each half of 128 columns is staged (rows of 128 bf16, 16-byte chunks XOR-swizzled by row) in
// the 128 x 128 staging the SiTU kernel uses; the coalesced store pass reads 8 staged products,
// 8 x values and 8 gate values a thread and writes 8 outputs (16 bytes each).
//
// Arguments: CUtensorMaps of a ({K, M}) and W ({K, D}) (bf16, box {64, 128}, SWIZZLE_128B), out,
// x (row stride D; bf16, or f32 in the `_f32` kernels: the f32 residual stream), gate, M, D, K.
// Launch: 1-D grid of min(SMs, ⌈M/128⌉ · D/256) blocks, DIT_SITU_GEMM_THREADS threads,
// DIT_SITU_GEMM_SMEM bytes of dynamic shared memory. Requires D % 256 == 0, K % 64 == 0 (the host
// checks). BUG 1 (check image): the gate of the column 8 to the right (the gate read misaligned).
#include "sm90a/gemm_tile.cuh"
#include "../launch.h"

namespace moss_glr {
using namespace moss_gemm;
static_assert(moss_gemm::SMEM == DIT_SITU_GEMM_SMEM && moss_gemm::THREADS == DIT_SITU_GEMM_THREADS, "the host's launch (launch.h)");
static_assert(DIT_QKV_GEMM_COLS == 256, "the host's column tiles: D / DIT_QKV_GEMM_COLS");

// Column tile n0 / 128: W rows 2·n0 .. 2·n0 + 255.
struct WideTiles {
    __device__ __forceinline__ int w_row0(int n0) const { return 2 * n0; }
    __device__ __forceinline__ int w_row1(int n0) const { return 2 * n0 + 128; }
};

__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 p = __bfloat1622float2(h[j]);
        f[2 * j] = p.x;
        f[2 * j + 1] = p.y;
    }
}

// 8 stream values (bf16: 16 bytes; f32, the bf16 forward's f32 stream: 32 bytes) as floats, and back.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* f) { unpack8(*reinterpret_cast<const uint4*>(p), f); }
__device__ __forceinline__ void load8(const float* p, float* f) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float* o) {
    uint4 v;
    v.x = pack_bf16(o[0], o[1]);
    v.y = pack_bf16(o[2], o[3]);
    v.z = pack_bf16(o[4], o[5]);
    v.w = pack_bf16(o[6], o[7]);
    *reinterpret_cast<uint4*>(p) = v;
}
__device__ __forceinline__ void store8(float* p, const float* o) {
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(o[4], o[5], o[6], o[7]);
}
template <int BUG, typename TX>
struct GatedResidualEpilogue {
    TX* __restrict__ out;
    const TX* __restrict__ x;
    const __nv_bfloat16* __restrict__ gate;
    int m, d;
    __device__ __forceinline__ void operator()(float (&acc)[128], int m0, int n0, int c, char* wg_rows) {
        const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
        const int g = lane >> 2, t = lane & 3, warp = wtid >> 5;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            named_sync128(1 + c);  // the previous stores have read the staging rows
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = 16 * warp + g + 8 * r;
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const float lo = acc[64 * h + 4 * i + 2 * r], hi = acc[64 * h + 4 * i + 2 * r + 1];
                    *reinterpret_cast<uint32_t*>(wg_rows + row * 256 + ((i ^ (row & 7)) << 4) + 4 * t) = pack_bf16(lo, hi);
                }
            }
            named_sync128(1 + c);
            const int col0 = 2 * n0 + 128 * h;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int idx = wtid + 128 * j, rr = idx >> 4, ch = idx & 15;
                const int row = m0 + 64 * c + rr, col = col0 + ch * 8;
                if (row < m) {
                    float y[8], xv[8], gv[8], o[8];
                    unpack8(*reinterpret_cast<const uint4*>(wg_rows + rr * 256 + ((ch ^ (rr & 7)) << 4)), y);
                    load8(x + (long)row * d + col, xv);
                    unpack8(*reinterpret_cast<const uint4*>(gate + (BUG == 1 ? (col + 8) % d : col)), gv);
#pragma unroll
                    for (int q = 0; q < 8; q++) o[q] = xv[q] + y[q] * gv[q];
                    store8(out + (long)row * d + col, o);
                }
            }
        }
    }
};

template <int BUG, typename TX>
__device__ __forceinline__ void linear_gres(const TmaMap* ta, const TmaMap* tw, TX* __restrict__ out, const TX* x,
                                            const __nv_bfloat16* gate, int m, int d, int k) {
    GatedResidualEpilogue<BUG, TX> epi{out, x, gate, m, d};
    gemm_tiles<false>(ta, tw, m, d / 256, k, WideTiles{}, epi);
}
}  // namespace moss_glr

// TX: the stream's type (bf16, or f32: the kernels named `_f32`).
#define MOSS_GLR_KERNEL(NAME, BUG, TX)                                                                    \
    MOSS_KERNEL void __launch_bounds__(moss_gemm::THREADS, 1)                                            \
        NAME(const __grid_constant__ moss_tma::TmaMap ta, const __grid_constant__ moss_tma::TmaMap tw,    \
             TX* out, const TX* x, const __nv_bfloat16* gate, int m, int d, int k) {                    \
        moss_glr::linear_gres<BUG, TX>(&ta, &tw, out, x, gate, m, d, k);                                  \
    }

MOSS_PRODUCTION(MOSS_GLR_KERNEL(moss_dit_linear_gated_residual, 0, __nv_bfloat16))
MOSS_PRODUCTION(MOSS_GLR_KERNEL(moss_dit_linear_gated_residual_f32, 0, float))
MOSS_CONTROL(MOSS_GLR_KERNEL(moss_dit_linear_gated_residual_gate_shift_control, 1, __nv_bfloat16))
MOSS_CONTROL(MOSS_GLR_KERNEL(moss_dit_linear_gated_residual_f32_gate_shift_control, 1, float))
