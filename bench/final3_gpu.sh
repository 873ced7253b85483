#!/usr/bin/env bash
# The integration run of the merged build (session 13), in one device call: every gate, then each
# stage at full size on one random checkpoint in the real layout, each next to its PyTorch reference
# timed in the same call:
#   1. moss check --device cuda (all gates and planted controls);
#   2. bench/full_ckpt.sh: text encoder (9B), DiT (42 blocks), VAE, tokenizer, random weights;
#   3. encoder: moss bench-encode at 128 and 4096 tokens (forward + download, and device_median_ms:
#      hidden states left on the GPU as transformers' timing leaves them), transformers bf16 + fp32
#      (TF_REPS timed runs each), hidden states of both against the fp32 run (compare); moss again
#      after transformers (drift);
#   4. VAE 1024 and 2048: moss bench-vae vs diffusers fp32 (TF32 off/on) and a float64 decode;
#      ENV_VAE variants (forward time only);
#   5. the split decode at 2048: forced strips (MOSS_VAE_STRIP_ROWS) and the automatic split while
#      another process holds all but 8 GiB; RGB bytes against the whole decode;
#   6. DiT 1024x1024: moss bench-dit (forwards + 50 guided steps), no torch (regression check);
#   7. golden checkpoints: CUDA decode vs CPU decode and golden pixels;
#   8. moss generate 1024x1024 50 steps end to end.
# Needs: the release binary in $BIN (default .final/moss), .whl/diffusers-*.whl.
set -uo pipefail
BIN=${BIN:-.final/moss}
# Everything lands in $O; at the end it is packed into $OUT/final3.tgz plus $OUT/log.txt (the
# device tool brings back at most 8 files).
O=/tmp/final3out; W=/tmp/final; mkdir -p "$O" "$W" "${OUT:=/tmp/finalout}"
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
F=$W/full; E=$F/text_encoder

el "== 3. encoder 128 / 4096 tokens vs transformers"
enc() { # tag, env...
  local tag=$1; shift
  env "$@" timeout 90 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt \
    --out $E/moss_bf16_128.st --out $E/moss_bf16_4096.st --device cuda --reps 7 > $O/enc_$tag.jsonl 2>$O/enc_$tag.err
  echo "bench-encode $tag rc=$?"
  python3 - $O/enc_$tag.jsonl $tag <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        print(f"  moss {sys.argv[2]:10} L={j['tokens']:5} median {j['median_ms']:.2f} ms, device {j.get('device_median_ms', float('nan')):.2f} ms, download {j.get('download_median_ms', float('nan')):.2f} ms")
PY
}
enc default
for v in ${ENV_ENC:-}; do enc "${v//[=,]/_}" ${v//,/ }; done
TF_REPS=${TF_REPS:-5} timeout 240 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v Warning | tail -8
enc default   # writes moss_bf16.jsonl's source again after transformers (drift)
cp $O/enc_default.jsonl $E/moss_bf16.jsonl
python3 bench/encoder_gpu.py compare $E 2>&1 | tee $O/enc_compare.txt

el "== 4. VAE vs diffusers fp32 and float64"
V=$W/vae; mkdir -p $V; ln -sfn $F $V/full
python3 -c "
import numpy as np
g = np.random.default_rng(11)
for s in (1024, 2048): g.standard_normal((1, 128, s // 16, s // 16)).astype('<f4').tofile('$V/z%d.f32' % s)"
for s in 1024 2048; do
  timeout 90 $BIN bench-vae --model $F --device cuda --latents $V/z$s.f32 --reps 5 \
    --out-f32 $V/moss$s.f32 --out-rgb $V/moss$s.rgb > $V/moss$s.json 2>&1
  echo "$s rc=$?"; cp $V/moss$s.json $O/vae$s.json
  jq1 $V/moss$s.json "'default forward_ms', [round(x,1) for x in j['forward_ms']], 'median', round(j['forward_ms_median'],1)"
  for v in ${ENV_VAE:-}; do
    env ${v//,/ } timeout 90 $BIN bench-vae --model $F --device cuda --latents $V/z$s.f32 --reps 3 > $O/vae${s}_${v//[=,]/_}.json 2>&1
    jq1 $O/vae${s}_${v//[=,]/_}.json "'$v forward_ms', [round(x,1) for x in j['forward_ms']]"
  done
  timeout 120 python3 bench/vae_bench.py ref $V $s || echo "ref $s failed"
done

el "== 5. split decode at 2048: forced strips, then automatic under memory pressure"
MOSS_VAE_STRIP_ROWS=${STRIP_ROWS:-256} timeout 90 $BIN bench-vae --model $F --device cuda --latents $V/z2048.f32 --decode-only --reps 2 \
  --out-rgb $V/strips2048.rgb > $O/vae2048_strips.json 2>&1; echo "forced strips rc=$?"; tail -c 600 $O/vae2048_strips.json; echo
cmp $V/strips2048.rgb $V/moss2048.rgb && echo "forced strips: RGB bytes identical to the whole decode"
rm -f $W/held
python3 -c "
import torch, time
free, total = torch.cuda.mem_get_info()
x = torch.empty(free - 8 * 2**30, dtype=torch.uint8, device='cuda'); open('$W/held', 'w').close(); time.sleep(60)" &
H=$!; for i in $(seq 120); do [ -e $W/held ] && break; sleep 0.5; done; ls $W/held
timeout 90 $BIN bench-vae --model $F --device cuda --latents $V/z2048.f32 --decode-only --reps 2 \
  --out-rgb $V/auto2048.rgb > $O/vae2048_auto.json 2>&1; echo "auto split rc=$?"; tail -c 600 $O/vae2048_auto.json; echo
cmp $V/auto2048.rgb $V/moss2048.rgb && echo "automatic split: RGB bytes identical to the whole decode"
kill $H; wait $H 2>/dev/null

el "== 6. DiT 1024x1024 (moss only)"
timeout 120 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
  --steps 50 --forwards 5 > $O/dit.json; echo "bench-dit rc=$?"
jq1 $O/dit.json "'moss forward_ms_median', round(j['forward_ms_median'],2), 'loop_s', round(j['loop_s'],3)"

el "== 7. golden checkpoints: CUDA decode vs CPU"
G=$W/golden; mkdir -p $G
python3 bench/vae_bench.py golden-z $G > /dev/null
for spec in "tiny-a 64x64" "tiny-b 96x64"; do
  set -- $spec
  $BIN decode $G/$1.z.f32 --model golden/$1 --size $2 --device cpu --out $G/$1.cpu.png -q
  $BIN decode $G/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $G/$1.cuda.png -q || echo "decode $1 failed"
  echo "$1 ($2):"; python3 bench/vae_bench.py cmp-png $G/$1.cuda.png $G/$1.cpu.png $G/$1.pixels.u8
done

el "== 8. end to end"
$BIN generate --device cuda --model $F --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 --steps 50 --json --out $W/full50.png; echo "rc=$?"
el "done"; date -u
tar czf "$OUT/final3.tgz" -C "$O" . && cp "$O/log.txt" "$OUT/log.txt"
