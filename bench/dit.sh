#!/usr/bin/env bash
# DiT stage, 1024x1024, 50 steps, bf16: moss bench-dit (one forward median of 5, CUDA events; 50 guided steps) vs golden/dit_ref.py eager and torch.compile per block (bench/dit.py torch).
#   bench/dit.sh CKPT OUT_DIR TAG=MOSS_BIN [TAG=MOSS_BIN ...]
# CKPT: a full-size checkpoint (bench/full_ckpt.sh); tables and files go to OUT_DIR. Part of bench/run_all.sh.
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; shift 2; W=${WORK:-/tmp/moss-bench}; mkdir -p "$OUT" "$W"
for b in "$@"; do
  t=${b%%=*}
  timeout 120 ${b#*=} bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
    --steps 50 --forwards 5 --save-velocity $W/dit_$t.vel > $OUT/dit_$t.json; echo "$t bench-dit rc=$?"
done
[ $# -eq 2 ] && { cmp -s $W/dit_${1%%=*}.vel $W/dit_${2%%=*}.vel && echo "velocities byte-identical" || echo "VELOCITIES DIFFER"; }
b=${!#}; timeout 300 python3 bench/dit.py torch $F $W/dit_${b%%=*}.vel $OUT/dit_torch.json > $OUT/dit_torch.log 2>&1; echo "torch rc=$?"
python3 bench/dit.py table $OUT | tee $OUT/dit.md
