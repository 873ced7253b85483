"""The delta rule's fused state pass + output alone: fused2c (cuda/sm90a/gdr_fused.cu, the default on
Hopper) against tma2 (cuda/sm90a/gdr_tma.cu: the tiles by TMA tensor copies), both after the default
prep (gdr_prep_tc3), at the real shapes (Hk 16, Hv 32, dk = dv = 128; q k v strided out of one
[L, 8192] bf16 conv output), L = 128, 4096 and 200 (partial last chunk).

Loads the cubins through the CUDA driver API (ctypes; torch owns the context and the stream; the
tensor maps are encoded here with cuTensorMapEncodeTiled as src/backend/cuda/encoder.rs does).
Output NaN-poisoned before each checked run; relative L2 of the bf16 output against a per-token fp64
recurrence (NaN/inf never passes); the planted controls (state read undecayed) must be far off;
CUDA-event medians of 20 per kernel. Prints a table last.

    python3 bench/gdrtma_bench.py GDR_CUBIN(sm_90: cuda/gdr.cu) TMA_CUBIN(sm_90a: cuda/sm90a/gdr_tma.cu) [OUT.json]
"""
import ctypes
import json
import math
import os
import sys

import torch

GDR, TMA = sys.argv[1], sys.argv[2]
HK, HV, D, GC = 16, 32, 128, 64
C = 2 * HK * D + HV * D
PREP3_BYTES = 2 * 64 * 136 * 2 + 2 * 64 * 72 * 4 + 8 * 64 * 4
FUSED_BYTES, TMA_BYTES, THREADS = 210736, 201776, 288
BOUND, CONTROL_MIN = 4e-3, 2e-2

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


mg, mt = load(GDR), load(TMA)
VARIANTS = ["fused2c", "tma2", "tma2p", "tma1", "tma2x", "tma2y"]  # tma2x: added after the helper's call; tma2y: CTA-scope barriers
# GDR_VARIANTS="tma2 tma2x" / GDR_L="4096": a subset (e.g. one kernel under ncu); fused2c stays first
if os.environ.get("GDR_VARIANTS"):
    VARIANTS = ["fused2c"] + [v for v in os.environ["GDR_VARIANTS"].split() if v != "fused2c"]
FN = {"prep": (func(mg, "moss_enc_gdr_prep_tc3_bf16", PREP3_BYTES), PREP3_BYTES, 256)}
for pfx in ["moss_enc", "moss_ctl_enc"]:
    FN[f"{pfx} fused2c"] = (func(mt, f"{pfx}_gdr_fused2c_bf16", FUSED_BYTES), FUSED_BYTES, THREADS)
    for v in VARIANTS[1:]:
        FN[f"{pfx} {v}"] = (func(mt, f"{pfx}_gdr_{v}_bf16", TMA_BYTES), TMA_BYTES, THREADS)


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


def steps(s, variant, pfx="moss_enc"):
    L, nb, q = s["L"], s["nb"], s["qkv"]
    dims = [I(L), I(HK), I(HV), I(D), I(D)]
    prep = launcher("prep", nb, [P(s["kd"]), P(s["wk"]), P(s["u0"]), P(s["wqk"]), P(s["gam"]), P(q), P(q, HK * D * 2),
                                 P(q, 2 * HK * D * 2), P(s["g"]), P(s["beta"])] + dims + [LL(C), LL(C)])
    if variant == "fused2c":
        st = launcher(f"{pfx} fused2c", 4 * HV, [P(s["out"]), P(q), P(s["wk"]), P(s["kd"]), P(s["u0"]), P(s["wqk"]), P(s["gam"])] + dims + [LL(C)])
    else:
        r = GC // 2 if variant.startswith("tma2") else GC
        maps = [TMap(q.data_ptr(), 9, HK * D, L, C, 64, r), TMap(s["wk"].data_ptr(), 7, D, nb * GC, D, 32, r),
                TMap(s["kd"].data_ptr(), 7, D, nb * GC, D, 32, r), TMap(s["u0"].data_ptr(), 7, D, nb * GC, D, 32, GC),
                TMap(s["wqk"].data_ptr(), 7, GC, nb * GC, GC, 32, r)]
        st = launcher(f"{pfx} {variant}", 4 * HV, [P(s["out"]), P(s["gam"])] + dims, maps)
    return [("prep", prep), ("state", st)]


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


def rel(a, ref):
    a = a.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).norm() / ref.norm()).item()


