#!/usr/bin/env bash
# End to end: moss generate, 1024x1024, 50 steps, seed 42 (wall time of the whole process, its --json timings), the PNG and its sha256; with two binaries, whether the PNGs are byte-identical.
#   bench/e2e.sh CKPT OUT_DIR TAG=MOSS_BIN [TAG=MOSS_BIN ...]
# CKPT: a full-size checkpoint (bench/full_ckpt.sh); tables and files go to OUT_DIR. Part of bench/run_all.sh.
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; shift 2; W=${WORK:-/tmp/moss-bench}; mkdir -p "$OUT" "$W"
P="a lighthouse at dusk, oil painting"
echo "| moss generate 1024x1024, 50 steps | exit | wall s | encode / denoise / decode s | PNG sha256 |" | tee $OUT/e2e.md
echo "|---|---:|---:|---|---|" | tee -a $OUT/e2e.md
for b in "$@"; do
  t=${b%%=*}; s=$(date +%s.%N)
  ${b#*=} generate --device cuda --model $F --prompt "$P" --size 1024x1024 --steps 50 --seed 42 --json --out $OUT/e2e_$t.png \
    > $OUT/e2e_$t.json; rc=$?; wall=$(python3 -c "import time; print(f'{time.time() - $s:.2f}')")
  st=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])).get('timings', {}); print(' / '.join(f'{j[k]:.2f}' for k in ('encode_s', 'denoise_s', 'decode_s')))" $OUT/e2e_$t.json 2>/dev/null)
  echo "| $t | $rc | $wall | ${st:-?} | $(sha256sum < $OUT/e2e_$t.png | cut -c1-64) |" | tee -a $OUT/e2e.md
done
[ $# -eq 2 ] && { cmp -s $OUT/e2e_${1%%=*}.png $OUT/e2e_${2%%=*}.png && echo "SAME PICTURE (byte-identical PNGs)" || echo "PICTURES DIFFER"; } | tee -a $OUT/e2e.md
