#!/usr/bin/env bash
# Session 17, lead's second call: this build's gates (the qkrope table path, the GEMM pins) and the
# encoder at 4096 / 128 tokens: default against MOSS_ENC_QKROPE=inline and MOSS_GEMM_PIN=0,
# alternating, two rounds, with the events profile.
#   bash bench/lead17b_gpu.sh OUT   (BIN default .dev-lead17/moss)
set -uo pipefail
OUT=${1:?OUT}; BIN=${BIN:-.dev-lead17/moss}; mkdir -p "$OUT/f"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
E=/tmp/te
(timeout 90 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1) &
MK=$!
timeout 200 $BIN check --device cuda --model golden/tiny-a > $OUT/f/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" $OUT/f/check.txt; grep -E "qkrope|rope" $OUT/f/check.txt | head -20
wait $MK
log "check"
for r in 1 2; do
  for v in default MOSS_ENC_QKROPE=inline MOSS_GEMM_PIN=0; do
    tag=${v//=/_}_$r
    if [ $v = default ]; then e=""; else e=$v; fi
    env $e timeout 60 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 7 > $OUT/f/enc_$tag.jsonl 2>$OUT/f/enc_$tag.err
    echo "$tag rc=$?"
    python3 - $OUT/f/enc_$tag.jsonl $tag <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l); e = j["events_ms"]
        print(f"  {sys.argv[2]:26} L={j['tokens']:5}: device median {j['device_median_ms']:.2f}; events span {j['events_span_ms']:.2f}: linear {e['linear']['ms']:.2f}, head_norm_rope {e['head_norm_rope']['ms']:.3f}")
PY
  done
done
log "done"
tar -C $OUT -czf $OUT/files.tgz f && rm -rf $OUT/f
