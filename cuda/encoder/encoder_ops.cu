// The encoder's fused ops (crates/moss-core/src/backend/ops/encoder.rs, host side crates/moss-cuda/src/encoder/mod.rs):
// embedding gather, per-head norm + partial RoPE, causal GQA attention (flash style, fp32
// online softmax), SiLU-gated product, causal depthwise conv + SiLU, the Gated-DeltaNet gates,
// the chunked gated delta rule (chunks of 64, fp32 state and decay) and the gated RMSNorm.
// Activations are bf16 or f32 (T); small per-channel vectors and g/beta are f32. fp32 inside,
// one rounding into the output. moss_ctl_enc_* are the same code with a planted bug.
#include "elem.cuh"
#include "launch.h"
#include "rope.cuh"
#include "row_impl.cuh"  // gates_impl, grms8_impl (row strides; contiguous here)

namespace moss_enc {
using namespace moss_elem;
using namespace moss_rope;
using bf16 = __nv_bfloat16;

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// ---- embed: out[t, :] = table[ids[t], :] (ids as f32, exact below 2^24). BUG 1: id + 1. -----------
template <typename T, int BUG>
__device__ void embed_impl(T* out, const T* table, const float* ids, long L, long H) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < L * H; i += (long)gridDim.x * blockDim.x) {
        long t = i / H, c = i - t * H;
        long id = (long)ids[t] + BUG;
        out[i] = table[id * H + c];
    }
}

// ---- per-head zero-centred RMSNorm + partial rotate-half RoPE, one warp per (t, head) row -------
// inv[half] are the fp32 inverse frequencies; angle = f32(t) · inv[i] in fp32. BUG 1: position t+1.
template <typename T, int BUG>
__device__ void head_rope_impl(T* out, const T* x, const float* w, const float* inv, long rows, int nh, int hd,
                               float eps, int rot) {
    int lane = threadIdx.x & 31;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long t = row / nh;
    const T* xr = x + row * hd;
    T* o = out + row * hd;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32) {
        float v = ld(xr, i);
        ss += v * v;
    }
    float r = rms_inv(warp_sum(ss), hd, eps);
    int half = rot / 2;
    float pos = (float)(t + BUG);
    for (int i = lane; i < hd; i += 32) {
        float y = MOSS_NORMED(ld(xr, i), r, 1.f + w[i]);
        if (i < rot) {
            int m = i < half ? i : i - half;
            int pi = i < half ? i + half : i - half;
            float yp = MOSS_NORMED(ld(xr, pi), r, 1.f + w[pi]);
            float s, c;
            sincosf(pos * inv[m], &s, &c);
            y = i < half ? MOSS_ROPE_FIRST(y, yp, c, s) : MOSS_ROPE_SECOND(y, yp, c, s);
        }
        st(o, i, y);
    }
}

// ---- causal GQA attention: one block = 32 query rows of one head, 256 threads -------------------
// Key tiles of 32; fp32 scores and online softmax; thread d owns output dim d (hd <= 256).
// BUG 1: query head h reads KV head h % Hkv instead of h / (H / Hkv).
constexpr int AQ = ENC_ATTN_Q, AK = ENC_ATTN_K, ATHREADS = ENC_ATTN_THREADS;
template <typename T, int BUG>
__device__ void attn_impl(T* out, const T* q, const T* k, const T* v, int L, int H, int Hkv, int hd, float scale) {
    extern __shared__ float sm[];
    const int hp = hd + 1;
    float* Qs = sm;                  // AQ x hp
    float* Ks = Qs + AQ * hp;        // AK x hp
    float* Vs = Ks + AK * hp;        // AK x hd
    float* Ps = Vs + AK * hd;        // AQ x (AK+1)
    float* mrow = Ps + AQ * (AK + 1);  // AQ
    float* lrow = mrow + AQ;         // AQ
    float* arow = lrow + AQ;         // AQ
    int nqt = (L + AQ - 1) / AQ;
    int h = blockIdx.x % H;
    int qt = nqt - 1 - blockIdx.x / H;  // longest rows first
    int q0 = qt * AQ;
    int kv = BUG == 1 ? h % Hkv : h / (H / Hkv);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int p = tid; p < AQ * hd; p += ATHREADS) {
        int i = p / hd, d = p - i * hd;
        int t = q0 + i;
        Qs[i * hp + d] = t < L ? ld(q, ((long)t * H + h) * hd + d) * scale : 0.f;
    }
    if (tid < AQ) {
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.f;
    }
    float acc[AQ];