def timed(st, reps=20):
    for _ in range(3):
        for _, fn in st:
            fn()
    per = {n: [] for n, _ in st}
    for _ in range(reps):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(st) + 1)]
        ev[0].record()
        for i, (_, fn) in enumerate(st):
            fn()
            ev[i + 1].record()
        torch.cuda.synchronize()
        for i, (n, _) in enumerate(st):
            per[n].append(ev[i].elapsed_time(ev[i + 1]))
    return {n: sorted(v)[len(v) // 2] for n, v in per.items()}


def overlap():
    """GDR_OVERLAP=1: how much of the delta rule (prep + tma2x at L tokens, stream B) and of a
    silu*mul row op hide under a cuBLAS GEMM (torch.matmul, stream A) when both run at once:
    each alone, then together (start and end events on the default stream, both streams joined)."""
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    dr = {L: steps(setup(L), "tma2x") for L in (4096, 2048)}
    x = {m: torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16) for m in (4096, 2048)}
    w = {n: torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16) * 0.02 for n in (4096, 16448, 24576)}
    big = torch.randn(4096, 24576, device="cuda", dtype=torch.bfloat16)
    gemm = lambda m, n, k=1: (lambda: [x[m] @ w[n].t() for _ in range(k)])  # noqa: E731
    drf = lambda L: (lambda: [fn() for _, fn in dr[L]])  # noqa: E731
    silu = lambda: torch.nn.functional.silu(big[:, :12288]) * big[:, 12288:]  # noqa: E731
    def run(fa, fb, reps=15):
        ts = []
        for i in range(reps + 3):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for s_, f_ in ((sa, fa), (sb, fb)):
                if f_ is None:
                    continue
                s_.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s_):
                    f_()
                torch.cuda.current_stream().wait_stream(s_)
            e1.record()
            torch.cuda.synchronize()
            if i >= 3:
                ts.append(e0.elapsed_time(e1))
        return sorted(ts)[len(ts) // 2]
    cases = [("z GEMM 4096x4096x4096", gemm(4096, 4096), "delta rule L=4096", drf(4096)),
             ("in_proj GEMM 2048x16448x4096", gemm(2048, 16448), "delta rule L=2048", drf(2048)),
             ("gate|up GEMM 4096x24576x4096", gemm(4096, 24576), "delta rule L=4096", drf(4096)),
             ("gate|up GEMM 4096x24576x4096", gemm(4096, 24576), "silu*mul 4096x12288", silu),
             ("3x gate|up GEMM", gemm(4096, 24576, 3), "delta rule L=4096", drf(4096))]
    print("| A (stream 1) | B (stream 2) | A alone ms | B alone ms | sum | together | hidden (sum - together) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for na, fa, nb_, fb in cases:
        ta, tb, tt = run(fa, None), run(None, fb), run(fa, fb)
        ta2 = run(fa, None)
        print(f"| {na} | {nb_} | {ta:.3f} ({ta2:.3f}) | {tb:.3f} | {ta + tb:.3f} | {tt:.3f} | {ta + tb - tt:.3f} ({(ta + tb - tt) / tb * 100:.0f} % of B) |", flush=True)


if os.environ.get("GDR_OVERLAP"):
    overlap()
    sys.exit(0)

res = []
for L in [int(x) for x in os.environ.get("GDR_L", "128 4096 200").split()]:
    s = setup(L)
    ref = reference(s)
    row = {"L": L}
    for v in VARIANTS:
        for pfx in ["moss_enc", "moss_ctl_enc"]:
            key = v if pfx == "moss_enc" else v + " control"
            st = steps(s, v, pfx)
            s["out"].fill_(float("nan"))
            for _, fn in st:
                fn()
            torch.cuda.synchronize()
            row[key + " relL2"] = rel(s["out"], ref)
        st = steps(s, v)
        per = timed(st)
        row[v + " prep ms"], row[v + " state ms"] = per["prep"], per["state"]
        row[v + " relL2 after timing"] = rel(s["out"], ref)
    # alternate once more (order effects)
    for v in VARIANTS:
        row[v + " state ms (2nd)"] = timed(steps(s, v))["state"]
    res.append(row)
    print(json.dumps(row), flush=True)
    del s, ref
    torch.cuda.empty_cache()
if len(sys.argv) > 3:
    json.dump(res, open(sys.argv[3], "w"), indent=1)
bad = 0
print()
print("| L | prep_tc3 ms | variant | state pass ms (2nd run) | vs fused2c | rel L2 vs fp64 (after timing) | control | verdict |")
print("|---|---|---|---|---|---|---|---|")
for r in res:
    for v in VARIANTS:
        good = r[v + " relL2"] < BOUND and r[v + " relL2 after timing"] < BOUND and r[v + " control relL2"] > CONTROL_MIN
        bad += not good
        print(f"| {r['L']} | {r[v + ' prep ms']:.4f} | {v} | {r[v + ' state ms']:.4f} ({r[v + ' state ms (2nd)']:.4f}) | "
              f"{r['fused2c state ms'] / r[v + ' state ms']:.2f}x | {r[v + ' relL2']:.2e} ({r[v + ' relL2 after timing']:.2e}) | "
              f"{r[v + ' control relL2']:.2e} | {'ok' if good else 'FAIL'} |")
sys.exit(1 if bad else 0)
