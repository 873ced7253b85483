#!/usr/bin/env bash
# Helper gdrprep4's device call: gdr_prep_tc3 as on main (old: 72 KiB, three blocks an SM) against
# this branch's (new: 55 KiB, four blocks an SM, balanced apply, Kd stored while V arrives), the pair
# prep gdr_prep_tc3p (both value heads of a key head in one block of 512, 93 KiB, two blocks an SM)
# and three bench-only variants of new (kdlate: Kd after the apply; oldmap: the old apply warp map;
# lb3: new with __launch_bounds__(256, 3), i.e. three blocks an SM).
#   1. gdrprep4_bench.py: each prep alone, L = 128 / 4096 / 200, CUDA-event medians of 20 (two
#      rounds), its five outputs vs an fp64 prep and vs old, the state pass gdr_tma fed by it (rel L2
#      vs an fp64 recurrence), its planted control through the same state pass;
#   2. ncu --set full of old, new and pair (L = 4096, two launches each);
#   3. `moss check --device cuda --model golden/tiny-a` with the branch's release binary (new prep
#      the default; the pair prep's gate rows + control too);
#   4. the tables again, last.
#
#   bash bench/gdrprep4_gpu.sh DIR OUT   (DIR: moss.xz, *.cubin, gdrprep4_bench.py, ncu_pick.py; <= 195 s)
set -uo pipefail
D=${1:?DIR}
OUT=${2:?OUT}
mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x "$D/moss"
BIN=$D/moss
log "binary carries: prep_tc3 $(grep -c moss_enc_gdr_prep_tc3_bf16 "$BIN")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
S=56320
PAIR="pair=$D/new.cubin=94720=gdr_prep_tc3p_bf16=512"
VARS="old=$D/old.cubin=73728 new=$D/new.cubin=$S $PAIR kdlate=$D/kdlate.cubin=$S oldmap=$D/oldmap.cubin=$S lb3=$D/lb3.cubin=$S"
log "kernels alone"
timeout 75 python3 "$D/gdrprep4_bench.py" "$D/gdr_tma.cubin" "$OUT/kernels.json" $VARS > "$OUT/kernels.txt" 2>&1
echo "kernels rc=$?"
grep -v '^{' "$OUT/kernels.txt" | tail -20
log "ncu (full set) of old, new and pair"
left=$((92 - SECONDS))
if [ $left -gt 15 ]; then
    GDR_NCU=1 timeout $left ncu --set full --clock-control none -k regex:gdr_prep --launch-count 6 -f -o "$OUT/prep" \
        python3 "$D/gdrprep4_bench.py" "$D/gdr_tma.cubin" x old=$D/old.cubin=73728 new=$D/new.cubin=$S $PAIR > "$OUT/ncu_log.txt" 2>&1
    echo "ncu rc=$?"; tail -2 "$OUT/ncu_log.txt"
    ncu -i "$OUT/prep.ncu-rep" --page raw --csv > "$OUT/ncu_raw.csv" 2> /dev/null
    python3 "$D/ncu_pick.py" "$OUT/ncu_raw.csv" > "$OUT/ncu_pick.txt" 2>&1
    rm -f "$OUT/prep.ncu-rep" "$OUT/ncu_raw.csv"
else
    log "no time left for ncu"
fi
log "moss check"
timeout 100 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "gated_delta_rule|kernel gates:|FAIL|ACCEPTED|^check" "$OUT/check.txt" > "$OUT/check_gdr.txt"
grep -E "kernel gates:|FAIL|ACCEPTED" "$OUT/check.txt" | head -20
tail -3 "$OUT/check_err.txt"
log "tables"
cat "$OUT/ncu_pick.txt" 2> /dev/null
grep -E "delta_rule" "$OUT/check.txt" | head -40
grep -v '^{' "$OUT/kernels.txt" | tail -20
log done