#pragma unroll
    for (int i = 0; i < AQ; i++) acc[i] = 0.f;
    int kend = min(q0 + AQ, L);
    for (int k0 = 0; k0 < kend; k0 += AK) {
        __syncthreads();
        for (int p = tid; p < AK * hd; p += ATHREADS) {
            int j = p / hd, d = p - j * hd;
            int s = k0 + j;
            long off = ((long)s * Hkv + kv) * hd + d;
            Ks[j * hp + d] = s < L ? ld(k, off) : 0.f;
            Vs[j * hd + d] = s < L ? ld(v, off) : 0.f;
        }
        __syncthreads();
        // scores: thread (warp, lane) -> key lane, queries warp + 8r
        {
            float sc[AQ / 8];
#pragma unroll
            for (int r = 0; r < AQ / 8; r++) sc[r] = 0.f;
            const float* kr = Ks + lane * hp;
            for (int d = 0; d < hd; d++) {
                float kd = kr[d];
#pragma unroll
                for (int r = 0; r < AQ / 8; r++) sc[r] += Qs[(warp + 8 * r) * hp + d] * kd;
            }
            int s = k0 + lane;
#pragma unroll
            for (int r = 0; r < AQ / 8; r++) {
                int i = warp + 8 * r;
                int t = q0 + i;
                Ps[i * (AK + 1) + lane] = (s <= t && s < L) ? sc[r] : -INFINITY;
            }
        }
        __syncthreads();
        // online softmax: warp per row
        for (int i = warp; i < AQ; i += ATHREADS / 32) {
            float s = Ps[i * (AK + 1) + lane];
            float mx = warp_max(s);
            float mo = mrow[i];
            float mn = fmaxf(mo, mx);
            float p = mn == -INFINITY ? 0.f : expf(s - mn);
            float al = mn == -INFINITY ? 1.f : expf(mo - mn);
            Ps[i * (AK + 1) + lane] = p;
            float ps = warp_sum(p);
            if (lane == 0) {
                mrow[i] = mn;
                lrow[i] = lrow[i] * al + ps;
                arow[i] = al;
            }
        }
        __syncthreads();
        for (int d = tid; d < hd; d += ATHREADS) {
            // hd <= 256: each thread owns at most one dim
#pragma unroll
            for (int i = 0; i < AQ; i++) acc[i] *= arow[i];
            for (int j = 0; j < AK; j++) {
                float vd = Vs[j * hd + d];
#pragma unroll
                for (int i = 0; i < AQ; i++) acc[i] += Ps[i * (AK + 1) + j] * vd;
            }
        }
    }
    __syncthreads();
    for (int d = tid; d < hd; d += ATHREADS) {
#pragma unroll
        for (int i = 0; i < AQ; i++) {
            int t = q0 + i;
            if (t < L) st(out, ((long)t * H + h) * hd + d, acc[i] / lrow[i]);
        }
    }
}

// ---- silu(gate) · up. BUG 1: silu(up) · gate. -------------------------------------------------
template <typename T, int BUG>
__device__ void silu_mul_impl(T* out, const T* g, const T* u, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float a = ld(g, i), b = ld(u, i);
        st(out, i, BUG == 1 ? silu(b) * a : silu(a) * b);
    }
}

// ---- silu_mul, 8 elements per thread (n % 8 == 0; 16-byte aligned buffers). BUG as silu_mul. ------
template <typename T, int BUG>
__device__ void silu_mul8_impl(T* out, const T* g, const T* u, long n8) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        float a[8], b[8], o[8];
        ld8(g, 8 * i, a);
        ld8(u, 8 * i, b);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = BUG == 1 ? silu(b[e]) * a[e] : silu(a[e]) * b[e];
        st8(out, 8 * i, o);
    }
}

// ---- causal conv1d + SiLU, 8 channels per thread (C % 8 == 0). The taps come TRANSPOSED, wt [K, C]
// f32, so that a warp's tap loads are contiguous. x rows of stride ldx (ldx % 8 == 0), out [L, C].
// BUG 1: taps reversed. -------------------------------------------------------------------------
template <typename T, int BUG>
__device__ void conv8_impl(T* out, const T* x, const float* wt, long L, int C, int K, long ldx) {
    const int c8 = C / 8;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < L * c8; i += (long)gridDim.x * blockDim.x) {
        long t = i / c8;
        int c = (int)(i - t * c8) * 8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < K; j++) {
            long s = t - (K - 1) + j;
            if (s < 0) continue;
            float xv[8];
            ld8(x, s * ldx + c, xv);
            int tap = BUG == 1 ? K - 1 - j : j;
            float wv[8];
            ld8(wt, (long)tap * C + c, wv);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] += wv[e] * xv[e];
        }
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = silu(acc[e]);
        st8(out, t * C + c, acc);
    }
}

