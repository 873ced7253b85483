"""Table of helper encops's device call: bench_*.jsonl in OUT, hidden states *_L.st in W,
optionally transformers' tf_fp32_L.st in F.   python3 summary.py W OUT [F]"""
import json, os, struct, sys
import numpy as np

W, OUT = sys.argv[1], sys.argv[2]
F = sys.argv[3] if len(sys.argv) > 3 else None
ORDER = ["old", "default", "default2", "cat_off", "cat_split", "cat_mlp", "resadd_off", "conv8", "gate_unfused", "tune"]
OPS = ["linear", "gated_delta_rule", "add_rms_norm", "silu_mul", "causal_attention", "causal_conv1d_silu",
       "gated_rms_norm", "gdn_gates", "head_norm_rope", "narrow", "attn_gate"]


def load_st(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    k = [k for k in h if k != "__metadata__"][0]
    m = h[k]
    raw = b[8 + n + m["data_offsets"][0]: 8 + n + m["data_offsets"][1]]
    if m["dtype"] == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif m["dtype"] == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(m["dtype"])
    return a.astype(np.float64).reshape(m["shape"])


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


runs = {}
for name in ORDER:
    p = os.path.join(OUT, f"bench_{name}.jsonl")
    if not os.path.exists(p):
        continue
    for line in open(p):
        if line.startswith("{"):
            j = json.loads(line)
            runs[(name, j["tokens"])] = j

print("| variant | L | device ms (median of 5) | forward + download ms | " + " | ".join(OPS) + " |")
print("|---|---:|---:|---:|" + "---:|" * len(OPS))
for L in (128, 4096):
    for name in ORDER:
        j = runs.get((name, L))
        if not j:
            continue
        pm = j.get("profile_ms", {})
        ops = " | ".join(f"{pm[o]['ms']:.2f}/{pm[o]['calls']}" if o in pm else "-" for o in OPS)
        print(f"| {name} | {L} | {j['device_median_ms']:.2f} | {j['median_ms']:.2f} | {ops} |")
print()
for L in (128, 4096):
    old = os.path.join(W, f"old_{L}.st")
    if not os.path.exists(old):
        continue
    ho = load_st(old)
    tf = load_st(os.path.join(F, f"tf_fp32_{L}.st")) if F and os.path.exists(os.path.join(F, f"tf_fp32_{L}.st")) else None
    for name in ORDER:
        p = os.path.join(W, f"{name}_{L}.st")
        if not os.path.exists(p):
            continue
        h = load_st(p)
        ok = bool(np.isfinite(h).all())
        line = f"L={L} {name:12} finite={ok} relL2 vs old {rel(h, ho):.3e}"
        if tf is not None:
            c = float((h * tf).sum() / np.linalg.norm(h) / np.linalg.norm(tf))
            line += f"  vs transformers fp32: relL2 {rel(h, tf):.4e} cos {c:.6f}"
        print(line)
    if tf is not None and os.path.exists(os.path.join(F, f"tf_bf16_{L}.st")):
        h = load_st(os.path.join(F, f"tf_bf16_{L}.st"))
        print(f"L={L} transformers bf16 vs fp32: relL2 {rel(h, tf):.4e}")
d, o = runs.get(("default", 4096)), runs.get(("old", 4096))
d2 = runs.get(("default2", 4096))
if d and o:
    print(f"\n4096 tokens: default {d['device_median_ms']:.2f} ms (again {d2['device_median_ms'] if d2 else float('nan'):.2f}) vs old {o['device_median_ms']:.2f} ms: "
          f"{o['device_median_ms'] - d['device_median_ms']:.2f} ms less")
