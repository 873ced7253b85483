#!/usr/bin/env bash
# Batch vs one-by-one: N prompts rendered by one `moss generate --prompts` invocation (weights
# loaded once) against N separate `moss generate --prompt` invocations (weights loaded N times),
# at full size. Prints the wall time of each, the per-picture time and the speedup, and checks
# that both ways wrote byte-identical pictures (same prompt, seed and settings).
#
#   bench/batch_bench.sh BIN MODEL_DIR [WORK_DIR]
#
#   BIN        the moss binary (e.g. target/release/moss)
#   MODEL_DIR  checkpoint folder (or repo id in the local HF cache)
#   WORK_DIR   where the pictures and the report go (default: a fresh temp folder)
#
# Environment: N (8), SIZE (1024x1024), STEPS (50), DEVICE (cuda), SEED (42), EXTRA (more flags
# for both ways, e.g. "--precision fp32"). A smoke run on the CPU with the tiny checkpoint:
#   N=3 SIZE=64x64 STEPS=2 DEVICE=cpu bench/batch_bench.sh target/debug/moss golden/tiny-a
# Drop the page cache between runs (as root: sync; echo 3 > /proc/sys/vm/drop_caches) to see the
# cold-load cost; by default both ways read the weights from a warm page cache after a first
# untimed warm-up render.
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
BIN=$1
MODEL=$2
WORK=${3:-$(mktemp -d -t moss-batch-bench.XXXXXX)}
N=${N:-8}
SIZE=${SIZE:-1024x1024}
STEPS=${STEPS:-50}
DEVICE=${DEVICE:-cuda}
SEED=${SEED:-42}
EXTRA=${EXTRA:-}

mkdir -p "$WORK/batch" "$WORK/single"
PROMPTS=(
    "a lighthouse at dusk, oil painting"
    "a red fox in fresh snow, telephoto photograph"
    "an isometric pixel-art city block at night"
    "a bowl of ramen, studio food photography"
    "a watercolor map of an imaginary island"
    "a steampunk owl made of brass gears"
    "a foggy pine forest at sunrise, 35mm film"
    "a ceramic teapot shaped like a whale"
)
LIST="$WORK/prompts.txt"
: >"$LIST"
for ((i = 0; i < N; i++)); do
    echo "${PROMPTS[i % ${#PROMPTS[@]}]} #$i" >>"$LIST"
done

common=(--model "$MODEL" --device "$DEVICE" --size "$SIZE")
# shellcheck disable=SC2206
extra=($EXTRA)
now() { date +%s.%N; }

echo "moss batch bench: N=$N size=$SIZE steps=$STEPS device=$DEVICE model=$MODEL" | tee "$WORK/report.txt"
"$BIN" --version | tee -a "$WORK/report.txt"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$WORK/report.txt" || true

# Warm-up (untimed): page cache, driver, kernel loading.
"$BIN" generate "${common[@]}" "${extra[@]}" --steps 1 --prompt warmup --out "$WORK/warmup.png" -q

t0=$(now)
"$BIN" generate "${common[@]}" "${extra[@]}" --steps "$STEPS" --prompts "$LIST" --seed "$SEED" --out-dir "$WORK/batch" --json \
    >"$WORK/batch.jsonl"
t1=$(now)
i=0
while IFS= read -r p; do
    name=$(printf '%05d-%d.png' "$i" $((SEED + i)))
    "$BIN" generate "${common[@]}" "${extra[@]}" --steps "$STEPS" --prompt "$p" --seed $((SEED + i)) --out "$WORK/single/$name" -q
    i=$((i + 1))
done <"$LIST"
t2=$(now)

same=0
for f in "$WORK"/single/*.png; do
    if cmp -s "$f" "$WORK/batch/$(basename "$f")"; then same=$((same + 1)); fi
done

awk -v n="$N" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v same="$same" 'BEGIN {
    b = t1 - t0; s = t2 - t1
    printf "one invocation, %d prompts: %8.2f s  (%.2f s per picture)\n", n, b, b / n
    printf "%d invocations:              %8.2f s  (%.2f s per picture)\n", n, s, s / n
    printf "speedup:                     %8.2fx\n", s / b
    printf "identical pictures:          %d of %d\n", same, n
}' | tee -a "$WORK/report.txt"
echo "pictures and report in $WORK" >&2
[ "$same" -eq "$N" ]
