#!/usr/bin/env bash
# The integration run, in one device call (~6 minutes): every gate of the merged build, then each
# stage at full size on one random checkpoint in the real layout, with the PyTorch reference where it
# fits in the call (the DiT's torch.compile loop; the encoder's and VAE's references were timed in
# the same kind of call earlier: bench/encoder_gpu.sh, bench/vae_gpu.sh), then the whole pipeline.
#   1. moss check --device cuda (all gates and planted controls);
#   2. bench/full_ckpt.sh: text encoder (9B), DiT (42 blocks), VAE, tokenizer, random weights;
#   3. DiT: moss bench-dit 1024x1024 (5 forwards + 50 guided steps) and the torch.compile'd
#      reference's forward and 50 steps (bench/dit_full.py compiled);
#   4. encoder: moss bench-encode at 128 and 4096 tokens;
#   5. VAE: moss bench-vae at 1024x1024 and 2048x2048 (MOSS_VAE_KERNELS=classic, then the default
#      halo kernels, whose output is compared with diffusers fp32 and a float64 decode);
#   6. moss generate 1024x1024 50 steps end to end; batch vs one by one (N=3, 4 steps): identical PNGs.
# Needs: the release binary in $BIN (default .final/moss), .whl/diffusers-*.whl. Usage: bash bench/final_gpu.sh
set -uo pipefail
BIN=${BIN:-.final/moss}
O=${OUT:-/tmp/finalout}; W=/tmp/final; mkdir -p "$O" "$W"
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
chmod +x "$BIN"

el "== 1. moss check --device cuda"
timeout 200 $BIN check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$O/check.txt"

el "== 2. full-size random checkpoint"
timeout 200 bash bench/full_ckpt.sh $W/full > $O/ckpt.txt 2>&1 || { tail $O/ckpt.txt; exit 1; }
F=$W/full

el "== 3. DiT 1024x1024"
timeout 120 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
  --steps 50 --forwards 5 --save-velocity $W/moss.vel > $O/dit.json; echo "bench-dit rc=$?"
python3 -c "import json; j=json.loads(open('$O/dit.json').read().strip().splitlines()[-1]); print('moss forward_ms_median', round(j['forward_ms_median'],2), 'loop_s', round(j['loop_s'],3))"
for k in wgmma_serial v2; do
  MOSS_FLASH=$k timeout 60 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
    --forward-only --forwards 5 > $O/dit_$k.json 2>&1
  python3 -c "import json; j=json.loads(open('$O/dit_$k.json').read().strip().splitlines()[-1]); print('MOSS_FLASH=$k forward_ms_median', round(j['forward_ms_median'],2))" || tail -2 $O/dit_$k.json
done
timeout 150 python3 bench/dit_full.py compiled $F $W/moss.vel $O/torch_compiled.json 2>&1 | grep -v Warning | tail -2

el "== 4. encoder 128 / 4096 tokens"
for L in 128 4096; do
  timeout 60 $BIN bench-encode --model $F/text_encoder --ids-file $F/text_encoder/ids$L.txt --out $W/enc$L.st --device cuda --reps 5 > $O/enc$L.json 2>&1
  echo "L=$L rc=$?"; python3 -c "import json; j=json.loads(open('$O/enc$L.json').read().strip().splitlines()[-1]); print('median_ms', round(j['median_ms'],2), 'forward_ms', [round(x,1) for x in j['forward_ms']])" || tail -3 $O/enc$L.json
done

el "== 5. VAE (MOSS_VAE_KERNELS=classic, and the default kernels vs diffusers fp32 and float64)"
V=$W/vae; mkdir -p $V; ln -sfn $F $V/full
python3 -c "
import numpy as np
g = np.random.default_rng(11)
for s in (1024, 2048): g.standard_normal((1, 128, s // 16, s // 16)).astype('<f4').tofile('$V/z%d.f32' % s)"
for s in 1024 2048; do
  MOSS_VAE_KERNELS=classic timeout 60 $BIN bench-vae --model $F --device cuda --latents $V/z$s.f32 --reps 3 > $O/vae$s.json 2>&1
  echo "$s classic rc=$?"; python3 -c "import json; j=json.loads(open('$O/vae$s.json').read().strip().splitlines()[-1]); print('forward_ms', [round(x,1) for x in j['forward_ms']])" || tail -3 $O/vae$s.json
  timeout 60 $BIN bench-vae --model $F --device cuda --latents $V/z$s.f32 --reps 3 \
    --out-f32 $V/moss$s.f32 --out-rgb $V/moss$s.rgb > $V/moss$s.json 2>&1
  echo "$s default (halo) rc=$?"; cp $V/moss$s.json $O/vae${s}fast.json
  python3 -c "import json; j=json.loads(open('$V/moss$s.json').read().strip().splitlines()[-1]); print('forward_ms', [round(x,1) for x in j['forward_ms']])" || tail -3 $V/moss$s.json
  timeout 90 python3 bench/vae_bench.py ref $V $s || echo "ref $s failed"
done
el "== 6. end to end"
$BIN generate --device cuda --model $F --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 --steps 50 --json --out $W/full50.png; echo "rc=$?"
N=3 SIZE=1024x1024 STEPS=4 timeout 150 bash bench/batch_bench.sh $BIN $F $W/batch; echo "batch bench rc=$?"
el "done"; date -u
