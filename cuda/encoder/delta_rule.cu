// Chunk-parallel gated delta rule (the op of crates/moss-core/src/backend/ops/encoder.rs, host side
// crates/moss-cuda/src/encoder/delta_rule.rs `gated_delta_rule_with`). Same algebra as the CPU twin
// `delta_rule_chunked` (chunks of GC = 64 tokens, fp32 throughout, state and decays fp32),
// rearranged so that only the state passing is sequential:
//
//   per chunk c and value head h, with γ = cumsum(g) in the chunk, q/k L2-normalised (q also /√dk):
//     A[i,j]  = β_i (k_i·k_j) e^{γ_i−γ_j}  (j < i),      T = (I + A)⁻¹ (forward substitution)
//     U0 = T (β ⊙ V),   Wk = T (β e^{γ} ⊙ K),   Kd = e^{γ_last−γ} ⊙ K,
//     Wqk[i,j] = (q_i·k_j) e^{γ_i−γ_j}  (j ≤ i)                      -- gdr_prep, all (c, h) at once
//   then, in chunk order per (h, 32 value columns), from S = 0:
//     S0_c = S,   U = U0 − Wk S,   S ← e^{γ_last} S + Kdᵀ U              -- gdr_seq
//   and
//     O = (e^{γ} ⊙ Q) S0_c + Wqk U                                   -- gdr_out, all (c, h) at once.
// U = U0 − Wk S0 is the twin's u = (I + A)⁻¹ β (v − e^{γ} S0ᵀk) by linearity.
// Head dims dk, dv ≤ GD = 128 are zero-padded to 128 (exact: padded columns carry zeros).
// A last chunk of n < 64 tokens is padded with k = q = v = 0, β = 0, g = 0 (γ stays γ_{n−1}),
// which changes nothing in the first n rows or in the state.
// Scratch (fp32, blk = c·Hv + h): Kd, Wk, U0, U [blk][64][128]; S [blk][128][128];
// Wqk [blk][64][64]; gam [blk][64].
// BUG 1 (moss_ctl_enc_gdr_out_*): the state read (e^{γ} ⊙ Q) S0 forgets its decay e^{γ}.
// q, k, v are read with row strides (rqk, rv), so they may be column slices of the conv output.
// Kernels (host: `gdr_chunked` in crates/moss-cuda/src/encoder/delta_rule.rs):
//   fp32 (`--precision fp32`): gdr_prep_f32, gdr_seq, gdr_out_f32 below (SIMT);
//   bf16: delta_rule_prep (delta_rule_prep.cuh, bf16 mma), then on Hopper the state pass + output in one
//   kernel (cuda/encoder/sm90a/delta_rule_tma.cu), elsewhere (or MOSS_KERNELS=portable) gdr_seq_tc + gdr_out_tc
//   (delta_rule_tc.cuh, TF32 mma).
#include "launch.h"
#ifndef GDR_EMU  // tools/delta_rule_emu.cpp compiles the bodies as host code (one std::thread per thread)
#include "elem.cuh"
#include "mma.cuh"
#define GDR_SMEM(name) extern __shared__ __align__(16) float name[]
// One 16-byte shared-memory load (the front end otherwise splits float4 reads whose lanes are
// used separately into four scalar loads).
__device__ __forceinline__ float4 gdr_lds4(const float* p) {
    float4 v;
    unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
#else
inline float4 gdr_lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }
#endif

