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
