#!/usr/bin/env bash
# Helper enc3's device call (written late in a session with no device time; NOT run yet).
# Two opt-in switches against the default: the pinned device-to-host download
# (`MOSS_DOWNLOAD=pinned`) and the sigmoid output gate fused into the flash causal attention
# (`MOSS_ENC_ATTN_GATE=fused`):
#   1. `moss check --device cuda --model golden/tiny-a` (gate "download": pageable, pinned, and the
#      control "pinned download drops the last chunk"; "enc causal_attention_gated" fused / unfused
#      and the control "gate of the KV head", L = 4096 and 777; every other gate as before);
#   2. random full-size Qwen3.5-9B text weights (bench/encoder_gpu.py make, in the background);
#   3. `moss bench-encode` at 128 and 4096 tokens: default, MOSS_DOWNLOAD=pinned,
#      MOSS_ENC_ATTN_GATE=fused, both, default again (against drift): median_ms (forward + download), device_median_ms (hidden states left
#      on the GPU), download_median_ms (the download alone);
#   4. transformers bf16/fp32 on the same weights and ids (bench/encoder_gpu.py tf);
#   5. if time is left (after the summary): `MOSS_DOWNLOAD=pinned moss check` (every gate's downloads through the
#      pinned path);
#   6. bench/enc3_summary.py: the table (written before step 5, printed again last).
#
#   bash bench/enc3_gpu.sh BIN OUT          (BIN: release moss of branch enc3; <= 180 s)
set -uo pipefail
BIN=${1:?BIN}
OUT=${2:?OUT}
S=$(dirname "$0")   # enc3_summary.py lies next to this script
W=/tmp/enc3w
F=$W/full
mkdir -p "$W" "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
log "binary carries: MOSS_DOWNLOAD $(grep -c MOSS_DOWNLOAD "$BIN"), download gate $(grep -c 'pinned download drops the last chunk' "$BIN"), fattn_gated $(grep -c moss_enc_fattn_gated_bf16 "$BIN")"
log "make full-size weights (background)"
(python3 bench/encoder_gpu.py make "$F" 2>&1 | grep -v Warning | tail -3 > "$OUT/make.txt") &
MK=$!
log "moss check"
MOSS_CHECK_VERBOSE=1 timeout 90 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "download|attention_gated|kernel gates:|FAIL|ACCEPTED|passed" "$OUT/check.txt" | head -40
tail -3 "$OUT/check_err.txt"
wait $MK
cat "$OUT/make.txt"
bench() { # name, env...
    local name=$1; shift
    log "bench-encode $name"
    env "$@" timeout 60 "$BIN" bench-encode --model "$F" --ids-file "$F/ids128.txt" --ids-file "$F/ids4096.txt" \
        --out "$W/${name}128.st" --out "$W/${name}4096.st" --device cuda --reps 7 > "$OUT/bench_$name.jsonl" 2> "$OUT/bench_$name.err"
    echo "rc=$?"; tail -2 "$OUT/bench_$name.err"
}
bench default MOSS_DOWNLOAD=pageable
bench pinned MOSS_DOWNLOAD=pinned
bench gatefused MOSS_ENC_ATTN_GATE=fused
bench both MOSS_DOWNLOAD=pinned MOSS_ENC_ATTN_GATE=fused
bench default2 MOSS_DOWNLOAD=pageable
left=$((155 - SECONDS))
if [ $left -gt 40 ]; then
    log "transformers (timeout ${left}s)"
    timeout $left python3 bench/encoder_gpu.py tf "$F" 2>&1 | grep -v -i warn | tail -8 > "$OUT/tf.txt"
    cat "$OUT/tf.txt"
else
    log "no time left for transformers"
fi
log "summary"
python3 "$S/enc3_summary.py" "$W" "$F" "$OUT" | tee "$OUT/summary.txt"
left=$((170 - SECONDS))
if [ $left -gt 50 ]; then
    log "MOSS_DOWNLOAD=pinned MOSS_ENC_ATTN_GATE=fused moss check (timeout ${left}s)"
    MOSS_DOWNLOAD=pinned MOSS_ENC_ATTN_GATE=fused timeout $left "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check_pinned.txt" 2> "$OUT/check_pinned_err.txt"
    echo "check (pinned downloads) rc=$?"
    grep -E "kernel gates:|FAIL|ACCEPTED|passed" "$OUT/check_pinned.txt" | head -10
else
    log "no time left for the second check"
fi
cat "$OUT/summary.txt"
log done