namespace moss_gdr {
using namespace moss_elem;

constexpr int GC = ENC_GDR_CHUNK;    // chunk
constexpr int GD = ENC_GDR_MAX_DIM;  // padded head dim
constexpr int GT = ENC_GDR_THREADS;  // threads per block (all three kernels)
constexpr int PKS = GD + 4;   // row stride of K/Q tiles (16-byte rows: float4 reads along d)
constexpr int AS = GC + 4;    // row stride of Aᵀ (16-byte rows)
constexpr int SQ_LD = GD + 4; // gdr_seq: row stride of Wk / Kd tiles (16-byte rows for cp.async)
constexpr int SQ_CB = ENC_GDR_SEQ_COLS;  // gdr_seq: value columns per block
constexpr int SQ_UL = SQ_CB + 4;
constexpr int OC = ENC_GDR_OUT_COLS;  // gdr_out: value columns per block
constexpr int OL = OC + 4;
// The fp32 kernels' shared memory (floats), as prep_impl, seq_impl and out_impl carve it.
static_assert(2 * GC * PKS + GC * AS + 4 * GC == ENC_GDR_PREP_FLOATS, "launch.h: ENC_GDR_PREP_FLOATS");
static_assert(2 * (2 * GC * SQ_LD + GC * SQ_UL) + GD * SQ_UL + GC * SQ_UL == ENC_GDR_SEQ_FLOATS, "launch.h: ENC_GDR_SEQ_FLOATS");
static_assert(GC * PKS + GD * OL + 2 * GC * OL + GC == ENC_GDR_OUT_FLOATS, "launch.h: ENC_GDR_OUT_FLOATS");

// Rows c0..c0+63 of head kh of x (token t's head kh at x[t·rs + kh·dk ..]), L2-normalised (rsqrt(Σx² + 1e-6)), times scale and
// rowscale[i] (if given), zero-padded to GD columns and 64 rows, into dst[64][stride]. Warp per row.
template <typename T>
__device__ __forceinline__ void load_norm(float* dst, int stride, const T* x, long rs, int c0, int n, int kh, int dk,
                                          float scale, const float* rowscale) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = warp; i < GC; i += GT / 32) {
        long off = (long)(c0 + i) * rs + (long)kh * dk;
        float v[GD / 32];
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < GD / 32; m++) {
            int a = lane + 32 * m;
            v[m] = (i < n && a < dk) ? ld(x, off + a) : 0.f;
            ss += v[m] * v[m];
        }
        float r = rsqrtf(warp_sum(ss) + 1e-6f) * scale;
        if (rowscale) r *= rowscale[i];
#pragma unroll
        for (int m = 0; m < GD / 32; m++) dst[i * stride + lane + 32 * m] = v[m] * r;
    }
}

// The chunk's gates into shared memory (block (chunk c0 with n valid rows, value head h) = blk):
// γ = the inclusive cumulative sum of g over the chunk (rows past n: 0), β, e^γ and e^{γ_last − γ};
// γ also to gamo[blk]. No barrier after the last writes (the caller's next one covers them).
__device__ void chunk_gates(float* gs, float* bs, float* es, float* dl, float* gamo, const float* g,
                            const float* beta, long blk, int c0, int n, int h, int Hv) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < GC) {
        long gi = (long)(c0 + tid) * Hv + h;
        gs[tid] = tid < n ? g[gi] : 0.f;
        bs[tid] = tid < n ? beta[gi] : 0.f;
    }
    __syncthreads();
    if (warp == 0) {  // inclusive scan of 64 values, two per lane
        float a = gs[2 * lane], b = gs[2 * lane + 1];
        float s = a + b;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float t = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += t;
        }
        float ex = s - (a + b);
        gs[2 * lane] = ex + a;
        gs[2 * lane + 1] = ex + a + b;
    }
    __syncthreads();
    if (tid < GC) {
        es[tid] = expf(gs[tid]);
        dl[tid] = expf(gs[GC - 1] - gs[tid]);
        gamo[blk * GC + tid] = gs[tid];
    }
}

