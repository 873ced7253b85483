#!/usr/bin/env bash
# Confirmation run of the committed default (fused2c state pass), one device call: moss check while
# the random full-size text-encoder weights are written; moss bench-encode at 128 and 4096 tokens,
# the default and MOSS_GDR_STATE=fused2 alternating (drift under sustained load); transformers
# bf16 + fp32 on the same weights and ids; both sides' hidden states against the fp32 run.
#   OUT=$OUT bash bench/final5_gpu.sh          (BIN default .final/moss)
set -uo pipefail
BIN=${BIN:-.final/moss}
O=/tmp/final5out; E=/tmp/final/text_encoder; mkdir -p "$O" "${OUT:=/tmp/finalout}"
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
el "== moss check --device cuda (text-encoder weights written meanwhile)"
(python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -2 > $O/make.txt) &
MK=$!
timeout 200 $BIN check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$O/check.txt"
wait $MK; cat $O/make.txt
enc() { # tag, env...
  local tag=$1; shift
  env "$@" timeout 90 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt \
    --out $E/moss_bf16_128.st --out $E/moss_bf16_4096.st --device cuda --reps 7 > $O/enc_$tag.jsonl 2>$O/enc_$tag.err
  echo "bench-encode $tag rc=$?"
  python3 - $O/enc_$tag.jsonl $tag <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        p = j.get("profile_ms", {})
        top = sorted(((k, v["ms"] if isinstance(v, dict) else v) for k, v in p.items()), key=lambda kv: -kv[1])[:6]
        print(f"  moss {sys.argv[2]:10} L={j['tokens']:5} median {j['median_ms']:.2f} ms, device {j.get('device_median_ms', float('nan')):.2f} ms, download {j.get('download_median_ms', float('nan')):.2f} ms")
        if j['tokens'] > 1000 and top:
            print("     profile: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
}
el "== encoder"
enc default; enc fused2 MOSS_GDR_STATE=fused2; enc default_b; enc fused2_b MOSS_GDR_STATE=fused2
TF_REPS=${TF_REPS:-7} timeout 200 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v -i "warn\|falling back" | tail -6
enc default_c
cp $O/enc_default_c.jsonl $E/moss_bf16.jsonl
python3 bench/encoder_gpu.py compare $E 2>&1 | tee $O/enc_compare.txt
el "done"
tar czf "$OUT/final5.tgz" -C "$O" . && cp "$O/log.txt" "$OUT/log.txt"
