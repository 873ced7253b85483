#!/usr/bin/env bash
# LoRA merge cost and the few-step picture time at full size (H200).
#
#   bench/lora_bench.sh MODEL_DIR [MOSS_BIN]     (MOSS_BIN default target/release/moss)
#
# Needs python3 with numpy + safetensors (golden/requirements.txt). Writes a rank-64 LoRA with random
# weights on every linear of the transformer (layers.N.proj.{q,k,v,o,ffn_up_gate,ffn_down}, the text
# embedder, modulation, embedders; kohya naming, bf16), then times `moss generate`:
#   - 1 step 256x256 CFG 1 with 0, 1 and 2 LoRAs: moss times the merge itself (`lora_merge_s` of
#     `--json`: each weight's merge on the GPU, device time by CUDA events plus the host's part;
#     see src/lora/ and src/backend/cuda/lora.rs); the wall difference shows what a LoRA adds in all
#     (reading the file, the merge);
#   - 8 steps CFG 1 1024x1024 with the LoRA (the few-step recipe), and without it.
# Prints a table: wall seconds, and the merge seconds moss reports (per LoRA for the 2-LoRA run).
set -euo pipefail
MODEL=${1:?usage: bench/lora_bench.sh MODEL_DIR [MOSS_BIN]}
MOSS=${2:-target/release/moss}
WORK=${WORK:-$(mktemp -d /tmp/lora-bench.XXXX)}
python3 - "$MODEL/transformer" "$WORK/r64.safetensors" <<'PY'
import json, os, sys, numpy as np
from safetensors.numpy import save_file
from safetensors import safe_open
folder, out = sys.argv[1], sys.argv[2]
idx = [f for f in os.listdir(folder) if f.endswith(".safetensors.index.json")]
files = sorted(set(json.load(open(os.path.join(folder, idx[0])))["weight_map"].values())) if idx else \
        [f for f in os.listdir(folder) if f.endswith(".safetensors")]
rng, t, r = np.random.default_rng(0), {}, 64
def bf16(a):  # numpy has no bf16: store as f16 (moss reads bf16, f16 and f32)
    return a.astype(np.float16)
for fn in files:
    with safe_open(os.path.join(folder, fn), "np") as f:
        for k in f.keys():
            if not k.endswith(".weight") or len(f.get_slice(k).get_shape()) != 2:
                continue
            o, i = f.get_slice(k).get_shape()
            stem = "lora_unet_" + k[:-len(".weight")].replace(".", "_")
            t[stem + ".lora_down.weight"] = bf16(rng.standard_normal((r, i), np.float32) / np.sqrt(i))
            t[stem + ".lora_up.weight"] = bf16(rng.standard_normal((o, r), np.float32) * 1e-3)
            t[stem + ".alpha"] = np.array(r, np.float32)
save_file(t, out)
print(f"wrote {out}: {len(t)//3} modules, rank {r}, {os.path.getsize(out)/2**20:.0f} MiB")
PY
cp "$WORK/r64.safetensors" "$WORK/r64b.safetensors"
run() {  # label, LoRA count, args...: wall seconds of one moss generate, and its lora_merge_s per LoRA
  local label=$1 n=$2; shift 2
  local t0=$(date +%s.%N)
  local json=$("$MOSS" generate --model "$MODEL" --prompt "a red fox in the snow, photo" --seed 1 --json "$@")
  local t1=$(date +%s.%N)
  python3 - "$label" "$n" "$t0" "$t1" "$json" <<'PY'
import json, sys
label, n, t0, t1, j = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), json.loads(sys.argv[5])
m = j["timings"]["lora_merge_s"]
merge = f"{m / n:8.3f} s" if n else "       -"
print(f"| {label:<40} | {t1 - t0:8.2f} s | {merge} | {j['timings']['total_s']:8.2f} s |")
PY
}
echo "| run | wall | merge per LoRA (lora_merge_s / LoRAs) | moss total_s |"
echo "|---|---|---|---|"
run "warm-up (no LoRA, 1 step 256x256)" 0 --steps 1 --guidance 1 --size 256x256 --out "$WORK/w.png"
run "no LoRA, 1 step 256x256" 0 --steps 1 --guidance 1 --size 256x256 --out "$WORK/a.png"
run "1 LoRA r64, 1 step 256x256" 1 --steps 1 --guidance 1 --size 256x256 --out "$WORK/b.png" --lora "$WORK/r64.safetensors"
run "2 LoRAs r64, 1 step 256x256" 2 --steps 1 --guidance 1 --size 256x256 --out "$WORK/c.png" --lora "$WORK/r64.safetensors" --lora "$WORK/r64b.safetensors:0.5"
run "no LoRA, 8 steps CFG 1 1024x1024" 0 --steps 8 --guidance 1 --out "$WORK/d.png"
run "1 LoRA r64, 8 steps CFG 1 1024x1024" 1 --steps 8 --guidance 1 --out "$WORK/e.png" --lora "$WORK/r64.safetensors"
echo "merge per LoRA: moss's lora_merge_s (expected well under 1 s); what a LoRA adds in all = wall(1 LoRA) - wall(no LoRA). Files in $WORK"
