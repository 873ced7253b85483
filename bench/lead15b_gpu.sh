#!/usr/bin/env bash
# Session 15, lead's third call: tma2y (tma2x with the barrier waits and remote arrivals at CTA
# scope) against tma2x: kernels alone at 4096 / 128 / 200, ncu stall reasons of tma2y, moss check
# (the tma2y rows + controls), moss bench-encode at 4096 tokens alternating twice.
#   bash bench/lead15b_gpu.sh DIR OUT   (DIR: gdr.cubin, gdr_tma.cubin, gdrtma_bench.py; BIN default .final/moss)
set -uo pipefail
D=${1:?DIR}; OUT=${2:?OUT}; BIN=${BIN:-.final/moss}; mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
E=/tmp/te
log "kernels alone"
GDR_VARIANTS="tma2x tma2y" GDR_L="4096 128 200" timeout 60 python3 $D/gdrtma_bench.py $D/gdr.cubin $D/gdr_tma.cubin > $OUT/kernels.txt 2>&1; echo "kernels rc=$?"
tail -9 $OUT/kernels.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu tma2y"
GDR_VARIANTS="tma2y" GDR_L=4096 timeout 40 $NCU --clock-control none --csv --page raw --print-units base \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,smsp__issue_active.avg.pct_of_peak_sustained_active' \
  -k "regex:^moss_enc_gdr_tma2y_bf16$" --launch-count 1 python3 $D/gdrtma_bench.py $D/gdr.cubin $D/gdr_tma.cubin > $OUT/ncu.csv 2>/dev/null
python3 - $OUT/ncu.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if len(rows) < 3: print("  no ncu rows"); sys.exit()
m = dict(zip(rows[0], rows[-1]))
f = lambda x: float(x) if x.replace('.', '', 1).isdigit() else float('nan')
st = sorted(((k.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""), f(v)) for k, v in m.items() if "issue_stalled" in k), key=lambda kv: -kv[1])
print(f"  tma2y: issue active {f(m.get('smsp__issue_active.avg.pct_of_peak_sustained_active', 'nan')):.1f} %; stalls: " + ", ".join(f"{k} {v:.2f}" for k, v in st[:6]))
PY
rm -f $OUT/ncu.csv
(timeout 60 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1) &
MK=$!
log "moss check"
timeout 70 $BIN check --device cuda --model golden/tiny-a > /tmp/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" /tmp/check.txt; grep -E "tma2y" /tmp/check.txt > $OUT/check_tma2y.txt
wait $MK
for r in 1 2; do
  for v in tma2x tma2y; do
    MOSS_GDR_STATE=$v timeout 30 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --device cuda --reps 7 > $OUT/enc_${v}_$r.jsonl 2>/dev/null
    python3 -c "
import json
for l in open('$OUT/enc_${v}_$r.jsonl'):
    if l.startswith('{'):
        j=json.loads(l); p=j['profile_ms']
        print('  $v round $r: device', round(j['device_median_ms'],2), 'delta rule', round(p['gated_delta_rule']['ms'],2))"
  done
done
log "done"
