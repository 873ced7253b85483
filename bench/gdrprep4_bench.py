"""The delta rule's chunk-local prep alone: gdr_prep_tc3 as on main (72 KiB, three blocks an SM)
against this branch's variants (cuda/gdr_prep3.cuh: 55 KiB, four blocks an SM), at the real shapes
(Hk 16, Hv 32, dk = dv = 128; q k v strided out of one [L, 8192] bf16 conv output), L = 128, 4096
and 200 (partial last chunk).

Per variant: its five outputs (U0, Wk, Kd, Wqk, gam; scratch NaN-poisoned first) against an fp64
prep (torch float64, T = (I + A)⁻¹ by a triangular solve) and against the old kernel's; then the
Hopper state pass gdr_tma (cuda/sm90a/gdr_tma.cu) fed by it, its bf16 output against a per-token
fp64 recurrence (NaN/inf never passes); the variant's planted control (moss_ctl_enc_: T's lower-left
block zero) through the same state pass must be far off. CUDA-event medians of 20 of the prep alone,
two rounds, variants interleaved. Prints a table last; exit status 1 if any check fails.

    python3 bench/gdrprep4_bench.py TMA_CUBIN OUT.json NAME=CUBIN=SMEM_BYTES[=KERNEL=THREADS]...   (the first is the reference "old")
"""
import ctypes
import json
import math
import os
import sys

import torch

TMA, OUTJ = sys.argv[1], sys.argv[2]
VARS = [a.split("=") for a in sys.argv[3:]]
HK, HV, D, GC = 16, 32, 128, 64
C = 2 * HK * D + HV * D
TMA_BYTES, THREADS = 201776, 288
BOUND, CONTROL_MIN = 4e-3, 2e-2
PREP_BOUND = {"U0": 1e-5, "Wk": 1e-5, "Kd": 1e-5, "Wqk": 1e-5, "gam": 1e-6}  # old tc3: 2.2e-6 2.5e-6 5.6e-7 3.8e-7 5.7e-8

torch.zeros(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")
cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
cu.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                                      ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]


def ok(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def load(path):
    m = ctypes.c_void_p()
    ok(cu.cuModuleLoad(ctypes.byref(m), path.encode()), f"cuModuleLoad {path}")
    return m


def func(mod, name, smem):
    f = ctypes.c_void_p()
    ok(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), f"cuModuleGetFunction {name}")
    ok(cu.cuFuncSetAttribute(f, 8, smem), f"max dynamic smem {name}")
    return f


FN = {}
mt = load(TMA)
FN["tma"] = (func(mt, "moss_enc_gdr_tma_bf16", TMA_BYTES), TMA_BYTES, THREADS)
for var in VARS:  # NAME=CUBIN=SMEM[=KERNEL=THREADS]: KERNEL (gdr_prep_tc3_bf16) with THREADS (256) a block, 256 a head
    name, path, smem = var[:3]
    kern, thr = (var[3], int(var[4])) if len(var) > 3 else ("gdr_prep_tc3_bf16", 256)
    m = load(path)
    for pfx in ["moss_enc", "moss_ctl_enc"]:
        FN[f"{pfx} {name}"] = (func(m, f"{pfx}_{kern}", int(smem)), int(smem), thr)
NAMES = [v[0] for v in VARS]


class TMap:
    """2-D map: cols x rows of bf16 (9) / f32 (7) at ptr, row stride ld elements, box {bx, by},
    128-byte swizzle (3), L2 promotion 256B (3), zeros past the edges."""

    def __init__(self, ptr, ty, cols, rows, ld, bx, by):
        es = 2 if ty == 9 else 4
        self.buf = ctypes.create_string_buffer(256)
        self.addr = (ctypes.addressof(self.buf) + 127) & ~127
        ok(cu.cuTensorMapEncodeTiled(self.addr, ty, 2, ctypes.c_void_p(ptr), (ctypes.c_uint64 * 2)(cols, rows),
                                     (ctypes.c_uint64 * 1)(ld * es), (ctypes.c_uint32 * 2)(bx, by),
                                     (ctypes.c_uint32 * 2)(1, 1), 0, 3, 3, 0), "cuTensorMapEncodeTiled")


def launcher(name, grid, vals, maps=()):
    f, smem, thr = FN[name]
    ptrs = [m.addr for m in maps] + [ctypes.addressof(x) for x in vals]
    args = (ctypes.c_void_p * len(ptrs))(*ptrs)

    def go():
        _keep = (maps, vals)
        ok(cu.cuLaunchKernel(f, grid, 1, 1, thr, 1, 1, smem, torch.cuda.current_stream().cuda_stream, args, None), f"launch {name}")
    return go


