"""Table of bench/encrows/run.sh's bench-encode runs: device median per variant and length, and the
op sums of the row kernels."""
import glob
import json
import os
import sys

O = sys.argv[1]
OPS = ["causal_conv1d_silu", "gdn_gates", "silu_mul", "add_rms_norm", "gated_rms_norm", "embed", "linear"]
print(f"{'run':12} {'L':>5} {'device ms':>9} {'per rep':40} " + " ".join(f"{o[:10]:>10}" for o in OPS))
for f in sorted(glob.glob(os.path.join(O, "enc_*.jsonl")), key=lambda p: (p.split("_")[-1], p)):
    for line in open(f):
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        p = j.get("profile_ms", {})
        reps = ",".join(f"{x:.2f}" for x in j.get("device_forward_ms", []))
        name = os.path.basename(f)[4:-6]
        print(f"{name:12} {j['tokens']:5} {j['device_median_ms']:9.2f} {reps[:40]:40} "
              + " ".join(f"{p.get(o, {}).get('ms', 0):10.3f}" for o in OPS))
