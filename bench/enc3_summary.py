# Table of bench/enc3_gpu.sh: bench-encode default / MOSS_DOWNLOAD=pinned / MOSS_ENC_ATTN_GATE=fused /
# both / default again, against transformers; hidden states of each run vs the default (pinned:
# must be identical; the fused gate keeps the unfused rounding points, so expected identical or
# nearly) and vs transformers fp32.
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


RUNS = ["default", "pinned", "gatefused", "both", "default2"]
runs = {k: jl(f"{OUT}/bench_{k}.jsonl") for k in RUNS}
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
        attn = j.get("profile_ms", {})
        attn = sum(attn.get(o, {}).get("ms", 0) for o in ["causal_attention", "attn_gate", "causal_attention_gated"])
        print(f"| {n} | {k} (download {j.get('download_mode')}, attn+gate profiled {attn:.2f} ms) | {f(j['median_ms'])} | {f(j['min_ms'])} | {f(j.get('device_median_ms'))} | "
              f"{f(j.get('download_median_ms'))} | {f(t)} | {sp} | {sd} |")
print()
for n in [128, 4096]:
    hs = {}
    for k in RUNS:
        if os.path.exists(f"{W}/{k}{n}.st"):
            hs[k] = load_file(f"{W}/{k}{n}.st")["hidden"]
    for k, p in [("tf_fp32", f"{F}/tf_fp32_{n}.st"), ("tf_bf16", f"{F}/tf_bf16_{n}.st")]:
        if os.path.exists(p):
            hs[k] = load_file(p)["hidden"]
    if "default" in hs:
        a = hs["default"]
        for k in RUNS[1:]:
            if k in hs:
                b = hs[k]
                same = a.shape == b.shape and torch.equal(a, b)
                print(f"L={n}: {k} vs default bit-identical: {same}; finite: {torch.isfinite(b).all().item()}"
                      + ("" if same else f" ({metrics(b, a)})"))
    if "tf_fp32" in hs:
        for k in RUNS + ["tf_bf16"]:
            if k in hs:
                print(f"L={n}: {k} vs tf fp32: {metrics(hs[k], hs['tf_fp32'])}")
