// Encoder ops that read their inputs in place out of a wider row (src/backend/cuda/enc_strided.rs):
// the DeltaNet's in_proj_qkv | z | a | b and the MLP's gate | up run as one GEMM each, whose
// output rows hold every part side by side; these kernels read their part with a row stride
// instead of a narrowed copy. Same formulas and rounding points as the contiguous kernels of
// encoder.cu (fp32 inside, one rounding into the output). moss_ctl_enc_* carry a planted bug.
#include "elem.cuh"

namespace moss_encs {
using namespace moss_elem;

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// ---- DeltaNet gates from strided a, b (row stride ld): g = −exp(A_log)·softplus(a + dt_bias),
// beta = sigmoid(b), both f32 [L, hv] contiguous. BUG 1: softplus left out. ----------------------
template <typename T, int BUG>
__device__ void gates_s_impl(float* g, float* beta, const T* a, const T* b, const float* alog, const float* dt,
                             long n, int hv, long lda) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long t = i / hv;
        int h = (int)(i - t * hv);
        float x = ld(a, t * lda + h) + dt[h];
        float sp = BUG == 1 ? x : (x > 20.f ? x : log1pf(expf(x)));
        g[i] = -expf(alog[h]) * sp;
        beta[i] = 1.f / (1.f + expf(-ld(b, t * lda + h)));
    }
}

// ---- gated RMSNorm with z read in place: rows r = t·zh + h of width d; z row at t·ldz + h·d.
// x·rsqrt(mean(x²)+eps)·w·silu(z), 16 lanes per row, 8 elements a lane a step (d % 8 == 0).
// BUG 1: sigmoid(z) (as grms8). --------------------------------------------------------------------
template <typename T, int BUG>
__device__ void grms8s_impl(T* out, const T* x, const T* z, const float* w, long rows, int d, float eps, int zh,
                            long ldz) {
    int sub = threadIdx.x & 15;
    long row = (long)blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
    bool live = row < rows;
    long rr = live ? row : 0;
    const T* xr = x + rr * d;
    const T* zr = z + (rr / zh) * ldz + (rr % zh) * d;
    float ss = 0.f;
    for (int i = sub * 8; i < d; i += 128) {
        float v[8];
        ld8(xr, i, v);
#pragma unroll
        for (int e = 0; e < 8; e++) ss += v[e] * v[e];
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (!live) return;
    float r = rsqrtf(ss / (float)d + eps);
    for (int i = sub * 8; i < d; i += 128) {
        float v[8], zz[8];
        ld8(xr, i, v);
        ld8(zr, i, zz);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float gt = BUG == 1 ? 1.f / (1.f + expf(-zz[e])) : silu(zz[e]);
            v[e] = v[e] * r * w[i + e] * gt;
        }
        st8(out + row * d, i, v);
    }
}

// ---- silu(gate)·up over rows: gate at g[t·ld + j], up at u[t·ld + j], out [rows, f] contiguous
// (f % 8 == 0, ld % 8 == 0). BUG 1: silu(up)·gate. ------------------------------------------------
template <typename T, int BUG>
__device__ void silu_mul8r_impl(T* out, const T* g, const T* u, long rows, int f, long ld) {
    const int f8 = f / 8;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * f8; i += (long)gridDim.x * blockDim.x) {
        long t = i / f8;
        long j = (i - t * f8) * 8;
        float a[8], b[8], o[8];
        ld8(g, t * ld + j, a);
        ld8(u, t * ld + j, b);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = BUG == 1 ? silu(b[e]) * a[e] : silu(a[e]) * b[e];
        st8(out, t * f + j, o);
    }
}

// ---- the attention's output gate: out[r, c] = o[r, c] · sigmoid(gate[r·ldg + c]), rows r of width
// d (d % 8 == 0, ldg % 8 == 0). BUG 1: sigmoid(−gate). ----------------------------------------------
template <typename T, int BUG>
__device__ void gmul8_impl(T* out, const T* o, const T* gate, long rows, int d, long ldg) {
    const int d8 = d / 8;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * d8; i += (long)gridDim.x * blockDim.x) {
        long r = i / d8;
        long c = (i - r * d8) * 8;
        float a[8], b[8];
        ld8(o, r * d + c, a);
        ld8(gate, r * ldg + c, b);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] *= 1.f / (1.f + expf(BUG == 1 ? b[e] : -b[e]));
        st8(out, r * d + c, a);
    }
}
}  // namespace moss_encs

#define MOSS_ENC_STRIDED(PFX, BUG, T, SX)                                                                     \
    MOSS_KERNEL void PFX##_gates_s_##SX(float* g, float* beta, const T* a, const T* b, const float* alog,     \
                                        const float* dt, long n, int hv, long ld) {                          \
        moss_encs::gates_s_impl<T, BUG>(g, beta, a, b, alog, dt, n, hv, ld);                                  \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_grms8s_##SX(T* out, const T* x, const T* z, const float* w, long rows, int d,      \
                                       float eps, int zh, long ldz) {                                         \
        moss_encs::grms8s_impl<T, BUG>(out, x, z, w, rows, d, eps, zh, ldz);                                  \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_silu_mul8r_##SX(T* out, const T* g, const T* u, long rows, int f, long ld) {       \
        moss_encs::silu_mul8r_impl<T, BUG>(out, g, u, rows, f, ld);                                           \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_gmul8_##SX(T* out, const T* o, const T* gate, long rows, int d, long ldg) {        \
        moss_encs::gmul8_impl<T, BUG>(out, o, gate, rows, d, ldg);                                            \
    }

MOSS_ENC_STRIDED(moss_enc, 0, __nv_bfloat16, bf16)
MOSS_ENC_STRIDED(moss_enc, 0, float, f32)
MOSS_ENC_STRIDED(moss_ctl_enc, 1, __nv_bfloat16, bf16)
MOSS_ENC_STRIDED(moss_ctl_enc, 1, float, f32)
