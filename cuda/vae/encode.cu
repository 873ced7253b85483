// The VAE encoder's one op beyond the decoder's (src/backend/cuda/vae/encode.rs; math on
// `VaeEncodeOps::conv2d_down2` in src/backend/ops/vae_encode.rs). diffusers' Downsample2D (pad
// right and bottom by one, 3x3 conv of stride 2) is the decoder's "same" 3x3 conv read at the
// odd pixels; the conv runs on the decoder's kernels, then:
//
// - moss_vae_pick_odd: out[p, y, x] = in[p, 2y + 1, 2x + 1] for every plane p (image x channel),
//   out [P, H/2, W/2] (floor), in [P, H, W]. Grid-stride, one output value a thread.
// moss_ctl_vae_pick_odd: the same with the even pixels (2y, 2x), for `moss check`.
#include "common.cuh"

namespace moss_vae_encode {

// BUG 1: the even pixels.
template <int BUG>
__device__ void pick_odd(float* __restrict__ out, const float* __restrict__ in, long planes, int h, int w) {
    const int oh = h / 2, ow = w / 2, o = BUG == 1 ? 0 : 1;
    const long total = planes * oh * ow;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        const int x = (int)(idx % ow);
        const long r = idx / ow;
        const int y = (int)(r % oh);
        const long p = r / oh;
        out[idx] = in[(p * h + 2 * y + o) * w + 2 * x + o];
    }
}

}  // namespace moss_vae_encode

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_vae_pick_odd(float* out, const float* in, long planes, int h, int w) {
    moss_vae_encode::pick_odd<0>(out, in, planes, h, w);
}
#endif
#ifdef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_ctl_vae_pick_odd(float* out, const float* in, long planes, int h, int w) {
    moss_vae_encode::pick_odd<1>(out, in, planes, h, w);
}
#endif
