#!/bin/bash
# The encew helper's one device call (issue #7): standalone old-vs-new kernel timing + correctness
# (bench/encew_bench.py on cubins), then `moss check --device cuda --model golden/tiny-a` of the
# branch's release binary; the kernel table is printed again last.
#   D=.dev-encew; bash $D/encew_gpu.sh $D $OUT      (D holds main.cubin wg.cubin encew_bench.py moss.xz)
D=${1:-.dev-encew}
OUT=${2:-$OUT}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
el "== kernels (bench/encew_bench.py)"
timeout 90 python3 "$D/encew_bench.py" "$D/main.cubin" "$D/wg.cubin" > "$OUT/bench.txt" 2>&1
echo "bench rc=$?"
el "== moss check"
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x "$D/moss"
timeout 90 "$D/moss" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2>&1
echo "check rc=$?"
grep -E "wgmma|conv8t|fattn|causal_attention|conv1d|sm_90a" "$OUT/check.txt" | head -60
grep -E "^check:|FAIL|fail" "$OUT/check.txt" | tail -8
el "done"
echo "== bench table (from $OUT/bench.txt)"
sed -n '/== encew kernels/,$p' "$OUT/bench.txt"
grep -q "== encew kernels" "$OUT/bench.txt" || tail -40 "$OUT/bench.txt"
