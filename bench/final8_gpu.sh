#!/usr/bin/env bash
# Integration run of session 17 (issue #7, the encoder at 4096 tokens), one device call:
#   1. moss check --device cuda (every gate and planted control) while bench/full_ckpt.sh writes
#      the random full-size checkpoint in the real layout in the background;
#   2. encoder: moss bench-encode at 128 and 4096 tokens, this build ($BIN) and the session's
#      start ($BIN_OLD) alternating, ENV_ENC variants of this build; transformers bf16 + fp32 (TF_REPS
#      timed runs after a warm-up); both builds again; transformers bf16 again in a second and a
#      third process, this build between and after; both sides' hidden states against the fp32 run
#      (compare), and the pooled device forwards of this build's five runs against the pooled
#      transformers bf16 reps of the three processes;
#   3. moss generate 1024x1024 50 steps end to end (regression).
# Needs $BIN (default .final/moss), $BIN_OLD (default .final/moss_old), .whl/diffusers-*.whl.
#   ENV_ENC="MOSS_ENC_QKROPE=inline MOSS_GEMM_PIN=0" TF_REPS=7 OUT=$OUT bash bench/final8_gpu.sh
set -uo pipefail
BIN=${BIN:-.final/moss}; BIN_OLD=${BIN_OLD:-.final/moss_old}
O=/tmp/final8out; W=/tmp/final; mkdir -p "$O" "$W" "${OUT:=/tmp/finalout}"
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv,noheader
chmod +x "$BIN" "$BIN_OLD"

el "== 1. moss check --device cuda (checkpoint written meanwhile)"
(timeout 240 bash bench/full_ckpt.sh $W/full > $O/ckpt.txt 2>&1; echo "ckpt rc=$?" >> $O/ckpt.txt) &
CK=$!
timeout 240 $BIN check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$O/check.txt"
wait $CK; tail -2 $O/ckpt.txt
F=$W/full; E=$F/text_encoder
[ -e $E/ids4096.txt ] || { echo "no checkpoint"; tar czf "$OUT/final8.tgz" -C "$O" .; cp "$O/log.txt" "$OUT/log.txt"; exit 1; }

el "== 2. encoder 128 / 4096 tokens: this build vs the session's start vs transformers"
enc() { # tag, binary, env...
  local tag=$1 bin=$2; shift 2
  env "$@" timeout 90 $bin bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt \
    --out $E/moss_bf16_128.st --out $E/moss_bf16_4096.st --device cuda --reps 7 > $O/enc_$tag.jsonl 2>$O/enc_$tag.err
  echo "bench-encode $tag rc=$?"
  python3 - $O/enc_$tag.jsonl $tag <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        p = j.get("profile_ms", {})
        top = sorted(((k, v["ms"] if isinstance(v, dict) else v) for k, v in p.items()), key=lambda kv: -kv[1])[:9]
        print(f"  moss {sys.argv[2]:24} L={j['tokens']:5} median {j['median_ms']:.2f} ms, device {j.get('device_median_ms', float('nan')):.2f} ms, download {j.get('download_median_ms', float('nan')):.2f} ms")
        if j['tokens'] > 1000 and top:
            print("     profile: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
}
enc new1 $BIN; enc old1 $BIN_OLD; enc new2 $BIN; enc old2 $BIN_OLD
for v in ${ENV_ENC:-}; do enc "${v//[=,]/_}" $BIN ${v//,/ }; done
TF_REPS=${TF_REPS:-7} timeout 240 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v Warning | tail -8
enc new3 $BIN; enc old3 $BIN_OLD
TF_TAG=b TF_DTYPES=bf16 TF_REPS=${TF_REPS:-7} timeout 120 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v Warning | tail -3
enc new4 $BIN
TF_TAG=c TF_DTYPES=bf16 TF_REPS=${TF_REPS:-7} timeout 120 python3 bench/encoder_gpu.py tf $E 2>&1 | grep -v Warning | tail -3
enc new5 $BIN
cp $O/enc_new5.jsonl $E/moss_bf16.jsonl
python3 bench/encoder_gpu.py compare $E 2>&1 | tee $O/enc_compare.txt
cp $E/tf_times*.json $O/ 2>/dev/null
python3 - $O $E <<'PY' | tee $O/pooled.txt
import glob, json, sys
o, e = sys.argv[1], sys.argv[2]
def dev(tag):
    r = {}
    for f in sorted(glob.glob(f"{o}/enc_{tag}*.jsonl")):
        for l in open(f):
            if l.startswith("{"):
                j = json.loads(l); r.setdefault(j["tokens"], []).extend(j["device_forward_ms"])
    return r
tf = json.load(open(f"{e}/tf_times.json"))
again = [json.load(open(a)) for a in sorted(glob.glob(f"{e}/tf_times_bf16_again*.json"))]
med = lambda xs: sorted(xs)[len(xs) // 2]
new, old = dev("new"), dev("old")
for n in (128, 4096):
    procs = [tf[f"bf16_{n}"]] + [a[f"bf16_{n}"] for a in again]
    pooled = [x for p in procs for x in p["ms"]]
    m, mo = med(new[n]), med(old[n])
    print(f"L={n}: moss this build {m:.2f} ms ({len(new[n])} forwards), start {mo:.2f} ms ({len(old[n])}); "
          f"transformers bf16 per process {[round(p['median_ms'], 1) for p in procs]} ms, pooled {med(pooled):.1f} ({len(pooled)} reps); "
          f"ratio per process {[round(p['median_ms'] / m, 2) for p in procs]}, pooled {med(pooled) / m:.2f}x")
PY

el "== 3. end to end"
$BIN generate --device cuda --model $F --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 --steps 50 --json --out $W/full50.png; echo "rc=$?"
el "done"; date -u
tar czf "$OUT/final8.tgz" -C "$O" . && cp "$O/log.txt" "$OUT/log.txt"
