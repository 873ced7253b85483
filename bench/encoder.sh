#!/usr/bin/env bash
# Encoder stage, 128 tokens: moss bench-encode (device forwards, CUDA events, median of 7) vs transformers Qwen3_5TextModel bf16 (median of 7 after a warm-up, CUDA events).
#   bench/encoder.sh CKPT OUT_DIR TAG=MOSS_BIN [TAG=MOSS_BIN ...]
# CKPT: a full-size checkpoint (bench/full_ckpt.sh); tables and files go to OUT_DIR. Part of bench/run_all.sh.
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; shift 2; W=${WORK:-/tmp/moss-bench}; mkdir -p "$OUT" "$W"
E=$F/text_encoder
for b in "$@"; do
  t=${b%%=*}
  timeout 90 ${b#*=} bench-encode --model $E --ids-file $E/ids128.txt --out $W/enc_$t.st --device cuda --reps 7 \
    > $OUT/enc_$t.jsonl 2> $OUT/enc_$t.err; echo "$t bench-encode rc=$?"
done
ENC_LENGTHS=128 TF_DTYPES=bf16 TF_REPS=7 timeout 150 python3 bench/encoder.py tf $E 2>&1 | grep -v Warning | tail -2
python3 bench/encoder.py table $E $(for b in "$@"; do echo $OUT/enc_${b%%=*}.jsonl; done) | tee $OUT/encoder.md
