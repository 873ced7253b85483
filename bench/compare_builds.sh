#!/usr/bin/env bash
# The product's GPU run, in one device call (about 8 minutes on an H200): this build (NEW) against
# an earlier one (BASE) on the same GPU, same weights, same inputs.
#
#   BASE=.final/moss_base NEW=.final/moss OUT=$OUT bash bench/compare_builds.sh
#
#   1. moss check --device cuda (every gate with its planted control), also with the portable path
#      forced (MOSS_KERNELS=portable) and a bad override value (must be refused);
#      meanwhile bench/full_ckpt.sh writes a full-size random checkpoint in the real layout;
#   2. golden tiny-a / tiny-b on CUDA, bf16, fp32 and fp8: NEW against BASE, pixels (the PNGs' IDAT
#      streams; NEW's metadata differs by design) and repeat identity;
#   3. moss generate 1024x1024, 50 steps, single shot, NEW and BASE alternating: wall time,
#      --json timings, pixel identity;
#   4. stages, NEW and BASE alternating: bench-dit (5 forwards + 50 guided steps), bench-encode
#      (128 tokens), bench-vae (1024x1024);
#   5. moss serve (bench/serve_bench.py): latency with the weights resident, throughput for 8
#      queued requests, peak GPU memory, byte identity against moss generate;
#   6. dit (not in the default set; a kernel change's A/B, ~2 minutes): the DiT forward at bf16 and
#      fp8, NEW and BASE alternating twice, 10 forwards each: every op's time side by side
#      (bench/dit_ops_table.py), and the latents after 2 guided steps of both builds compared byte
#      for byte.
# STAGES="check golden e2e stages serve" selects (the default; add `dit`). A step that fails prints FAILED.
# Needs .whl/diffusers-*.whl (the VAE of the random checkpoint).
set -uo pipefail
BASE=${BASE:-.final/moss_base}; NEW=${NEW:-.final/moss}
OUT=${OUT:-/tmp/moss-gpu-out}; W=/tmp/moss-gpu; mkdir -p "$OUT" "$W"
STAGES=${STAGES:-check golden e2e stages serve}
has() { [[ " $STAGES " == *" $1 "* ]]; }
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl \
  && export PYTHONPATH=/tmp/site || echo "FAILED: diffusers wheel"