// Columns [col0, col0 + OC) of the GD x GD state of block blk (Sall: one state per (chunk, value
// head)) into Ss (row stride ld), 16 bytes a copy. No barrier.
__device__ void load_state_cols(float* Ss, int ld, const float* Sall, long blk, int col0) {
    const float* sg = Sall + blk * GD * GD + col0;
    for (int p = threadIdx.x; p < GD * OC / 4; p += GT) {
        int d = p / (OC / 4), x = (p % (OC / 4)) * 4;
        *reinterpret_cast<float4*>(Ss + d * ld + x) = *reinterpret_cast<const float4*>(sg + d * GD + x);
    }
}

}  // namespace moss_gdr
#include "delta_rule_tc.cuh"     // bf16: gdr_seq_tc, gdr_out_tc (TF32 mma)
#include "delta_rule_prep.cuh"  // bf16: delta_rule_prep ((I + A)⁻¹ blockwise, [U0 | Wk] on bf16 mma)
#include "delta_rule_compact.cuh"  // gdr_seq_compact, gdr_out_compact: within 96 KiB a block (99 KiB GPUs)
namespace moss_gdr {

// ---- gdr_prep (fp32): one block per (chunk, value head) ----------------------------------------
template <typename T>
__device__ void prep_impl(float* Kd, float* Wk, float* U0, float* Wqk, float* gamo, const T* q, const T* k,
                          const T* v, const float* g, const float* beta, int L, int Hk, int Hv, int dk, int dv,
                          long rqk, long rv) {
    GDR_SMEM(gdr_sm);
    float* Ks = gdr_sm;          // GC x PKS
    float* Qs = Ks + GC * PKS;   // GC x PKS
    float* At = Qs + GC * PKS;   // GC x AS: Aᵀ, At[j][i] = A[i][j]
    float* gs = At + GC * AS;    // γ
    float* bs = gs + GC;         // β
    float* es = bs + GC;         // e^γ
    float* dl = es + GC;         // e^{γ_last − γ}
    const long blk = blockIdx.x;
    const int c = (int)(blk / Hv), h = (int)(blk % Hv);
    const int c0 = c * GC, n = min(GC, L - c0);
    const int kh = h / (Hv / Hk);
    const int tid = threadIdx.x;
    chunk_gates(gs, bs, es, dl, gamo, g, beta, blk, c0, n, h, Hv);
    load_norm(Ks, PKS, k, rqk, c0, n, kh, dk, 1.f, nullptr);
    load_norm(Qs, PKS, q, rqk, c0, n, kh, dk, rsqrtf((float)dk), nullptr);
    __syncthreads();
    {
        // K Kᵀ and Q Kᵀ: thread (ry, cx) owns rows 4ry..4ry+3, columns cx + 16m.
        const int ry = tid >> 4, cx = tid & 15;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) kk[a][b] = qk[a][b] = 0.f;
#pragma unroll 2
        for (int d = 0; d < GD; d += 4) {
            float4 ki[4], qi[4], kj[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                ki[a] = gdr_lds4(Ks + (4 * ry + a) * PKS + d);
                qi[a] = gdr_lds4(Qs + (4 * ry + a) * PKS + d);
                kj[a] = gdr_lds4(Ks + (cx + 16 * a) * PKS + d);
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    kk[a][b] += ki[a].x * kj[b].x;
                    kk[a][b] += ki[a].y * kj[b].y;
                    kk[a][b] += ki[a].z * kj[b].z;
                    kk[a][b] += ki[a].w * kj[b].w;
                    qk[a][b] += qi[a].x * kj[b].x;
                    qk[a][b] += qi[a].y * kj[b].y;
                    qk[a][b] += qi[a].z * kj[b].z;
                    qk[a][b] += qi[a].w * kj[b].w;
                }
        }
        float* wq = Wqk + blk * GC * GC;
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int i = 4 * ry + a, j = cx + 16 * b;
                float e = j <= i ? expf(gs[i] - gs[j]) : 0.f;
                At[j * AS + i] = j < i ? bs[i] * kk[a][b] * e : 0.f;
                wq[i * GC + j] = qk[a][b] * e;
            }
    }
    // Right-hand sides, one column per thread: t < 128 is column t of β ⊙ V, t ≥ 128 column
    // t − 128 of β e^{γ} ⊙ K; then x ← (I + A)⁻¹ x, right-looking (row j done, update rows > j),
    // reading column j of A as float4 from Aᵀ from the aligned group holding row j + 1 on (the
    // entries i ≤ j are zero, so those updates leave x unchanged).
    float x[GC];
    if (tid < GD) {
        const bool live = tid < dv;
#pragma unroll
        for (int i = 0; i < GC; i++)
            x[i] = (live && i < n) ? bs[i] * ld(v, (long)(c0 + i) * rv + (long)h * dv + tid) : 0.f;
    } else {
#pragma unroll
        for (int i = 0; i < GC; i++) x[i] = bs[i] * es[i] * Ks[i * PKS + tid - GD];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < GC - 1; j++) {
        const float xj = x[j];
#pragma unroll
        for (int i4 = (j + 1) / 4 * 4; i4 < GC; i4 += 4) {
            float4 a = gdr_lds4(At + j * AS + i4);
            if (i4 + 0 > j) x[i4 + 0] -= a.x * xj;
            if (i4 + 1 > j) x[i4 + 1] -= a.y * xj;
            if (i4 + 2 > j) x[i4 + 2] -= a.z * xj;
            x[i4 + 3] -= a.w * xj;
        }
    }
    {
        float* dst = (tid < GD ? U0 : Wk) + blk * GC * GD + (tid & (GD - 1));
#pragma unroll
        for (int i = 0; i < GC; i++) dst[i * GD] = x[i];
    }
    float* kd = Kd + blk * GC * GD;
    for (int p = tid; p < GC * GD; p += GT) {
        int i = p / GD, a = p - i * GD;
        kd[p] = Ks[i * PKS + a] * dl[i];
    }
}

