"""The DiT's per-op profile, its floor and the fraction of the floor reached (issue 22), for
bench/dit_precision.py: `ceilings()` measures on the GPU, in the torch step of the same run, what
the hardware gives the DiT's two kinds of work, and `lines()` turns moss bench-dit's profiles
(OUT_DIR/moss_<p>.json, and OUT_DIR/moss_base_<p>.json from BASE_BIN, the build before) into tables.

The floor of one forward is its GEMM FLOPs at the GEMM ceiling plus its attention FLOPs at the
attention ceiling: every kernel between them fused away, each at the best rate measured here.
- GEMM ceiling: the best of torch.matmul (bf16) / torch._scaled_mm with row-wise scales and bf16
  output (fp8 e4m3) over the DiT's four main-block shapes and 8192^3 (cuBLAS, CUDA events, median).
- attention ceiling: torch's SDPA at the DiT's shape (1 x 24 heads x N x 128, bf16), cuDNN and
  flash backends, the faster.
"""

import re

import torch

from timing import cuda_ms

HEADS, HEAD_DIM, DIM, FFN = 24, 128, 3072, 8192


def shapes(n):
    """(M, K, N) of the main blocks' four products at n joint tokens."""
    return [(n, DIM, 3 * DIM), (n, DIM, DIM), (n, DIM, 2 * FFN), (n, FFN, DIM)]


@torch.no_grad()
def ceilings(n):
    """{"gemm_bf16", "gemm_fp8", "attention"}: TFLOP/s (with the shape that gave each)."""
    dev = "cuda"
    res = {}

    def best(key, run):
        top = (0.0, None)
        for m, k, nn in shapes(n) + [(8192, 8192, 8192)]:
            ms = run(m, k, nn)
            top = max(top, (2 * m * k * nn / ms / 1e9, f"{m}x{k}x{nn}"))
        res[key] = {"tflops": top[0], "shape": top[1]}

    def bf16(m, k, nn):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(nn, k, device=dev, dtype=torch.bfloat16)
        return cuda_ms(lambda: a @ w.t(), 10, warmup=3)[0]

    def fp8(m, k, nn):
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        w = torch.randn(nn, k, device=dev).to(torch.float8_e4m3fn)
        sa, sw = torch.ones(m, 1, device=dev), torch.ones(1, nn, device=dev)
        return cuda_ms(lambda: torch._scaled_mm(a, w.t(), sa, sw, out_dtype=torch.bfloat16), 10, warmup=3)[0]

    best("gemm_bf16", bf16)
    try:
        best("gemm_fp8", fp8)
    except Exception as e:  # no FP8 on this GPU or this torch
        res["gemm_fp8"] = {"not_run": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, device=dev, dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * n * n * HEADS * HEAD_DIM
    top = (0.0, None)
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                ms = cuda_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), 10, warmup=3)[0]
            top = max(top, (flops / ms / 1e9, name))
        except Exception:  # a backend torch does not have here
            continue
    res["attention"] = {"tflops": top[0], "backend": top[1]} if top[1] else {"not_run": "no SDPA backend ran"}
    return res


GROUPS = [
    ("GEMMs (main blocks)", lambda op: re.match(r"linear[a-z0-9_]* (\d+)x", op) and int(op.split()[1].split("x")[0]) > 64),
    ("attention", lambda op: op == "attention"),
    ("SiTU-GLU", lambda op: op.startswith("situ_glu")),
    ("gated residual + norm/modulate", lambda op: op.startswith(("gated_residual", "rms_norm_modulate"))),
    ("QK-norm + RoPE", lambda op: op.startswith("qkv_norm_rope")),
    ("fp8 activation quantize", lambda op: op.startswith("quantize_fp8")),
    ("the rest", lambda op: True),
]


def group(op):
    return next(name for name, hit in GROUPS if hit(op))


