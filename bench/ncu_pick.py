"""Selected metrics of an `ncu --set full` report exported with `ncu -i REP --page raw --csv`:
duration, occupancy, throughputs, and the largest warp stall reasons, per kernel launch.

    python3 bench/ncu_pick.py RAW.csv
"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
data = [r for r in rows[2:] if len(r) == len(hdr)]
col = {h: i for i, h in enumerate(hdr)}
want = [
    ("duration us", "gpu__time_duration.sum", 1e-3),
    ("regs", "launch__registers_per_thread", 1),
    ("smem/block B", "launch__shared_mem_per_block_dynamic", 1),
    ("theor. occ %", "sm__maximum_warps_per_active_cycle_pct", 1),
    ("achieved occ %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
    ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    ("DRAM read MB", "dram__bytes_read.sum", 1e-6),
    ("DRAM write MB", "dram__bytes_write.sum", 1e-6),
    ("L2 %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    ("L1 %", "l1tex__throughput.avg.pct_of_peak_sustained_active", 1),
    ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    ("issue active %", "sm__inst_issued.avg.pct_of_peak_sustained_active", 1),
    ("instr (M)", "smsp__inst_executed.sum", 1e-6),
    ("smem bank confl.", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", 1),
]
name_i = col.get("Kernel Name", col.get("Function Name"))
for r in data:
    print(f"== {r[name_i] if name_i is not None else '?'}")
    for lab, m, sc in want:
        if m in col:
            try:
                v = float(r[col[m]].replace(",", "")) * sc
                print(f"   {lab:18s} {v:.4g}")
            except ValueError:
                print(f"   {lab:18s} {r[col[m]]}")
    st = []
    for h, i in col.items():
        if "issue_stalled" in h and h.endswith("per_warp_active.pct"):
            try:
                st.append((float(r[i].replace(",", "")), h))
            except ValueError:
                pass
    if not st:
        for h, i in col.items():
            if "issue_stalled" in h and "per_issue_active" in h:
                try:
                    st.append((float(r[i].replace(",", "")), h))
                except ValueError:
                    pass
    st.sort(reverse=True)
    print("   stalls: " + ", ".join(f"{h.split('issue_stalled_')[1].split('_per')[0]} {v:.3g}" for v, h in st[:8]))
