#!/usr/bin/env bash
# A short device call after making the halo VAE kernels the default: golden decodes on CUDA
# (default and MOSS_VAE_KERNELS=classic) against the CPU decode and golden pixels; repeat and
# batch-vs-single byte identity of `moss generate --device cuda` on the golden checkpoints.
# Needs the release binary in $BIN (default .final/moss). Usage: bash bench/verify_default_gpu.sh
set -uo pipefail
BIN=${BIN:-.final/moss}; W=/tmp/verify; mkdir -p $W
python3 bench/vae_bench.py golden-z $W > /dev/null
for spec in "tiny-a 64x64" "tiny-b 96x64"; do
  set -- $spec
  $BIN decode $W/$1.z.f32 --model golden/$1 --size $2 --device cpu --out $W/$1.cpu.png -q
  for k in default classic; do
    MOSS_VAE_KERNELS=$([ $k = classic ] && echo classic) $BIN decode $W/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $W/$1.$k.png -q || echo "decode $1 $k failed"
    echo "$1 ($2), $k kernels:"; python3 bench/vae_bench.py cmp-png $W/$1.$k.png $W/$1.cpu.png $W/$1.pixels.u8
  done
done
for c in tiny-a tiny-b; do
  s=64x64; [ $c = tiny-b ] && s=96x64
  N=4 SIZE=$s STEPS=4 DEVICE=cuda bash bench/batch_bench.sh $BIN golden/$c $W/batch-$c 2>&1 | grep -E "identical|speedup"
done
