"""The encoder's row kernels, previous vs byte-floor (cuda/enc_floor.cu), at the Qwen3.5-9B shapes.

    python3 bench/encrows/rowbench.py CUBIN [--once]

Loads the cubin of bench/encrows/unit.cu through the CUDA driver API (ctypes), runs each kernel on
torch tensors: outputs of the new kernels against the previous ones (rel L2; NaN fails), the
planted controls (must differ), and CUDA-event times (mean of a loop of launches over 3 rotating
input copies, median of 7 rounds, old and new interleaved). --once: each kernel a few launches
only (for ncu). Prints a table last.
"""
import ctypes
import math
import sys

import torch

CUBIN = sys.argv[1]
ONCE = "--once" in sys.argv
torch.zeros(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")
mod = ctypes.c_void_p()
data = open(CUBIN, "rb").read()
assert cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)) == 0, "cuModuleLoadData"
FN = {}


def fn(name):
    if name not in FN:
        f = ctypes.c_void_p()
        r = cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode())
        assert r == 0, f"{name}: {r}"
        FN[name] = f
    return FN[name]


def P(t, off=0):
    return ctypes.c_uint64(0 if t is None else t.data_ptr() + off * t.element_size())


L_, I_, F_ = ctypes.c_int64, ctypes.c_int32, ctypes.c_float


def launch(name, grid, block, args):
    if isinstance(grid, int):
        grid = (grid, 1)
    arr = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    s = torch.cuda.current_stream().cuda_stream
    r = cu.cuLaunchKernel(fn(name), grid[0], grid[1], 1, block, 1, 1, 0, ctypes.c_void_p(s), arr, None)
    assert r == 0, f"launch {name}: {r}"


SMS = torch.cuda.get_device_properties(0).multi_processor_count


def grid_for(work):
    return max(1, min(math.ceil(work / 256), SMS * 16))


def rel(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm()).item()


HID, FFN, KH, VH, DK, DV = 4096, 12288, 16, 32, 128, 128
CONV = 2 * KH * DK + VH * DV  # 8192
VD = VH * DV
NY = CONV + VD + 2 * VH  # 12352
bf = torch.bfloat16
COPIES = 1 if ONCE else 3


MODE = {"graph": 0, "loop": 0}


