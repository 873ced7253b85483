#!/usr/bin/env bash
# The Qwen3.5 prompt encoder on the GPU, in one call (run from the repo root on the GPU machine):
#   1. `moss check --device cuda --model golden/tiny-a` (every kernel gate, the encoder's included);
#   2. golden tiny-a / tiny-b: `moss encode --device cuda` vs `--device cpu`, and the hidden states of
#      every golden prompt (`moss bench-encode`, cpu / cuda fp32 / cuda bf16) against the
#      transformers float64 (`enc64`) and fp32 (`enc`) references;
#   3. full size: random Qwen3.5-9B text weights in the real layout (bf16, `language_model.` keys),
#      transformers' Qwen3_5TextModel (bf16 and fp32) and `moss bench-encode` (bf16) on the same
#      weights and ids, 128 and 4096 tokens: hidden states against the fp32 run, and times.
#
#   bench/encoder_gpu.sh BIN OUT_DIR        (BIN: the release moss binary)
# STAGES (default "check golden full") picks the parts.
set -uo pipefail
BIN=$1
OUT=$2
STAGES=${STAGES:-check golden full}
PY=${PY:-python3}
H=bench/encoder_gpu.py
mkdir -p "$OUT"
W=${WORK:-/tmp/enc_work}
mkdir -p "$W"
log() { echo "== $(date +%T) $*"; }

if [[ " $STAGES " == *" check "* ]]; then
    log "moss check --device cuda"
    MOSS_CHECK_VERBOSE=1 timeout 240 "$BIN" check --device cuda --model golden/tiny-a > "$OUT/check.txt" 2> "$OUT/check_times.txt"
    echo "moss check rc=$?" | tee -a "$OUT/check.txt"
    grep -E "^enc |^  control: enc |kernel gates:|FAIL|ACCEPTED" "$OUT/check.txt" | head -80
fi

if [[ " $STAGES " == *" golden "* ]]; then
    for ck in tiny-a tiny-b; do
        log "golden $ck"
        D="$W/golden_$ck"
        mkdir -p "$D"
        $PY $H ids golden/expected/$ck.json "$D/ids"
        for dev in "cpu cpu bf16" "cuda_fp32 cuda fp32" "cuda_bf16 cuda bf16"; do
            set -- $dev
            args=()
            for f in "$D"/ids/*.txt; do
                p=$(basename "$f" .txt)
                args+=(--ids-file "$f" --out "$D/${1}_$p.st")
            done
            "$BIN" bench-encode --model golden/$ck/text_encoder "${args[@]}" --device "$2" --precision "$3" --reps 2 \
                > "$D/${1}_times.jsonl" 2>&1 || { echo "bench-encode $1 failed:"; cat "$D/${1}_times.jsonl"; }
        done
        $PY $H golden golden/expected/$ck.json golden/expected/$ck.safetensors "$D" | tee "$OUT/golden_$ck.txt"
        cat "$D"/cuda_bf16_times.jsonl >> "$OUT/golden_$ck.txt"
        PROMPT=$($PY -c "import json; print([p['text'] for p in json.load(open('golden/expected/$ck.json'))['prompts'] if p['name']=='plain'][0])")
        "$BIN" encode --model golden/$ck --prompt "$PROMPT" --device cpu -o "$D/enc_cpu.safetensors" -q
        "$BIN" encode --model golden/$ck --prompt "$PROMPT" --device cuda -o "$D/enc_cuda.safetensors" -q \
            && { echo "moss encode cuda vs cpu ($ck, plain):"; $PY $H encode "$D/enc_cuda.safetensors" "$D/enc_cpu.safetensors"; } \
            | tee -a "$OUT/golden_$ck.txt"
    done
fi

if [[ " $STAGES " == *" full "* ]]; then
    F="$W/full"
    log "full: write random Qwen3.5-9B text weights"
    $PY $H make "$F" 2>&1 | grep -v Warning | tail -5 | tee "$OUT/full_make.txt"
    log "full: transformers"
    $PY $H tf "$F" 2>&1 | grep -v Warning | tail -12 | tee "$OUT/full_tf.txt"
    log "full: moss bench-encode (bf16)"
    "$BIN" bench-encode --model "$F" --ids-file "$F/ids128.txt" --ids-file "$F/ids4096.txt" \
        --out "$F/moss_bf16_128.st" --out "$F/moss_bf16_4096.st" --device cuda --reps 5 2>&1 | tee "$F/moss_bf16.jsonl" "$OUT/full_moss.txt"
    log "full: compare"
    $PY $H compare "$F" 2>&1 | tee "$OUT/full_compare.txt"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/nvidia_smi.txt" 2>&1
fi
log done
