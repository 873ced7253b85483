"""The DiT forward under the GPU's power limit (issue 22), for bench/power.sh.

    python3 bench/power.py torch TOKENS OUT.json     # torch's burst and sustained rates (prints MARK lines)
    python3 bench/power.py report OUT_DIR            # OUT_DIR/power.md from what power.sh left there

`torch` times, on the GPU, the work of one DiT forward as PyTorch runs it alone: the main blocks'
four products at TOKENS rows (bf16 `a @ w.t()`, and e4m3 `torch._scaled_mm` with row-wise scales,
bf16 output), the 8192^3 product, and SDPA attention (cuDNN backend, 24 heads of 128). Each twice:
"burst" (median of 10 CUDA-event runs after 3 warm-ups, as bench/dit_profile.py's ceilings) and
"sustained" (back to back for SECS seconds, CUDA events around the whole loop), the second long
enough for the GPU to settle at its power limit. Before and after each sustained loop it prints
`MARK <name> start|end <unix time>`, so that the nvidia-smi samples power.sh takes meanwhile can be
cut by phase.

`report` reads OUT_DIR/smi.csv (nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,
temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20), OUT_DIR/marks.txt
(the MARK lines of the moss forwards and of `torch`), OUT_DIR/torch_power.json and
OUT_DIR/moss_<bf16|fp8>.json (moss bench-dit --forward-only), and writes the SM clock and power of
every phase, and every product and the attention of the forward: moss's time in its forward
against torch's for the same FLOPs alone, burst and sustained; the sums of torch's sustained times
are the sustained floor (GEMMs + attention, every other op fused away, each at the rate cuBLAS or
cuDNN holds at the power limit).
"""

import datetime
import json
import re
import statistics
import sys
import time

from dit_profile import HEAD_DIM, HEADS, flops, group, shapes

PRODUCTS = "GEMMs (main blocks)"


def torch_rates(n, out, secs=2.0):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from timing import cuda_ms

    dev, res = "cuda", {}

    def both(name, fn, flop):
        ms = cuda_ms(fn, 10, warmup=3)[0]
        n_runs = max(10, int(secs * 1e3 / ms))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        print(f"MARK {name} start {time.time():.3f}", flush=True)
        a.record()
        for _ in range(n_runs):
            fn()
        b.record()
        torch.cuda.synchronize()
        print(f"MARK {name} end {time.time():.3f}", flush=True)
        res[name] = {"flop": flop, "burst_tflops": flop / ms / 1e9,
                     "sustained_tflops": flop * n_runs / a.elapsed_time(b) / 1e9}
        print(f"{name}: burst {res[name]['burst_tflops']:.1f}, sustained {res[name]['sustained_tflops']:.1f} TFLOP/s", flush=True)

    with torch.no_grad():
        for m, k, nn in shapes(n) + [(8192, 8192, 8192)]:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(nn, k, device=dev, dtype=torch.bfloat16)
            both(f"bf16 {m}x{k}x{nn}", lambda: x @ w.t(), 2 * m * k * nn)
            try:
                xq, wq = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                sx, sw = torch.ones(m, 1, device=dev), torch.ones(1, nn, device=dev)
                both(f"fp8 {m}x{k}x{nn}", lambda: torch._scaled_mm(xq, wq.t(), sx, sw, out_dtype=torch.bfloat16),
                     2 * m * k * nn)
            except Exception as e:  # no FP8 on this GPU or this torch
                res[f"fp8 {m}x{k}x{nn}"] = {"not_run": f"{type(e).__name__}"}
            del x, w
        q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, device=dev, dtype=torch.bfloat16) for _ in range(3))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            both("attention cudnn", lambda: F.scaled_dot_product_attention(q, k, v), 4 * n * n * HEADS * HEAD_DIM)
    json.dump(res, open(out, "w"), indent=1)