// ---- causal depthwise conv1d + SiLU: x [L, C], w [C, K] f32. BUG 1: taps reversed. -------------
template <typename T, int BUG>
__device__ void conv_impl(T* out, const T* x, const float* w, long L, int C, int K) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < L * C; i += (long)gridDim.x * blockDim.x) {
        long t = i / C;
        int c = (int)(i - t * C);
        float acc = 0.f;
        for (int j = 0; j < K; j++) {
            long s = t - (K - 1) + j;
            if (s >= 0) acc += w[c * K + (BUG == 1 ? K - 1 - j : j)] * ld(x, s * C + c);
        }
        st(out, i, silu(acc));
    }
}

// ---- gated RMSNorm: x·rsqrt(mean(x²)+eps)·w·silu(z), warp per row. BUG 1: sigmoid(z). -----------
template <typename T, int BUG>
__device__ void grms_impl(T* out, const T* x, const T* z, const float* w, long rows, int d, float eps) {
    int lane = threadIdx.x & 31;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const T* xr = x + row * d;
    const T* zr = z + row * d;
    float ss = 0.f;
    for (int i = lane; i < d; i += 32) {
        float v = ld(xr, i);
        ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / (float)d + eps);
    for (int i = lane; i < d; i += 32) {
        float zi = ld(zr, i);
        float gt = BUG == 1 ? 1.f / (1.f + expf(-zi)) : silu(zi);
        st(out + row * d, i, ld(xr, i) * r * w[i] * gt);
    }
}

