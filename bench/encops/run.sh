#!/usr/bin/env bash
# Helper encops's one device call (<= 200 s): the encoder's non-delta-rule ops at 4096 tokens.
#   1. moss check --device cuda --model golden/tiny-a (every gate incl. the new ones) while the
#      random full-size Qwen3.5-9B text weights are written (bench/encoder_gpu.py make);
#   2. moss bench-encode at 128 and 4096 tokens (--reps 5): the new default, the old behaviour
#      (every new switch off), the cat / resadd switches alone, MOSS_GEMM_TUNE=1, default again (drift);
#   3. summary table (device_median_ms, op sums, hidden states of each variant vs the old);
#   4. time left: transformers fp32 hidden states on the same weights; each variant's accuracy vs them.
#   bash .dev-encops/run.sh BIN OUT
# This is the script as run on 2026-12-03 (bench/notes-encops.md). Since then: MOSS_ENC_CONV is
# gone (conv8 is the only strided conv) and gate|up in one GEMM is the default (MOSS_ENC_CAT_MLP=0
# turns it off), so the old path is now MOSS_ENC_CAT=off MOSS_ENC_CAT_MLP=0 MOSS_ENC_RESADD=off
# MOSS_ENC_GATE=unfused.
set -uo pipefail
BIN=${1:?BIN}; OUT=${2:?OUT}
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/encw; F=$W/full
mkdir -p "$W" "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
log "binary carries: convt $(grep -c moss_enc_convt_bf16 "$BIN"), rms1 $(grep -c moss_enc_rms1_bf16 "$BIN"), MOSS_ENC_CAT $(grep -c MOSS_ENC_CAT "$BIN")"
log "make full-size weights (background)"
(python3 bench/encoder_gpu.py make "$F" 2>&1 | grep -v Warning | tail -3 > "$OUT/make.txt") &
MK=$!
log "moss check"
timeout 100 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$OUT/check.txt" | head -20
grep -E "linear_cat|strided|linear_add|attn_gate|convt|conv8" "$OUT/check.txt" | head -60
tail -2 "$OUT/check_err.txt"
wait $MK
cat "$OUT/make.txt"
ls "$F" | head -3
bench() { # name, env...
    local name=$1; shift
    log "bench-encode $name"
    env "$@" timeout 60 "$BIN" bench-encode --model "$F" --ids-file "$F/ids128.txt" --ids-file "$F/ids4096.txt" \
        --out "$W/${name}_128.st" --out "$W/${name}_4096.st" --device cuda --reps 5 > "$OUT/bench_$name.jsonl" 2> "$OUT/bench_$name.err"
    echo "rc=$?"; grep -v "^{" "$OUT/bench_$name.err" | tail -2
}
bench default MOSS_ENC_NONE=1
bench old MOSS_ENC_CAT=off MOSS_ENC_RESADD=off MOSS_ENC_CONV=conv8 MOSS_ENC_GATE=unfused
bench cat_off MOSS_ENC_CAT=off
bench cat_split MOSS_ENC_CAT=split
bench cat_mlp MOSS_ENC_CAT_MLP=1
bench resadd_off MOSS_ENC_RESADD=off
bench tune MOSS_GEMM_TUNE=1
bench default2 MOSS_ENC_NONE=1
log "summary"
python3 "$D/summary.py" "$W" "$OUT" | tee "$OUT/summary.txt"
left=$((178 - SECONDS))
if [ $left -gt 25 ]; then
    log "transformers fp32 hidden states (timeout ${left}s)"
    timeout $left python3 "$D/tf32.py" "$F" 2>&1 | grep -v -i warn | tail -4
    python3 "$D/summary.py" "$W" "$OUT" "$F" > "$OUT/summary.txt"
else
    log "no time left for transformers"
fi
cat "$OUT/summary.txt"
log done
