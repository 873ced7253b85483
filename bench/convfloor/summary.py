"""Summary of bench/convfloor/run.sh's files: bench-encode new vs old, and ncu per kernel."""
import csv
import json
import os
import sys

F = sys.argv[1]
print("== bench-encode (device median ms; op sums ms)")
print(f"{'run':8} {'L':>5} {'device':>8} {'conv':>7} {'grms':>7}  per rep")
for i in (1, 2):
    for v in ("new", "old"):
        p = f"{F}/enc_{v}_{i}.jsonl"
        if not os.path.exists(p):
            continue
        for line in open(p):
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            pr = j.get("profile_ms", {})
            c = pr.get("causal_conv1d_silu", {}).get("ms", float("nan"))
            g = pr.get("gated_rms_norm", {}).get("ms", float("nan"))
            reps = " ".join(f"{x:.2f}" for x in j.get("device_forward_ms", []))
            print(f"{v} {i:<4} {j['tokens']:5} {j['device_median_ms']:8.2f} {c:7.3f} {g:7.3f}  {reps}")
p = f"{F}/ncu.csv"
if os.path.exists(p):
    lines = [l for l in open(p) if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    per = {}
    for r in rows:
        k = (r.get("Kernel Name", "?"), r.get("ID", "?"))
        per.setdefault(k, {})[r["Metric Name"]] = r["Metric Value"]
    print("== ncu (kbench --once: each kernel once, 4096 then 128 tokens)")
    for (name, i), m in per.items():
        print(f"{i:>4} {name[:34]:34} " + " ".join(f"{k.split('__')[1][:18]}={v}" for k, v in sorted(m.items())))
