# One device call of helper encrows (carry .dev-encrows; run from the repository root):
#   python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev-encrows/moss.xz'), open('.dev-encrows/moss','wb'))" \
#     && chmod +x .dev-encrows/moss && bash .dev-encrows/run.sh
# moss check (while bench/encoder_gpu.py writes random encoder weights), the row-kernel bench
# (CUDA events), moss bench-encode new / old (MOSS_ENC_ROWS=old) alternating, then the row bench
# under ncu in the time left; tables last.
set -uo pipefail
D=.dev-encrows; BIN=$D/moss; E=/tmp/te; O=${OUT:-/tmp/encout}; mkdir -p $O
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
(python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -2 > $O/make.log) &
MK=$!
t check
MOSS_ENC_ROWS= timeout 75 $BIN check --device cuda --model golden/tiny-a > $O/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" $O/check.txt | head -20
grep -E "convg|rms1|grms8r|silu_mul8v|embed8" $O/check.txt > $O/check_new_rows.txt
t rowbench
timeout 40 python3 $D/rowbench.py $D/unit.cubin > $O/rowbench.txt 2> $O/rowbench.err; echo "rowbench rc=$?"
t "wait weights"
wait $MK; cat $O/make.log
t bench-encode
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then ENV="MOSS_ENC_ROWS=old"; else ENV="MOSS_ENC_ROWS=new"; fi
    env $ENV timeout 30 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt --device cuda --reps 5 > $O/enc_${v}_$i.jsonl 2> $O/enc_${v}_$i.err
    echo "bench-encode $v $i rc=$?"
  done
done
t ncu
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout $(( 192 - ($(date +%s) - T0) )) $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
  --csv --print-units base --kernel-name regex:moss_ python3 $D/rowbench.py $D/unit.cubin --once > $O/ncu.csv 2> $O/ncu.err; echo "ncu rc=$?"
python3 $D/ncu_table.py $O/ncu.csv > $O/ncu_table.txt 2>&1
t done
python3 $D/summary.py $O
echo "== ncu per kernel (rowbench --once)"; cat $O/ncu_table.txt
echo "== rowbench (CUDA events)"; tail -40 $O/rowbench.txt
