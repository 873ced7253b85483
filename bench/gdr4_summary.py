# Table of bench/gdr4_gpu.sh: bench-encode default (TF32 delta rule) / MOSS_GDR=v2 / default again /
# v2 again / MOSS_GDR=tc2, against transformers; hidden states of v2 vs default and of each vs transformers fp32.
#   python3 bench/gdr4_summary.py WORK FULL OUT
import json, os, sys
import torch
from safetensors.torch import load_file
W, F, OUT = sys.argv[1:4]
RUNS = ["default", "v2", "default2", "v2b", "tc2"]


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
    return f"relL2 {rel:.3e} cos {(a * ref).sum().item() / (a.norm() * ref.norm()).item():.5f} min tok cos {c.min().item():.5f}"


runs = {k: jl(f"{OUT}/bench_{k}.jsonl") for k in RUNS}
tf = json.load(open(f"{F}/tf_times.json")) if os.path.exists(f"{F}/tf_times.json") else {}
f = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"
print("| L | run | median_ms (forward + download) | min_ms | device_median_ms | delta rule profiled ms (calls) | op sum ms | tf bf16 ms | speedup (median) | speedup (device) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in [128, 4096]:
    t = tf.get(f"bf16_{n}", {}).get("median_ms")
    for k, r in runs.items():
        j = r.get(n)
        if not j:
            print(f"| {n} | {k} | missing | | | | | | | |")
            continue
        sp = f"{t / j['median_ms']:.2f}x" if t else "-"
        sd = f"{t / j['device_median_ms']:.2f}x" if t and j.get("device_median_ms") else "-"
        pr = j.get("profile_ms", {})
        gd = pr.get("gated_delta_rule", {})
        osum = sum(v.get("ms", 0) for v in pr.values())
        print(f"| {n} | {k} | {f(j['median_ms'])} | {f(j['min_ms'])} | {f(j.get('device_median_ms'))} | "
              f"{f(gd.get('ms'))} ({gd.get('calls', '-')}) | {f(osum)} | {f(t)} | {sp} | {sd} |")
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
        for k in RUNS[1:]:
            if k in hs:
                b = hs[k]
                same = hs["default"].shape == b.shape and torch.equal(hs["default"], b)
                print(f"L={n}: {k} vs default bit-identical: {same}; finite: {torch.isfinite(b).all().item()}"
                      + ("" if same else f" ({metrics(b, hs['default'])})"))
    if "tf_fp32" in hs:
        for k in RUNS + ["tf_bf16"]:
            if k in hs:
                print(f"L={n}: {k} vs tf fp32: {metrics(hs[k], hs['tf_fp32'])}")