P = lambda t, off=0: ctypes.c_uint64(t.data_ptr() + off)  # noqa: E731
I = ctypes.c_int32  # noqa: E741
LL = ctypes.c_int64


def setup(L):
    torch.manual_seed(L)
    qkv = torch.randn(L, C, device="cuda").to(torch.bfloat16)
    g = -torch.exp(torch.randn(L, HV, device="cuda") - 2.5)
    beta = torch.sigmoid(1.5 * torch.randn(L, HV, device="cuda"))
    nc = (L + GC - 1) // GC
    nb = nc * HV
    f = lambda n: torch.empty(n, device="cuda", dtype=torch.float32)  # noqa: E731
    return dict(L=L, qkv=qkv, g=g, beta=beta, nc=nc, nb=nb, out=torch.empty(L, HV, D, device="cuda", dtype=torch.bfloat16),
                kd=f(nb * GC * D), wk=f(nb * GC * D), u0=f(nb * GC * D), wqk=f(nb * GC * GC), gam=f(nb * GC))


def prep(s, name, pfx="moss_enc"):
    L, q = s["L"], s["qkv"]
    dims = [I(L), I(HK), I(HV), I(D), I(D)]
    return launcher(f"{pfx} {name}", s["nb"] * 256 // FN[f"{pfx} {name}"][2], [P(s["kd"]), P(s["wk"]), P(s["u0"]), P(s["wqk"]), P(s["gam"]), P(q),
                                               P(q, HK * D * 2), P(q, 2 * HK * D * 2), P(s["g"]), P(s["beta"])] + dims + [LL(C), LL(C)])


def state(s):
    L, nb, q = s["L"], s["nb"], s["qkv"]
    dims = [I(L), I(HK), I(HV), I(D), I(D)]
    r = GC // 2
    maps = [TMap(q.data_ptr(), 9, HK * D, L, C, 64, r), TMap(s["wk"].data_ptr(), 7, D, nb * GC, D, 32, r),
            TMap(s["kd"].data_ptr(), 7, D, nb * GC, D, 32, r), TMap(s["u0"].data_ptr(), 7, D, nb * GC, D, 32, GC),
            TMap(s["wqk"].data_ptr(), 7, GC, nb * GC, GC, 32, r)]
    return launcher("tma", 4 * HV, [P(s["out"]), P(s["gam"])] + dims, maps)


def reference(s):
    L = s["L"]
    x = s["qkv"].double()
    q = x[:, :HK * D].reshape(L, HK, D)
    k = x[:, HK * D:2 * HK * D].reshape(L, HK, D)
    v = x[:, 2 * HK * D:].reshape(L, HV, D)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(D)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    rep = HV // HK
    q, k = q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)
    g, beta = s["g"].double().exp(), s["beta"].double()
    S = torch.zeros(HV, D, D, device="cuda", dtype=torch.float64)
    out = torch.empty(L, HV, D, device="cuda", dtype=torch.float64)
    for t in range(L):
        S *= g[t][:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("ha,hab->hb", k[t], S))
        S += k[t][:, :, None] * u[:, None, :]
        out[t] = torch.einsum("ha,hab->hb", q[t], S)
    return out


def prep_reference(s):
    """The prep's scratch in fp64 (blk = chunk·Hv + head): U0, Wk, Kd [nb][64][128], Wqk [nb][64][64],
    gam [nb][64]; rows past L as the kernel has them (q k v, g, β zero)."""
    L, nc, nb = s["L"], s["nc"], s["nb"]
    Lp = nc * GC
    x = torch.zeros(Lp, C, device="cuda", dtype=torch.float64)
    x[:L] = s["qkv"].double()
    gg = torch.zeros(Lp, HV, device="cuda", dtype=torch.float64)
    bb = torch.zeros(Lp, HV, device="cuda", dtype=torch.float64)
    gg[:L], bb[:L] = s["g"].double(), s["beta"].double()
    q = x[:, :HK * D].reshape(Lp, HK, D)
    k = x[:, HK * D:2 * HK * D].reshape(Lp, HK, D)
    v = x[:, 2 * HK * D:].reshape(Lp, HV, D)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(D)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    rep = HV // HK
    blocks = lambda t: t.repeat_interleave(rep, 1) if t.shape[1] == HK else t  # noqa: E731
    per = lambda t: blocks(t).reshape(nc, GC, HV, -1).permute(0, 2, 1, 3).reshape(nb, GC, -1)  # noqa: E731
    q, k, v = per(q), per(k), per(v)
    g = gg.reshape(nc, GC, HV).permute(0, 2, 1).reshape(nb, GC)
    beta = bb.reshape(nc, GC, HV).permute(0, 2, 1).reshape(nb, GC)
    gam = g.cumsum(-1)
    dec = torch.exp(gam[:, :, None] - gam[:, None, :])
    ii = torch.arange(GC, device="cuda")
    low, lowd = (ii[:, None] > ii[None, :]).double(), (ii[:, None] >= ii[None, :]).double()
    A = beta[:, :, None] * (k @ k.transpose(1, 2)) * dec * low
    eye = torch.eye(GC, device="cuda", dtype=torch.float64).expand(nb, GC, GC)
    T = torch.linalg.solve_triangular(eye + A, eye.contiguous(), upper=False, unitriangular=True)
    return dict(U0=T @ (beta[:, :, None] * v), Wk=T @ ((beta * gam.exp())[:, :, None] * k),
                Kd=torch.exp(gam[:, -1:] - gam)[:, :, None] * k, Wqk=(q @ k.transpose(1, 2)) * dec * lowd, gam=gam)


