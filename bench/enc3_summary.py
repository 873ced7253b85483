# Table of bench/enc3_gpu.sh: bench-encode default / MOSS_DOWNLOAD=pinned / default again, against
# transformers; hidden states pinned vs default (must be identical) and each vs transformers fp32.
#   python3 bench/enc3_summary.py WORK FULL OUT
import json, os, sys
import torch
from safetensors.torch import load_file
W, F, OUT = sys.argv[1:4]


def jl(p):
    r = {}
    if os.path.exists(p):
        for line in open(p):
            if line.startswith("{"):
                j = json.loads(line)
                r[j["tokens"]] = j
    return r


def metrics(a, ref):
    a, ref = a.double(), ref.double()
    rel = ((a - ref).norm() / ref.norm()).item()
    c = (a * ref).sum(-1) / (a.norm(dim=-1) * ref.norm(dim=-1))
    return f"relL2 {rel:.3e} min tok cos {c.min().item():.5f}"


runs = {k: jl(f"{OUT}/bench_{k}.jsonl") for k in ["default", "pinned", "default2"]}
tf = json.load(open(f"{F}/tf_times.json")) if os.path.exists(f"{F}/tf_times.json") else {}
f = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"
print("| L | run | median_ms (forward + download) | min_ms | device_median_ms | download_median_ms | tf bf16 ms | speedup (median) | speedup (device) |")
print("|---|---|---|---|---|---|---|---|---|")
for n in [128, 4096]:
    t = tf.get(f"bf16_{n}", {}).get("median_ms")
    for k, r in runs.items():
        j = r.get(n)
        if not j:
            print(f"| {n} | {k} | missing | | | | | | |")
            continue
        sp = f"{t / j['median_ms']:.2f}x" if t else "-"
        sd = f"{t / j['device_median_ms']:.2f}x" if t and j.get("device_median_ms") else "-"
        print(f"| {n} | {k} ({j.get('download_mode')}) | {f(j['median_ms'])} | {f(j['min_ms'])} | {f(j.get('device_median_ms'))} | "
              f"{f(j.get('download_median_ms'))} | {f(t)} | {sp} | {sd} |")
print()
for n in [128, 4096]:
    hs = {}
    for k, p in [("default", f"{W}/default{n}.st"), ("pinned", f"{W}/pinned{n}.st"), ("tf_fp32", f"{F}/tf_fp32_{n}.st"), ("tf_bf16", f"{F}/tf_bf16_{n}.st")]:
        if os.path.exists(p):
            hs[k] = load_file(p)["hidden"]
    if "default" in hs and "pinned" in hs:
        a, b = hs["default"], hs["pinned"]
        same = a.shape == b.shape and torch.equal(a, b)
        print(f"L={n}: pinned vs default hidden states bit-identical: {same}; finite: {torch.isfinite(b).all().item()}"
              + ("" if same else f" ({metrics(b, a)})"))
    if "tf_fp32" in hs:
        for k in ["default", "pinned", "tf_bf16"]:
            if k in hs:
                print(f"L={n}: {k} vs tf fp32: {metrics(hs[k], hs['tf_fp32'])}")
