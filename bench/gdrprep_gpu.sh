#!/usr/bin/env bash
# Helper gdrprep's device call: gdr_prep_tc3 (MOSS_GDR_PREP=tc3, cuda/gdr_prep3.cuh) against the
# default prep_tc.
#   1. gdr_bench.py (the version of commit 020317f): the delta-rule kernels alone from a cubin of cuda/gdr.cu, L = 128 and
#      4096, real shapes (q k v strided out of [L, 8192] bf16), CUDA-event medians, output rel L2 vs
#      an fp64 recurrence, the tc3 control, each prep's scratch vs an fp64 prep;
#   2. `moss check --device cuda --model golden/tiny-a` (gate rows "prep tc3" + control);
#   3. ncu --set full of prep_tc and prep_tc3 (L = 4096, two launches each): occupancy, stalls,
#      DRAM / L2 throughput;
#   4. the tables again, last.
#
#   bash bench/gdrprep_gpu.sh DIR OUT     (DIR: moss.xz, gdr.cubin, gdr_bench.py, ncu_pick.py; <= 190 s)
set -uo pipefail
D=${1:?DIR}
OUT=${2:?OUT}
mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x "$D/moss"
BIN=$D/moss
log "binary carries: prep_tc3 $(grep -c moss_enc_gdr_prep_tc3_bf16 "$BIN"), tc3 gate $(grep -c 'prep tc3, (I + A)' "$BIN")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
log "kernels alone"
timeout 75 python3 "$D/gdr_bench.py" "$D/gdr.cubin" "$OUT/gdr_bench.json" > "$OUT/gdr_bench.txt" 2>&1
echo "rc=$?"; grep -v '^{' "$OUT/gdr_bench.txt" | tail -30
log "moss check"
MOSS_CHECK_VERBOSE=1 timeout 70 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "delta_rule|kernel gates:|FAIL|ACCEPTED|passed|failed" "$OUT/check.txt" | head -60
tail -3 "$OUT/check_err.txt"
log "ncu (full set) of prep_tc and prep_tc3"
left=$((180 - SECONDS))
if [ $left -gt 20 ]; then
    timeout $left ncu --set full --clock-control none -k regex:gdr_prep --launch-count 4 -f -o "$OUT/prep" \
        python3 "$D/gdr_bench.py" "$D/gdr.cubin" --ncu > "$OUT/ncu_log.txt" 2>&1
    echo "ncu rc=$?"; tail -3 "$OUT/ncu_log.txt"
    ncu -i "$OUT/prep.ncu-rep" --page raw --csv > "$OUT/ncu_raw.csv" 2> /dev/null
    ncu -i "$OUT/prep.ncu-rep" --page details --print-units base > "$OUT/ncu_details.txt" 2> /dev/null
    python3 "$D/ncu_pick.py" "$OUT/ncu_raw.csv" | tee "$OUT/ncu_pick.txt"
else
    log "no time left for ncu"
fi
log "tables"
grep -E "delta_rule" "$OUT/check.txt" | head -40
grep -v '^{' "$OUT/gdr_bench.txt" | tail -14
log done