def timed(fn_, reps):
    """ms per call: events around `reps` calls, captured in a CUDA graph (no Python launch gaps;
    a plain loop where the capture fails)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g = None
    if not ONCE:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(reps):
                    fn_(i)
            g.replay()
        except Exception as e:  # noqa: BLE001
            print("graph capture failed:", e, file=sys.stderr)
            g = None
    torch.cuda.synchronize()
    a.record()
    if g is not None:
        g.replay()
    else:
        for i in range(reps):
            fn_(i)
    b.record()
    torch.cuda.synchronize()
    MODE["graph" if g is not None else "loop"] += 1
    return a.elapsed_time(b) / reps


def race(variants, reps):
    """variants: name -> fn(i). Median over 7 rounds, interleaved, in us."""
    res = {k: [] for k in variants}
    for f in variants.values():
        f(0)
    torch.cuda.synchronize()
    rounds = 1 if ONCE else 7
    for _ in range(rounds):
        for k, f in variants.items():
            res[k].append(timed(f, 1 if ONCE else reps) * 1e3)
    return {k: sorted(v)[len(v) // 2] for k, v in res.items()}


rows = []  # (op, L, variant, us, floor_us, check)


def add(op, L, times, bytes_, checks):
    floor = bytes_ / 4.3e12 * 1e6
    for k, us in times.items():
        rows.append((op, L, k, us, floor, checks.get(k, "")))


torch.manual_seed(0)
for L in [4096, 128]:
    reps = 20 if L == 4096 else 200
    # ---- conv (+ gates) over columns of y [L, NY]
    ys = [torch.randn(L, NY, device="cuda").mul(1.5).to(bf) for _ in range(COPIES)]
    w = (torch.randn(CONV, 1, 4, device="cuda") * 0.5).to(bf)
    wt = w.float().reshape(CONV, 4).t().contiguous()  # the old path's cast + permute
    alog = torch.log(0.5 + 15.5 * torch.rand(VH, device="cuda")).to(bf)
    dtb = (torch.randn(VH, device="cuda") * 4).to(bf)
    alog32, dtb32 = alog.float(), dtb.float()
    out = {k: torch.empty(L, CONV, device="cuda", dtype=bf) for k in ["old", "t4", "t8", "t16", "q4", "q8", "t4g", "t8g", "ctl"]}
    gg = {k: (torch.empty(L, VH, device="cuda"), torch.empty(L, VH, device="cuda")) for k in ["old", "t8g", "ctl"]}

    def conv8(i, o=out["old"]):
        y = ys[i % COPIES]
        launch("moss_enc_conv8_bf16", grid_for(L * CONV // 8), 256, [P(o), P(y), P(wt), L_(L), I_(CONV), I_(4), L_(NY)])

    def gates_s(i, k="old"):
        y = ys[i % COPIES]
        g, b = gg[k]
        launch("moss_enc_gates_s_bf16", grid_for(L * VH), 256,
               [P(g), P(b), P(y, CONV + VD), P(y, CONV + VD + VH), P(alog32), P(dtb32), L_(L * VH), I_(VH), L_(NY)])

    def convg(tt, gates, pfx="moss_enc", key=None, v=8):
        def f(i):
            y = ys[i % COPIES]
            o = out[key]
            ncx = math.ceil(CONV // v / 128)
            ncb = ncx * math.ceil(L / tt)
            if gates:
                g, b = gg[key]
                ga = [P(g), P(b), P(y, CONV + VD), P(y, CONV + VD + VH), P(alog), P(dtb), I_(1), I_(VH), L_(NY)]
                ngb = math.ceil(L * VH / 128)
            else:
                ga = [P(None)] * 6 + [I_(0), I_(0), L_(0)]
                ngb = 0
            launch(f"{pfx}_{'convg' if v == 8 else 'convq'}{tt}_bf16", ncb + ngb, 128,
                   [P(o), P(y), P(w), I_(1), I_(L), I_(CONV), L_(NY), I_(ncx), I_(ncb)] + ga)
        return f

    t = race({
        "conv8 (old)": conv8,
        "convg4": convg(4, False, key="t4"),
        "convg8": convg(8, False, key="t8"),
        "convg16": convg(16, False, key="t16"),
        "convq4": convg(4, False, key="q4", v=4),
        "convq8": convg(8, False, key="q8", v=4),
    }, reps)
    last = 0 if ONCE else reps - 1  # the index every variant ran last
    convg(8, True, "moss_ctl_enc", "ctl")(last)
    torch.cuda.synchronize()
    ck = {k: rel(out[o], out["old"]) for k, o in [("convg4", "t4"), ("convg8", "t8"), ("convg16", "t16"), ("convq4", "q4"), ("convq8", "q8")]}
    add("conv", L, t, L * CONV * 2 * 2, {k: f"vs old {v:.2e}" for k, v in ck.items()})
    t = race({"conv8 + gates_s (old)": lambda i: (conv8(i), gates_s(i)), "convg8 + gates": convg(8, True, key="t8g")}, reps)
    torch.cuda.synchronize()
    gchk = f"conv {rel(out['t8g'], out['old']):.2e} g {rel(gg['t8g'][0], gg['old'][0]):.2e} beta {rel(gg['t8g'][1], gg['old'][1]):.2e}"
    add("conv+gates", L, t, L * CONV * 4 + L * VH * 12, {"convg8 + gates": gchk})
    rows.append(("conv ctl", L, "taps reversed / no softplus", float("nan"), float("nan"),
                 f"conv {rel(out['ctl'], out['old']):.2e} g {rel(gg['ctl'][0], gg['old'][0]):.2e} (must be large)"))
    # ---- gated RMSNorm: x [L, VH, DV], z = columns CONV.. of y
    xs = [torch.randn(L, VH, DV, device="cuda").to(bf) for _ in range(COPIES)]
    wn = torch.randn(DV, device="cuda").to(bf)
    wn32 = wn.float()
    go = {k: torch.empty(L, VH, DV, device="cuda", dtype=bf) for k in ["old", "new", "ctl"]}
    rws = L * VH

    def grms8s(i):
        launch("moss_enc_grms8s_bf16", math.ceil(rws / 16), 256,
               [P(go["old"]), P(xs[i % COPIES]), P(ys[i % COPIES], CONV), P(wn32), L_(rws), I_(DV), F_(1e-6), I_(VH), L_(NY)])

    def grms8r(i, pfx="moss_enc", k="new"):
        launch(f"{pfx}_grms8r_bf16", math.ceil(rws / 16), 256,
               [P(go[k]), P(xs[i % COPIES]), P(ys[i % COPIES], CONV), P(wn), I_(1), L_(rws), I_(DV), F_(1e-6), I_(VH), L_(NY)])

    t = race({"grms8s (old)": grms8s, "grms8r": grms8r}, reps)
    grms8r(last, "moss_ctl_enc", "ctl")
    torch.cuda.synchronize()
    add("gated_rms_norm", L, t, L * VD * 2 * 3,
        {"grms8r": f"vs old {rel(go['new'], go['old']):.2e}; ctl {rel(go['ctl'], go['old']):.2e}"})
    del ys, xs
    # ---- silu_mul over [L, 2·FFN]
    y2 = [torch.randn(L, 2 * FFN, device="cuda").mul(1.5).to(bf) for _ in range(COPIES)]
    so = {k: torch.empty(L, FFN, device="cuda", dtype=bf) for k in ["old", "new", "ctl"]}

    def silu8r(i):
        launch("moss_enc_silu_mul8r_bf16", grid_for(L * FFN // 8), 256,
               [P(so["old"]), P(y2[i % COPIES]), P(y2[i % COPIES], FFN), L_(L), I_(FFN), L_(2 * FFN)])

    def silu8v(i, pfx="moss_enc", k="new"):
        launch(f"{pfx}_silu_mul8v_bf16", (math.ceil(FFN // 8 / 512), L), 256,
               [P(so[k]), P(y2[i % COPIES]), P(y2[i % COPIES], FFN), I_(FFN), L_(2 * FFN)])

    t = race({"silu_mul8r (old)": silu8r, "silu_mul8v": silu8v}, reps)
    silu8v(last, "moss_ctl_enc", "ctl")
    torch.cuda.synchronize()
    add("silu_mul", L, t, L * FFN * 2 * 3,
        {"silu_mul8v": f"vs old {rel(so['new'], so['old']):.2e}; ctl {rel(so['ctl'], so['old']):.2e}"})
    del y2
    # ---- rms1 over [L, HID]
    xr = [torch.randn(L, HID, device="cuda").to(bf) for _ in range(COPIES)]
    wr = (torch.randn(HID, device="cuda") * 0.3).to(bf)
    wr32 = wr.float()
    ro = {k: torch.empty(L, HID, device="cuda", dtype=bf) for k in ["old", "new", "ctl"]}

    def rms1(i):
        launch("moss_enc_rms1_bf16", L, 256, [P(ro["old"]), P(xr[i % COPIES]), P(wr32), I_(HID), F_(1e-6)])

    def rms1w(i, pfx="moss_enc", k="new"):
        launch(f"{pfx}_rms1w2_bf16", L, 256, [P(ro[k]), P(xr[i % COPIES]), P(wr), I_(1), I_(HID), F_(1e-6)])

    t = race({"rms1 (old)": rms1, "rms1w2": rms1w}, reps)
    rms1w(last, "moss_ctl_enc", "ctl")
    torch.cuda.synchronize()
    add("rms1", L, t, L * HID * 2 * 2, {"rms1w2": f"vs old {rel(ro['new'], ro['old']):.2e}; ctl {rel(ro['ctl'], ro['old']):.2e}"})
    # ---- embed
    table = torch.randn(248320 if not ONCE else 4096, HID, device="cuda").to(bf)
    ids = torch.randint(0, table.shape[0] - 1, (L,), device="cuda").float()
    eo = {k: torch.empty(L, HID, device="cuda", dtype=bf) for k in ["old", "new", "ctl"]}

    def embed(i):
        launch("moss_enc_embed_bf16", grid_for(L * HID), 256, [P(eo["old"]), P(table), P(ids), L_(L), L_(HID)])

    def embed8(i, pfx="moss_enc", k="new"):
        launch(f"{pfx}_embed8_bf16", (math.ceil(HID / 8 / 256), L), 256, [P(eo[k]), P(table), P(ids), L_(HID)])

    t = race({"embed (old)": embed, "embed8": embed8}, reps)
    embed8(last, "moss_ctl_enc", "ctl")
    torch.cuda.synchronize()
    add("embed", L, t, L * HID * 2 * 2,
        {"embed8": f"vs old {rel(eo['new'], eo['old']):.2e}; vs torch {rel(eo['new'], table[ids.long()]):.2e}; ctl {rel(eo['ctl'], eo['old']):.2e}"})
    del xr, table

print(f"timing: {MODE}")
print(f"{'op':15} {'L':>5} {'variant':28} {'us':>8} {'floor us':>8}  check")
for op, L, k, us, fl, c in rows:
    print(f"{op:15} {L:5} {k:28} {us:8.2f} {fl:8.2f}  {c}")
