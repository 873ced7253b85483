#!/usr/bin/env bash
# Every product benchmark in one device call (about 7-9 minutes on an H200), results in OUT_DIR:
#   bench/run_all.sh [--base BASE_BIN] NEW_BIN OUT_DIR
#   1. a full-size checkpoint with random weights in the real layout (bench/full_ckpt.sh, once);
#   2. moss check --device cuda, and with MOSS_KERNELS=$KERNELS_ALT (default portable) when set;
#   3. encoder, 128 tokens: moss bench-encode vs transformers bf16 (bench/encoder.sh);
#   4. DiT, 1024x1024, 50 steps: moss bench-dit vs golden/dit_ref.py eager and torch.compile (bench/dit.sh);
#   5. VAE, 1024x1024: moss bench-vae vs diffusers AutoencoderKLFlux2 fp32 (bench/vae.sh);
#   6. end to end: moss generate 1024x1024, 50 steps (wall time), the PNG and its sha256 (bench/e2e.sh).
# With --base, each moss step runs for both binaries (BASE then NEW): velocities, pixels and PNGs compared.
# KERNELS_ALT=portable (default; empty to skip): also `MOSS_KERNELS=$KERNELS_ALT moss check` with NEW_BIN.
# Needs diffusers importable or .whl/diffusers-*.whl (see bench/README.md).
set -uo pipefail
BASE=; [ "${1:-}" = --base ] && { BASE=$2; shift 2; }
[ $# -eq 2 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
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
F=$W/full; E=$F/text_encoder

el "1. full-size random checkpoint (written while moss check runs)"
( [ -e $E/ids128.txt ] || timeout 300 bash bench/full_ckpt.sh $F > $OUT/ckpt.txt 2>&1; echo "checkpoint rc=$?" >> $OUT/ckpt.txt ) &
CK=$!

el "2. moss check --device cuda"
for b in $BINS; do
  t=${b%%=*}; bin=${b#*=}
  timeout 200 $bin check --device cuda --model golden/tiny-a > $OUT/check_$t.txt 2>&1; echo "$t check rc=$?"
  grep -E "kernel gates:|FAIL|ACCEPTED" $OUT/check_$t.txt
  if [ -n "${KERNELS_ALT-portable}" ] && [ $t = new ]; then
    MOSS_KERNELS=${KERNELS_ALT-portable} timeout 200 $bin check --device cuda --model golden/tiny-a > $OUT/check_${t}_alt.txt 2>&1
    echo "$t MOSS_KERNELS=${KERNELS_ALT-portable} check rc=$?"; grep -E "kernel gates:|FAIL|ACCEPTED" $OUT/check_${t}_alt.txt
  fi
done
wait $CK; tail -3 $OUT/ckpt.txt
[ -e $E/ids128.txt ] || { echo "no checkpoint: stop"; exit 1; }

el "3. encoder, 128 tokens"; bash bench/encoder.sh $F $OUT $BINS
el "4. DiT, 1024x1024, 50 steps"; bash bench/dit.sh $F $OUT $BINS
el "5. VAE, 1024x1024"; bash bench/vae.sh $F $OUT $BINS
el "6. end to end: moss generate 1024x1024, 50 steps"; bash bench/e2e.sh $F $OUT $BINS
el "done"; date -u
echo; echo "== tables"; cat $OUT/encoder.md $OUT/dit.md $OUT/vae.md $OUT/e2e.md
