// The standalone unit of bench/encrows/rowbench.py: the previous row kernels and the new ones.
#include "../../cuda/encoder.cu"
#include "../../cuda/enc_strided.cu"
#include "../../cuda/enc_addnorm.cu"
#include "../../cuda/enc_floor.cu"
