// Encoder ops that read their inputs in place out of a wider row (crates/moss-cuda/src/encoder/strided_row_ops.rs):
// the DeltaNet's in_proj_qkv | z | a | b and the MLP's gate | up run as one GEMM each, whose
// output rows hold every part side by side; these kernels read their part with a row stride
// instead of a narrowed copy. Same formulas and rounding points as the contiguous kernels of
// encoder_ops.cu (fp32 inside, one rounding into the output). moss_ctl_enc_* carry a planted bug.
#include "elem.cuh"
#include "row_impl.cuh"  // gates_impl, grms8_impl

namespace moss_encs {
using namespace moss_elem;

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

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

}  // namespace moss_encs

#define MOSS_ENC_STRIDED(PFX, BUG, T, SX)                                                                     \
    MOSS_KERNEL void PFX##_gates_s_##SX(float* g, float* beta, const T* a, const T* b, const float* alog,     \
                                        const float* dt, long n, int hv, long ld) {                          \
        moss_encr::gates_impl<T, BUG>(g, beta, a, b, alog, dt, n, hv, ld);                                    \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_grms8s_##SX(T* out, const T* x, const T* z, const float* w, long rows, int d,      \
                                       float eps, int zh, long ldz) {                                         \
        moss_encr::grms8_impl<T, BUG>(out, x, z, w, rows, d, eps, zh, ldz);                                     \
    }                                                                                                         \
    MOSS_KERNEL void PFX##_silu_mul8r_##SX(T* out, const T* g, const T* u, long rows, int f, long ld) {       \
        moss_encs::silu_mul8r_impl<T, BUG>(out, g, u, rows, f, ld);                                           \
    }

MOSS_PRODUCTION(MOSS_ENC_STRIDED(moss_enc, 0, __nv_bfloat16, bf16))
MOSS_PRODUCTION(MOSS_ENC_STRIDED(moss_enc, 0, float, f32))
MOSS_CONTROL(MOSS_ENC_STRIDED(moss_ctl_enc, 1, __nv_bfloat16, bf16))
MOSS_CONTROL(MOSS_ENC_STRIDED(moss_ctl_enc, 1, float, f32))
