#!/usr/bin/env bash
# Issue #8, helper "vaeattn16" (bench/notes-vaeattn16.md): the fp16 hi/lo attention kernels
# (MOSS_VAE_ATTN=f16 | f16r, cuda/vae_attn16.cu) against flash (the default before) and flash2,
# one device call (as run on the H200: VARIANTS="flash2 f16 f16r f16o" with flash the default):
#   1. `moss check --device cuda --model golden/tiny-a` (all gates; the flash / flash2 / f16 rows shown);
#   2. full-size decoder (random weights, bench/vae_bench.py make-ckpt) at 1024 and 2048:
#      `moss bench-vae --reps 3` per MOSS_VAE_ATTN value, the attention row of the per-op profile;
#   3. `vae_bench.py ref`: diffusers fp32 (TF32 off / on) time, float64 decode, every variant's
#      error against it (VAE_EXTRA) and its max abs vs the default;
#   4. a table, printed last.
# Prepare: .dev-vaeattn16/moss.xz (stripped release binary), this script, bench/vae_bench.py.
# Run: D=.dev-vaeattn16 OUT=$OUT bash .dev-vaeattn16/vaeattn16_gpu.sh   (carry .dev-vaeattn16 and .whl; timeout 200)
set -u
D=${D:-.dev-vaeattn16}
OUT=${OUT:-/tmp/vaeattn16out}; mkdir -p "$OUT"
W=${W:-/tmp/va16work}; mkdir -p $W
VB=$D/vae_bench.py; [ -f $VB ] || VB=bench/vae_bench.py
VARIANTS=${VARIANTS:-"flash flash2 f16r"}  # (f16o of the measured run is a control now; f16 the default)
export PYTHONUNBUFFERED=1
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
[ -x $D/moss ] || { python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x $D/moss; }
if [ -z "${NO_PIP:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site
fi
M=$D/moss
grep -c moss_vae_attn16_d384 $M | sed 's/^/attn16 kernel name occurrences in the binary: /'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
(timeout 60 python3 $VB make-ckpt $W > $OUT/make.txt 2>&1; echo "make-ckpt rc=$?" >> $OUT/make.txt) &
MK=$!
ts "== moss check --device cuda --model golden/tiny-a"
timeout ${CHECK_S:-70} $M check --device cuda --model golden/tiny-a > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "flash|f16|kernel gates|FAIL|ACCEPTED|all passed" $OUT/check.txt | cut -c1-200
wait $MK; tail -2 $OUT/make.txt
summ() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'forward_ms', j.get('forward_ms'), 'median', j.get('forward_ms_median')); [print(f\"   {r['ms']:9.2f} ms {r['calls']:4d}x  {r['op']}\") for r in j.get('profile', []) if 'attention' in r['op']]" "$@" 2>/dev/null || { echo "$2: FAILED"; tail -c 600 "$1"; }; }
for side in 1024 2048; do
  ts "== $side"
  timeout 40 $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-f32 $W/moss$side.f32 --out-rgb $W/moss$side.rgb > $W/moss$side.json 2>&1
  cp $W/moss$side.json $OUT/; summ $W/moss$side.json "default $side"
  EXTRA=""
  for va in $VARIANTS; do
    MOSS_VAE_ATTN=$va timeout 40 $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps 3 --out-f32 $W/${va}_$side.f32 --out-rgb $W/${va}_$side.rgb > $W/${va}_$side.json 2>&1
    cp $W/${va}_$side.json $OUT/; summ $W/${va}_$side.json "MOSS_VAE_ATTN=$va $side"
    [ -s $W/${va}_$side.f32 ] && EXTRA="$EXTRA,moss MOSS_VAE_ATTN:$va=$W/${va}_$side"
  done
  ts "ref $side"
  VAE_EXTRA="${EXTRA#,}" timeout 60 python3 $VB ref $W $side > $OUT/ref$side.txt 2>&1 || echo "ref $side failed"
  tail -9 $OUT/ref$side.txt | cut -c1-300
  cp $W/table$side.json $OUT/ 2>/dev/null
done
ts "== check summary"
grep -E "f16|flash2|kernel gates|all passed|FAIL|ACCEPTED" $OUT/check.txt | cut -c1-200
ts "== table"
python3 - $OUT <<'PY'
import json, sys
o = sys.argv[1]
def att(f):
    try:
        return sum(r["ms"] for r in json.load(open(f))["profile"] if "attention" in r["op"])
    except Exception:
        return float("nan")
print(f"{'side':>5} {'what':40} {'ms':>9} {'attn ms':>8} {'mean abs':>9} {'max abs':>9} {'off':>6} {'>1':>3} {'vs default':>10}")
for side in (1024, 2048):
    try:
        rows = json.load(open(f"{o}/table{side}.json"))
    except Exception as e:
        print(side, "no table:", e); continue
    for r in rows:
        w = r["what"]
        f = f"{o}/moss{side}.json" if w.startswith("moss cuda") else f"{o}/{w.split(':')[-1]}_{side}.json" if "MOSS_VAE_ATTN:" in w else None
        a = att(f) if f else float("nan")
        print(f"{side:5d} {w[:40]:40} {r.get('ms', float('nan')):9.2f} {a:8.2f} {r.get('mean_abs', float('nan')):9.2e} "
              f"{r.get('max_abs', float('nan')):9.2e} {r.get('px_off', -1):6d} {r.get('px_off_gt1', -1):3d} {r.get('max_abs_vs_default', float('nan')):10.2e}")
PY
ts "done"
