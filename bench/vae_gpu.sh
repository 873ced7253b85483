#!/usr/bin/env bash
# The VAE decoder on the GPU (one device call): kernel gates, golden pixels cuda vs cpu, then the
# full-size decoder (widths 96/192/384/384, random weights) at 1024x1024 and 2048x2048 against
# diffusers fp32 (TF32 off) and a float64 decode. Needs .vaetest/moss or $MOSS_BIN (release build)
# and .whl/diffusers-*.whl carried. Everything lands in $OUT (log.txt, tables).
# Run: bash bench/vae_gpu.sh  (on the device; carry .vaetest and .whl). The full-size rows use
# the default (halo) kernels (VAE_FAST=0: MOSS_VAE_KERNELS=classic); each size also runs the classic kernels once.
set -u
OUT=${OUT:-/tmp/vaeout}; mkdir -p "$OUT"
W=/tmp/vaework; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
M=${MOSS_BIN:-./.vaetest/moss}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "== moss check --device cuda --model golden/tiny-a (VAE rows and summary)"
t=$(date +%s)
$M check --device cuda --model golden/tiny-a > $OUT/check.txt 2>&1; echo "check rc=$?"
echo "check took $(( $(date +%s) - t )) s"
grep -E "^kernel |vae|VAE|kernel gates|FAIL|ACCEPTED" $OUT/check.txt
echo "== golden: moss decode --device cuda vs --device cpu vs golden pixels"
python3 bench/vae_bench.py golden-z $W
for spec in "tiny-a 64x64" "tiny-b 96x64"; do
  set -- $spec
  $M decode $W/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $W/$1.cuda.png -q || echo "cuda decode $1 failed"
  MOSS_VAE_KERNELS= $M decode $W/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $W/$1.fast.png -q || echo "fast decode $1 failed"
  MOSS_VAE_CONV=simt $M decode $W/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $W/$1.simt.png -q || echo "simt decode $1 failed"
  $M decode $W/$1.z.f32 --model golden/$1 --size $2 --device cpu --out $W/$1.cpu.png -q || echo "cpu decode $1 failed"
  echo "$1 ($2), split-TF32 conv:"; python3 bench/vae_bench.py cmp-png $W/$1.cuda.png $W/$1.cpu.png $W/$1.pixels.u8
  echo "$1 ($2), default (halo) kernels:"; python3 bench/vae_bench.py cmp-png $W/$1.fast.png $W/$1.cpu.png $W/$1.pixels.u8
  echo "$1 ($2), SIMT conv:"; python3 bench/vae_bench.py cmp-png $W/$1.simt.png $W/$1.cpu.png $W/$1.pixels.u8
done
echo "== full size"
python3 bench/vae_bench.py make-ckpt $W || exit 1
for side in 1024 2048; do
  MOSS_VAE_KERNELS=$([ "${VAE_FAST:-1}" = 1 ] || echo classic) $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-f32 $W/moss$side.f32 --out-rgb $W/moss$side.rgb > $W/moss$side.json || echo "bench-vae $side failed"
  cat $W/moss$side.json
  MOSS_VAE_KERNELS=classic $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 1 | sed "s/^/classic kernels (tap-major conv, cuBLAS attention): /" | cut -c1-400
  [ $side = 1024 ] && MOSS_VAE_CONV=simt $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 1 | sed "s/^/simt: /" | cut -c1-400
  python3 bench/vae_bench.py ref $W $side || echo "ref $side failed"
  cp $W/table$side.json $OUT/ 2>/dev/null
done