chmod +x "$BASE" "$NEW"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
"$NEW" --version
# The IDAT stream of a PNG (the pixels as encoded; both builds use the same encoder settings).
idat() { python3 -c "
import sys, struct, hashlib
b = open(sys.argv[1], 'rb').read(); i = 8; h = hashlib.sha256()
while i < len(b):
    n, t = struct.unpack('>I4s', b[i:i+8])
    if t == b'IDAT': h.update(b[i+8:i+8+n])
    i += 12 + n
print(h.hexdigest()[:16])" "$1"; }
same() { [ "$(idat "$1")" = "$(idat "$2")" ] && echo identical || echo "DIFFERENT (FAILED)"; }

F=$W/full
if has check || has e2e || has stages || has serve || has dit; then
  (timeout 300 bash bench/full_ckpt.sh $F > $OUT/ckpt.txt 2>&1; echo "ckpt rc=$?" >> $OUT/ckpt.txt) &
  CK=$!
fi

if has check; then
  el "== 1. moss check --device cuda"
  timeout 200 "$NEW" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2>&1; echo "check rc=$?"
  grep -E "^(op|  )|kernel gates|weights:|FAIL|ACCEPTED|check:" "$OUT/check.txt" | head -60
  MOSS_KERNELS=portable timeout 200 "$NEW" check --device cuda --model golden/tiny-a > "$OUT/check_portable.txt" 2>&1
  echo "check (MOSS_KERNELS=portable) rc=$?"
  grep -E "forced|kernel gates|FAIL|ACCEPTED|check:" "$OUT/check_portable.txt" | head -30
  MOSS_KERNELS=bogus timeout 60 "$NEW" check --device cuda --model golden/tiny-a > $W/bogus.txt 2>&1
  echo "MOSS_KERNELS=bogus rc=$? (must be non-zero): $(tail -1 $W/bogus.txt)"
fi

if has golden; then
  el "== 2. golden checkpoints on CUDA: NEW vs BASE"
  for spec in "tiny-a 64x64" "tiny-b 96x64"; do
    set -- $spec; c=$1; s=$2
    for p in bf16 fp32 fp8; do
      for b in BASE NEW; do
        bin=${!b}
        for r in 1 2; do
          timeout 60 "$bin" generate --device cuda --precision $p --model golden/$c --prompt "a cat" --steps 4 --size $s \
            --seed 42 -q --out $W/$c.$p.$b.$r.png || echo "FAILED generate $b $c $p"
        done
      done
      echo "$c $p: NEW repeat $(cmp -s $W/$c.$p.NEW.1.png $W/$c.$p.NEW.2.png && echo identical || echo 'DIFFERENT (FAILED)'), NEW vs BASE pixels $(same $W/$c.$p.NEW.1.png $W/$c.$p.BASE.1.png)"
    done
  done
fi

if [ -n "${CK:-}" ]; then
  wait $CK; tail -3 $OUT/ckpt.txt
  [ -e $F/transformer/config.json ] || { echo "FAILED: no full-size checkpoint"; exit 1; }
fi

if has e2e; then
  el "== 3. moss generate 1024x1024, 50 steps, single shot (page cache warm after the first)"
  cat $F/transformer/*.safetensors $F/text_encoder/*.safetensors $F/vae/*.safetensors > /dev/null
  for b in BASE NEW BASE NEW; do
    bin=${!b}; s=$(date +%s.%N)
    timeout 120 "$bin" generate --device cuda --model $F --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 \
      --steps 50 --seed 42 --json --out $W/full.$b.png > $W/full.$b.json 2> $W/full.$b.err || echo "FAILED e2e $b: $(tail -2 $W/full.$b.err)"
    echo "$b wall $(python3 -c "import time; print(f'{time.time() - $s:.2f}')") s  $(cat $W/full.$b.json)"
  done
  echo "full-size picture NEW vs BASE pixels: $(same $W/full.NEW.png $W/full.BASE.png) (NEW $(idat $W/full.NEW.png))"
  for b in BASE NEW; do
    timeout 120 "${!b}" generate --device cuda --precision fp8 --model $F --prompt "a lighthouse at dusk, oil painting" \
      --size 1024x1024 --steps 50 --seed 42 --json --out $W/full8.$b.png > $W/full8.$b.json 2> $W/full8.$b.err || echo "FAILED e2e fp8 $b"
    echo "$b fp8 $(cat $W/full8.$b.json)"
  done
  echo "full-size fp8 picture NEW vs BASE pixels: $(same $W/full8.NEW.png $W/full8.BASE.png)"
  cp $W/full.NEW.png $OUT/full_new.png
fi

if has stages; then
  el "== 4. stages, NEW and BASE alternating"
  E=$F/text_encoder
  python3 -c "
import numpy as np; np.random.seed(0)
np.random.randn(1, 128, 64, 64).astype('<f4').tofile('$W/lat1024.f32')"
  for b in NEW BASE NEW BASE; do
    bin=${!b}
    timeout 120 "$bin" bench-dit --device cuda --model $F --embeds $F/embeds.safetensors --size 1024x1024 --steps 50 \
      --forwards 5 > $W/dit.$b.json 2> $W/dit.$b.err || echo "FAILED bench-dit $b: $(tail -2 $W/dit.$b.err)"
    python3 -c "
import json; j = json.load(open('$W/dit.$b.json'))
print(f\"$b DiT: forward median {j.get('forward_ms_median', float('nan')):.2f} ms, 50 steps {j.get('loop_s', j.get('denoise_s', float('nan')))} s\")" \
      2>/dev/null || echo "$b dit: $(head -c 600 $W/dit.$b.json)"
    timeout 90 "$bin" bench-encode --model $E --ids 128 --device cuda --reps 7 > $W/enc.$b.json 2> $W/enc.$b.err \
      || echo "FAILED bench-encode $b: $(tail -2 $W/enc.$b.err)"
    python3 -c "
import json
for l in open('$W/enc.$b.json'):
    if l.startswith('{'):
        j = json.loads(l); print(f\"$b encoder {j['tokens']} tokens: median {j['median_ms']:.2f} ms, device {j.get('device_median_ms', float('nan')):.2f} ms\")" \
      2>/dev/null || echo "$b enc: $(head -c 400 $W/enc.$b.json)"
    timeout 90 "$bin" bench-vae --device cuda --model $F --latents $W/lat1024.f32 --reps 5 > $W/vae.$b.json 2> $W/vae.$b.err \
      || echo "FAILED bench-vae $b: $(tail -2 $W/vae.$b.err)"
    python3 -c "
import json; j = json.load(open('$W/vae.$b.json'))
print('$b VAE 1024x1024:', {k: v for k, v in j.items() if 'ms' in k and not isinstance(v, (list, dict))})" \
      2>/dev/null || echo "$b vae: $(head -c 400 $W/vae.$b.json)"
  done
  grep -h . $W/dit.NEW.json | head -c 3000 > $OUT/dit_new.json
fi

if has serve; then
  el "== 5. moss serve"
  N=8 REPEAT=2 timeout 300 python3 bench/serve_bench.py "$NEW" $F $W/serve 2>&1 | tail -30 || echo "FAILED serve bench"
fi
if has dit; then
  el "== 6. DiT forward, NEW and BASE alternating: every op, and 2-step latents"
  for p in bf16 fp8; do
    for r in 1 2; do
      for b in NEW BASE; do
        timeout 90 "${!b}" bench-dit --device cuda --precision $p --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
          --forward-only --forwards 10 > $W/fwd.$p.$b.$r.json 2> $W/fwd.$p.$b.$r.err || echo "FAILED bench-dit $b $p: $(tail -2 $W/fwd.$p.$b.$r.err)"
      done
    done
    echo "$p:"
    python3 bench/dit_ops_table.py $W/fwd.$p.NEW.1.json,$W/fwd.$p.NEW.2.json $W/fwd.$p.BASE.1.json,$W/fwd.$p.BASE.2.json \
      || echo "FAILED dit_ops_table $p"
    for b in NEW BASE; do
      timeout 90 "${!b}" bench-dit --device cuda --precision $p --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
        --steps 2 --forwards 1 --save-latents $W/lat2.$p.$b.f32 > /dev/null 2> $W/lat2.$p.$b.err || echo "FAILED 2-step latents $b $p"
    done
    echo "$p latents after 2 steps, NEW vs BASE: $(cmp -s $W/lat2.$p.NEW.f32 $W/lat2.$p.BASE.f32 && echo identical || echo 'DIFFERENT (FAILED)')"
  done
fi
el "done"
