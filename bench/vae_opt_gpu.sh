#!/usr/bin/env bash
# Issue #8 speed work (helper "vae2", bench/notes-vae2.md), one device call: this branch's binary
# (as run on 2026-12-03 the default had the GroupNorm fused; it is opt-in now, MOSS_VAE_FUSE=1)
# ($D/moss.xz) against main's ($D/main.xz): `moss check --device cuda --model golden/tiny-a`
# (VAE rows), golden decodes cuda vs cpu, then the full-size decoder (random weights, widths
# 96/192/384/384) at 1024 and 2048: main's halo kernels and this branch's default (flash attention +
# GroupNorm fused into the conv load) with their per-op profiles, the accuracy of the default against
# float64 and diffusers fp32 (bench/vae_bench.py ref); then MOSS_VAE_CONV=halo32 (fp32 weight
# stream) and MOSS_VAE_ATTN=split (the earlier attention) if time is left.
# Run on the device: D=.dev-vae2 OUT=$OUT bash .dev-vae2/vae_opt_gpu.sh   (carry .dev-vae2 and .whl)
set -u
D=${D:-.dev-vae2}
OUT=${OUT:-/tmp/vae2out}; mkdir -p "$OUT"
W=/tmp/vaework; mkdir -p $W
export PYTHONUNBUFFERED=1
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
for b in moss main; do
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/$b.xz'), open('$D/$b','wb'))" && chmod +x $D/$b
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site
M=$D/moss; MAIN=$D/main
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
(python3 bench/vae_bench.py make-ckpt $W > $OUT/make.txt 2>&1; echo "make-ckpt rc=$?" >> $OUT/make.txt) &
MK=$!
ts "== moss check --device cuda --model golden/tiny-a"
timeout 100 $M check --device cuda --model golden/tiny-a > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "vae|VAE|kernel gates|FAIL|ACCEPTED|all passed" $OUT/check.txt | cut -c1-200
ts "== golden decodes"
python3 bench/vae_bench.py golden-z $W > /dev/null
for spec in "tiny-a 64x64" "tiny-b 96x64"; do
  set -- $spec
  $M decode $W/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $W/$1.cuda.png -q
  $M decode $W/$1.z.f32 --model golden/$1 --size $2 --device cpu --out $W/$1.cpu.png -q
  echo "$1:"; python3 bench/vae_bench.py cmp-png $W/$1.cuda.png $W/$1.cpu.png $W/$1.pixels.u8
done
wait $MK; cat $OUT/make.txt
summ() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'forward_ms', j.get('forward_ms'), 'median', j.get('forward_ms_median'), 'decode_rgb8 median', j.get('decode_rgb8_ms_median'))" "$@" 2>/dev/null || { echo "$2: FAILED"; tail -c 600 "$1"; }; }
for side in 1024 2048; do
  ts "== $side"
  MOSS_VAE_KERNELS=fast $MAIN bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 > $OUT/main$side.json 2>&1; summ $OUT/main$side.json "main (halo kernels)"
  $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-f32 $W/moss$side.f32 --out-rgb $W/moss$side.rgb > $W/moss$side.json 2>&1
  cp $W/moss$side.json $OUT/; summ $W/moss$side.json "vae2 default"
  python3 - $W/moss$side.json $OUT/main$side.json <<'EOF'
import json, sys
for f in sys.argv[1:]:
    j = json.load(open(f))
    rows = sorted(j.get("profile", []), key=lambda r: -r["ms"])
    print(f, "profile_total_ms", j.get("profile_total_ms"))
    for r in rows[:14]:
        print(f"   {r['ms']:9.2f} ms {r['calls']:4d}x  {r['op']}")
EOF
  ts "ref $side"
  python3 bench/vae_bench.py ref $W $side || echo "ref $side failed"
  cp $W/table$side.json $OUT/ 2>/dev/null
done
for side in 1024 2048; do
  ts "== halo32 $side"
  MOSS_VAE_FUSE=1 $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 > $OUT/fuse_$side.json 2>&1; summ $OUT/fuse_$side.json "vae2 MOSS_VAE_FUSE=1 $side"
  MOSS_VAE_FUSE=1 MOSS_VAE_CONV=halo32 $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 > $OUT/h32_$side.json 2>&1; summ $OUT/h32_$side.json "vae2 halo32 $side"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); [print(f\"   {r['ms']:9.2f} ms {r['calls']:4d}x  {r['op']}\") for r in sorted(j['profile'], key=lambda r: -r['ms'])[:8]]" $OUT/h32_$side.json
done
for side in 1024 2048; do
  MOSS_VAE_ATTN=split $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 1 > $OUT/split$side.json 2>&1; summ $OUT/split$side.json "vae2 MOSS_VAE_ATTN=split $side"
done
ts "done"
