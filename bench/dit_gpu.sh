#!/usr/bin/env bash
# The DiT stage on the GPU, in one device call (see bench/RESULTS.md for what it measured):
#   1. golden tiny-a / tiny-b: `moss bench-dit --device cuda` (bf16 and fp32, each twice) latents
#      against the CPU backend's and golden loop.latents; repeat runs byte-identical; the PNGs
#      decoded from them (`moss decode --device cpu`) byte-identical;
#   2. a random full-size DiT in the real layout + random embeds (bench/dit_full.py write);
#   3. moss bench-dit at 1024x1024, bf16: 5 timed forwards + 50 guided steps; fp32 forward;
#      the first flash kernel (MOSS_FLASH=v1) forward for before/after; the memory plan refusing
#      while another process holds most of the GPU; the attention kernels alone (attn_bench.py);
#   4. golden/dit_ref.py on the same weights: bf16 eager / torch.compile per block / fp32,
#      velocities compared, 50 guided steps timed; the summary table;
#   5. moss check --device cuda (every gate, the flash attention rows among them).
# Needs (carried in .dittest/, made on the build machine): the release binary `moss`,
# {tiny-a,tiny-b}.embeds (`moss encode --device cpu`, the golden loop's prompt), {tiny-a,tiny-b}.cpu.lat
# (`moss bench-dit --device cpu --steps 4 --seed 42`), attn.cubin (`nvcc --cubin` of cuda/attention.cu).
# Usage on the GPU machine: bash bench/dit_gpu.sh
set -uo pipefail
BIN=${BIN:-.dittest/moss}
W=${WORK:-/tmp/ditw}
O=${OUT:-/tmp/ditout}
mkdir -p "$W" "$O"
exec > >(tee -a "$O/log.txt") 2>&1
export PYTHONUNBUFFERED=1
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv

echo "== 1. golden tiny checkpoints, CUDA vs CPU"
for c in tiny-a tiny-b; do
  if [ $c = tiny-a ]; then S=64x64; else S=96x64; fi
  for p in bf16 fp32; do
    for r in 1 2; do
      $BIN bench-dit --device cuda --precision $p --model golden/$c --embeds .dittest/$c.embeds --size $S \
        --steps 4 --seed 42 --forwards 3 --save-latents $W/$c.$p.$r.lat > $W/$c.$p.$r.json || echo "FAILED $c $p $r"
    done
    cat $W/$c.$p.1.json
    cmp $W/$c.$p.1.lat $W/$c.$p.2.lat && echo "$c $p: repeat latents byte-identical"
    # the PNG's metadata names the latents file (`source`): decode both runs from one path
    for r in 1 2; do
      cp $W/$c.$p.$r.lat $W/decode.lat
      $BIN decode --device cpu --model golden/$c --size $S $W/decode.lat -o $W/$c.$p.$r.png -q
    done
    cmp $W/$c.$p.1.png $W/$c.$p.2.png && echo "$c $p: repeat PNGs byte-identical (sha256 $(sha256sum < $W/$c.$p.1.png | cut -c1-16))"
  done
  python3 bench/dit_full.py tiny $c .dittest/$c.cpu.lat $W/$c.bf16.1.lat $W/$c.fp32.1.lat | tee -a $O/tiny.jsonl
done

echo "== 2. random full-size DiT"
timeout 240 python3 bench/dit_full.py write $W/full || exit 1
E=$W/full/embeds.safetensors

echo "== 3. moss bench-dit at 1024x1024"
timeout 200 $BIN bench-dit --device cuda --precision bf16 --model $W/full --embeds $E --size 1024x1024 --steps 50 \
  --forwards 5 --save-velocity $W/moss.vel --save-latents $W/moss.lat | tee $O/moss_full.json
timeout 120 $BIN bench-dit --device cuda --precision fp32 --model $W/full --embeds $E --size 1024x1024 --forward-only \
  --forwards 1 --save-velocity $W/moss32.vel | tee $O/moss_full_fp32.json
echo "-- the first flash kernel (MOSS_FLASH=v1), forward only:"
MOSS_FLASH=v1 timeout 60 $BIN bench-dit --device cuda --precision bf16 --model $W/full --embeds $E --size 1024x1024 \
  --forward-only --forwards 5 --save-velocity $W/moss_v1.vel
cmp $W/moss.vel $W/moss_v1.vel && echo "v1 and v2 velocities byte-identical"
echo "-- memory plan with 134 GiB held by another process:"
rm -f $W/held  # a warm machine may still have the last run's
python3 -c "import torch,time,os; x=torch.empty(134*2**30,dtype=torch.uint8,device='cuda'); open('$W/held','w').close(); time.sleep(40)" &
HOLD=$!
for i in $(seq 60); do [ -e $W/held ] && break; sleep 0.5; done
$BIN bench-dit --device cuda --model $W/full --embeds $E --size 1024x1024 --forward-only --forwards 1; echo "exit code $?"
kill $HOLD; wait $HOLD 2>/dev/null

echo "== 3b. attention kernels alone (bench/attn_bench.py)"
timeout 90 python3 bench/attn_bench.py .dittest/attn.cubin | tee $O/attn.txt

echo "== 4. torch reference (golden/dit_ref.py) on the same weights"
timeout 420 python3 bench/dit_full.py torch $W/full $W/moss.vel $W/moss32.vel $O/torch_full.json
python3 bench/dit_full.py table $O | tee $O/summary.md

echo "== 5. moss check --device cuda (all gates; the flash rows)"
timeout 150 $BIN check --device cuda --model golden/tiny-a > $O/check.txt 2>&1; echo "moss check exit code $?"
grep -iE "flash|attention|kernel gates:" $O/check.txt
date -u
