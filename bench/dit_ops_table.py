"""Per-op DiT forward times of two builds side by side (bench/compare_builds.sh, stage `dit`).

    python3 bench/dit_ops_table.py NEW_1.json[,NEW_2.json..] BASE_1.json[,BASE_2.json..]

Each file is `moss bench-dit --forward-only` JSON (its `forward_ms_median` and the profiled
forward's `profile_ms`: ms a forward and calls for every op). Prints a markdown table: every op
that takes 0.05 ms or more in either build, each run's ms, NEW's median minus BASE's; then the
unprofiled forward's median of each run.
"""

import json
import statistics
import sys


def load(arg):
    return [json.load(open(p)) for p in arg.split(",") if p]


def main():
    new, base = load(sys.argv[1]), load(sys.argv[2])
    ops = {}
    for runs in (new, base):
        for j in runs:
            for op, v in j.get("profile_ms", {}).items():
                ops[op] = max(ops.get(op, 0.0), v["ms"])
    shown = sorted((op for op, ms in ops.items() if ms >= 0.05), key=lambda op: -ops[op])
    print("| op | " + " | ".join(f"NEW {i + 1}" for i in range(len(new))) + " | "
          + " | ".join(f"BASE {i + 1}" for i in range(len(base))) + " | NEW - BASE |")
    print("|---|" + "---:|" * (len(new) + len(base) + 1))

    def ms(j, op):
        v = j.get("profile_ms", {}).get(op)
        return v["ms"] if v else 0.0

    for op in shown:
        a, b = [ms(j, op) for j in new], [ms(j, op) for j in base]
        print(f"| {op} | " + " | ".join(f"{x:.3f}" for x in a + b) + f" | {statistics.median(a) - statistics.median(b):+.3f} |")
    fa = [j.get("forward_ms_median", float("nan")) for j in new]
    fb = [j.get("forward_ms_median", float("nan")) for j in base]
    print("| forward, unprofiled (median) | " + " | ".join(f"{x:.2f}" for x in fa + fb)
          + f" | {statistics.median(fa) - statistics.median(fb):+.2f} |")


if __name__ == "__main__":
    main()
