#!/usr/bin/env bash
# The split VAE decode on the GPU (issue #8), one device call: the VAE gates of `moss check`
# (split-invariant GroupNorm statistics), then the full-size decoder (random weights, widths
# 96/192/384/384) at 1024x1024 and 2048x2048: whole vs forced row strips (MOSS_VAE_STRIP_ROWS),
# RGB8 bytes compared and timed; then the automatic split: another process holds all but
# ~6 GiB of the GPU and `moss bench-vae --decode-only` (the pipeline's decode, no env var) must
# split and give the same bytes; with ~1.5 GiB left it must refuse with numbers.
# Run on the device from the repository root, carrying .dev-vaesplit (moss binary) and .whl.
set -u
OUT=${OUT:-/tmp/vsout}; mkdir -p "$OUT"
W=/tmp/vswork; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
M=./.dev-vaesplit/moss
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
if [ "${SKIP_CHECK:-0}" != 1 ]; then
echo "== moss check --device cuda --model golden/tiny-a"
t=$(date +%s)
$M check --device cuda --model golden/tiny-a > $OUT/check.txt 2>&1; echo "check rc=$? ($(( $(date +%s) - t )) s)"
grep -E "vae|VAE|gates|FAIL|ACCEPTED|passed" $OUT/check.txt | cut -c1-200
fi
echo "== full-size checkpoint"
t=$(date +%s)
python3 bench/vae_bench.py make-ckpt $W > $OUT/make-ckpt.txt 2>&1 || { cat $OUT/make-ckpt.txt; exit 1; }
echo "make-ckpt $(( $(date +%s) - t )) s"
same() { if cmp -s "$1" "$2"; then echo "IDENTICAL bytes: $1 == $2"; else echo "DIFFERENT: $1 vs $2 ($(cmp -l "$1" "$2" 2>/dev/null | wc -l) bytes differ)"; fi; }
# A size whose widths are not multiples of the conv's 128-pixel tile (130, 260, 520, 1040).
python3 -c "import numpy as np; np.random.default_rng(1).standard_normal((1,128,65,65)).astype('<f4').tofile('$W/z1040.f32')"
for side in 1040 1024 2048; do
  echo "== $side x $side"
  $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-rgb $W/whole$side.rgb > $OUT/whole$side.json 2>$OUT/whole$side.err || echo "whole $side failed"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('whole: forward_ms_median', round(d['forward_ms_median'],1), 'decode_rgb8_ms_median', round(d['decode_rgb8_ms_median'],1), d['split_of_decode_rgb8'])" $OUT/whole$side.json || cat $OUT/whole$side.json
  case $side in 1040) RS="99";; 1024) RS="99 256";; *) RS="256";; esac
  for rows in $RS; do
    MOSS_VAE_STRIP_ROWS=$rows $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps $([ $side = 2048 ] && echo 1 || echo 2) --decode-only --out-rgb $W/strip$side-$rows.rgb > $OUT/strip$side-$rows.json 2>&1 || echo "strips $rows at $side failed"
    cat $OUT/strip$side-$rows.json | cut -c1-400; echo
    same $W/whole$side.rgb $W/strip$side-$rows.rgb
  done
done
echo "== automatic split at 2048x2048 with ~6 GiB free"
hog() {  # hold all but $1 GiB of the GPU until killed
  python3 -c "
import torch,time,sys
f,t=torch.cuda.mem_get_info(); keep=int(float(sys.argv[1])*2**30)
x=torch.empty(max(0,f-keep),dtype=torch.uint8,device='cuda'); torch.cuda.synchronize()
print('hog holds %.1f GiB, free now %.2f GiB'%(x.numel()/2**30, torch.cuda.mem_get_info()[0]/2**30),flush=True)
open('/tmp/hog.ready','w').close(); time.sleep(300)" $1 &
  HOG=$!
  for i in $(seq 60); do [ -f /tmp/hog.ready ] && break; sleep 0.5; done
}
rm -f /tmp/hog.ready; hog 6
$M bench-vae --model $W/full --device cuda --latents $W/z2048.f32 --reps 1 --decode-only --out-rgb $W/auto2048.rgb > $OUT/auto2048.json 2>&1; echo "auto rc=$?"
cat $OUT/auto2048.json | cut -c1-600; echo
same $W/whole2048.rgb $W/auto2048.rgb
kill $HOG; wait $HOG 2>/dev/null
echo "== too little memory (~1.5 GiB free): must refuse with numbers"
rm -f /tmp/hog.ready; hog 1.5
$M decode $W/z2048.f32 --model $W/full --device cuda --size 2048x2048 --out $W/refused.png; echo "refuse rc=$? (png exists: $([ -f $W/refused.png ] && echo yes || echo no))"
kill $HOG; wait $HOG 2>/dev/null
echo "== done"