// ---- chunked gated delta rule ---------------------------------------------------------------------
// One block per (value head, slice of dvb value columns); the columns of S evolve independently,
// so a slice needs only its columns of S (dk x dvb, fp32, shared). Per chunk of CH tokens (as
// delta_rule_chunked in backend/cpu/encoder.rs), γ = cumsum(g) in the chunk:
//   A[i,j] = β_i (k_i·k_j) e^{γ_i−γ_j} (j<i),  W[i,j] = (q_i·k_j) e^{γ_i−γ_j} (j≤i)
//   r_i = β_i (v_i − e^{γ_i} S0ᵀk_i);  u_i = r_i − Σ_{j<i} A[i,j] u_j  (forward substitution)
//   o_i = e^{γ_i} S0ᵀq_i + Σ_{j≤i} W[i,j] u_j;  S ← e^{γ_n−1} S0 + Σ_j e^{γ_n−1 − γ_j} k_j u_jᵀ
// q, k are L2-normalised in the kernel (q also by 1/√dk). BUG 1: the state read e^{γ_i} S0ᵀq_i
// forgets its decay e^{γ_i}.
constexpr int CH = ENC_GDR_CHUNK, DTHREADS = ENC_GDR_SEQ1_THREADS;
template <typename T, int BUG>
__device__ void gdr_impl(T* out, const T* q, const T* k, const T* v, const float* g, const float* beta, int L,
                         int Hk, int Hv, int dk, int dv, int dvb) {
    extern __shared__ float sm[];
    const int kp = dk + 1;
    float* S = sm;                  // dk x dvb
    float* Kc = S + dk * dvb;       // CH x kp
    float* Qc = Kc + CH * kp;       // CH x kp
    float* U = Qc + CH * kp;        // CH x dvb
    float* Os = U + CH * dvb;       // CH x dvb
    float* A = Os + CH * dvb;       // CH x (CH+1)
    float* W = A + CH * (CH + 1);   // CH x (CH+1)
    float* gam = W + CH * (CH + 1); // CH
    float* bet = gam + CH;
    float* eg = bet + CH;
    float* dl = eg + CH;
    int nslice = dv / dvb;
    int h = blockIdx.x / nslice;
    int j0 = (blockIdx.x % nslice) * dvb;
    int kh = h / (Hv / Hk);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float qscale = rsqrtf((float)dk);
    for (int p = tid; p < dk * dvb; p += DTHREADS) S[p] = 0.f;
    for (int c0 = 0; c0 < L; c0 += CH) {
        int n = min(CH, L - c0);
        __syncthreads();
        for (int i = warp; i < CH; i += DTHREADS / 32) {
            if (i < n) {
                long off = ((long)(c0 + i) * Hk + kh) * dk;
                float sk = 0.f, sq = 0.f;
                for (int a = lane; a < dk; a += 32) {
                    float kv = ld(k, off + a), qv = ld(q, off + a);
                    sk += kv * kv;
                    sq += qv * qv;
                }
                float rk = rsqrtf(warp_sum(sk) + 1e-6f);
                float rq = rsqrtf(warp_sum(sq) + 1e-6f) * qscale;
                for (int a = lane; a < dk; a += 32) {
                    Kc[i * kp + a] = ld(k, off + a) * rk;
                    Qc[i * kp + a] = ld(q, off + a) * rq;
                }
            } else {
                for (int a = lane; a < dk; a += 32) {
                    Kc[i * kp + a] = 0.f;
                    Qc[i * kp + a] = 0.f;
                }
            }
        }
        for (int p = tid; p < CH * dvb; p += DTHREADS) {
            int i = p / dvb, jj = p - i * dvb;
            U[p] = i < n ? ld(v, ((long)(c0 + i) * Hv + h) * dv + j0 + jj) : 0.f;
        }
        if (tid == 0) {
            float acc = 0.f;
            for (int i = 0; i < CH; i++) {
                if (i < n) {
                    long gi = (long)(c0 + i) * Hv + h;
                    acc += g[gi];
                    bet[i] = beta[gi];
                } else {
                    bet[i] = 0.f;
                }
                gam[i] = acc;
            }
        }
        __syncthreads();
        if (tid < CH) {
            eg[tid] = expf(gam[tid]);
            dl[tid] = expf(gam[n - 1] - gam[tid]);
        }
        __syncthreads();
        // A and W (lower triangle; the rest zero)
        for (int p = tid; p < CH * CH; p += DTHREADS) {
            int i = p / CH, j = p - i * CH;
            float a = 0.f, w = 0.f;
            if (j <= i && i < n) {
                float kk = 0.f, qk = 0.f;
                const float* ki = Kc + i * kp;
                const float* qi = Qc + i * kp;
                const float* kj = Kc + j * kp;
                for (int d = 0; d < dk; d++) {
                    kk += ki[d] * kj[d];
                    qk += qi[d] * kj[d];
                }
                float e = expf(gam[i] - gam[j]);
                a = j < i ? bet[i] * kk * e : 0.f;
                w = qk * e;
            }
            A[i * (CH + 1) + j] = a;
            W[i * (CH + 1) + j] = w;
        }
        // r and the state read
        for (int p = tid; p < CH * dvb; p += DTHREADS) {
            int i = p / dvb, jj = p - i * dvb;
            float sk = 0.f, sq = 0.f;
            const float* ki = Kc + i * kp;
            const float* qi = Qc + i * kp;
            for (int d = 0; d < dk; d++) {
                float s = S[d * dvb + jj];
                sk += ki[d] * s;
                sq += qi[d] * s;
            }
            U[p] = bet[i] * (U[p] - eg[i] * sk);
            Os[p] = BUG == 1 ? sq : eg[i] * sq;
        }
        __syncthreads();
        // forward substitution, one thread per column
        if (tid < dvb) {
            for (int i = 1; i < n; i++) {
                // four partial sums for instruction-level parallelism
                float u0 = U[i * dvb + tid], u1 = 0.f, u2 = 0.f, u3 = 0.f;
                const float* ai = A + i * (CH + 1);
                int j = 0;
                for (; j + 4 <= i; j += 4) {
                    u0 -= ai[j] * U[j * dvb + tid];
                    u1 -= ai[j + 1] * U[(j + 1) * dvb + tid];
                    u2 -= ai[j + 2] * U[(j + 2) * dvb + tid];
                    u3 -= ai[j + 3] * U[(j + 3) * dvb + tid];
                }
                for (; j < i; j++) u0 -= ai[j] * U[j * dvb + tid];
                U[i * dvb + tid] = (u0 + u1) + (u2 + u3);
            }
        }
        __syncthreads();
        // outputs
        for (int p = tid; p < n * dvb; p += DTHREADS) {
            int i = p / dvb, jj = p - i * dvb;
            float o = Os[p];
            const float* wi = W + i * (CH + 1);
            for (int j = 0; j <= i; j++) o += wi[j] * U[j * dvb + jj];
            st(out, ((long)(c0 + i) * Hv + h) * dv + j0 + jj, o);
        }
        // the state after the chunk
        float last = eg[n - 1];
        for (int p = tid; p < dk * dvb; p += DTHREADS) {
            int d = p / dvb, jj = p - d * dvb;
            float s = S[p] * last;
            for (int i = 0; i < n; i++) s += dl[i] * Kc[i * kp + d] * U[i * dvb + jj];
            S[p] = s;
        }
    }
}

