#!/usr/bin/env bash
# moss generate 1024x1024, 50 steps under --max-vram caps: wall time, the load / compute split of each stage (--json timings),
# the peak GPU memory sampled from outside the process (nvidia-smi every 50 ms, less the memory used before the run), the plan,
# and whether the PNG is byte-identical to the unlimited run's. Then the default cap with a torch process holding most of the GPU.
#   bench/memory_bench.sh CKPT OUT_DIR MOSS_BIN [CAPS...]      (CAPS default: 4 6 8 12 16 24)
# CKPT: a full-size checkpoint (bench/full_ckpt.sh).
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; BIN=$3; shift 3; CAPS=${*:-4 6 8 12 16 24}; mkdir -p "$OUT"
P="a lighthouse at dusk, oil painting"
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1; }
run() { # TAG [flags...]: one run, sampled
  local t=$1; shift
  local base; base=$(used)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 50 > $OUT/smi_$t.txt &
  local smi=$! s; s=$(date +%s.%N)
  $BIN generate --device cuda --model $F --prompt "$P" --size 1024x1024 --steps 50 --seed 42 --json -v "$@" --out $OUT/mem_$t.png \
    > $OUT/mem_$t.json 2> $OUT/mem_$t.err; local rc=$?
  local wall; wall=$(python3 -c "import time; print(f'{time.time() - $s:.2f}')")
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  local peak; peak=$(sort -n $OUT/smi_$t.txt | tail -1)
  python3 - "$t" "$rc" "$wall" "$base" "${peak:-0}" $OUT/mem_$t.json $OUT/mem_$t.png $OUT/mem_unlimited.png <<'PY' | tee -a $OUT/memory.md
import hashlib, json, os, sys
t, rc, wall, base, peak, js, png, ref = sys.argv[1:]
try:
    j = json.load(open(js)); tm = j["timings"]
    split = " / ".join(f"{tm[k + '_load_s']:.2f}+{tm[k + '_s'] - tm[k + '_load_s']:.2f}" for k in ("encode", "denoise", "decode"))
    plan = "; ".join(f"{n['name']} {n['mode']}" + (f" {n['resident_blocks']}/{n['blocks']}" if n["mode"] == "streamed" else "") for n in j["plan"]["networks"])
    cap = j["plan"]["cap_bytes"] / 2**30
except Exception as e:
    split, plan, cap = "?", f"(no result: {e.__class__.__name__})", float("nan")
sha = hashlib.sha256(open(png, "rb").read()).hexdigest()[:16] if os.path.exists(png) else "-"
same = "-" if t == "unlimited" or not os.path.exists(png) or not os.path.exists(ref) else ("yes" if open(png, "rb").read() == open(ref, "rb").read() else "NO")
peak_gib = (int(peak) - int(base)) / 1024
under = "-" if t in ("unlimited", "default") else ("yes" if peak_gib <= cap else "NO")
print(f"| {t} | {rc} | {cap:.2f} | {wall} | {split} | {peak_gib:.2f} | {under} | {same} | {sha} | {plan} |")
PY
}
echo "| cap GiB | exit | planned cap | wall s | load+compute s: encode / denoise / decode | peak GiB (nvidia-smi, over the idle) | under cap | PNG = unlimited | sha256 | plan |" | tee $OUT/memory.md
echo "|---|---:|---:|---:|---|---:|---|---|---|---|" | tee -a $OUT/memory.md
run unlimited --max-vram 100000
for c in $CAPS; do run $c --max-vram $c; done
# The default cap follows real free memory: another process holds all but ~20 GiB of the GPU.
python3 - <<'PY' &
import torch, time
free, total = torch.cuda.mem_get_info()
hold = torch.empty(max(free - (20 << 30), 0), dtype=torch.uint8, device="cuda")
open("/tmp/moss-hold.ready", "w").close()
time.sleep(600)
PY
HOLD=$!
for i in $(seq 1 120); do [ -e /tmp/moss-hold.ready ] && break; sleep 0.5; done
run default
kill $HOLD 2>/dev/null; wait $HOLD 2>/dev/null; rm -f /tmp/moss-hold.ready
echo "(each run's -v plan and timing lines: $OUT/mem_*.err)"
