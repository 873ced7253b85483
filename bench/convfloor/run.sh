#!/usr/bin/env bash
# The one device call of helper convfloor (carry .dev-convfloor; from the repository root):
#   python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev-convfloor/moss.xz'), open('.dev-convfloor/moss','wb'))" \
#     && chmod +x .dev-convfloor/moss && bash .dev-convfloor/run.sh
# moss check (while bench/encoder_gpu.py writes random encoder weights); kbench.py (conv + gates and
# gated RMSNorm kernels alone, every variant, fp64 references, CUDA events); moss bench-encode with
# kbench's fastest passing variants (MOSS_ENC_CONV / MOSS_ENC_GRMS) against the defaults,
# alternating twice; ncu of kbench --once in the time left; a table last. Files tarred (f.tgz).
set -uo pipefail
D=.dev-convfloor; BIN=$D/moss; E=/tmp/te; O=${OUT:-/tmp/cfout}; F=$O/f; mkdir -p $F
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
(timeout 100 python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -2 > $F/make.log) &
MK=$!
t check
timeout 150 $BIN check --device cuda --model golden/tiny-a > $F/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" $F/check.txt | head -20
grep -E "convg|convf|grms" $F/check.txt > $F/check_conv_grms.txt; echo "conv/grms rows: $(wc -l < $F/check_conv_grms.txt)"
t kbench
timeout 50 python3 $D/kbench.py $D/cf.cubin --best=$F/best.txt > $F/kbench.txt 2> $F/kbench.err; echo "kbench rc=$?"
BEST=$(cat $F/best.txt 2>/dev/null); echo "best: $BEST"
t "wait weights"; wait $MK; cat $F/make.log
t bench-encode
for i in 1 2; do
  for v in new old; do
    if [ $v = new ]; then ENV="$BEST"; else ENV="MOSS_ENC_CONV_TT=4"; fi
    env $ENV timeout 40 $BIN bench-encode --model $E --ids-file $E/ids4096.txt --ids-file $E/ids128.txt --device cuda --reps 7 > $F/enc_${v}_$i.jsonl 2> $F/enc_${v}_$i.err
    echo "bench-encode $v ($ENV) $i rc=$?"
  done
done
t ncu
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LEFT=$(( 188 - ($(date +%s) - T0) ))
if [ $LEFT -gt 8 ]; then
  timeout $LEFT $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
    --csv --print-units base --kernel-name regex:moss_ --launch-count 44 python3 $D/kbench.py $D/cf.cubin --once > $F/ncu.csv 2> $F/ncu.err; echo "ncu rc=$?"
fi
tar -C $O -czf $O/f.tgz f
t done
python3 $D/summary.py $F
echo "== kbench (CUDA events)"; grep -E "control|kbench|best" $F/kbench.txt; sed -n '/^op /,$p' $F/kbench.txt | head -40
