#!/usr/bin/env bash
# Integration run of session 14 (issue #7, the encoder at 4096 tokens), one device call:
#   1. moss check --device cuda (every gate and planted control) while bench/full_ckpt.sh writes
#      the random full-size checkpoint in the real layout in the background;
#   2. encoder: moss bench-encode at 128 and 4096 tokens (device_median_ms: hidden states left on
#      the GPU, as transformers' timing leaves them; median_ms: forward + download), default and
#      ENV_ENC variants; transformers bf16 + fp32 (TF_REPS timed runs after a warm-up); moss again
#      after transformers (drift); both sides' hidden states against the fp32 run (compare);
#   3. DiT 1024x1024 forward + 50 guided steps (moss only, regression check);
#   4. golden checkpoints: CUDA generate-free decode vs CPU (regression);
#   5. moss generate 1024x1024 50 steps end to end.
# Needs the release binary in $BIN (default .final/moss), .whl/diffusers-*.whl.
#   ENV_ENC="MOSS_GDR_PREP=tc3 ..." TF_REPS=7 OUT=$OUT bash bench/final4_gpu.sh
set -uo pipefail
BIN=${BIN:-.final/moss}
O=/tmp/final4out; W=/tmp/final; mkdir -p "$O" "$W" "${OUT:=/tmp/finalout}"
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
jq1() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print($2)" "$1" || tail -3 "$1"; }
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv,noheader
chmod +x "$BIN"

el "== 1. moss check --device cuda (checkpoint written meanwhile)"
(timeout 240 bash bench/full_ckpt.sh $W/full > $O/ckpt.txt 2>&1; echo "ckpt rc=$?" >> $O/ckpt.txt) &
CK=$!
timeout 240 $BIN check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$O/check.txt"
wait $CK; tail -2 $O/ckpt.txt
F=$W/full; E=$F/text_encoder
[ -e $E/ids4096.txt ] || { echo "no checkpoint"; tar czf "$OUT/final4.tgz" -C "$O" .; cp "$O/log.txt" "$OUT/log.txt"; exit 1; }

el "== 2. encoder 128 / 4096 tokens vs transformers"
enc() { # tag, env...
  local tag=$1; shift
  env "$@" timeout 90 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt \
    --out $E/moss_bf16_128.st --out $E/moss_bf16_4096.st --device cuda --reps 7 > $O/enc_$tag.jsonl 2>$O/enc_$tag.err
  echo "bench-encode $tag rc=$?"
  python3 - $O/enc_$tag.jsonl $tag <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        p = j.get("profile_ms", {})
        top = sorted(((k, v["ms"] if isinstance(v, dict) else v) for k, v in p.items()), key=lambda kv: -kv[1])[:8]
        print(f"  moss {sys.argv[2]:24} L={j['tokens']:5} median {j['median_ms']:.2f} ms, device {j.get('device_median_ms', float('nan')):.2f} ms, download {j.get('download_median_ms', float('nan')):.2f} ms")
        if j['tokens'] > 1000 and top:
            print("     profile: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
}
enc default
for v in ${ENV_ENC:-}; do enc "${v//[=,]/_}" ${v//,/ }; done
TF_REPS=${TF_REPS:-7} timeout 240 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v Warning | tail -8
enc default2
cp $O/enc_default2.jsonl $E/moss_bf16.jsonl
python3 bench/encoder_gpu.py compare $E 2>&1 | tee $O/enc_compare.txt

el "== 3. DiT 1024x1024 (moss only)"
timeout 120 $BIN bench-dit --device cuda --precision bf16 --model $F --embeds $F/embeds.safetensors --size 1024x1024 \
  --steps 50 --forwards 5 > $O/dit.json; echo "bench-dit rc=$?"
jq1 $O/dit.json "'moss forward_ms_median', round(j['forward_ms_median'],2), 'loop_s', round(j['loop_s'],3)"

el "== 4. golden checkpoints: CUDA decode vs CPU"
G=$W/golden; mkdir -p $G
python3 bench/vae_bench.py golden-z $G > /dev/null
for spec in "tiny-a 64x64" "tiny-b 96x64"; do
  set -- $spec
  $BIN decode $G/$1.z.f32 --model golden/$1 --size $2 --device cpu --out $G/$1.cpu.png -q
  $BIN decode $G/$1.z.f32 --model golden/$1 --size $2 --device cuda --out $G/$1.cuda.png -q || echo "decode $1 failed"
  echo "$1 ($2):"; python3 bench/vae_bench.py cmp-png $G/$1.cuda.png $G/$1.cpu.png $G/$1.pixels.u8
done

el "== 5. end to end"
$BIN generate --device cuda --model $F --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 --steps 50 --json --out $W/full50.png; echo "rc=$?"
el "done"; date -u
tar czf "$OUT/final4.tgz" -C "$O" . && cp "$O/log.txt" "$OUT/log.txt"
