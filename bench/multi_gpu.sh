#!/usr/bin/env bash
# One picture over several GPUs (`--devices`): moss generate at each SIZE (square), 50 steps, guidance 3, seed 42, on 1, 2, 4
# and 8 GPUs (those the machine has): wall time and the --json denoise time, the denoise's speed-up over one GPU and its
# efficiency (speed-up / GPUs), the layout (CFG groups x sequence ranks), the peak memory of every GPU used (nvidia-smi every
# 50 ms, less that GPU's memory before the run), and the picture against one GPU's: the latents byte for byte (CFG-parallel,
# 2 GPUs, must be), else their relative L2 distance, and the pictures' PSNR and SSIM (moss bench-compare).
#   bench/multi_gpu.sh CKPT OUT_DIR MOSS_BIN [SIZES] [COUNTS]      (SIZES default "1024 2048", COUNTS default "1 2 4 8")
# CKPT: a full-size checkpoint (bench/full_ckpt.sh). NCCL: moss loads libnccl.so; without one on the library path, the
# script links the libnccl.so.2 of torch's nvidia-nccl wheel as $OUT/nccl/libnccl.so and puts that folder first.
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; BIN=$3; SIZES=${4:-1024 2048}; COUNTS=${5:-1 2 4 8}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
  NCCL=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  if [ -n "$NCCL" ] && [ -e "$NCCL" ]; then
    mkdir -p $OUT/nccl && ln -sf "$NCCL" $OUT/nccl/libnccl.so && export LD_LIBRARY_PATH=$OUT/nccl:${LD_LIBRARY_PATH:-}
    echo "NCCL: $NCCL (as $OUT/nccl/libnccl.so)"
  else
    echo "NCCL: no libnccl.so on the library path and no nvidia-nccl wheel found; the runs on several GPUs will say so"
  fi
fi
P="a lighthouse at dusk, oil painting"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
T=$OUT/multi_gpu.md
echo "| size | GPUs | layout | exit | wall s | denoise s | speed-up | efficiency | peak GiB per GPU | latents vs 1 GPU | pixels vs 1 GPU |" | tee $T
echo "|---|---:|---|---:|---:|---:|---:|---:|---|---|---|" | tee -a $T
for S in $SIZES; do
  for N in $COUNTS; do
    if [ "$N" -gt "$GPUS" ]; then echo "| ${S}x$S | $N | not run: the machine has $GPUS GPUs | | | | | | | | |" | tee -a $T; continue; fi
    DEV=$(seq -s, -f "cuda:%g" 0 $((N - 1))); tag=${S}_$N
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits > $OUT/base_$tag.txt
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 50 > $OUT/smi_$tag.txt &
    smi=$!; s=$(date +%s.%N)
    $BIN generate --devices "$DEV" --model "$F" --prompt "$P" --size ${S}x$S --steps 50 --seed 42 --guidance 3 --json -v -y \
      --out $OUT/pic_$tag.png --save-latents $OUT/lat_$tag.safetensors > $OUT/gen_$tag.json 2> $OUT/gen_$tag.err; rc=$?
    wall=$(python3 -c "import time; print(f'{time.time() - $s:.2f}')")
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    cmp=$( [ "$N" != 1 ] && [ -e $OUT/pic_${S}_1.png ] && [ -e $OUT/pic_$tag.png ] && $BIN bench-compare $OUT/pic_${S}_1.png $OUT/pic_$tag.png 2>&1 )
    python3 - "$S" "$N" "$rc" "$wall" "$OUT" "$tag" "${S}_1" "${cmp:-}" <<'PY' | tee -a $T
import json, os, sys
import numpy as np
S, N, rc, wall, out, tag, one, cmp = sys.argv[1:]
N = int(N)
def load(t):
    from safetensors.numpy import load_file
    p = f"{out}/lat_{t}.safetensors"
    return load_file(p)["latents"].astype(np.float64) if os.path.exists(p) else None
try:
    j = json.load(open(f"{out}/gen_{tag}.json")); den = j["timings"]["denoise_s"]
    par = j.get("parallel") or {"cfg_groups": 1, "seq_ranks": 1}
    layout = f"{par['cfg_groups']} x {par['seq_ranks']}"
except Exception as e:
    den, layout = float("nan"), f"(no result: {e.__class__.__name__})"
try:
    d1 = json.load(open(f"{out}/gen_{one}.json"))["timings"]["denoise_s"]
    up = d1 / den
    speed, eff = f"{up:.2f}", f"{up / N:.2f}"
except Exception:
    speed = eff = "-"
base = [int(x) for x in open(f"{out}/base_{tag}.txt").read().split()]
peak = {}
for line in open(f"{out}/smi_{tag}.txt"):
    try:
        i, used = (int(x) for x in line.split(","))
    except ValueError:
        continue
    peak[i] = max(peak.get(i, 0), used)
per = " / ".join(f"{(peak.get(i, 0) - base[i]) / 1024:.1f}" for i in range(N))
a, b = load(tag), load(one)
if a is None or b is None or tag == one:
    lat = "-"
elif open(f"{out}/lat_{tag}.safetensors", "rb").read() == open(f"{out}/lat_{one}.safetensors", "rb").read():
    lat = "identical"
else:
    lat = f"rel L2 {np.linalg.norm(a - b) / np.linalg.norm(b):.2e}"
# moss bench-compare: PSNR (null: the same pixels) and SSIM of the two pictures.
try:
    c = json.loads(cmp)
    pix = "identical" if c["psnr_db"] is None else f"PSNR {c['psnr_db']:.1f} dB, SSIM {c['ssim']:.4f}"
except Exception:
    pix = "-" if not cmp else cmp.strip()[:60]
print(f"| {S}x{S} | {N} | {layout} | {rc} | {wall} | {den:.2f} | {speed} | {eff} | {per} | {lat} | {pix} |")
PY
  done
done
echo "(each run's -v plan, layout and timing lines: $OUT/gen_*.err)"
