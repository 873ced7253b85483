"""transformers Qwen3_5TextModel in fp32 on the full-size random weights of DIR, at 4096 tokens
(and 128): hidden states DIR/tf_fp32_L.st (one run after one warm-up; no timing needed here).
   python3 tf32.py DIR   (run from the repository root: imports bench/encoder_gpu.py)"""
import json, os, sys, time
sys.path.insert(0, "bench")
import torch
from encoder_gpu import full_config, load_file, save_file

d = sys.argv[1]
t = time.time()
from transformers import Qwen3_5TextModel
cfg = full_config()
with torch.device("cuda"):
    model = Qwen3_5TextModel(cfg)  # fp32
wmap = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
sd = {}
for shard in sorted(set(wmap.values())):
    for k, v in load_file(os.path.join(d, shard), device="cuda").items():
        sd[k.removeprefix("language_model.")] = v
model.load_state_dict(sd, strict=True)
del sd
model.eval()
print(f"tf fp32 loaded in {time.time() - t:.1f} s", flush=True)
for n in (4096, 128):
    ids = torch.tensor([[int(x) for x in open(os.path.join(d, f"ids{n}.txt")).read().split()]], device="cuda")
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=False).last_hidden_state[0]
        torch.cuda.synchronize()
        t1 = time.time()
        out = model(input_ids=ids, use_cache=False).last_hidden_state[0]
        torch.cuda.synchronize()
    save_file({"hidden": out.float().cpu().contiguous()}, os.path.join(d, f"tf_fp32_{n}.st"))
    print(f"tf fp32 L={n}: {1e3 * (time.time() - t1):.1f} ms", flush=True)
