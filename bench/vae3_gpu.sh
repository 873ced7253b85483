#!/usr/bin/env bash
# Issue #8, helper "vae3" (bench/notes-vae3.md): the opt-in attention MOSS_VAE_ATTN=flash2 (K and V
# split into hi/lo once, key tile 16) against the default (moss_vae_flash_d384), one device call:
#   1. `moss check --device cuda --model golden/tiny-a` (the flash/flash2 gate and control rows);
#   2. the full-size decoder (random weights, widths 96/192/384/384, bench/vae_bench.py make-ckpt)
#      at 1024 and 2048: `moss bench-vae --reps 3` without and with MOSS_VAE_ATTN=flash2, their
#      attention rows of the per-op profile;
#   3. `vae_bench.py ref`: diffusers fp32 (TF32 off / on) time, float64 decode, errors of the
#      default and (VAE_EXTRA) of flash2 against it, flash2 vs default max abs;
#   4. a table, printed last.
# Prepare (on the CPU machine, see notes-vae3.md): .dev-vae3/moss.xz (stripped release binary of
# branch vae3), .dev-vae3/vae3_gpu.sh and .dev-vae3/vae_bench.py (this branch's copies).
# Run: D=.dev-vae3 OUT=$OUT bash .dev-vae3/vae3_gpu.sh     (carry .dev-vae3 and .whl; timeout 180)
set -u
D=${D:-.dev-vae3}
OUT=${OUT:-/tmp/vae3out}; mkdir -p "$OUT"
W=/tmp/vae3work; mkdir -p $W
VB=$D/vae_bench.py; [ -f $VB ] || VB=bench/vae_bench.py
export PYTHONUNBUFFERED=1
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x $D/moss
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site
M=$D/moss
grep -c moss_vae_flash2_d384 $M | sed 's/^/flash2 kernel name occurrences in the binary: /'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
(python3 $VB make-ckpt $W > $OUT/make.txt 2>&1; echo "make-ckpt rc=$?" >> $OUT/make.txt) &
MK=$!
ts "== moss check --device cuda --model golden/tiny-a"
timeout 100 $M check --device cuda --model golden/tiny-a > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "flash|kernel gates|FAIL|ACCEPTED|all passed" $OUT/check.txt | cut -c1-220
wait $MK; tail -2 $OUT/make.txt
summ() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'forward_ms', j.get('forward_ms'), 'median', j.get('forward_ms_median')); [print(f\"   {r['ms']:9.2f} ms {r['calls']:4d}x  {r['op']}\") for r in j.get('profile', []) if 'attention' in r['op']]" "$@" 2>/dev/null || { echo "$2: FAILED"; tail -c 600 "$1"; }; }
for side in 1024 2048; do
  ts "== $side"
  $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-f32 $W/moss$side.f32 --out-rgb $W/moss$side.rgb > $W/moss$side.json 2>&1
  cp $W/moss$side.json $OUT/; summ $W/moss$side.json "default (flash) $side"
  MOSS_VAE_ATTN=flash2 $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-f32 $W/f2_$side.f32 --out-rgb $W/f2_$side.rgb > $W/f2_$side.json 2>&1
  cp $W/f2_$side.json $OUT/; summ $W/f2_$side.json "MOSS_VAE_ATTN=flash2 $side"
  ts "ref $side"
  VAE_EXTRA="moss MOSS_VAE_ATTN=flash2=$W/f2_$side" python3 $VB ref $W $side > $OUT/ref$side.txt 2>&1 || echo "ref $side failed"
  tail -8 $OUT/ref$side.txt | cut -c1-400
  cp $W/table$side.json $OUT/ 2>/dev/null
done
ts "== table"
python3 - $OUT <<'PY'
import json, os, sys
o = sys.argv[1]
def att(f):
    try:
        return sum(r["ms"] for r in json.load(open(f))["profile"] if "attention" in r["op"])
    except Exception:
        return float("nan")
print(f"{'side':>5} {'what':46} {'ms':>9} {'attn ms':>8} {'mean abs':>9} {'max abs':>9} {'off':>6} {'>1':>3}")
for side in (1024, 2048):
    try:
        rows = json.load(open(f"{o}/table{side}.json"))
    except Exception as e:
        print(side, "no table:", e); continue
    for r in rows:
        a = att(f"{o}/moss{side}.json") if r["what"].startswith("moss cuda") else att(f"{o}/f2_{side}.json") if "flash2" in r["what"] else float("nan")
        print(f"{side:5d} {r['what'][:46]:46} {r.get('ms', float('nan')):9.2f} {a:8.2f} {r.get('mean_abs', float('nan')):9.2e} "
              f"{r.get('max_abs', float('nan')):9.2e} {r.get('px_off', -1):6d} {r.get('px_off_gt1', -1):3d}"
              + (f"  vs default max abs {r['max_abs_vs_default']:.2e}" if "max_abs_vs_default" in r else ""))
PY
ts "done"
