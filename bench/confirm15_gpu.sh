#!/usr/bin/env bash
# Session 15 confirmation of the committed default (tma2x state pass), one device call: moss check
# while random full-size text-encoder weights are written; moss bench-encode at 128 and 4096 tokens
# before and after transformers bf16 + fp32 on the same weights and ids; both sides' hidden states
# against the fp32 run.   OUT=$OUT bash bench/confirm15_gpu.sh   (BIN default .final/moss)
set -uo pipefail
BIN=${BIN:-.final/moss}; O=${OUT:-/tmp/confirm15}; E=/tmp/te; mkdir -p "$O"
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
(python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1 > $O/make.txt) &
MK=$!
el "moss check"
timeout 200 $BIN check --device cuda --model golden/tiny-a > $O/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" $O/check.txt
wait $MK; cat $O/make.txt
enc() {
  timeout 60 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt \
    --out $E/moss_bf16_128.st --out $E/moss_bf16_4096.st --device cuda --reps 7 > $O/enc_$1.jsonl 2>$O/enc_$1.err
  echo "bench-encode $1 rc=$?"
  python3 -c "
import json
for l in open('$O/enc_$1.jsonl'):
    if l.startswith('{'):
        j=json.loads(l); p=j['profile_ms']
        print('  moss $1 L', j['tokens'], 'device', round(j['device_median_ms'],2), 'host', round(j['median_ms'],2), 'delta rule', round(p['gated_delta_rule']['ms'],2))"
}
el "encoder"; enc a
TF_REPS=7 timeout 200 python3 bench/encoder_gpu.py tf $E 2>&1 | grep "transformers bf16\|transformers fp32"
enc b
cp $O/enc_b.jsonl $E/moss_bf16.jsonl
python3 bench/encoder_gpu.py compare $E 2>&1 | tee $O/compare.txt | python3 -c "
import json,sys
for l in sys.stdin:
    if l.startswith('{'):
        j=json.loads(l); print('  L', j['L'], 'moss device', round(j['moss_bf16_device_ms'],2), 'tf bf16', round(j['tf_bf16_ms'],1), 'speedup device', round(j['speedup_device_vs_tf_bf16'],2), 'host', round(j['speedup_vs_tf_bf16'],2), 'relL2 moss / tf bf16', '%.3e / %.3e' % (j['moss_bf16']['relL2_vs_tf_fp32'], j['tf_bf16']['relL2_vs_tf_fp32']))"
el "done"
