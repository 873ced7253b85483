#!/usr/bin/env bash
# The whole pipeline on the GPU, in one device call (results: bench/RESULTS.md, "End to end"):
#   1. moss check --device cuda (every kernel gate and planted control);
#   2. golden tiny-a / tiny-b: `moss generate --device cuda` (bf16 and fp32) twice -> PNG bytes
#      identical; saved latents against `--device cpu` (relative L2);
#   3. a complete full-size random checkpoint in the real layout (bench/full_ckpt.sh);
#   4. `moss generate --device cuda` at 1024x1024, 50 steps, end to end (--json timings);
#   5. the memory plan refusing while another process holds most of the GPU;
#   6. batch vs one-by-one: bench/batch_bench.sh (N=8, STEPS=$STEPS) -- also a repeat check, since
#      both ways must write byte-identical PNGs.
# Needs: the release binary in $BIN (default .e2e/moss), .whl/diffusers-*.whl. Usage: bash bench/e2e_gpu.sh
set -uo pipefail
BIN=${BIN:-.e2e/moss}
O=${OUT:-/tmp/e2eout}; W=/tmp/e2e; mkdir -p "$O" "$W"
STEPS=${STEPS:-20}
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/diffusers-*.whl && export PYTHONPATH=/tmp/site || exit 1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
rel() { python3 -c "import numpy as np,sys; a=np.fromfile(sys.argv[1],'<f4').astype('f8'); b=np.fromfile(sys.argv[2],'<f4').astype('f8'); print(f'{np.linalg.norm(a-b)/np.linalg.norm(b):.3e}')" "$1" "$2"; }

if [ -z "${SKIP_CHECK:-}" ]; then
echo "== 1. moss check --device cuda"
t=$(date +%s); timeout 200 $BIN check --device cuda --model golden/tiny-a > "$O/check.txt" 2>&1; echo "check rc=$? ($(( $(date +%s) - t )) s)"
grep -E "kernel gates|FAIL|ACCEPTED|all passed" "$O/check.txt"
fi

echo "== 2. golden: generate --device cuda twice, vs cpu"
for spec in "tiny-a 64x64" "tiny-b 96x64"; do
  set -- $spec; c=$1; s=$2
  $BIN generate --device cpu --model golden/$c --prompt "a cat" --steps 4 --size $s --seed 42 -q --save-latents $W/$c.cpu.lat --out $W/$c.cpu.png
  for p in bf16 fp32; do
    for r in 1 2; do
      $BIN generate --device cuda --precision $p --model golden/$c --prompt "a cat" --steps 4 --size $s --seed 42 -q \
        --save-latents $W/$c.lat --out $W/$c.$p.$r.png || echo "FAILED generate $c $p"
      cp $W/$c.lat $W/$c.$p.$r.lat
    done
    cmp -s $W/$c.$p.1.png $W/$c.$p.2.png && same=identical || same=DIFFERENT
    cmp -s $W/$c.$p.1.lat $W/$c.$p.2.lat && lsame=identical || lsame=DIFFERENT
    echo "$c $p: repeat PNG $same, latents $lsame; latents vs cpu rel L2 $(rel $W/$c.$p.1.lat $W/$c.cpu.lat); PNG vs cpu: $(cmp -s $W/$c.$p.1.png $W/$c.cpu.png && echo identical || echo differs)"
  done
done

echo "== 3. full-size random checkpoint"
t=$(date +%s); timeout 300 bash bench/full_ckpt.sh $W/full || exit 1; echo "written in $(( $(date +%s) - t )) s"
$BIN check --model $W/full; echo "check (checkpoint only) rc=$?"

echo "== 4. generate --device cuda, 1024x1024, 50 steps"
/usr/bin/time -v $BIN generate --device cuda --model $W/full --prompt "a lighthouse at dusk, oil painting" --size 1024x1024 \
  --steps 50 --json --out $W/full50.png 2> $W/time.txt; echo "rc=$?"
grep -E "Elapsed|Maximum resident" $W/time.txt
python3 -c "from PIL import Image; im=Image.open('$W/full50.png'); print(im.size, im.mode, im.text.get('prompt'))"
cp $W/full50.png $O/full50.png

echo "== 5. memory plan with 130 GiB held by another process"
rm -f $W/held
python3 -c "import torch,time; x=torch.empty(130*2**30,dtype=torch.uint8,device='cuda'); open('$W/held','w').close(); time.sleep(60)" &
H=$!; for i in $(seq 120); do [ -e $W/held ] && break; sleep 0.5; done; ls $W/held
t=$(date +%s.%N); $BIN generate --device cuda --model $W/full --prompt "x" --size 1024x1024 --steps 2 --out $W/oom.png; echo "exit code $? after $(python3 -c "import time;print(round(time.time()-$t,1))") s; file written: $(ls $W/oom.png 2>/dev/null || echo none)"
kill $H; wait $H 2>/dev/null

echo "== 6. batch bench (N=8, 1024x1024, $STEPS steps)"
N=8 SIZE=1024x1024 STEPS=$STEPS timeout 420 bash bench/batch_bench.sh $BIN $W/full $W/batch; echo "batch bench rc=$?"
cp $W/batch/report.txt $O/batch_report.txt 2>/dev/null; cp $W/batch/batch.jsonl $O/ 2>/dev/null
date -u
