#!/usr/bin/env bash
# LoRA cost and the few-step picture time at full size (H200).
#
#   bench/lora_bench.sh MODEL_DIR [MOSS_BIN]     (MOSS_BIN default target/release/moss)
#
# Needs python3 with numpy + safetensors (golden/requirements.txt). Writes a rank-64 LoRA with random
# weights on every linear of the transformer (layers.N.proj.{q,k,v,o,ffn_up_gate,ffn_down}, the text
# embedder, modulation, embedders; kohya naming), once in bf16 and once in f16 (the same values), then
# times `moss generate`:
#   - 1 step 256x256 CFG 1 with no LoRA, the bf16 one, the f16 one, and both (the f16 at 0.5). moss
#     times the LoRA itself (`--json` timings): `lora_read_s` (reading and checking the files, beside
#     the device's start-up), and the merge into the weights as they load, split into
#     `lora_merge_host_s` (the host preparing the factors: their stored bytes into the upload ring;
#     bf16 goes up as stored and is widened on the GPU, f16 is converted to f32 on the host) and
#     `lora_merge_device_s` (the GPU's part: the factors' copies and widening, the merge kernels; CUDA
#     events); `lora_merge_s` is their sum, an upper bound since the host prepares the next tensor
#     while the GPU merges one. See crates/moss-core/src/lora/ and crates/moss-cuda/src/lora.rs. The wall difference with
#     the no-LoRA run shows what a LoRA adds in all;
#   - 8 steps CFG 1 1024x1024 with the bf16 LoRA (the few-step recipe), and without it.
# Prints a table: wall seconds, the read, and the merge per LoRA (all, host, device).
set -euo pipefail
MODEL=${1:?usage: bench/lora_bench.sh MODEL_DIR [MOSS_BIN]}
MOSS=${2:-target/release/moss}
WORK=${WORK:-$(mktemp -d /tmp/lora-bench.XXXX)}
python3 - "$MODEL/transformer" "$WORK/r64-bf16.safetensors" "$WORK/r64-f16.safetensors" <<'PY'
import json, os, sys, numpy as np
from safetensors import safe_open
folder, out_bf16, out_f16 = sys.argv[1:4]
idx = [f for f in os.listdir(folder) if f.endswith(".safetensors.index.json")]
files = sorted(set(json.load(open(os.path.join(folder, idx[0])))["weight_map"].values())) if idx else \
        [f for f in os.listdir(folder) if f.endswith(".safetensors")]
rng, t, r = np.random.default_rng(0), {}, 64
for fn in files:
    with safe_open(os.path.join(folder, fn), "np") as f:
        for k in f.keys():
            if not k.endswith(".weight") or len(f.get_slice(k).get_shape()) != 2:
                continue
            o, i = f.get_slice(k).get_shape()
            stem = "lora_unet_" + k[:-len(".weight")].replace(".", "_")
            t[stem + ".lora_down.weight"] = (rng.standard_normal((r, i)) / np.sqrt(i)).astype(np.float32)
            t[stem + ".lora_up.weight"] = (rng.standard_normal((o, r)) * 1e-3).astype(np.float32)
            t[stem + ".alpha"] = np.array(r, np.float32)
def bf16(a):  # numpy has no bf16: its bits, rounded to nearest even (a: float32)
    u = a.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
def write(path, cast):  # a safetensors file: header length, JSON header (padded to 8), the bytes
    header, blobs, off = {}, [], 0
    for k in sorted(t):
        dtype, a = ("F32", t[k]) if t[k].ndim == 0 else cast(t[k])
        b = a.tobytes()
        header[k] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    print(f"wrote {path}: {len(t)//3} modules, rank {r}, {os.path.getsize(path)/2**20:.0f} MiB")
write(out_bf16, lambda a: ("BF16", bf16(a)))
write(out_f16, lambda a: ("F16", a.astype(np.float16)))
PY
run() {  # label, LoRA count, args...: wall seconds of one moss generate, and its LoRA timings
  local label=$1 n=$2; shift 2
  local t0=$(date +%s.%N)
  local json=$("$MOSS" generate --model "$MODEL" --prompt "a red fox in the snow, photo" --seed 1 --json "$@")
  local t1=$(date +%s.%N)
  python3 - "$label" "$n" "$t0" "$t1" "$json" <<'PY'
import json, sys
label, n, t0, t1, j = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), json.loads(sys.argv[5])
t = j["timings"]
per = lambda k: f"{t[k] / n:8.3f} s" if n else "         -"
read = f"{t['lora_read_s']:8.3f} s" if n else "         -"
print(f"| {label:<44} | {t1 - t0:8.2f} s | {read} | {per('lora_merge_s')} | {per('lora_merge_host_s')} | {per('lora_merge_device_s')} | {t['total_s']:8.2f} s |")
PY
}
B="$WORK/r64-bf16.safetensors" F="$WORK/r64-f16.safetensors"
echo "| run | wall | LoRA read (lora_read_s) | merge per LoRA (lora_merge_s / LoRAs) | host prep per LoRA (lora_merge_host_s / LoRAs) | device per LoRA (lora_merge_device_s / LoRAs) | moss total_s |"
echo "|---|---|---|---|---|---|---|"
run "warm-up (no LoRA, 1 step 256x256)" 0 --steps 1 --guidance 1 --size 256x256 --out "$WORK/w.png"
run "no LoRA, 1 step 256x256" 0 --steps 1 --guidance 1 --size 256x256 --out "$WORK/a.png"
run "1 LoRA r64 bf16, 1 step 256x256" 1 --steps 1 --guidance 1 --size 256x256 --out "$WORK/b.png" --lora "$B"
run "1 LoRA r64 f16, 1 step 256x256" 1 --steps 1 --guidance 1 --size 256x256 --out "$WORK/c.png" --lora "$F"
run "2 LoRAs r64 (bf16, f16:0.5), 1 step 256x256" 2 --steps 1 --guidance 1 --size 256x256 --out "$WORK/d.png" --lora "$B" --lora "$F:0.5"
run "no LoRA, 8 steps CFG 1 1024x1024" 0 --steps 8 --guidance 1 --out "$WORK/e.png"
run "1 LoRA r64 bf16, 8 steps CFG 1 1024x1024" 1 --steps 8 --guidance 1 --out "$WORK/f.png" --lora "$B"
echo "merge per LoRA: host preparation + device (an upper bound: they overlap), expected well under 1 s;"
echo "what a LoRA adds in all = wall(1 LoRA) - wall(no LoRA). Files in $WORK"
