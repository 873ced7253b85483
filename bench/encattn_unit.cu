// The standalone unit of bench/encattn_bench.py (helper encattn): the old head_norm_rope and gate
// kernels and the new qkrope / gmulh kernels, outside sm90a:
//   nvcc --cubin -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I cuda bench/encattn_unit.cu
#include "enc_attn.cu"
#include "enc_strided.cu"
#include "encoder.cu"
