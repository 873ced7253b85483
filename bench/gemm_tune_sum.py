"""Summarise `MOSS_GEMM_TUNE=1` stderr logs (one per process): per product shape, each heuristic
candidate's configuration and its median time in every process, the heuristic's first choice (#0)
against the fastest.  python3 bench/gemm_tune_sum.py LOG...
"""
import re, sys
from collections import defaultdict

head = re.compile(r"gemm tune m=(\d+) n=(\d+) k=(\d+) acc=(\w+) cc=([\d.]+): candidate (-?\d+) of (\d+)")
cand = re.compile(r"gemm tune   #(\d+) ([\d.]+|NaN|nan|inf) ms (.*)")
shapes = defaultdict(lambda: defaultdict(list))  # shape -> config -> [ms per process]
order = defaultdict(dict)                          # shape -> config -> candidate index
for path in sys.argv[1:]:
    key = None
    for line in open(path):
        m = head.search(line)
        if m:
            key = m.groups()[:5]
            continue
        m = cand.search(line)
        if m and key:
            i, ms, cfg = int(m.group(1)), float(m.group(2)), m.group(3)
            shapes[key][cfg].append(ms)
            order[key].setdefault(cfg, i)
for key, cfgs in shapes.items():
    m, n, k, acc, cc = key
    print(f"m={m} n={n} k={k} acc={acc} cc={cc}")
    first = next(c for c, i in order[key].items() if i == 0)
    t0 = sorted(cfgs[first])
    for cfg, ts in sorted(cfgs.items(), key=lambda kv: sorted(kv[1])[len(kv[1]) // 2]):
        med = sorted(ts)[len(ts) // 2]
        rel = med / t0[len(t0) // 2]
        print(f"  #{order[key][cfg]} {med:.4f} ms ({rel:.3f} of #0) per process {[round(t, 4) for t in ts]} {cfg}")
