#!/usr/bin/env bash
# Session 16, lead's last call: where the 4096-token forward's time goes without per-op syncs:
# bench-encode's new events profile (each op bracketed by two CUDA events, nothing synchronised)
# against the device median; the span less the ops' sum is GPU time between ops.
#   bash bench/lead16c_gpu.sh OUT   (BIN default .final/moss)
set -uo pipefail
OUT=${1:?OUT}; BIN=${BIN:-.final/moss}; mkdir -p "$OUT/f"
E=/tmp/te
timeout 90 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1
for r in 1 2; do
  timeout 60 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 7 > $OUT/f/enc_$r.jsonl 2>$OUT/f/enc_$r.err
  echo "round $r rc=$?"
  python3 - $OUT/f/enc_$r.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        ev = sorted(((k, v["ms"], v["calls"]) for k, v in j["events_ms"].items()), key=lambda t: -t[1])
        ps = sum(v["ms"] for v in j["profile_ms"].values())
        print(f"  L={j['tokens']}: device median {j['device_median_ms']:.2f} ms; events: span {j['events_span_ms']:.2f}, ops' sum {j['events_sum_ms']:.2f}, between ops {j['events_span_ms'] - j['events_sum_ms']:.2f}; synced profile sum {ps:.2f}")
        print("     " + ", ".join(f"{k} {ms:.2f} ({n})" for k, ms, n in ev))
PY
done
tar -C $OUT -czf $OUT/files.tgz f && rm -rf $OUT/f
