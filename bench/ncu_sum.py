"""Sum Nsight Compute `gpu__time_duration.sum` rows (--csv --print-units base) by kernel name.
Prints total, then each kernel: launches, total ms, mean us, share."""
import csv, sys
from collections import defaultdict

rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("no ncu rows"); sys.exit(0)
h = rows[0]
ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
agg = defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    if r[mi] == "gpu__time_duration.sum":
        a = agg[r[ki][:90]]; a[0] += 1; a[1] += float(r[vi].replace(",", "")) / 1e6  # ns -> ms
tot = sum(v[1] for v in agg.values())
print(f"total {tot:.3f} ms over {sum(v[0] for v in agg.values())} kernels")
for k, (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"  {n:4d} {ms:9.3f} ms {1000*ms/n:9.1f} us {100*ms/tot:5.1f}%  {k}")