// ---- gdr_seq (fp32): one block per (value head, 32 value columns), sequential over chunks -------------
// S (128 x 32 of this block) lives in registers (thread owns rows 4dy.., columns 4cx..) and in
// shared memory for U = U0 − Wk S; the next chunk's Wk, Kd, U0 stream in with cp.async.
__device__ __forceinline__ void seq_issue(float* dst, const float* Wk, const float* Kd, const float* U0, long blk,
                                          int j0) {
    const float* wk = Wk + blk * GC * GD;
    const float* kd = Kd + blk * GC * GD;
    const float* u0 = U0 + blk * GC * GD + j0;
    for (int p = threadIdx.x; p < GC * GD / 4; p += GT) {
        int i = p / (GD / 4), a = (p % (GD / 4)) * 4;
        moss_mma::cp_async16(dst + i * SQ_LD + a, wk + i * GD + a, true);
        moss_mma::cp_async16(dst + GC * SQ_LD + i * SQ_LD + a, kd + i * GD + a, true);
    }
    for (int p = threadIdx.x; p < GC * SQ_CB / 4; p += GT) {
        int i = p / (SQ_CB / 4), a = (p % (SQ_CB / 4)) * 4;
        moss_mma::cp_async16(dst + 2 * GC * SQ_LD + i * SQ_UL + a, u0 + i * GD + a, true);
    }
    moss_mma::cp_async_commit();
}

__device__ void seq_impl(float* Sall, float* Uall, const float* Wk, const float* Kd, const float* U0,
                         const float* gam, int nc, int Hv, int ncb) {
    GDR_SMEM(gdr_sm);
    constexpr int BUFN = 2 * GC * SQ_LD + GC * SQ_UL;
    float* Ss = gdr_sm + 2 * BUFN;  // GD x SQ_UL
    float* Us = Ss + GD * SQ_UL;    // GC x SQ_UL
    const int h = blockIdx.x / ncb, j0 = (blockIdx.x % ncb) * SQ_CB;
    const int tid = threadIdx.x, dy = tid >> 3, cx = tid & 7;
    float S[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) S[a][b] = 0.f;
    for (int p = tid; p < GD * SQ_UL; p += GT) Ss[p] = 0.f;
    seq_issue(gdr_sm, Wk, Kd, U0, h, j0);
    for (int c = 0; c < nc; c++) {
        const long blk = (long)c * Hv + h;
        const float* wks = gdr_sm + (c & 1) * BUFN;
        const float* kds = wks + GC * SQ_LD;
        const float* u0s = kds + GC * SQ_LD;
        if (c + 1 < nc) {
            seq_issue(gdr_sm + ((c + 1) & 1) * BUFN, Wk, Kd, U0, blk + Hv, j0);
            moss_mma::cp_async_wait<1>();
        } else {
            moss_mma::cp_async_wait<0>();
        }
        __syncthreads();
        // the state entering chunk c
        float* so = Sall + blk * GD * GD + j0 + 4 * cx;
#pragma unroll
        for (int a = 0; a < 4; a++)
            *reinterpret_cast<float4*>(so + (4 * dy + a) * GD) = make_float4(S[a][0], S[a][1], S[a][2], S[a][3]);
        // U = U0 − Wk S: thread owns rows 2r, 2r+1 (r = tid / 8), columns 4cx..
        {
            const int r = tid >> 3;
            float u[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int b = 0; b < 4; b++) u[m][b] = u0s[(2 * r + m) * SQ_UL + 4 * cx + b];
#pragma unroll 8
            for (int d = 0; d < GD; d++) {
                float w0 = wks[(2 * r) * SQ_LD + d], w1 = wks[(2 * r + 1) * SQ_LD + d];
                float4 s = *reinterpret_cast<const float4*>(Ss + d * SQ_UL + 4 * cx);
                u[0][0] -= w0 * s.x; u[0][1] -= w0 * s.y; u[0][2] -= w0 * s.z; u[0][3] -= w0 * s.w;
                u[1][0] -= w1 * s.x; u[1][1] -= w1 * s.y; u[1][2] -= w1 * s.z; u[1][3] -= w1 * s.w;
            }
#pragma unroll
            for (int m = 0; m < 2; m++) {
                float4 f = make_float4(u[m][0], u[m][1], u[m][2], u[m][3]);
                *reinterpret_cast<float4*>(Us + (2 * r + m) * SQ_UL + 4 * cx) = f;
                *reinterpret_cast<float4*>(Uall + blk * GC * GD + (2 * r + m) * GD + j0 + 4 * cx) = f;
            }
        }
        __syncthreads();
        // S ← e^{γ_last} S + Kdᵀ U
        const float dec = expf(gam[blk * GC + GC - 1]);
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) S[a][b] *= dec;
#pragma unroll 4
        for (int i = 0; i < GC; i++) {
            float4 kv = *reinterpret_cast<const float4*>(kds + i * SQ_LD + 4 * dy);
            float4 uv = *reinterpret_cast<const float4*>(Us + i * SQ_UL + 4 * cx);
            float kk[4] = {kv.x, kv.y, kv.z, kv.w}, uu[4] = {uv.x, uv.y, uv.z, uv.w};
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) S[a][b] += kk[a] * uu[b];
        }
