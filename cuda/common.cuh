// Shared helpers for moss kernels. Every kernel is extern "C" with a unique name.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#define MOSS_KERNEL extern "C" __global__
