// The LoRA merge on the device (crates/moss-cuda/src/lora.rs; host twin crates/moss-core/src/lora/merge.rs): one
// update ("term") of one weight per launch. The delta's rows are computed in fp32 with exactly
// the host's operations: each product and each sum rounded (__fmul_rn / __fadd_rn, never a fused
// multiply-add), the rank summed in order k = 0, 1, ...; then `· alpha/rank` (when not 1) and
// `· scale`, added to the tensor's running sum, which starts at zero. The last term adds the sum
// to the weight and rounds once into its storage type. So the bytes equal the host merge's.
//
// mode: bit 0 = add to the running sum in `acc` (else start from zero); bit 1 = the last term:
// write W = round(W + sum) (else write the sum to `acc`).
// moss_ctl_* (check image): BUG 1 rounds the update to bf16 before adding it (two roundings).
// tools/lora_merge_emu.cpp compiles this file on the host (LORA_EMU) to check its index math.
#ifndef LORA_EMU
#include "elem.cuh"
#endif

using bf16 = __nv_bfloat16;
using namespace moss_elem;

template <typename TW, int BUG>
__device__ __forceinline__ void lora_finish(float d, float fs, float scale, int mode, float* __restrict__ acc,
                                            TW* __restrict__ w, long idx) {
    if (fs != 1.0f) d = __fmul_rn(d, fs);
    float s = __fadd_rn((mode & 1) ? acc[idx] : 0.0f, __fmul_rn(scale, d));
    if (mode & 2) {
        if (BUG == 1) s = __bfloat162float(__float2bfloat16_rn(s));
        st(w, idx, __fadd_rn(ld(w, idx), s));
    } else {
        acc[idx] = s;
    }
}

// ---- low rank: up [rows, r] · down [r, cols]; LoHa: (up · down) ⊙ (up2 [rows, r2] · down2) -----
// A 64 x 64 tile of the weight per block of 256 threads, each thread 4 rows x 4 columns; the rank
// through shared memory in chunks of 16.
constexpr int LORA_TILE = 64;
constexpr int LORA_KC = 16;
constexpr int LORA_PAD = LORA_TILE + 4;

__device__ __forceinline__ void lora_product(float (&o)[4][4], const float* __restrict__ up,
                                             const float* __restrict__ down, long rows, long cols, int r,
                                             long i0, long j0, float (*su)[LORA_PAD], float (*sd)[LORA_PAD]) {
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) o[a][b] = 0.0f;
    for (int k0 = 0; k0 < r; k0 += LORA_KC) {
        for (int e = threadIdx.x; e < LORA_TILE * LORA_KC; e += blockDim.x) {
            int row = e / LORA_KC, k = e % LORA_KC;
            long gi = i0 + row;
            su[k][row] = (gi < rows && k0 + k < r) ? up[gi * r + k0 + k] : 0.0f;
        }
        for (int e = threadIdx.x; e < LORA_TILE * LORA_KC; e += blockDim.x) {
            int k = e / LORA_TILE, col = e % LORA_TILE;
            long gj = j0 + col;
            sd[k][col] = (gj < cols && k0 + k < r) ? down[(long)(k0 + k) * cols + gj] : 0.0f;
        }
        __syncthreads();
        int kn = min(LORA_KC, r - k0);
#pragma unroll 4
        for (int k = 0; k < kn; k++) {
            float4 av = *reinterpret_cast<const float4*>(&su[k][ty * 4]);
            float4 bv = *reinterpret_cast<const float4*>(&sd[k][tx * 4]);
            float a[4] = {av.x, av.y, av.z, av.w}, b[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int p = 0; p < 4; p++)
#pragma unroll
                for (int q = 0; q < 4; q++) o[p][q] = __fadd_rn(o[p][q], __fmul_rn(a[p], b[q]));
        }
        __syncthreads();
    }
}

template <typename TW, int HADA, int BUG>
__device__ void lora_lowrank_impl(TW* __restrict__ w, float* __restrict__ acc, const float* __restrict__ up,
                                  const float* __restrict__ down, const float* __restrict__ up2,
                                  const float* __restrict__ down2, long rows, long cols, int r, int r2, float fs,
                                  float scale, int mode) {
    __shared__ __align__(16) float su[LORA_KC][LORA_PAD];
    __shared__ __align__(16) float sd[LORA_KC][LORA_PAD];
    long i0 = (long)blockIdx.y * LORA_TILE, j0 = (long)blockIdx.x * LORA_TILE;
    float o[4][4];
    lora_product(o, up, down, rows, cols, r, i0, j0, su, sd);
    if (HADA) {
        float o2[4][4];
        lora_product(o2, up2, down2, rows, cols, r2, i0, j0, su, sd);
#pragma unroll
        for (int p = 0; p < 4; p++)
#pragma unroll
            for (int q = 0; q < 4; q++) o[p][q] = __fmul_rn(o[p][q], o2[p][q]);
    }
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        long i = i0 + ty * 4 + p;
        if (i >= rows) continue;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            long j = j0 + tx * 4 + q;
            if (j < cols) lora_finish<TW, BUG>(o[p][q], fs, scale, mode, acc, w, i * cols + j);
        }
    }
}

// ---- rows row0.. of kron(a [ar, ac], b [br, bc]): LoKr, and a full difference as kron([1], diff) -
template <typename TW, int BUG>
__device__ void lora_kron_impl(TW* __restrict__ w, float* __restrict__ acc, const float* __restrict__ a,
                               const float* __restrict__ b, long rows, long cols, long row0, int ac, int br, int bc,
                               float fs, float scale, int mode) {
    long n = rows * cols;
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long gi = row0 + e / cols, j = e % cols;
        float d = __fmul_rn(a[(gi / br) * ac + j / bc], b[(gi % br) * bc + j % bc]);
        lora_finish<TW, BUG>(d, fs, scale, mode, acc, w, e);
    }
}

#define MOSS_LORA(PFX, TW, SUF, BUG)                                                                       \
    MOSS_KERNEL void PFX##_lora_lowrank_##SUF(TW* w, float* acc, const float* up, const float* down, long rows, \
                                               long cols, int r, float fs, float scale, int mode) {         \
        lora_lowrank_impl<TW, 0, BUG>(w, acc, up, down, nullptr, nullptr, rows, cols, r, 0, fs, scale, mode); \
    }                                                                                                      \
    MOSS_KERNEL void PFX##_lora_loha_##SUF(TW* w, float* acc, const float* w1a, const float* w1b,             \
                                            const float* w2a, const float* w2b, long rows, long cols, int r1,  \
                                            int r2, float fs, float scale, int mode) {                         \
        lora_lowrank_impl<TW, 1, BUG>(w, acc, w1a, w1b, w2a, w2b, rows, cols, r1, r2, fs, scale, mode);       \
    }                                                                                                      \
    MOSS_KERNEL void PFX##_lora_kron_##SUF(TW* w, float* acc, const float* a, const float* b, long rows,      \
                                            long cols, long row0, int ac, int br, int bc, float fs, float scale, \
                                            int mode) {                                                        \
        lora_kron_impl<TW, BUG>(w, acc, a, b, rows, cols, row0, ac, br, bc, fs, scale, mode);                \
    }

MOSS_PRODUCTION(MOSS_LORA(moss, bf16, bf16, 0))
MOSS_PRODUCTION(MOSS_LORA(moss, float, f32, 0))
MOSS_CONTROL(MOSS_LORA(moss_ctl, bf16, bf16, 1))
MOSS_CONTROL(MOSS_LORA(moss_ctl, float, f32, 1))