#pragma unroll
        for (int a = 0; a < 4; a++)
            *reinterpret_cast<float4*>(Ss + (4 * dy + a) * SQ_UL + 4 * cx) = make_float4(S[a][0], S[a][1], S[a][2], S[a][3]);
        __syncthreads();
    }
}

// ---- gdr_out (fp32): one block per (chunk, value head) x 64 value columns -----------------------------
template <typename T, int BUG>
__device__ void out_impl(T* out, const T* q, const float* Sall, const float* Uall, const float* Wqk, const float* gam,
                         int L, int Hk, int Hv, int dk, int dv, long rqk) {
    GDR_SMEM(gdr_sm);
    float* Qs = gdr_sm;          // GC x PKS
    float* Ss = Qs + GC * PKS;   // GD x OL
    float* Ws = Ss + GD * OL;    // GC x OL
    float* Us = Ws + GC * OL;    // GC x OL
    float* es = Us + GC * OL;    // GC
    const long blk = blockIdx.x;
    const int c = (int)(blk / Hv), h = (int)(blk % Hv);
    const int c0 = c * GC, n = min(GC, L - c0);
    const int kh = h / (Hv / Hk);
    const int col0 = blockIdx.y * OC;
    const int tid = threadIdx.x;
    if (tid < GC) es[tid] = BUG == 1 ? 1.f : expf(gam[blk * GC + tid]);
    __syncthreads();
    load_norm(Qs, PKS, q, rqk, c0, n, kh, dk, rsqrtf((float)dk), es);
    load_state_cols(Ss, OL, Sall, blk, col0);
    const float* ug = Uall + blk * GC * GD + col0;
    const float* wg = Wqk + blk * GC * GC;
    for (int p = tid; p < GC * OC / 4; p += GT) {
        int i = p / (OC / 4), x = (p % (OC / 4)) * 4;
        *reinterpret_cast<float4*>(Us + i * OL + x) = *reinterpret_cast<const float4*>(ug + i * GD + x);
        *reinterpret_cast<float4*>(Ws + i * OL + x) = *reinterpret_cast<const float4*>(wg + i * GC + x);
    }
    __syncthreads();
    const int ry = tid >> 4, cx = tid & 15;
    float o[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) o[a][b] = 0.f;
    // o += A_rows · B for A [64][lda] read as float4 along the inner index, B [inner][OL]
    auto rank4 = [&](const float* Am, int lda, const float* Bm, int inner) {
#pragma unroll 2
        for (int d = 0; d < inner; d += 4) {
            float4 s[4];
#pragma unroll
            for (int e = 0; e < 4; e++) s[e] = gdr_lds4(Bm + (d + e) * OL + 4 * cx);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float4 q4 = gdr_lds4(Am + (4 * ry + a) * lda + d);
                float qa[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    o[a][0] += qa[e] * s[e].x; o[a][1] += qa[e] * s[e].y;
                    o[a][2] += qa[e] * s[e].z; o[a][3] += qa[e] * s[e].w;
                }
            }
        }
    };
    rank4(Qs, PKS, Ss, GD);
    rank4(Ws, OL, Us, GC);
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int i = 4 * ry + a;
        if (i >= n) continue;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int col = col0 + 4 * cx + b;
            if (col < dv) st(out, ((long)(c0 + i) * Hv + h) * dv + col, o[a][b]);
        }
    }
}

}  // namespace moss_gdr
#ifndef GDR_EMU

