#!/usr/bin/env bash
# Session 16, lead's first call: (1) can the delta rule / a row op hide under a cuBLAS GEMM on a
# second stream (bench/gdrtma_bench.py GDR_OVERLAP=1); (2) tma2y against tma2x (bench/lead15b_gpu.sh);
# (3) MOSS_GEMM_TUNE=1 against the default, alternating.
#   bash bench/lead16a_gpu.sh DIR OUT   (DIR: gdr.cubin, gdr_tma.cubin; BIN default .final/moss)
set -uo pipefail
D=${1:?DIR}; OUT=${2:?OUT}; BIN=${BIN:-.final/moss}; mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
log "overlap probe"
GDR_OVERLAP=1 timeout 90 python3 bench/gdrtma_bench.py $D/gdr.cubin $D/gdr_tma.cubin > $OUT/overlap.txt 2>&1; echo "overlap rc=$?"
cat $OUT/overlap.txt | tail -8
BIN=$BIN bash bench/lead15b_gpu.sh $D $OUT
E=/tmp/te
for r in 1 2; do
  for v in default tune; do
    if [ $v = tune ]; then export MOSS_GEMM_TUNE=1; else unset MOSS_GEMM_TUNE; fi
    timeout 40 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 7 > $OUT/enc_${v}_$r.jsonl 2>$OUT/enc_${v}_$r.err
    python3 -c "
import json
for l in open('$OUT/enc_${v}_$r.jsonl'):
    if l.startswith('{'):
        j=json.loads(l); p=j['profile_ms']
        print('  $v round $r: tokens', j['tokens'], 'device', round(j['device_median_ms'],2), [round(x,1) for x in j['device_forward_ms']], 'linear', round(p['linear']['ms'],2))"
  done
done
unset MOSS_GEMM_TUNE
# (an nsys trace of the forward was attempted here: Nsight Systems is not installed there)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
log "done"
