#!/usr/bin/env bash
# Does the 4096-token encoder forward slow down under sustained load? (notes-enc2.md: the
# unsynchronised forward does not follow the per-op sum.) Logs SM clock, power and throttle
# reasons every 50 ms while `moss bench-encode` runs 10 reps, and prints each rep's time next to
# the clock range seen. Run on the GPU machine from the repo root:
#   bash bench/encoder_gpu_clocks.sh BIN MODEL_DIR OUT_DIR     (MODEL_DIR from `encoder_gpu.py make`)
set -uo pipefail
BIN=$1
M=$2
OUT=$3
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 50 > "$OUT/clocks.csv" 2>&1 &
P=$!
"$BIN" bench-encode --model "$M" --ids-file "$M/ids4096.txt" --device cuda --reps 10 > "$OUT/bench_clocks.jsonl"
kill "$P" 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [l.split(", ") for l in open(f"{out}/clocks.csv") if l.count(",") >= 4]
busy = [r for r in rows if float(r[2]) > 200]  # power above idle: the GPU is working
if busy:
    clk = sorted(float(r[1]) for r in busy)
    pw = sorted(float(r[2]) for r in busy)
    print(f"busy samples {len(busy)}: SM clock min {clk[0]:.0f} median {clk[len(clk)//2]:.0f} max {clk[-1]:.0f} MHz; "
          f"power median {pw[len(pw)//2]:.0f} max {pw[-1]:.0f} W; throttle reasons seen {sorted(set(r[4].strip() for r in busy))}")
for l in open(f"{out}/bench_clocks.jsonl"):
    if l.startswith("{"):
        j = json.loads(l)
        print("forward_ms", [round(x, 1) for x in j["forward_ms"]], "profiled", round(j["profile_forward_ms"], 1),
              "op sum", round(sum(v["ms"] for v in j["profile_ms"].values()), 1))
PY