// ---- causal softmax of the cuBLASLt attention path (long prompts) --------------------------------
// Scores s [rows, nk] fp32 (already scaled) of query chunk rows: row R is query t = i0 + R % qn;
// keys s ≤ t count, the rest get p = 0. BUG 1: key t + 1 leaks in (off-by-one causal mask).
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = sh[0];
    for (int i = 1; i < nw; i++) r = is_max ? fmaxf(r, sh[i]) : r + sh[i];
    return r;
}
template <typename T, int BUG>
__device__ void csoftmax_impl(T* p, const float* s, int qn, int nk, int i0) {
    __shared__ float sh[32];
    long row = blockIdx.x;
    int t = i0 + (int)(row % qn);
    int lim = min(t + 1 + BUG, nk);  // keys [0, lim)
    const float* sr = s + row * nk;
    T* pr = p + row * nk;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < lim; j += blockDim.x) m = fmaxf(m, sr[j]);
    m = block_reduce(m, true, sh);
    float sum = 0.f;
    for (int j = threadIdx.x; j < lim; j += blockDim.x) sum += expf(sr[j] - m);
    sum = block_reduce(sum, false, sh);
    float inv = 1.f / sum;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) st(pr, j, j < lim ? expf(sr[j] - m) * inv : 0.f);
}

}  // namespace moss_enc

#define MOSS_ENC_KERNELS(PFX, BUG, T, SX)                                                                    \
    MOSS_KERNEL void PFX##_embed_##SX(T* out, const T* table, const float* ids, long L, long H) {             \
        moss_enc::embed_impl<T, BUG>(out, table, ids, L, H);                                                  \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_head_rope_##SX(T* out, const T* x, const float* w, const float* inv, long rows,    \
                                          int nh, int hd, float eps, int rot) {                               \
        moss_enc::head_rope_impl<T, BUG>(out, x, w, inv, rows, nh, hd, eps, rot);                             \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_attn_##SX(T* out, const T* q, const T* k, const T* v, int L, int H, int Hkv, int hd, \
                                     float scale) {                                                           \
        moss_enc::attn_impl<T, BUG>(out, q, k, v, L, H, Hkv, hd, scale);                                      \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_silu_mul_##SX(T* out, const T* g, const T* u, long n) {                            \
        moss_enc::silu_mul_impl<T, BUG>(out, g, u, n);                                                        \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_conv_##SX(T* out, const T* x, const float* w, long L, int C, int K) {              \
        moss_enc::conv_impl<T, BUG>(out, x, w, L, C, K);                                                      \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_silu_mul8_##SX(T* out, const T* g, const T* u, long n8) {                          \
        moss_enc::silu_mul8_impl<T, BUG>(out, g, u, n8);                                                      \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_conv8_##SX(T* out, const T* x, const float* wt, long L, int C, int K, long ldx) {  \
        moss_enc::conv8_impl<T, BUG>(out, x, wt, L, C, K, ldx);                                               \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_gates_##SX(float* g, float* beta, const T* a, const T* b, const float* alog,       \
                                      const float* dt, long n, int hv) {                                      \
        moss_encr::gates_impl<T, BUG>(g, beta, a, b, alog, dt, n, hv, hv);                                         \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_grms_##SX(T* out, const T* x, const T* z, const float* w, long rows, int d,        \
                                     float eps) {                                                             \
        moss_enc::grms_impl<T, BUG>(out, x, z, w, rows, d, eps);                                              \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_grms8_##SX(T* out, const T* x, const T* z, const float* w, long rows, int d,       \
                                      float eps) {                                                            \
        moss_encr::grms8_impl<T, BUG>(out, x, z, w, rows, d, eps, 1, d);                                             \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_csoftmax_##SX(T* p, const float* s, int qn, int nk, int i0) {                   \
        moss_enc::csoftmax_impl<T, BUG>(p, s, qn, nk, i0);                                                    \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_gdr_##SX(T* out, const T* q, const T* k, const T* v, const float* g,              \
                                    const float* beta, int L, int Hk, int Hv, int dk, int dv, int dvb) {      \
        moss_enc::gdr_impl<T, BUG>(out, q, k, v, g, beta, L, Hk, Hv, dk, dv, dvb);                            \
    }

MOSS_PRODUCTION(MOSS_ENC_KERNELS(moss_enc, 0, __nv_bfloat16, bf16))
MOSS_PRODUCTION(MOSS_ENC_KERNELS(moss_enc, 0, float, f32))
MOSS_CONTROL(MOSS_ENC_KERNELS(moss_ctl_enc, 1, __nv_bfloat16, bf16))
MOSS_CONTROL(MOSS_ENC_KERNELS(moss_ctl_enc, 1, float, f32))
