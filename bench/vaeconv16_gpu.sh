#!/usr/bin/env bash
# Issue #8, helper "vaeconv16" (bench/notes-vaeconv16.md): the split-fp16 VAE conv
# (MOSS_VAE_CONV=f16 and the f16a accumulation variant) against the split-TF32 halo conv, one call:
#   1. `moss check --device cuda --model golden/tiny-a` (every gate; the fp16 conv rows, controls,
#      the overflow fallback, the split decode with fp16 convs);
#   2. the full-size decoder (random weights, bench/vae_bench.py make-ckpt) at 1024 and 2048:
#      `moss bench-vae --reps 3` with MOSS_VAE_CONV=halo|f16|f16a|f16b (forward median, decode_rgb8
#      median, the convs' share of the per-op profile);
#   3. `vae_bench.py ref`: diffusers fp32 (TF32 off / on), float64 decode, errors of all three;
#   4. a table, printed last.
# Prepare: .dev-vaeconv16/moss.xz (stripped release binary), this script and vae_bench.py there.
# Run: D=.dev-vaeconv16 OUT=$OUT bash .dev-vaeconv16/vaeconv16_gpu.sh  (carry .dev-vaeconv16, .whl)
set -u
D=${D:-.dev-vaeconv16}
OUT=${OUT:-/tmp/vc16out}; mkdir -p "$OUT"
W=/tmp/vc16work; mkdir -p $W/out
# $OUT gets few files (a run returns at most 8): check.txt, make.txt and one archive a picture size
# (bench-vae JSONs, stderr, ref logs, tables); `table` reads the tables from $W/out.
VB=$D/vae_bench.py; [ -f $VB ] || VB=bench/vae_bench.py
export PYTHONUNBUFFERED=1
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
M=$D/moss
[ -x $M ] || { python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/moss.xz'), open('$D/moss','wb'))" && chmod +x $M; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site
grep -c moss_vae_conv16_b128_k3 $M | sed 's/^/conv16 kernel name occurrences in the binary: /'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
(python3 $VB make-ckpt $W > $OUT/make.txt 2>&1; echo "make-ckpt rc=$?" >> $OUT/make.txt) &
MK=$!
ts "== moss check --device cuda --model golden/tiny-a"
timeout 110 $M check --device cuda --model golden/tiny-a > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "fp16|f16|overflow|split decode|kernel gates|FAIL|ACCEPTED|all passed" $OUT/check.txt | cut -c1-230
wait $MK; tail -2 $OUT/make.txt
summ() { python3 -c "
import json,sys
j=json.load(open(sys.argv[1]))
conv=sum(r['ms'] for r in j.get('profile',[]) if 'conv' in r['op'])
print(f\"{sys.argv[2]:14} forward {j.get('forward_ms')} median {j.get('forward_ms_median'):.2f}  decode_rgb8 median {j.get('decode_rgb8_ms_median'):.2f}  convs (profile) {conv:.1f} ms\")
" "$@" 2>/dev/null || { echo "$2: FAILED"; tail -c 600 "$1"; }; }
table() { python3 - $W/out "$@" <<'PY'
import json, sys
o = sys.argv[1]
def prof(f):
    try:
        j = json.load(open(f))
        return sum(r["ms"] for r in j["profile"] if "conv" in r["op"]), j["decode_rgb8_ms_median"]
    except Exception:
        return float("nan"), float("nan")
print(f"{'side':>5} {'what':44} {'fwd ms':>8} {'rgb8 ms':>8} {'conv ms':>8} {'mean abs':>9} {'max abs':>9} {'off':>6} {'>1':>3}")
for side in sys.argv[2:]:
    try:
        rows = json.load(open(f"{o}/table{side}.json"))
    except Exception as e:
        print(side, "no table:", e); continue
    for r in rows:
        w = r["what"]
        src = f"{o}/halo_{side}.json" if w.startswith("moss cuda") else f"{o}/f16_{side}.json" if w.startswith("moss f16 ") else f"{o}/f16a_{side}.json" if w.startswith("moss f16a") else f"{o}/f16b_{side}.json" if w.startswith("moss f16b") else None
        c, d = prof(src) if src else (float("nan"), float("nan"))
        print(f"{side:>5} {w[:44]:44} {r.get('ms', float('nan')):8.2f} {d:8.2f} {c:8.2f} {r.get('mean_abs', float('nan')):9.2e} "
              f"{r.get('max_abs', float('nan')):9.2e} {r.get('px_off', -1):6d} {r.get('px_off_gt1', -1):3d}"
              + (f"  vs halo max abs {r['max_abs_vs_default']:.2e}" if "max_abs_vs_default" in r else ""))
PY
}
for side in 1024 2048; do
  ts "== $side"
  for v in halo f16 f16a f16b; do
    pre=$W/${v}_$side; [ $v = halo ] && pre=$W/moss$side
    reps=3; [ $v = f16a -o $v = f16b ] && reps=2
    MOSS_VAE_CONV=$v $M bench-vae --model $W/full --device cuda --latents $W/z$side.f32 --reps $reps --out-f32 $pre.f32 --out-rgb $pre.rgb > $pre.json 2>$W/${v}_$side.err
    cp $pre.json $W/out/${v}_$side.json; cp $W/${v}_$side.err $W/out/ 2>/dev/null
    summ $pre.json "$v $side"
  done
  ts "ref $side"
  VAE_EXTRA="moss f16 (MOSS_VAE_CONV f16)=$W/f16_$side,moss f16a (MOSS_VAE_CONV f16a)=$W/f16a_$side,moss f16b (MOSS_VAE_CONV f16b)=$W/f16b_$side" python3 $VB ref $W $side > $W/out/ref$side.txt 2>&1 || echo "ref $side failed"
  tail -3 $W/out/ref$side.txt | cut -c1-300
  cp $W/table$side.json $W/out/ 2>/dev/null
  table $side
  tar -C $W/out -czf $OUT/side$side.tgz . 2>/dev/null
done
ts "== table"
grep -E "kernel gates|all passed|FAIL|ACCEPTED" $OUT/check.txt | head -5
table 1024 2048
ts "done"
