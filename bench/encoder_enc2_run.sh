#!/usr/bin/env bash
# helper enc2's one device call: gates, full-size encoder bench (mine vs main), transformers.
set -uo pipefail
OUT=${1:?OUT}
D=.dev-enc2
W=/tmp/encw
F=$W/full
mkdir -p "$W" "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
for b in moss main; do
    python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/$b.xz'), open('$D/$b','wb'))" && chmod +x $D/$b
done
log "kernels in mine: fattn $(grep -c moss_enc_fattn_bf16 $D/moss) gdr_seq_tc $(grep -c moss_enc_gdr_seq_tc $D/moss) add_rms $(grep -c moss_enc_add_rms_bf16 $D/moss)"
log "make full-size weights (background)"
(python3 bench/encoder_gpu.py make "$F" 2>&1 | grep -v Warning | tail -3 > "$OUT/make.txt") &
MK=$!
log "moss check"
MOSS_CHECK_VERBOSE=1 timeout 100 $D/moss check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "^enc |control: enc |kernel gates:|FAIL|ACCEPTED" "$OUT/check.txt" | head -90
tail -3 "$OUT/check_err.txt"
wait $MK
cat "$OUT/make.txt"
ls "$F" | head -3
log "bench mine"
timeout 60 $D/moss bench-encode --model "$F" --ids-file "$F/ids128.txt" --ids-file "$F/ids4096.txt" \
    --out "$W/mine128.st" --out "$W/mine4096.st" --device cuda --reps 5 > "$OUT/bench_mine.jsonl" 2> "$OUT/bench_mine.err"
echo "rc=$?"; tail -2 "$OUT/bench_mine.err"
log "bench main"
timeout 60 $D/main bench-encode --model "$F" --ids-file "$F/ids128.txt" --ids-file "$F/ids4096.txt" \
    --out "$W/main128.st" --out "$W/main4096.st" --device cuda --reps 5 > "$OUT/bench_main.jsonl" 2> "$OUT/bench_main.err"
echo "rc=$?"; tail -2 "$OUT/bench_main.err"
left=$((172 - SECONDS))
if [ $left -gt 45 ]; then
    log "transformers (timeout ${left}s)"
    timeout $left python3 bench/encoder_gpu.py tf "$F" 2>&1 | grep -v -i warn | tail -8 > "$OUT/tf.txt"
    cat "$OUT/tf.txt"
else
    log "no time left for transformers"
fi
log "summary"
python3 $D/summary.py "$W" "$F" "$OUT" | tee "$OUT/summary.txt"
