#!/bin/bash
# ditfuse's one device call: main's binary vs ditfuse's on one random full-size DiT, the op
# profile, velocities, the gates, the elementwise microbench, opt-in GEMM tuning, torch.compile.
D=.dev-ditfuse
O=${OUT:-/tmp/out}
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
for b in moss main_moss; do
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/$b.xz'), open('$D/$b','wb'))" && chmod +x $D/$b
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
el "write checkpoint"
python3 bench/dit_full.py write /tmp/ck > $O/write.txt 2>&1 || { tail $O/write.txt; exit 1; }
B="bench-dit --device cuda --precision bf16 --model /tmp/ck --embeds /tmp/ck/embeds.safetensors --size 1024x1024"
el "main forward"
$D/main_moss $B --forward-only --forwards 5 --save-velocity /tmp/vmain.f32 > $O/main.json 2> $O/main.err; echo "rc=$?"
el "ditfuse forward + profile + 50 steps"
$D/moss $B --forwards 5 --save-velocity /tmp/vmine.f32 > $O/mine.json 2> $O/mine.err; echo "rc=$?"
el "velocities"
python3 - <<'PY'
import json, numpy as np
a = np.fromfile('/tmp/vmine.f32', '<f4').astype(np.float64); b = np.fromfile('/tmp/vmain.f32', '<f4').astype(np.float64)
print("velocity rel L2 ditfuse vs main: %.3e  (finite: %s)" % (np.linalg.norm(a - b) / np.linalg.norm(b), np.isfinite(a).all()))
PY
el "gates"
timeout 100 $D/moss check --device cuda --model golden/tiny-a > $O/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates|FAIL|ACCEPTED|qkv_norm|attention_packed|gated_residual_norm|^check" $O/check.txt
el "elementwise microbench"
timeout 40 python3 $D/ew_bench.py $D/ew.cubin > $O/ew.txt 2>&1; echo "rc=$?"; cat $O/ew.txt
el "GEMM tuning (opt-in)"
MOSS_GEMM_TUNE=1 timeout 40 $D/moss $B --forward-only --forwards 5 > $O/tune.json 2> $O/tune.err; echo "rc=$?"
grep "gemm tune" $O/tune.err | sort | uniq -c | sort -rn | head -12
LEFT=$(( 168 - ($(date +%s) - T0) ))
el "torch.compile reference (timeout ${LEFT}s)"
if [ $LEFT -gt 40 ]; then timeout $LEFT python3 bench/dit_full.py compiled /tmp/ck /tmp/vmine.f32 $O/compiled.json > $O/compiled.txt 2>&1; echo "rc=$?"; tail -2 $O/compiled.txt; fi
el "summary"
python3 - $O <<'PY'
import json, sys, os
o = sys.argv[1]
def j(n):
    try: return json.loads(open(f"{o}/{n}").read().strip().splitlines()[-1])
    except Exception as e: return {"error": str(e)}
m, d, t = j("main.json"), j("mine.json"), j("tune.json")
print("forward ms median: main %s  ditfuse %s  ditfuse+MOSS_GEMM_TUNE %s" % (m.get("forward_ms_median"), d.get("forward_ms_median"), t.get("forward_ms_median")))
print("main forwards", m.get("forward_ms")); print("ditfuse forwards", d.get("forward_ms")); print("tuned forwards", t.get("forward_ms"))
print("ditfuse 50 guided steps: %s s (%s s/step)" % (d.get("loop_s"), d.get("loop_s_per_step")))
print("profiled forward %s ms, sum of op GPU times %s ms" % (d.get("profile_forward_ms"), d.get("profile_gpu_sum_ms")))
p = d.get("profile_ms", {})
for k, v in sorted(p.items(), key=lambda kv: -kv[1]["ms"]):
    print("  %-48s %4d calls %9.3f ms GPU %8.3f ms host  %7.1f us/call" % (k, v["calls"], v["ms"], v["host_ms"], 1e3 * v["ms"] / v["calls"]))
if os.path.exists(f"{o}/compiled.json"): print("torch.compile:", open(f"{o}/compiled.json").read().replace("\n", " "))
PY
el "done"