// Row strides (elements between tokens): rqk of q and k, rv of v (the conv output when the
// delta rule reads q, k, v straight out of it). The output is contiguous [L, Hv, dv].
// fp32: the SIMT kernels; the planted control (moss_ctl_enc_) in gdr_out.
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) moss_enc_gdr_prep_f32(float* Kd, float* Wk, float* U0, float* Wqk, float* gam,
                                                              const float* q, const float* k, const float* v,
                                                              const float* g, const float* beta, int L, int Hk, int Hv,
                                                              int dk, int dv, long rqk, long rv) {
    moss_gdr::prep_impl<float>(Kd, Wk, U0, Wqk, gam, q, k, v, g, beta, L, Hk, Hv, dk, dv, rqk, rv);
}
#endif
#define MOSS_GDR_OUT_F32(PFX, BUG)                                                                            \
    MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) PFX##_gdr_out_f32(float* out, const float* q, const float* S,      \
                                                              const float* U, const float* Wqk, const float* gam, \
                                                              int L, int Hk, int Hv, int dk, int dv, long rqk, \
                                                              long rv) {                                       \
        moss_gdr::out_impl<float, BUG>(out, q, S, U, Wqk, gam, L, Hk, Hv, dk, dv, rqk);                        \
    }
MOSS_PRODUCTION(MOSS_GDR_OUT_F32(moss_enc, 0))
MOSS_CONTROL(MOSS_GDR_OUT_F32(moss_ctl_enc, 1))
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) moss_enc_gdr_seq(float* S, float* U, const float* Wk, const float* Kd,
                                                         const float* U0, const float* gam, int nc, int Hv, int ncb) {
    moss_gdr::seq_impl(S, U, Wk, Kd, U0, gam, nc, Hv, ncb);
}
#endif

// bf16: delta_rule_prep (delta_rule_prep.cuh; a block per chunk and pair of value heads, 512 threads,
// 93 KiB, two blocks an SM), its planted control (moss_ctl_enc_) leaving T's lower-left 32x32 block
// at zero; then either the Hopper kernel (cuda/encoder/sm90a/delta_rule_tma.cu) or gdr_seq_tc + gdr_out_tc, the
// control in gdr_out_tc.
#define MOSS_GDR_BF16(PFX, BUG)                                                                               \
    MOSS_KERNEL void __launch_bounds__(ENC_GDR_PREP_BF16_THREADS, 2) PFX##_delta_rule_prep_bf16(                                       \
        float* Kd, float* Wk, float* U0, float* Wqk, float* gam, const __nv_bfloat16* q, const __nv_bfloat16* k, \
        const __nv_bfloat16* v, const float* g, const float* beta, int L, int Hk, int Hv, int dk, int dv, long rqk, \
        long rv) {                                                                                             \
        moss_gdr::prep3p_impl<__nv_bfloat16, BUG>(Kd, Wk, U0, Wqk, gam, q, k, v, g, beta, L, Hk, Hv, dk, dv, rqk, rv); \
    }                                                                                                          \
    MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) PFX##_gdr_out_tc_bf16(__nv_bfloat16* out, const __nv_bfloat16* q,  \
                                                                  const float* S, const float* U, const float* Wqk, \
                                                                  const float* gam, int L, int Hk, int Hv, int dk, \
                                                                  int dv, long rqk, long rv) {                 \
        moss_gdr::out_tc_impl<__nv_bfloat16, BUG>(out, q, S, U, Wqk, gam, L, Hk, Hv, dk, dv, rqk);             \
    }
MOSS_PRODUCTION(MOSS_GDR_BF16(moss_enc, 0))
MOSS_CONTROL(MOSS_GDR_BF16(moss_ctl_enc, 1))
#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void __launch_bounds__(ENC_GDR_THREADS) moss_enc_gdr_seq_tc(float* S, float* U, const float* Wk, const float* Kd,
                                                            const float* U0, const float* gam, int nc, int Hv,
                                                            int ncb) {
    moss_gdr::seq_tc_impl(S, U, Wk, Kd, U0, gam, nc, Hv, ncb);
}
#endif
#endif
