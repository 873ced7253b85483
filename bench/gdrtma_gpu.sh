#!/usr/bin/env bash
# Helper gdrtma's device call (ran 2026-12-03 without tma2x, which was added after it): the fused state pass with TMA tensor copies (cuda/sm90a/gdr_tma.cu,
# MOSS_GDR_STATE=tma2 / tma2p / tma1) against the default fused2c (cuda/sm90a/gdr_fused.cu).
#   1. bench/gdrtma_bench.py: kernels alone from cubins (cuda/gdr.cu sm_90 for prep_tc3,
#      cuda/sm90a/gdr_tma.cu sm_90a: fused2c + tma*), L = 128 / 4096 / 200, rel L2 vs fp64, controls;
#   2. `moss check --device cuda --model golden/tiny-a` (random encoder weights written meanwhile);
#   3. `moss bench-encode` at 128 + 4096 tokens, MOSS_GDR_STATE = fused2c, tma2, tma2p, tma1 in turn,
#      two rounds (delta-rule op sum and device median);
#   4. tables last.
#
#   bash bench/gdrtma_gpu.sh DIR OUT   (DIR holds moss.xz, gdr.cubin, gdr_tma.cubin, gdrtma_bench.py; <= 195 s)
set -uo pipefail
D=${1:?DIR}
OUT=${2:?OUT}
mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x "$D/moss"
BIN=$D/moss
log "binary carries: gdr_tma2 $(grep -c moss_enc_gdr_tma2_bf16 "$BIN"), tma gate $(grep -c 'TMA tensor boxes' "$BIN")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
log "kernels alone"
timeout 60 python3 "$D/gdrtma_bench.py" "$D/gdr.cubin" "$D/gdr_tma.cubin" "$OUT/kernels.json" > "$OUT/kernels.txt" 2>&1
echo "kernels rc=$?"
tail -14 "$OUT/kernels.txt"
E=/tmp/te
(timeout 80 python3 bench/encoder_gpu.py make $E > "$OUT/make.txt" 2>&1; echo "make rc=$?" >> "$OUT/make.txt") &
MK=$!
log "moss check"
timeout 75 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "gated_delta_rule|kernel gates:|FAIL|ACCEPTED|^check" "$OUT/check.txt" > "$OUT/check_gdr.txt"
grep -E "kernel gates:|FAIL|ACCEPTED|^check|tma" "$OUT/check.txt" | head -40
tail -3 "$OUT/check_err.txt"
wait $MK
tail -2 "$OUT/make.txt"
log "bench-encode"
for round in 1 2; do
  for v in fused2c tma2 tma2p tma1 tma2x; do
    if [ $SECONDS -gt 180 ]; then echo "skip $v round $round (time)"; continue; fi
    MOSS_GDR_STATE=$v timeout 25 "$BIN" bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt --device cuda --reps 7 \
      > "$OUT/enc_${v}_$round.jsonl" 2> "$OUT/enc_${v}_$round.err"
    echo "bench-encode $v round $round rc=$?"
  done
done
log "tables"
cat "$OUT/kernels.txt" | grep -E "^\|"
echo
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
o = sys.argv[1]
print("| MOSS_GDR_STATE | round | tokens | median ms | device median ms | gated_delta_rule op sum ms (24 calls) |")
print("|---|---|---|---|---|---|")
for round in (1, 2):
    for v in ("fused2c", "tma2", "tma2p", "tma1", "tma2x"):
        f = f"{o}/enc_{v}_{round}.jsonl"
        if not os.path.exists(f):
            continue
        for l in open(f):
            if l.startswith("{"):
                j = json.loads(l)
                p = j.get("profile_ms", {}).get("gated_delta_rule", {})
                print(f"| {v} | {round} | {j['tokens']} | {j['median_ms']:.2f} | {j['device_median_ms']:.2f} | {p.get('ms', float('nan')):.3f} |")
EOF
