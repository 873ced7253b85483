import json, os, sys
import torch
from safetensors.torch import load_file
W, F, OUT = sys.argv[1:4]

def m(a, ref):
    a, ref = a.double(), ref.double()
    rel = ((a - ref).norm() / ref.norm()).item()
    c = (a * ref).sum(-1) / (a.norm(dim=-1) * ref.norm(dim=-1))
    return f"relL2 {rel:.3e} cos {(a.flatten() @ ref.flatten() / (a.norm() * ref.norm())).item():.5f} min tok cos {c.min().item():.5f}"

def jl(p):
    r = {}
    if os.path.exists(p):
        for line in open(p):
            if line.startswith("{"):
                j = json.loads(line); r[j["tokens"]] = j
    return r

mine, main = jl(f"{OUT}/bench_mine.jsonl"), jl(f"{OUT}/bench_main.jsonl")
tf = json.load(open(f"{F}/tf_times.json")) if os.path.exists(f"{F}/tf_times.json") else {}
for n in [128, 4096]:
    a, b = mine.get(n), main.get(n)
    print(f"L={n}: mine median {a and a['median_ms']:.2f} ms (min {a and a['min_ms']:.2f}) | main median {b and b['median_ms']:.2f} ms (min {b and b['min_ms']:.2f})" if a and b else f"L={n}: mine {a and a['median_ms']} main {b and b['median_ms']}")
    if f"bf16_{n}" in tf:
        t = tf[f"bf16_{n}"]["median_ms"]
        print(f"   tf bf16 {t:.1f} ms, tf fp32 {tf[f'fp32_{n}']['median_ms']:.1f} ms; speedup mine {t / a['median_ms']:.2f}x main {t / b['median_ms']:.2f}x" if a and b else f"   tf bf16 {t}")
    hs = {}
    for k, p in [("mine", f"{W}/mine{n}.st"), ("main", f"{W}/main{n}.st"), ("tf_fp32", f"{F}/tf_fp32_{n}.st"), ("tf_bf16", f"{F}/tf_bf16_{n}.st")]:
        if os.path.exists(p):
            h = load_file(p)["hidden"]
            hs[k] = h
            print(f"   {k}: finite {torch.isfinite(h).all().item()} shape {tuple(h.shape)}")
    if "mine" in hs and "main" in hs:
        print(f"   mine vs main: {m(hs['mine'], hs['main'])}")
    if "tf_fp32" in hs:
        for k in ["mine", "main", "tf_bf16"]:
            if k in hs:
                print(f"   {k} vs tf fp32: {m(hs[k], hs['tf_fp32'])}")
for n in [4096, 128]:
    for name, r in [("mine", mine), ("main", main)]:
        if n in r:
            p = sorted(r[n]["profile_ms"].items(), key=lambda kv: -kv[1]["ms"])
            print(f"profile_ms {name} L={n} (total {r[n]['profile_forward_ms']:.1f}): " + ", ".join(f"{k} {v['ms']:.1f}/{v['calls']}" for k, v in p))
