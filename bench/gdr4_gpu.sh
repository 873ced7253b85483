#!/usr/bin/env bash
# Helper gdr4's device call: the delta rule MOSS_GDR=v2 (cuda/gdr_v2.cuh) against the default TF32
# kernels.
#   1. bench/gdr_bench.py: the kernels alone from a cubin of cuda/gdr.cu, L = 4096 and 128, real
#      shapes, CUDA-event medians per kernel, rel L2 vs an fp64 recurrence, planted control;
#   2. random full-size Qwen3.5-9B text weights (bench/encoder_gpu.py make, background) while
#      `moss check --device cuda --model golden/tiny-a` runs (gates incl. the v2 rows + control);
#   3. `moss bench-encode` at 128 and 4096 tokens: default, MOSS_GDR=v2, default, v2 (drift), tc2;
#   4. transformers bf16/fp32 on the same weights (bench/encoder_gpu.py tf) if time is left;
#   5. bench/gdr4_summary.py, then the kernel table again last.
#
#   bash bench/gdr4_gpu.sh BIN CUBIN OUT          (<= 190 s)
set -uo pipefail
BIN=${1:?BIN}
CUBIN=${2:?CUBIN}
OUT=${3:?OUT}
S=$(dirname "$0")
W=/tmp/gdr4w
F=$W/full
mkdir -p "$W" "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
log "binary carries: gdr_seq2 $(grep -c moss_enc_gdr_seq2 "$BIN"), v2 gate $(grep -c 'gated_delta_rule v2, state read undecayed' "$BIN"), tc2 $(grep -c moss_enc_gdr_prep_tc2_bf16 "$BIN")"
log "kernels alone"
timeout 60 python3 "$S/gdr_bench.py" "$CUBIN" "$OUT/gdr_bench.json" > "$OUT/gdr_bench.txt" 2>&1
echo "rc=$?"; cat "$OUT/gdr_bench.txt"
log "make full-size weights (background)"
(python3 bench/encoder_gpu.py make "$F" 2>&1 | grep -v Warning | tail -3 > "$OUT/make.txt") &
MK=$!
log "moss check"
MOSS_CHECK_VERBOSE=1 timeout 80 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "delta_rule|kernel gates:|FAIL|ACCEPTED|passed" "$OUT/check.txt" | head -40
tail -3 "$OUT/check_err.txt"
wait $MK
cat "$OUT/make.txt"
bench() { # name, env...
    local name=$1; shift
    log "bench-encode $name"
    env "$@" timeout 40 "$BIN" bench-encode --model "$F" --ids-file "$F/ids128.txt" --ids-file "$F/ids4096.txt" \
        --out "$W/${name}128.st" --out "$W/${name}4096.st" --device cuda --reps 7 > "$OUT/bench_$name.jsonl" 2> "$OUT/bench_$name.err"
    echo "rc=$?"; tail -2 "$OUT/bench_$name.err"
}
bench default MOSS_GDR=tc
bench v2 MOSS_GDR=v2
bench default2 MOSS_GDR=tc
bench v2b MOSS_GDR=v2
bench tc2 MOSS_GDR=tc2
left=$((170 - SECONDS))
if [ $left -gt 35 ]; then
    log "transformers (timeout ${left}s)"
    timeout $left python3 bench/encoder_gpu.py tf "$F" 2>&1 | grep -v -i warn | tail -8 > "$OUT/tf.txt"
    cat "$OUT/tf.txt"
else
    log "no time left for transformers"
fi
log "summary"
python3 "$S/gdr4_summary.py" "$W" "$F" "$OUT" | tee "$OUT/summary.txt"
tail -11 "$OUT/gdr_bench.txt"
log done
