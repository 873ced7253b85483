// The sampling loop's elementwise step: CFG combine and the Euler update, in fp32.
//   v = v_u + g (v_c - v_u);  x += dsigma * v
#include "common.cuh"

#ifndef MOSS_CHECK_IMAGE
MOSS_KERNEL void moss_cfg_euler_f32(float* __restrict__ x, const float* __restrict__ v_c,
                                    const float* __restrict__ v_u, float guidance, float dsigma,
                                    int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = v_u ? v_u[i] + guidance * (v_c[i] - v_u[i]) : v_c[i];
        x[i] = x[i] + dsigma * v;
    }
}
#endif
