#!/bin/bash
# The encattn helper's one device call (issue #7): `moss check` of the branch's release binary,
# the standalone kernel bench (bench/encattn_bench.py on cubins), then `moss bench-encode` at 128
# and 4096 tokens on encoder-only random weights, main's binary (.final, old) vs this branch (new),
# alternated, plus the new binary with MOSS_ENC_ATTN=wgmma2 and with the old path's switches.
# As run at commit 0a6bc6a (wgmma2 was removed after it; bench/notes-encattn.md has the results).
#   bash .dev-encattn/encattn_gpu.sh .dev-encattn $OUT
#   (D holds moss.xz, unit.cubin, wg.cubin, encattn_bench.py; .final/moss.xz is main's binary)
set -uo pipefail
D=${1:-.dev-encattn}; O=${2:-$OUT}; E=/tmp/te
mkdir -p "$O"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
unxz() { python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$1'), open('$2','wb'))" && chmod +x "$2"; }
unxz "$D/moss.xz" "$D/moss"; unxz .final/moss.xz "$D/moss_old"
echo "old = .final (commit $(cat .final/COMMIT 2>/dev/null)); new = $(cat $D/COMMIT 2>/dev/null)"
(python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1) &
MK=$!
el "== moss check (new)"
timeout 80 "$D/moss" check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$?"
grep -E "qkrope|gmulh|attn_qkv|gated_y|wgmma2" "$O/check.txt" | head -40
grep -E "kernel gates:|FAIL|ACCEPTED|^check" "$O/check.txt" | tail -6
wait $MK
el "== golden tiny-a hidden states (moss bench-encode cuda fp32 / bf16 vs transformers fp64)"
G=/tmp/g; mkdir -p $G; python3 bench/encoder_gpu.py ids golden/expected/tiny-a.json $G/ids > /dev/null
for dev in "cuda_fp32 cuda fp32" "cuda_bf16 cuda bf16"; do
  set -- $dev; args=()
  for f in $G/ids/*.txt; do p=$(basename "$f" .txt); args+=(--ids-file "$f" --out "$G/${1}_$p.st"); done
  timeout 30 "$D/moss" bench-encode --model golden/tiny-a/text_encoder "${args[@]}" --device $2 --precision $3 --reps 2 > "$G/$1.jsonl" 2>&1 || echo "golden $1 failed"
done
python3 bench/encoder_gpu.py golden golden/expected/tiny-a.json golden/expected/tiny-a.safetensors $G 2>&1 | grep -v MISSING | tee "$O/golden_tiny-a.txt" | tail -3
run() {  # name binary [env...]
  local n=$1 b=$2; shift 2
  env "$@" timeout 40 "$b" bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt --device cuda --reps 9 > "$O/enc_$n.jsonl" 2> "$O/enc_$n.err"
  echo "$n rc=$?"
}
el "== bench-encode"
run old1 "$D/moss_old"; run new1 "$D/moss"; run w2_1 "$D/moss" MOSS_ENC_ATTN=wgmma2
run old2 "$D/moss_old"; run new2 "$D/moss"; run w2_2 "$D/moss" MOSS_ENC_ATTN=wgmma2
run split "$D/moss" MOSS_ENC_CAT_ATTN=0 MOSS_ENC_QKROPE=split
el "== kernels"
timeout 45 python3 "$D/encattn_bench.py" "$D/unit.cubin" "$D/wg.cubin" > "$O/bench.txt" 2>&1; echo "bench rc=$?"
el "done"
python3 - "$O" <<'PY'
import json, sys, glob, os
o = sys.argv[1]
ops = ("linear", "head_norm_rope", "narrow", "causal_attention", "attn_gate")
print("== bench-encode (ms): run, tokens, median, device median, device min, profile op sums")
for n in ["old1", "new1", "w2_1", "old2", "new2", "w2_2", "split"]:
    p = f"{o}/enc_{n}.jsonl"
    if not os.path.exists(p):
        continue
    for l in open(p):
        if l.startswith("{"):
            j = json.loads(l); pr = j.get("profile_ms", {})
            print(f"{n:<6} {j['tokens']:>5} {j['median_ms']:8.2f} {j['device_median_ms']:8.2f} {min(j['device_forward_ms']):8.2f} ",
                  {k: round(pr[k]['ms'], 2) for k in ops if k in pr})
PY
echo "== kernel table (from $O/bench.txt)"
sed -n '/== encattn kernels/,$p' "$O/bench.txt"
grep -q "== encattn kernels" "$O/bench.txt" || tail -30 "$O/bench.txt"
