"""Per-kernel Nsight Compute metrics of bench/encrows/rowbench.py --once, by (kernel, grid):
median duration, DRAM read/write MB, L2 (lts) MB, achieved warps %, registers.

    python3 bench/encrows/ncu_table.py NCU.csv
"""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("no ncu rows")
    sys.exit(0)
h = rows[0]
ix = {k: h.index(k) for k in ["ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value"]}
per = defaultdict(dict)  # launch id -> metric -> value
key = {}
for r in rows[1:]:
    i = r[ix["ID"]]
    key[i] = (r[ix["Kernel Name"]], r[ix["Grid Size"]])
    try:
        per[i][r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
    except ValueError:
        pass
agg = defaultdict(list)
for i, m in per.items():
    agg[key[i]].append(m)


def med(ms, k):
    v = sorted(x.get(k, float("nan")) for x in ms)
    return v[len(v) // 2]


print(f"{'kernel':32} {'grid':>16} {'n':>2} {'us':>8} {'DRAM rd MB':>10} {'wr MB':>8} {'L2 MB':>8} {'warps%':>7} {'regs':>5}")
for (k, g), ms in sorted(agg.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{k[:32]:32} {g:>16} {len(ms):2} {med(ms, 'gpu__time_duration.sum') / 1e3:8.2f} "
          f"{med(ms, 'dram__bytes_read.sum') / 1e6:10.2f} {med(ms, 'dram__bytes_write.sum') / 1e6:8.2f} "
          f"{med(ms, 'lts__t_bytes.sum') / 1e6:8.2f} {med(ms, 'sm__warps_active.avg.pct_of_peak_sustained_active'):7.1f} "
          f"{med(ms, 'launch__registers_per_thread'):5.0f}")
