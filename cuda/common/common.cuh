// Shared helpers for moss kernels. Every kernel is extern "C" with a unique name.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#define MOSS_KERNEL extern "C" __global__

// Two images from the same sources: the production fatbins, and the check image that only
// `moss check` loads (compiled with -DMOSS_CHECK_IMAGE): the planted controls (`moss_ctl_*`,
// `*_control`), each a twin of a production kernel with a bug the gates must reject.
// MOSS_PRODUCTION(...) keeps its argument only in the production image, MOSS_CONTROL(...) only
// in the check image; kernels written out are inside #ifndef / #ifdef MOSS_CHECK_IMAGE.
#ifdef MOSS_CHECK_IMAGE
#define MOSS_PRODUCTION(...)
#define MOSS_CONTROL(...) __VA_ARGS__
#else
#define MOSS_PRODUCTION(...) __VA_ARGS__
#define MOSS_CONTROL(...)
#endif

// The instantiations of an op's kernel macro `M`: every (activation, vector) dtype pair,
// `M(NAME, BUG, TX, SX, TV, SV)` (type and kernel-name suffix, bf16 / f32 each; `bf16` is the
// including file's alias of __nv_bfloat16), or every unit of the byte-moving kernels,
// `M(NAME, BUG, T, S)` (2, 4, 8, 16 bytes).
#define MOSS_EACH_TX_TV(M, NAME, BUG) \
    M(NAME, BUG, bf16, bf16, bf16, bf16) M(NAME, BUG, bf16, bf16, float, f32) M(NAME, BUG, float, f32, bf16, bf16) M(NAME, BUG, float, f32, float, f32)
// The DiT norms over the residual stream: every (activation, vector) pair with the output in the
// activation's type, `M(NAME_SX_SV, BUG, TY = TX, TX, TV)`, and the f32 stream of a bf16 forward
// with a bf16 output, `M(NAME_f32_bf16_to_bf16, BUG, bf16, float, bf16)`.
#define MOSS_EACH_STREAM_NORM(M, NAME, BUG)                                                                    \
    M(NAME##_bf16_bf16, BUG, bf16, bf16, bf16) M(NAME##_bf16_f32, BUG, bf16, bf16, float)                      \
    M(NAME##_f32_bf16, BUG, float, float, bf16) M(NAME##_f32_f32, BUG, float, float, float)                     \
    M(NAME##_f32_bf16_to_bf16, BUG, bf16, float, bf16)
#define MOSS_EACH_UNIT(M, NAME, BUG) \
    M(NAME, BUG, unsigned short, u2) M(NAME, BUG, unsigned int, u4) M(NAME, BUG, uint2, u8) M(NAME, BUG, uint4, u16)
