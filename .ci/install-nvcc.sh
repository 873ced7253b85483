#!/usr/bin/env bash
# Installs the pinned nvcc 13.0 from PyPI into $1 (default .nvcc) and prints the nvcc path.
# Pinned to 13.0.x: the GPU machine's driver is CUDA 13.0, and PTX from a newer toolkit does not JIT there.
set -euo pipefail
dir=${1:-.nvcc}
if [ ! -x "$dir/nvidia/cu13/bin/nvcc" ]; then
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dir" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
    nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 >&2
fi
echo "$(cd "$dir" && pwd)/nvidia/cu13/bin/nvcc"
