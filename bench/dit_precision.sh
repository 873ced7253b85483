#!/usr/bin/env bash
# DiT precisions side by side (issue 22), 1024x1024, 50 guided steps, CFG 3, uncond skipping block 22, one call (~6-8 min on an H200):
#   bench/dit_precision.sh CKPT OUT_DIR MOSS_BIN
# moss bench-dit --precision bf16 and fp8 (an fp8 the binary refuses is reported "not run: <why>"), then
# golden/dit_ref.py in torch fp32 (TF32 off: the reference), bf16 eager, bf16 torch.compile per block, and
# torchao float8 row-wise + torch.compile (bench/dit_precision.py torch); the report: times, velocity and
# latents rel L2 and the decoded picture's PSNR against fp32, speed-ups, issue 22's targets and bars.
# CKPT: bench/full_ckpt.sh's folder (its DiT and VAE are written here if missing). Installs .whl/torchao-*.whl and
# .whl/diffusers-*.whl offline when present (bench/README.md). BASE_BIN: an earlier moss build, whose per-op
# profiles the report prints beside this one's (before/after). DEADLINE_S (default 540): the whole run's seconds;
# the torch side gets what is left less the report's share, and keeps what it measured when stopped.
# Out: OUT_DIR/dit_precision.md (the table), dit_precision.json, torch.json, moss_<p>.json/.err/.rc, log.txt.
set -uo pipefail
[ $# -eq 3 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; BIN=$3; W=${WORK:-/tmp/moss-bench}/precision; mkdir -p "$OUT" "$W"
T0=$(date +%s); DEADLINE=${DEADLINE_S:-540}; left() { echo $(( T0 + DEADLINE - $(date +%s) )); }
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-precision \
    .whl/*.whl && export PYTHONPATH=/tmp/site-precision${PYTHONPATH:+:$PYTHONPATH}
fi
chmod +x "$BIN" 2>/dev/null; echo "moss: $($BIN --version 2>&1 | head -1)"
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null
read -r SIZE STEPS DEV < <(python3 bench/dit_precision.py settings)
el() { echo; echo "[$(( $(date +%s) - T0 )) s] == $*"; }

el "checkpoint (DiT + VAE, written if missing)"
timeout 300 python3 bench/dit_precision.py ckpt "$F" || { echo "no checkpoint: stop"; exit 1; }

rm -f "$W"/*.f32 "$OUT"/moss_*.json "$OUT"/moss_base_* "$OUT"/moss_*.err "$OUT"/moss_*.rc "$OUT"/torch.json  # nothing stale is reported
for p in bf16 fp8; do
  el "moss bench-dit --precision $p"
  timeout 150 "$BIN" bench-dit --device "$DEV" --precision $p --model "$F" --embeds "$F/embeds.safetensors" \
    --size ${SIZE}x$SIZE --steps "$STEPS" --forwards 5 --save-velocity "$W/vel_moss_$p.f32" \
    --save-latents "$W/lat_moss_$p.f32" > "$OUT/moss_$p.json" 2> "$OUT/moss_$p.err"
  echo $? > "$OUT/moss_$p.rc"; echo "rc=$(cat "$OUT/moss_$p.rc")"; tail -2 "$OUT/moss_$p.err"
done

if [ -n "${BASE_BIN:-}" ]; then  # the build before: its per-op profiles, for the report's before/after
  chmod +x "$BASE_BIN" 2>/dev/null
  for p in bf16 fp8; do
    el "before: $BASE_BIN bench-dit --precision $p --forward-only"
    timeout 120 "$BASE_BIN" bench-dit --device "$DEV" --precision $p --model "$F" --embeds "$F/embeds.safetensors" \
      --size ${SIZE}x$SIZE --forwards 5 --forward-only > "$OUT/moss_base_$p.json" 2> "$OUT/moss_base_$p.err"
    echo "rc=$?"; tail -2 "$OUT/moss_base_$p.err"
  done
fi

TL=$(( $(left) - 90 )); [ $TL -ge 60 ] || TL=60
el "torch: fp32 reference, bf16 eager, bf16 compiled, torchao fp8 compiled (time limit $TL s)"
timeout $TL python3 bench/dit_precision.py torch "$F" "$W" "$OUT/torch.json"; echo "torch rc=$?"

el "report"
timeout $(( $(left) > 60 ? $(left) : 60 )) python3 bench/dit_precision.py report "$F" "$W" "$OUT" > "$OUT/dit_precision.md"
echo "report rc=$?"; el "done"; echo; cat "$OUT/dit_precision.md"
