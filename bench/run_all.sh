#!/usr/bin/env bash
# Every product benchmark in one device call (about 7-9 minutes on an H200), results in OUT_DIR:
#   bench/run_all.sh [--base BASE_BIN] NEW_BIN OUT_DIR
#   1. a full-size checkpoint with random weights in the real layout (bench/full_ckpt.sh, once);
#   2. moss check --device cuda, and with MOSS_KERNELS=$KERNELS_ALT (default portable) when set;
#   3. encoder, 128 tokens: moss bench-encode vs transformers bf16 (bench/encoder.py);
#   4. DiT, 1024x1024, 50 steps: moss bench-dit vs golden/dit_ref.py eager and torch.compile (bench/dit.py);
#   5. VAE, 1024x1024: moss bench-vae vs diffusers AutoencoderKLFlux2 fp32 (bench/vae.py);
#   6. end to end: moss generate 1024x1024, 50 steps (wall time), the PNG and its sha256.
# With --base, each moss step runs for both binaries (BASE then NEW) and the PNGs' sha256 are compared.
# Needs diffusers importable or .whl/diffusers-*.whl (see bench/README.md).
set -uo pipefail
BASE=; [ "${1:-}" = --base ] && { BASE=$2; shift 2; }
[ $# -eq 2 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
NEW=$1; OUT=$2; W=${WORK:-/tmp/moss-bench}; mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
BINS="${BASE:+base=$BASE }new=$NEW"
for b in $BINS; do chmod +x "${b#*=}" 2>/dev/null; echo "$b: $(${b#*=} --version 2>&1 | head -1)"; done
t0=$(date +%s); el() { echo; echo "[$(( $(date +%s) - t0 )) s] == $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
F=$W/full; E=$F/text_encoder; P="a lighthouse at dusk, oil painting"

el "1. full-size random checkpoint (written while moss check runs)"
( [ -e $E/ids128.txt ] || timeout 300 bash bench/full_ckpt.sh $F > $OUT/ckpt.txt 2>&1; echo "checkpoint rc=$?" >> $OUT/ckpt.txt ) &
CK=$!

el "2. moss check --device cuda"
for b in $BINS; do
  t=${b%%=*}; bin=${b#*=}
  timeout 200 $bin check --device cuda --model golden/tiny-a > $OUT/check_$t.txt 2>&1; echo "$t check rc=$?"
  grep -E "kernel gates:|FAIL|ACCEPTED" $OUT/check_$t.txt
  if [ -n "${KERNELS_ALT:-portable}" ]; then
    MOSS_KERNELS=${KERNELS_ALT:-portable} timeout 200 $bin check --device cuda --model golden/tiny-a > $OUT/check_${t}_alt.txt 2>&1
    echo "$t MOSS_KERNELS=${KERNELS_ALT:-portable} check rc=$?"; grep -E "kernel gates:|FAIL|ACCEPTED" $OUT/check_${t}_alt.txt
  fi
done
wait $CK; tail -3 $OUT/ckpt.txt
[ -e $E/ids128.txt ] || { echo "no checkpoint: stop"; exit 1; }

el "3. encoder, 128 tokens"
for b in $BINS; do
  t=${b%%=*}
  timeout 90 ${b#*=} bench-encode --model $E --ids-file $E/ids128.txt --out $E/moss_bf16_128.st --device cuda --reps 7 \
    > $OUT/enc_$t.jsonl 2> $OUT/enc_$t.err; echo "$t bench-encode rc=$?"
done
ENC_LENGTHS=128 TF_DTYPES=bf16 TF_REPS=7 timeout 150 python3 bench/encoder.py tf $E 2>&1 | grep -v Warning | tail -2
python3 bench/encoder.py table $E $OUT/enc_*.jsonl | tee $OUT/encoder.md

el "4. DiT, 1024x1024, 50 steps"
for b in $BINS; do
  t=${b%%=*}
  timeout 120 ${b#*=} bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
    --steps 50 --forwards 5 --save-velocity $W/dit_$t.vel > $OUT/dit_$t.json; echo "$t bench-dit rc=$?"
done
cmp -s $W/dit_base.vel $W/dit_new.vel 2>/dev/null && echo "base and new velocities byte-identical"
timeout 300 python3 bench/dit.py torch $F $W/dit_new.vel $OUT/dit_torch.json > $OUT/dit_torch.log 2>&1; echo "torch rc=$?"
python3 bench/dit.py table $OUT | tee $OUT/dit.md

el "5. VAE, 1024x1024"
python3 -c "import torch; torch.randn(1, 128, 64, 64, generator=torch.Generator().manual_seed(11)).numpy().astype('<f4').tofile('$W/z1024.f32')"
for b in $BINS; do
  t=${b%%=*}
  timeout 90 ${b#*=} bench-vae --model $F --device cuda --latents $W/z1024.f32 --reps 5 --out-f32 $W/vae_$t.f32 \
    --out-rgb $W/vae_$t.rgb > $OUT/vae_$t.json; echo "$t bench-vae rc=$?"
done
cmp -s $W/vae_base.rgb $W/vae_new.rgb 2>/dev/null && echo "base and new pixels byte-identical"
timeout 150 python3 bench/vae.py table $W $OUT 1024 | tee $OUT/vae.md

el "6. end to end: moss generate 1024x1024, 50 steps"
for b in $BINS; do
  t=${b%%=*}; s=$(date +%s.%N)
  ${b#*=} generate --device cuda --model $F --prompt "$P" --size 1024x1024 --steps 50 --seed 42 --json --out $OUT/e2e_$t.png \
    > $OUT/e2e_$t.json; rc=$?
  echo "| $t | rc $rc | wall $(python3 -c "import time; print(f'{time.time() - $s:.2f}')") s | sha256 $(sha256sum < $OUT/e2e_$t.png | cut -c1-64) |" | tee -a $OUT/e2e.md
done
[ -n "$BASE" ] && { cmp -s $OUT/e2e_base.png $OUT/e2e_new.png && echo "SAME PICTURE (byte-identical PNGs)" || echo "PICTURES DIFFER"; } | tee -a $OUT/e2e.md
el "done"; date -u
