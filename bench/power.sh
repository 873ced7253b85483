#!/usr/bin/env bash
# The DiT forward under the GPU's power limit (issue 22), one call (~2 min on an H100 or H200):
#   bench/power.sh CKPT OUT_DIR MOSS_BIN
# nvidia-smi samples the SM clock and board power every 20 ms while moss bench-dit runs 100 forwards at
# bf16 and at fp8, then while torch runs the forward's products and attention alone, in bursts and
# sustained (bench/power.py torch); OUT_DIR/power.md: clock and power of each phase, and every product
# and the attention of moss's forward against torch's time for the same FLOPs, burst and sustained.
# CKPT: bench/full_ckpt.sh's folder (its DiT is written here if missing; needs .whl/diffusers for the VAE).
set -uo pipefail
[ $# -eq 3 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; BIN=$3; mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
if ls .whl/diffusers-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-power \
    .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site-power${PYTHONPATH:+:$PYTHONPATH}
fi
chmod +x "$BIN" 2>/dev/null; echo "moss: $($BIN --version 2>&1 | head -1)"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
timeout 300 python3 bench/dit_precision.py ckpt "$F" || { echo "no checkpoint: stop"; exit 1; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 20 > "$OUT/smi.csv" 2>&1 &
SMI=$!; sleep 1
: > "$OUT/marks.txt"
for p in bf16 fp8; do
  echo "MARK moss $p forward start $(date +%s.%N)" >> "$OUT/marks.txt"
  timeout 60 "$BIN" bench-dit --precision $p --model "$F" --embeds "$F/embeds.safetensors" --size 1024x1024 \
    --forward-only --forwards 100 > "$OUT/moss_$p.json" 2> "$OUT/moss_$p.err" || echo "moss $p: FAILED ($(tail -1 "$OUT/moss_$p.err"))"
  echo "MARK moss $p forward end $(date +%s.%N)" >> "$OUT/marks.txt"
  sleep 2
done
N=$(python3 -c "import json; print(json.load(open('$OUT/moss_bf16.json'))['tokens_cond'])" 2>/dev/null || echo 4224)
(cd bench && timeout 200 python3 power.py torch "$N" "$OUT/torch_power.json") | tee -a "$OUT/marks.txt"
kill $SMI
(cd bench && python3 power.py report "$OUT")
