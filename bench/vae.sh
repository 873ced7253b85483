#!/usr/bin/env bash
# VAE stage, 1024x1024, fp32: moss bench-vae (median of 5) vs diffusers AutoencoderKLFlux2 fp32, TF32 off (CUDA events, median of 5).
#   bench/vae.sh CKPT OUT_DIR TAG=MOSS_BIN [TAG=MOSS_BIN ...]
# CKPT: a full-size checkpoint (bench/full_ckpt.sh); tables and files go to OUT_DIR. Part of bench/run_all.sh.
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; shift 2; W=${WORK:-/tmp/moss-bench}; mkdir -p "$OUT" "$W"
python3 -c "import torch; torch.randn(1, 128, 64, 64, generator=torch.Generator().manual_seed(11)).numpy().astype('<f4').tofile('$W/z1024.f32')"
for b in "$@"; do
  t=${b%%=*}
  timeout 90 ${b#*=} bench-vae --model $F --device cuda --latents $W/z1024.f32 --reps 5 --out-f32 $W/vae_$t.f32 \
    --out-rgb $W/vae_$t.rgb > $OUT/vae_$t.json; echo "$t bench-vae rc=$?"
done
[ $# -eq 2 ] && { cmp -s $W/vae_${1%%=*}.rgb $W/vae_${2%%=*}.rgb && echo "pixels byte-identical" || echo "PIXELS DIFFER"; }
timeout 150 python3 bench/vae.py table $W $OUT 1024 $F | tee $OUT/vae.md
