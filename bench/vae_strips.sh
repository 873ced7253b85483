#!/usr/bin/env bash
# The VAE's split decode (row strips, for pictures that do not fit whole) against the whole
# decode, fp32, one binary, SIDE x SIDE (default 2048): the full-size decoder with random weights
# (bench/vae.py make-ckpt; needs diffusers) on random latents, `moss bench-vae` strip mode:
# every kept picture in host memory (strips of 64 and 256 rows), all on the device
# (--keep-gib 64), and the planner's split for 4, 6 and 8 GiB free. A table row per split: its
# time (median after the first run, which pins host memory) against the whole decode's, whether
# the RGB8 bytes are identical (in process, and the files' sha256), the device pool's peak
# (weights included) of each, where the pictures were kept and the bytes moved host <-> device.
#   bench/vae_strips.sh MOSS_BIN OUT_DIR [SIDE]      (diffusers importable or .whl/diffusers-*.whl)
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
M=$1; OUT=$2; SIDE=${3:-2048}; W=${WORK:-/tmp/moss-bench}; mkdir -p "$OUT" "$W"
if ls .whl/diffusers-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ ! -e $W/full/vae/config.json ]; then
  python3 bench/vae.py make-ckpt $W > $OUT/vae_strips_ckpt.txt 2>&1 || { cat $OUT/vae_strips_ckpt.txt; exit 1; }
fi
Z=$W/z$SIDE.f32
[ -e $Z ] || python3 -c "import numpy as np; s=$SIDE//16; np.random.default_rng(11).standard_normal((1,128,s,s)).astype('<f4').tofile('$Z')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run() {
  tag=$1; shift
  timeout 300 $M bench-vae --model $W/full --device cuda --latents $Z --reps 3 --out-rgb $W/strips_$tag.rgb "$@" \
    > $OUT/vae_strips_$tag.json 2> $OUT/vae_strips_$tag.err
  echo "$tag rc=$? ($*)"
}
run host64 --strip-rows 64
run host256 --strip-rows 256
run device64 --strip-rows 64 --keep-gib 64
run device256 --strip-rows 256 --keep-gib 64
run plan4 --plan-free-gib 4
run plan6 --plan-free-gib 6
run plan8 --plan-free-gib 8
echo "sha256 of the split decodes' RGB8 bytes (all must be the same):"
sha256sum $W/strips_*.rgb | sed "s|$W/||"
python3 - "$OUT" "$SIDE" <<'PY' | tee $OUT/vae_strips.md
import glob, json, os, sys
out, side = sys.argv[1], sys.argv[2]
g = 2 ** 30
print(f"| VAE {side}x{side} split | split ms | whole ms | split / whole | RGB8 identical | pool peak split / whole GiB | pictures device / host | GB moved |")
print("|---|---:|---:|---:|---|---:|---:|---:|")
for f in sorted(glob.glob(f"{out}/vae_strips_*.json")):
    tag = os.path.basename(f)[11:-5]
    try:
        d = json.load(open(f))
    except Exception:
        print(f"| {tag} | failed: {open(f[:-5] + '.err').read().strip()[-200:]} |||||||")
        continue
    print(f"| {tag}: {d['split']} | {d['split_ms_median_after_first']:.1f} (first {d['split_ms'][0]:.1f}) | {d['whole_ms_median']:.1f} "
          f"| {d['split_over_whole']:.2f} | {d['identical_rgb8']} | {d['pool_peak_bytes_split'] / g:.2f} / {d['pool_peak_bytes_whole'] / g:.2f} "
          f"| {d['device_pictures']} / {d['host_pictures']} | {d['host_bytes_moved'] / 1e9:.1f} |")
PY
