#!/usr/bin/env bash
# Per-kernel profile of every stage at full size, in one device call (~4 minutes): writes the
# random full-size checkpoint (bench/full_ckpt.sh), then
#   - moss's own per-op profiles (bench-encode at 4096 tokens, bench-vae at 1024 and 2048), and
#   - Nsight Compute kernel durations (gpu__time_duration, clocks left alone) over a window of
#     consecutive kernels in the middle of a DiT forward at 1024x1024, an encoder forward at 4096
#     tokens and whole VAE decodes, summed by kernel name (bench/ncu_sum.py).
# Needs the release binary in $BIN (default .prof/moss) and .whl/diffusers-*.whl.
set -uo pipefail
BIN=${BIN:-.prof/moss}
O=${OUT:-/tmp/profout}; W=/tmp/prof; mkdir -p "$O" "$W"
exec > >(tee -a "$O/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
ncu_run() { # name skip count cmd...
  local n=$1 s=$2 c=$3; shift 3
  timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --launch-skip $s --launch-count $c "$@" > $O/ncu_$n.csv 2> $O/ncu_$n.err; echo "ncu $n rc=$?"
  python3 bench/ncu_sum.py $O/ncu_$n.csv | head -40
}
el "== checkpoint"
timeout 200 bash bench/full_ckpt.sh $W/full > $O/ckpt.txt 2>&1 || { tail $O/ckpt.txt; exit 1; }
F=$W/full
el "== encoder 4096 (moss profile)"
timeout 60 $BIN bench-encode --model $F/text_encoder --ids-file $F/text_encoder/ids4096.txt --device cuda --reps 3 > $O/enc4096.json 2>&1
tail -1 $O/enc4096.json | python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print('median', j['median_ms']); [print(f'  {k:28s} {v}') for k,v in sorted(j['profile_ms'].items(), key=lambda kv: -kv[1]['ms'] if isinstance(kv[1],dict) else -kv[1])]" || tail -3 $O/enc4096.json
el "== VAE profiles"
python3 -c "
import numpy as np
g = np.random.default_rng(11)
for s in (1024, 2048): g.standard_normal((1, 128, s // 16, s // 16)).astype('<f4').tofile('$W/z%d.f32' % s)"
for s in 1024 2048; do
  timeout 60 $BIN bench-vae --model $F --device cuda --latents $W/z$s.f32 --reps 2 > $O/vae$s.json 2>&1; echo "vae $s rc=$?"
  tail -1 $O/vae$s.json | python3 -c "
import json,sys; j=json.loads(sys.stdin.read()); print('forward_ms', j['forward_ms'], 'profile_total', j.get('profile_total_ms'))
agg = {}
for p in j['profile']:
    k = p.get('op', str(p))
    a = agg.setdefault(k, [0, 0.0]); a[0] += 1; a[1] += p.get('ms', 0)
for k, (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1]): print(f'  {k:40s} {n:4d} {ms:8.2f} ms')" || tail -3 $O/vae$s.json
done
el "== ncu: VAE 1024 whole decode, DiT window, encoder window"
ncu_run vae1024 0 400 $BIN bench-vae --model $F --device cuda --latents $W/z1024.f32 --reps 1 --decode-only
ncu_run dit 400 300 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 --forward-only --forwards 1
ncu_run enc 300 300 $BIN bench-encode --model $F/text_encoder --ids-file $F/text_encoder/ids4096.txt --device cuda --reps 1
el "done"
