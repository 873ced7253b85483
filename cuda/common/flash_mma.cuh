// The portable flash-attention mainloop step (mma.sync m16n8k16 bf16, fp32 accumulate, fp32 online
// softmax in base 2) shared by the DiT's bidirectional attention (cuda/dit/flash_attention.cu) and
// the encoder's causal GQA attention (cuda/encoder/causal_flash_attention.cu). A warp owns 16 query
// rows; a thread the rows g = lane / 4 and g + 8 of them (its two softmax states) and, per 8 output
// columns, the fragment acc[dt] (mma.cuh's C layout). Shared K and V tiles are [BN][D] bf16 with
// the 16-byte chunk index XOR-swizzled by (row & 7), so ldmatrix reads of 8 rows hit 8 bank groups.
// P is rounded to bf16 for P V.
#pragma once
#include "mma.cuh"

namespace moss_flash {
using namespace moss_mma;

// The byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of D bf16 columns.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
    return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

// One key tile of BN keys (kb, vb: its K and V tiles) for the warp's 16 rows:
//   S = Q Kᵀ, q(kk, a) giving the Q fragment a of columns 16kk .. 16kk + 15;
//   mask(s): sets the scores of keys the rows do not see to -inf;
//   m' = max(m, rowmax(S)·scale_log2), P = 2^(S·scale_log2 − m'), l = l·2^(m − m') + ΣP,
//   O = O·2^(m − m') + P V.
// GUARD (causal): a row with no visible key yet keeps m = -inf (no update, P = 0). RESCALE false:
// the planted control that forgets O's rescale.
template <int D, int BN, bool GUARD, bool RESCALE, class Q, class Mask>
__device__ __forceinline__ void tile_step(float (&acc)[D / 8][4], float (&mrow)[2], float (&lrow)[2], const char* kb,
                                          const char* vb, float scale_log2, Q q, Mask mask) {
    const int lane = threadIdx.x & 31;
    // S = Q Kᵀ: the warp's 16 rows x the BN keys of the tile
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        unsigned a[4];
        q(kk, a);
#pragma unroll
        for (int np = 0; np < BN / 16; np++) {
            unsigned b[4];
            ldsm_x4(b, kb + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
            mma_bf16(s[2 * np], a, b[0], b[1]);
            mma_bf16(s[2 * np + 1], a, b[2], b[3]);
        }
    }
    mask(s);
    // online softmax (rows g and g + 8 of the warp's 16)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float mnew = fmaxf(mrow[r], mx * scale_log2);
        const float corr = GUARD && mnew == -INFINITY ? 1.f : exp2f(mrow[r] - mnew);
        mrow[r] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            float p0 = GUARD && mnew == -INFINITY ? 0.f : exp2f(s[nt][2 * r] * scale_log2 - mnew);
            float p1 = GUARD && mnew == -INFINITY ? 0.f : exp2f(s[nt][2 * r + 1] * scale_log2 - mnew);
            s[nt][2 * r] = p0;
            s[nt][2 * r + 1] = p1;
            sum += p0 + p1;
        }
        lrow[r] = lrow[r] * corr + sum;
        if (RESCALE) {
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                acc[dt][2 * r] *= corr;
                acc[dt][2 * r + 1] *= corr;
            }
        }
    }
    // O += P V
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        unsigned a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                         pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            unsigned b[4];
            ldsm_x4_t(b, vb + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
            mma_bf16(acc[2 * dp], a, b[0], b[1]);
            mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// The row sum l of row r (0: g, 1: g + 8) over the quad's 4 threads, and its inverse: O / l.
__device__ __forceinline__ float row_inv(const float (&lrow)[2], int r) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    return 1.f / l;
}

// O / l of row r as bf16 at dst (the row's first of its thread's columns: + (lane & 3)·2).
template <int D>
__device__ __forceinline__ void store_row(__nv_bfloat16* dst, const float (&acc)[D / 8][4], int r, float inv) {
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
        *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) = __floats2bfloat162_rn(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv);
}

}  // namespace moss_flash
