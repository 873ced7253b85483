// The standalone unit of bench/encew_bench.py (the old and new encoder kernels outside sm90a), as
// run at commit 886f2c5 (cuda/enc_conv.cu, the conv8t kernel, was removed after that call: no gain):
//   nvcc --cubin -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I cuda bench/encew_unit.cu
#include "attention_causal.cu"
#include "enc_addnorm.cu"
#if __has_include("enc_conv.cu")  // at 886f2c5 only
#include "enc_conv.cu"
#endif
#include "encoder.cu"