def rel(a, ref):
    a = a.double().reshape(-1)
    ref = ref.double().reshape(-1)
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).norm() / ref.norm()).item()


def outputs(s):
    return dict(U0=s["u0"].clone(), Wk=s["wk"].clone(), Kd=s["kd"].clone(), Wqk=s["wqk"].clone(), gam=s["gam"].clone())


def poison(s):
    for key in ("kd", "wk", "u0", "wqk", "gam", "out"):
        s[key].fill_(float("nan"))


def time_prep(fn, reps=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    return sorted(ts)[len(ts) // 2]


if os.environ.get("GDR_NCU"):  # a few launches of each prep for ncu, nothing checked
    s = setup(4096)
    for name in NAMES:
        for _ in range(2):
            prep(s, name)()
    torch.cuda.synchronize()
    sys.exit(0)

res = []
bad = []
for L in [int(x) for x in os.environ.get("GDR_L", "128 4096 200").split()]:
    s = setup(L)
    ref = reference(s)
    pref = prep_reference(s)
    row = {"L": L}
    old = None
    for name in NAMES:
        poison(s)
        prep(s, name)()
        torch.cuda.synchronize()
        o = outputs(s)
        if old is None:
            old = o
        for f in pref:
            row[f"{name} {f} vs fp64"] = rel(o[f], pref[f])
            row[f"{name} {f} vs old"] = rel(o[f], old[f])
        state(s)()
        torch.cuda.synchronize()
        row[f"{name} out relL2"] = rel(s["out"], ref)
        poison(s)
        prep(s, name, "moss_ctl_enc")()
        state(s)()
        torch.cuda.synchronize()
        row[f"{name} control relL2"] = rel(s["out"], ref)
    for rnd in (1, 2):
        for name in (NAMES if rnd == 1 else NAMES[::-1]):
            row[f"{name} ms {rnd}"] = time_prep(prep(s, name))
    # after timing: the last run's outputs still right (state pass fed by the last variant timed)
    state(s)()
    torch.cuda.synchronize()
    row[f"{NAMES[0]} out relL2 after timing"] = rel(s["out"], ref)
    for name in NAMES:
        good = (row[f"{name} out relL2"] < BOUND and row[f"{name} control relL2"] > CONTROL_MIN
                and all(row[f"{name} {f} vs fp64"] < b for f, b in PREP_BOUND.items()))
        row[f"{name} ok"] = good
        if not good:
            bad.append((L, name))
    res.append(row)
    print(json.dumps(row), flush=True)
    del s, ref, pref, old
    torch.cuda.empty_cache()
json.dump(res, open(OUTJ, "w"), indent=1)
print()
print("| L | prep | ms (round 1 / 2) | vs old | U0 / Wk / Kd / Wqk / gam rel L2 vs fp64 | max rel vs old | out rel L2 (tma) | control | verdict |")
print("|---|---|---|---|---|---|---|---|---|")
for r in res:
    o = min(r[f"{NAMES[0]} ms 1"], r[f"{NAMES[0]} ms 2"])
    for name in NAMES:
        t = min(r[f"{name} ms 1"], r[f"{name} ms 2"])
        fp = " / ".join(f"{r[f'{name} {f} vs fp64']:.2e}" for f in PREP_BOUND)
        vo = max(r[f"{name} {f} vs old"] for f in PREP_BOUND)
        print(f"| {r['L']} | {name} | {r[f'{name} ms 1']:.4f} / {r[f'{name} ms 2']:.4f} | {o / t:.2f}x | {fp} | {vo:.1e} | "
              f"{r[f'{name} out relL2']:.2e} | {r[f'{name} control relL2']:.2e} | {'ok' if r[f'{name} ok'] else 'FAIL'} |")
print("FAILED: " + str(bad) if bad else "all checks passed")
sys.exit(1 if bad else 0)
