#!/usr/bin/env bash
# Session 16, lead's second call: moss check (with the tma2y rows; the first call's 70 s limit cut it
# short) and MOSS_GEMM_TUNE=1's per-shape choices at 4096 / 128 tokens (its stderr log).
#   bash bench/lead16b_gpu.sh OUT   (BIN default .final/moss)
set -uo pipefail
OUT=${1:?OUT}; BIN=${BIN:-.final/moss}; mkdir -p "$OUT/f"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
E=/tmp/te
(timeout 90 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1) &
MK=$!
log "moss check"
timeout 200 $BIN check --device cuda --model golden/tiny-a > $OUT/f/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" $OUT/f/check.txt; grep -E "tma2y" $OUT/f/check.txt
wait $MK
for r in 1 2; do
  for v in default tune; do
    if [ $v = tune ]; then export MOSS_GEMM_TUNE=1; else unset MOSS_GEMM_TUNE; fi
    timeout 40 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 7 > $OUT/f/enc_${v}_$r.jsonl 2>$OUT/f/enc_${v}_$r.err
    python3 -c "
import json
for l in open('$OUT/f/enc_${v}_$r.jsonl'):
    if l.startswith('{'):
        j=json.loads(l); p=j['profile_ms']
        print('  $v round $r: tokens', j['tokens'], 'device', round(j['device_median_ms'],2), [round(x,1) for x in j['device_forward_ms']], 'linear', round(p['linear']['ms'],2))"
  done
done
unset MOSS_GEMM_TUNE
grep "gemm tune" $OUT/f/enc_tune_1.err | head -40
tar -C $OUT -czf $OUT/files.tgz f && rm -rf $OUT/f
log "done"
