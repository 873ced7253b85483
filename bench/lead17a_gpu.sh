#!/usr/bin/env bash
# Session 17, lead's first call: MOSS_GEMM_TUNE=1's candidates (configurations + median times) at
# 4096 / 128 tokens in three processes, to pin the clear winners (src/backend/cuda/gemm_pins.rs);
# the SM clock and power during a default bench-encode; ncu of the attention's q/k norm + RoPE.
#   bash bench/lead17a_gpu.sh OUT   (BIN default .dev-lead17/moss)
set -uo pipefail
OUT=${1:?OUT}; BIN=${BIN:-.dev-lead17/moss}; mkdir -p "$OUT/f"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
E=/tmp/te
timeout 90 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1
log "weights"
for r in 1 2 3; do
  MOSS_GEMM_TUNE=1 timeout 60 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 5 > $OUT/f/tune_$r.jsonl 2>$OUT/f/tune_$r.err
  echo "tune $r rc=$?"
done
python3 bench/gemm_tune_sum.py $OUT/f/tune_*.err | tee $OUT/f/tune_sum.txt
log "tune"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 50 > $OUT/f/smi.csv 2>&1 &
SMI=$!
timeout 60 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 7 > $OUT/f/default.jsonl 2>$OUT/f/default.err
echo "default rc=$?"
kill $SMI
python3 - $OUT/f/default.jsonl $OUT/f/tune_1.jsonl $OUT/f/tune_2.jsonl $OUT/f/tune_3.jsonl <<'PY'
import json, sys
for f in sys.argv[1:]:
    for l in open(f):
        if l.startswith("{"):
            j = json.loads(l)
            print(f"  {f.split('/')[-1]} L={j['tokens']}: device median {j['device_median_ms']:.2f} {[round(x, 1) for x in j['device_forward_ms']]}; linear (events) {j['events_ms']['linear']['ms']:.2f}; span {j['events_span_ms']:.2f}")
PY
python3 - $OUT/f/smi.csv <<'PY'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1])][1:]
sm = [float(r[1].split()[0]) for r in rows if len(r) > 4 and r[1].split()[0].replace('.', '').isdigit()]
pw = [float(r[3].split()[0]) for r in rows if len(r) > 4 and r[3].split()[0].replace('.', '').isdigit()]
if sm:
    print(f"  smi: {len(sm)} samples, SM clock min {min(sm):.0f} median {sorted(sm)[len(sm)//2]:.0f} max {max(sm):.0f} MHz; power max {max(pw):.0f} W median {sorted(pw)[len(pw)//2]:.0f} W")
PY
log "default + smi"
timeout 60 ncu --set full --clock-control none -k regex:"qkrope|gmulh" --launch-count 2 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --device cuda --reps 1 > $OUT/f/ncu_qkrope.txt 2>&1
echo "ncu rc=$?"
grep -E "qkrope|gmulh|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|One or More" $OUT/f/ncu_qkrope.txt | head -40
tar -C $OUT -czf $OUT/files.tgz f && rm -rf $OUT/f
log "done"