def phases(d):
    """{phase: (seconds, SM clock median, clock min, power median W, temperature max, event reasons)}."""
    rows = []
    for line in open(f"{d}/smi.csv"):
        p = [s.strip() for s in line.split(",")]
        try:
            t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(p[1].split()[0]), float(p[2].split()[0]), float(p[3]), p[4]))
        except (ValueError, IndexError):
            continue
    span = {}
    for m in re.finditer(r"MARK (.*?) (start|end) ([0-9.]+)", open(f"{d}/marks.txt").read()):
        span.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    out = {}
    for name, s in span.items():
        w = [r for r in rows if "start" in s and "end" in s and s["start"] + 0.3 < r[0] < s["end"]]
        if w:
            out[name] = (s["end"] - s["start"], statistics.median(r[1] for r in w), min(r[1] for r in w),
                         statistics.median(r[2] for r in w), max(r[3] for r in w), sorted({r[4] for r in w}))
    return out


def torch_key(op, precision):
    """The torch row timing the same work as a moss profile op, or None."""
    if op == "attention":
        return "attention cudnn"
    m = re.match(r"linear[a-z0-9_]* (\d+x\d+x\d+)", op)
    return f"{precision} {m.group(1)}" if m and group(op) == PRODUCTS else None


def report(d):
    tr = json.load(open(f"{d}/torch_power.json"))
    out = ["# The DiT forward under the power limit (bench/power.sh)", "",
           "SM clock and board power (nvidia-smi every 20 ms) while each phase ran:", "",
           "| phase | s | SM clock median (min), MHz | power median, W | temp max, C | clock event reasons |",
           "|---|---:|---:|---:|---:|---|"]
    for name, (s, clk, cmin, pw, temp, why) in phases(d).items():
        out.append(f"| {name} | {s:.1f} | {clk:.0f} ({cmin:.0f}) | {pw:.0f} | {temp:.0f} | {' '.join(why)} |")
    for p in ("bf16", "fp8"):
        try:
            j = json.load(open(f"{d}/moss_{p}.json"))
        except (OSError, ValueError):
            out += ["", f"moss {p}: not run"]
            continue
        n, prof = j["tokens_cond"], j["profile_ms"]
        out += ["", f"moss {p}, forward {j['forward_ms_median']:.2f} ms (median, unprofiled); per op, ms a forward "
                f"({n} tokens), against torch doing the same FLOPs alone:", "",
                "| op | calls | moss in the forward | TFLOP/s | torch burst | torch sustained | sustained TFLOP/s |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        tot = {"moss": 0.0, "burst": 0.0, "sust": 0.0}
        for op, r in sorted(prof.items(), key=lambda kv: -kv[1]["ms"]):
            key = torch_key(op, p)
            t = tr.get(key, {}) if key else {}
            if "sustained_tflops" not in t:
                continue
            f = flops(op, n) * r["calls"]
            b, s = f / t["burst_tflops"] / 1e9, f / t["sustained_tflops"] / 1e9
            tot["moss"] += r["ms"]
            tot["burst"] += b
            tot["sust"] += s
            out.append(f"| {op} | {r['calls']} | {r['ms']:.2f} | {f / r['ms'] / 1e9:.0f} | {b:.2f} | {s:.2f} | "
                       f"{t['sustained_tflops']:.0f} |")
        rest = sum(r["ms"] for r in prof.values()) - tot["moss"]
        out.append(f"| products + attention | | {tot['moss']:.2f} | | {tot['burst']:.2f} | {tot['sust']:.2f} | |")
        out.append(f"| every other op (moss) | | {rest:.2f} | | | | |")
        out.append(f"| torch's sustained products + attention, with moss's other ops | | | | | {tot['sust'] + rest:.2f} | |")
    out += ["", "torch alone, TFLOP/s (burst / sustained):", "",
            "| work | burst | sustained |", "|---|---:|---:|"]
    for k, v in tr.items():
        out.append(f"| {k} | " + (f"{v['burst_tflops']:.1f} | {v['sustained_tflops']:.1f} |" if "burst_tflops" in v
                                 else f"not run ({v.get('not_run')}) | |"))
    open(f"{d}/power.md", "w").write("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "torch":
        torch_rates(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__.split("\n\n")[1])
