#!/usr/bin/env bash
# Session 15, lead's second call: is the delta-rule state pass (tma2) bound by its compute warps'
# serial load -> mma chain, and does tma2x (operands a k-step ahead) help?
#   1. bench/gdrtma_bench.py: kernels alone (fused2c, tma2, tma2p, tma1, tma2x) at L = 128 / 4096 / 200;
#   2. ncu stall reasons (per issued instruction) of fused2c, tma2 and tma2x at L = 4096;
#   3. moss bench-encode at 4096 tokens: default (tma2) and MOSS_GDR_STATE=tma2x alternating, 3 rounds.
#   bash bench/lead15_gpu.sh DIR OUT   (DIR: gdr.cubin, gdr_tma.cubin, gdrtma_bench.py; BIN default .final/moss)
set -uo pipefail
D=${1:?DIR}; OUT=${2:?OUT}; BIN=${BIN:-.final/moss}; mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
log "kernels alone"
timeout 90 python3 $D/gdrtma_bench.py $D/gdr.cubin $D/gdr_tma.cubin > $OUT/kernels.txt 2>&1; echo "kernels rc=$?"
tail -17 $OUT/kernels.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in fused2c tma2 tma2x; do
  log "ncu $v"
  GDR_VARIANTS="$v" GDR_L=4096 timeout 60 $NCU --clock-control none --csv --page raw --print-units base \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__warps_active.avg.per_cycle_active' \
    -k "regex:^moss_enc_gdr_${v}_bf16$" --launch-count 1 python3 $D/gdrtma_bench.py $D/gdr.cubin $D/gdr_tma.cubin > $OUT/ncu_$v.csv 2> $OUT/ncu_$v.err
  echo "ncu $v rc=$?"
  python3 - $OUT/ncu_$v.csv $v <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if len(rows) < 3:
    print("  no ncu rows"); sys.exit()
h, vals = rows[0], rows[-1]
m = {k: v for k, v in zip(h, vals)}
def f(x):
    try: return float(x)
    except ValueError: return float("nan")
st = sorted(((k.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""), f(v)) for k, v in m.items() if "issue_stalled" in k), key=lambda kv: -kv[1])
print(f"  {sys.argv[2]}: {f(m.get('gpu__time_duration.sum')) / 1e3:.1f} us, issue active {f(m.get('smsp__issue_active.avg.pct_of_peak_sustained_active')):.1f} %, warps/scheduler {f(m.get('smsp__warps_active.avg.per_cycle_active')):.2f}")
print("  stalls per issued instruction: " + ", ".join(f"{k} {v:.2f}" for k, v in st[:8]))
PY
done
log "encoder weights"
E=/tmp/te; timeout 90 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1
for r in 1 2 3; do
  for v in tma2 tma2x; do
    MOSS_GDR_STATE=$v timeout 40 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --device cuda --reps 7 > $OUT/enc_${v}_$r.jsonl 2>/dev/null
    python3 -c "
import json,sys
for l in open('$OUT/enc_${v}_$r.jsonl'):
    if l.startswith('{'):
        j=json.loads(l); p=j['profile_ms']
        print('  $v round $r: L', j['tokens'], 'device', round(j['device_median_ms'],2), 'delta rule', round(p['gated_delta_rule']['ms'],2), 'forwards', [round(x,1) for x in j['device_forward_ms']])"
  done
done
log "done"
