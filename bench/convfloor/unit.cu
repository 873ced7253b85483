// The standalone unit of bench/convfloor/kbench.py: the conv and gated-RMSNorm kernels, old and new.
#include "../../cuda/encoder.cu"
#include "../../cuda/enc_strided.cu"
#include "../../cuda/enc_floor.cu"
