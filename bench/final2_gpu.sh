#!/usr/bin/env bash
# The integration run of the merged build, in one device call (~6 minutes): every gate, then each
# stage at full size on one random checkpoint in the real layout, each next to its PyTorch reference
# timed in the same call:
#   1. moss check --device cuda (all gates and planted controls);
#   2. bench/full_ckpt.sh: text encoder (9B), DiT (42 blocks), VAE, tokenizer, random weights;
#   3. DiT 1024x1024: moss bench-dit (5 forwards + 50 guided steps), FLASH_ALT variants' forwards,
#      and the torch.compile'd reference's forward and 50 steps (bench/dit_full.py compiled);
#   4. encoder: transformers bf16 + fp32 (bench/encoder_gpu.py tf), moss bench-encode at 128 and 4096
#      tokens, hidden states of both against the fp32 run (compare);
#   5. VAE 1024 and 2048: moss bench-vae vs diffusers fp32 (TF32 off/on) and a float64 decode;
#   6. moss generate 1024x1024 50 steps end to end;
#   7. generate while another process holds 130 GiB: the memory plan must refuse before loading.
# Needs: the release binary in $BIN (default .final/moss), .whl/diffusers-*.whl.
set -uo pipefail
BIN=${BIN:-.final/moss}
FLASH_ALT=${FLASH_ALT:-wgmma}
O=${OUT:-/tmp/finalout}; W=/tmp/final; mkdir -p "$O" "$W"
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
jq1() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print($2)" "$1" || tail -3 "$1"; }
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
chmod +x "$BIN"

el "== 1. moss check --device cuda"
timeout 240 $BIN check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$O/check.txt"

el "== 2. full-size random checkpoint"
timeout 200 bash bench/full_ckpt.sh $W/full > $O/ckpt.txt 2>&1 || { tail $O/ckpt.txt; exit 1; }
F=$W/full

el "== 3. DiT 1024x1024"
timeout 120 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
  --steps 50 --forwards 5 --save-velocity $W/moss.vel > $O/dit.json; echo "bench-dit rc=$?"
jq1 $O/dit.json "'moss forward_ms_median', round(j['forward_ms_median'],2), 'loop_s', round(j['loop_s'],3)"
for k in $FLASH_ALT; do
  MOSS_FLASH=$k timeout 60 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
    --forward-only --forwards 5 > $O/dit_$k.json 2>&1
  jq1 $O/dit_$k.json "'MOSS_FLASH=$k forward_ms_median', round(j['forward_ms_median'],2)"
done
timeout 150 python3 bench/dit_full.py compiled $F $W/moss.vel $O/torch_compiled.json 2>&1 | grep -v Warning | tail -2

el "== 4. encoder 128 / 4096 tokens vs transformers"
E=$F/text_encoder
timeout 200 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v Warning | tail -8
timeout 90 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt \
  --out $E/moss_bf16_128.st --out $E/moss_bf16_4096.st --device cuda --reps 5 > $E/moss_bf16.jsonl 2>&1; echo "bench-encode rc=$?"
cp $E/moss_bf16.jsonl $O/enc_moss.jsonl
python3 bench/encoder_gpu.py compare $E 2>&1 | tee $O/enc_compare.txt

el "== 5. VAE vs diffusers fp32 and float64"
V=$W/vae; mkdir -p $V; ln -sfn $F $V/full
python3 -c "
import numpy as np
g = np.random.default_rng(11)
for s in (1024, 2048): g.standard_normal((1, 128, s // 16, s // 16)).astype('<f4').tofile('$V/z%d.f32' % s)"
for s in 1024 2048; do
  timeout 60 $BIN bench-vae --model $F --device cuda --latents $V/z$s.f32 --reps 3 \
    --out-f32 $V/moss$s.f32 --out-rgb $V/moss$s.rgb > $V/moss$s.json 2>&1
  echo "$s rc=$?"; cp $V/moss$s.json $O/vae$s.json
  jq1 $V/moss$s.json "'forward_ms', [round(x,1) for x in j['forward_ms']]"
  timeout 90 python3 bench/vae_bench.py ref $V $s || echo "ref $s failed"
done

el "== 6. end to end"
$BIN generate --device cuda --model $F --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 --steps 50 --json --out $W/full50.png; echo "rc=$?"

el "== 7. memory plan with 130 GiB held by another process (must refuse before loading)"
rm -f $W/held
python3 -c "import torch,time; x=torch.empty(130*2**30,dtype=torch.uint8,device='cuda'); open('$W/held','w').close(); time.sleep(40)" &
H=$!; for i in $(seq 120); do [ -e $W/held ] && break; sleep 0.5; done; ls $W/held
t=$(date +%s.%N); timeout 60 $BIN generate --device cuda --model $F --prompt "x" --size 1024x1024 --steps 2 --out $W/oom.png; echo "exit code $? after $(python3 -c "import time;print(round(time.time()-$t,1))") s; file written: $(ls $W/oom.png 2>/dev/null || echo none)"
kill $H; wait $H 2>/dev/null
el "done"; date -u
