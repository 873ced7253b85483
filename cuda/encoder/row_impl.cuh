// Row kernels shared by cuda/encoder/encoder_ops.cu (contiguous inputs) and cuda/encoder/strided_row_ops.cu (inputs read in
// place out of a wider GEMM output row): the Gated-DeltaNet gates and the vectorised gated RMSNorm,
// each taking its input's row stride. fp32 inside, one rounding into the output; BUG 1 is the
// planted control of moss_ctl_enc_*.
#pragma once
#include "elem.cuh"

namespace moss_encr {
using namespace moss_elem;

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// ---- DeltaNet gates from a, b with row stride lda (hv when contiguous): g = −exp(A_log)·softplus(a + dt_bias),
// beta = sigmoid(b), both f32 [L, hv] contiguous. BUG 1: softplus left out. ----------------------
template <typename T, int BUG>
__device__ void gates_impl(float* g, float* beta, const T* a, const T* b, const float* alog, const float* dt,
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

// ---- gated RMSNorm: rows r = t·zh + h of width d; z row at t·ldz + h·d (zh = 1, ldz = d when z is
// contiguous).
// x·rsqrt(mean(x²)+eps)·w·silu(z), 16 lanes per row, 8 elements a lane a step (d % 8 == 0).
// BUG 1: sigmoid(z) (as grms8). --------------------------------------------------------------------
template <typename T, int BUG>
__device__ void grms8_impl(T* out, const T* x, const T* z, const float* w, long rows, int d, float eps, int zh,
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

}  // namespace moss_encr
