#!/usr/bin/env bash
# Helper gdrseq's device call: the fused state pass + output (cuda/sm90a/gdr_fused.cu,
# MOSS_GDR_STATE=fused4 / fused2) against the default gdr_seq_tc + gdr_out_tc.
#   1. bench/gdr_bench.py: kernels alone from cubins (cuda/gdr.cu for sm_90, cuda/sm90a/gdr_fused.cu
#      for sm_90a), L = 128, 4096, 200, real shapes, CUDA-event medians, rel L2 vs fp64, controls;
#   2. `moss check --device cuda --model golden/tiny-a` (the fused gate rows + controls);
#   3. Nsight Compute (--set full) of gdr_seq_tc and both gdr_fused at L = 4096;
#   4. the kernel table again last.
#
#   bash bench/gdrseq_gpu.sh DIR OUT      (DIR holds moss.xz, gdr.cubin, gdr_fused.cubin, gdr_bench.py; <= 190 s)
set -uo pipefail
D=${1:?DIR}
OUT=${2:?OUT}
mkdir -p "$OUT"
log() { echo "== $(date +%T) t=${SECONDS}s $*"; }
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x "$D/moss"
BIN=$D/moss
log "binary carries: gdr_fused4 $(grep -c moss_enc_gdr_fused4_bf16 "$BIN"), fused gate $(grep -c 'state pass + output, cluster of' "$BIN")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
log "kernels alone"
timeout 75 python3 "$D/gdr_bench.py" "$D/gdr.cubin" "$OUT/gdr_bench.json" "$D/gdr_fused.cubin" > "$OUT/gdr_bench.txt" 2>&1
echo "rc=$?"
cat "$OUT/gdr_bench.txt"
log "moss check"
MOSS_CHECK_VERBOSE=1 timeout 70 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_err.txt"
echo "check rc=$?"
grep -E "delta_rule|kernel gates:|FAIL|ACCEPTED|passed" "$OUT/check.txt" | head -60
tail -3 "$OUT/check_err.txt"
left=$((180 - SECONDS))
if [ $left -gt 25 ]; then
    log "ncu (timeout ${left}s)"
    timeout $left ncu --set full -k 'regex:gdr_(seq_tc|fused)' --launch-count 6 \
        python3 "$D/gdr_bench.py" "$D/gdr.cubin" x "$D/gdr_fused.cubin" --ncu > "$OUT/ncu.txt" 2> "$OUT/ncu_err.txt"
    echo "ncu rc=$?"
    grep -E "gdr_|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Cluster|One or More Eligible|Issued Warp|No Eligible|Registers Per" "$OUT/ncu.txt" | head -80
    tail -3 "$OUT/ncu_err.txt"
else
    log "no time left for ncu"
fi
log "table"
tail -8 "$OUT/gdr_bench.txt"
log done