def flops(op, n):
    """An op's FLOPs per call from its profile name (products and attention; else 0)."""
    m = re.match(r"linear[a-z0-9_]* (\d+)x(\d+)x(\d+)", op)
    if m:
        a, b, c = map(int, m.groups())
        return 2 * a * b * c
    return 4 * n * n * DIM if op == "attention" else 0


def floor_ms(prof, n, ceil, fp8):
    """The forward's floor (ms) from its profiled ops and the ceilings, or None without them."""
    g = ceil.get("gemm_fp8" if fp8 else "gemm_bf16", {}).get("tflops")
    a = ceil.get("attention", {}).get("tflops")
    if not g or not a:
        return None
    gemm = sum(flops(op, n) * r["calls"] for op, r in prof.items() if group(op) == GROUPS[0][0])
    att = sum(flops(op, n) * r["calls"] for op, r in prof.items() if op == "attention")
    return gemm / g / 1e9 + att / a / 1e9


def lines(runs, ceil):
    """runs: {label: moss bench-dit JSON} (labels "bf16", "fp8", "bf16 before", ...) → markdown lines."""
    out = []
    if ceil:
        parts = []
        for key, label in (("gemm_bf16", "bf16 GEMM"), ("gemm_fp8", "fp8 GEMM"), ("attention", "attention")):
            c = ceil.get(key, {})
            parts.append(f"{label} {c['tflops']:.0f} TFLOP/s ({c.get('shape') or c.get('backend')})" if "tflops" in c
                         else f"{label} not run ({c.get('not_run', 'missing')})")
        out += ["Ceilings measured in this run (torch/cuBLAS/cuDNN on the same GPU): " + "; ".join(parts) + ".", ""]
    labels = [k for k in runs if "profile_ms" in runs[k]]
    if not labels:
        return out + ["(no moss profile in this run)"]
    out += ["Per-op GPU time of one cond forward (moss bench-dit, CUDA events around each op):", "",
            "| op group | " + " | ".join(f"{k} ms" for k in labels) + " |", "|---" + "|---:" * len(labels) + "|"]
    table = {}
    for k in labels:
        for op, r in runs[k]["profile_ms"].items():
            table.setdefault(group(op), {}).setdefault(k, 0.0)
            table[group(op)][k] += r["ms"]
    for name, _ in GROUPS:
        if name in table:
            out.append(f"| {name} | " + " | ".join(f"{table[name].get(k, 0.0):.2f}" for k in labels) + " |")
    out.append("| sum of ops | " + " | ".join(f"{runs[k]['profile_gpu_sum_ms']:.2f}" for k in labels) + " |")
    out.append("| forward (median, unprofiled) | " + " | ".join(f"{runs[k]['forward_ms_median']:.2f}" for k in labels) + " |")
    fl = [floor_ms(runs[k]["profile_ms"], runs[k]["tokens_cond"], ceil or {}, runs[k]["precision"] == "fp8") for k in labels]
    out.append("| floor (GEMMs + attention at the ceilings) | " + " | ".join("-" if f is None else f"{f:.2f}" for f in fl) + " |")
    out.append("| fraction of the floor reached | " + " | ".join(
        "-" if f is None else f"{f / runs[k]['forward_ms_median']:.0%}" for f, k in zip(fl, labels)) + " |")
    out += ["", "Every op (ms per forward, calls):", "", "| op | " + " | ".join(labels) + " |", "|---" + "|---:" * len(labels) + "|"]
    ops = sorted({op for k in labels for op in runs[k]["profile_ms"]}, key=lambda op: -max(
        runs[k]["profile_ms"].get(op, {"ms": 0})["ms"] for k in labels))
    for op in ops:
        cells = []
        for k in labels:
            r = runs[k]["profile_ms"].get(op)
            cells.append("" if r is None else f"{r['ms']:.3f} ({r['calls']})")
        out.append(f"| {op} | " + " | ".join(cells) + " |")
    return out
