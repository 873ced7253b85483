"""The encoder's gated delta rule alone (cuda/gdr.cu): the default TF32 kernels (prep_tc, seq_tc,
out_tc) against MOSS_GDR=v2 (prep2, seq2, out2, cuda/gdr_v2.cuh) at the real shapes (Hk = 16,
Hv = 32, dk = dv = 128, q k v read strided out of one [L, 8192] bf16 conv output), L = 4096 and
128. Loads the kernels from a cubin through CuPy; CUDA-event medians per kernel and for the three
together; relative L2 of each output (bf16) against a per-token fp64 recurrence in torch, and the
planted control (v2 out with the state read undecayed, must be far off).
MOSS_GDR_PREP=tc3 (cuda/gdr_prep3.cuh): its prep with seq_tc / out_tc, its control (prep with T's
lower-left block zero), and the prep's scratch (U0, Wk, Kd, Wqk, gam) of prep_tc and prep_tc3 each
against an fp64 prep in torch.

    python3 bench/gdr_bench.py CUBIN [OUT.json]
    python3 bench/gdr_bench.py CUBIN --ncu       (only prep_tc, prep_tc3, prep_tc, prep_tc3 at L = 4096)
"""
import json
import math
import sys

import cupy
import torch

cubin = sys.argv[1]
mod = cupy.RawModule(path=cubin)
HK, HV, D, GC = 16, 32, 128, 64
C = 2 * HK * D + HV * D
# dynamic shared memory (floats) as in src/backend/cuda/encoder.rs
PREP = 2 * 64 * 132 + 64 * 68 + 4 * 64
SEQ_TC = 2 * (64 * 132 + 64 * 136 + 64 * 36) + 128 * 40 + 64 * 40
OUT_TC = 64 * 132 + 128 * 72 + 64 * 68 + 64 * 72 + 64
PREP2 = 2 * 64 * 132 + 2 * 64 * 68 + 4 * 64
SEQ2 = 2 * (128 * 132 + 128 * 36) + 2 * 128 * 40
OUT2 = 64 * 132 + 128 * 72 + 64
PREP3 = (2 * 64 * 136 * 2 + 2 * 64 * 72 * 4 + 8 * 64 * 4) // 4
K = {}
for n, f in [("moss_enc_gdr_prep_tc_bf16", PREP), ("moss_enc_gdr_seq_tc", SEQ_TC), ("moss_enc_gdr_out_tc_bf16", OUT_TC),
             ("moss_enc_gdr_prep2_bf16", PREP2), ("moss_enc_gdr_seq2", SEQ2), ("moss_enc_gdr_out2_bf16", OUT2),
             ("moss_ctl_enc_gdr_out2_bf16", OUT2), ("moss_enc_gdr_seq2_plain", SEQ2),
             ("moss_enc_gdr_prep_tc2_bf16", PREP), ("moss_enc_gdr_out_tc2_bf16", OUT_TC),
             ("moss_enc_gdr_prep_tc3_bf16", PREP3), ("moss_ctl_enc_gdr_prep_tc3_bf16", PREP3),
             ("moss_bench_hi_gdr_prep_tc3_bf16", PREP3)]:
    try:
        K[n] = (mod.get_function(n), f * 4)
    except Exception:  # seq2_plain: only with -DGDR_BENCH_VARIANTS; tc2: not in older cubins
        continue
    K[n][0].max_dynamic_shared_size_bytes = f * 4


def P(t, off=0):
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t)
    return cupy.ndarray((1,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, off))


def launch(name, grid, args):
    """A launcher with its arguments built once (host overhead stays out of the timed loop)."""
    f, sm = K[name]
    return lambda: f(grid, (256,), args, shared_mem=sm)


i32, i64 = cupy.int32, cupy.int64


def setup(L):
    torch.manual_seed(L)
    qkv = torch.randn(L, C, device="cuda").to(torch.bfloat16)
    g = -torch.exp(torch.randn(L, HV, device="cuda") - 2.5)
    beta = torch.sigmoid(1.5 * torch.randn(L, HV, device="cuda"))
    nc = (L + GC - 1) // GC
    nb = nc * HV
    f = lambda n: torch.empty(n, device="cuda", dtype=torch.float32)  # noqa: E731
    s = dict(L=L, qkv=qkv, g=g, beta=beta, nc=nc, nb=nb, out=torch.empty(L, HV, D, device="cuda", dtype=torch.bfloat16))
    s["old"] = dict(kd=f(nb * GC * D), wk=f(nb * GC * D), u0=f(nb * GC * D), u=f(nb * GC * D), S=f(nb * D * D),
                    wqk=f(nb * GC * GC), gam=f(nb * GC))
    s["v2"] = dict(N=f(nb * D * D), B=f(nb * D * D), S=f(nb * D * D), P=f(nb * GC * D), Ou=f(nb * GC * D), gam=f(nb * GC))
    return s


def qkv_args(s):
    q = s["qkv"]
    return P(q, 0), P(q, HK * D * 2), P(q, 2 * HK * D * 2)


def dims(s):
    return (i32(s["L"]), i32(HK), i32(HV), i32(D), i32(D), i64(C))


def old_steps(s, sx="tc", prep=None):
    """sx = "tc" (the default kernels) or "tc2" (MOSS_GDR=tc2: batched row loads); prep: another
    prep kernel (tc3) with the tc seq / out."""
    o, (q, k, v) = s["old"], qkv_args(s)
    nb, nc = s["nb"], s["nc"]
    return [
        ("prep_tc", launch(prep or f"moss_enc_gdr_prep_{sx}_bf16", (nb,), (P(o["kd"]), P(o["wk"]), P(o["u0"]), P(o["wqk"]), P(o["gam"]), q, k, v, P(s["g"]), P(s["beta"])) + dims(s) + (i64(C),))),
        ("seq_tc", launch("moss_enc_gdr_seq_tc", (HV * 4,), (P(o["S"]), P(o["u"]), P(o["wk"]), P(o["kd"]), P(o["u0"]), P(o["gam"]), i32(nc), i32(HV), i32(4)))),
        ("out_tc", launch(f"moss_enc_gdr_out_{sx}_bf16", (nb, 2), (P(s["out"]), q, P(o["S"]), P(o["u"]), P(o["wqk"]), P(o["gam"])) + dims(s) + (i64(C),))),
    ]


def v2_steps(s, out_kernel="moss_enc_gdr_out2_bf16", seq_kernel="moss_enc_gdr_seq2"):
    o, (q, k, v) = s["v2"], qkv_args(s)
    nb, nc = s["nb"], s["nc"]
    return [
        ("prep2", launch("moss_enc_gdr_prep2_bf16", (nb,), (P(o["N"]), P(o["B"]), P(o["P"]), P(o["Ou"]), P(o["gam"]), q, k, v, P(s["g"]), P(s["beta"])) + dims(s) + (i64(C),))),
        ("seq2", launch(seq_kernel, (HV * 4,), (P(o["S"]), P(o["N"]), P(o["B"]), P(o["gam"]), i32(nc), i32(HV), i32(4)))),
        ("out2", launch(out_kernel, (nb, 2), (P(s["out"]), q, P(o["S"]), P(o["P"]), P(o["Ou"]), P(o["gam"])) + dims(s))),
    ]


def reference(s):
    """Per-token recurrence in fp64 (the CPU twin's algebra): o_t = q̂_t S_t, S_t = e^{g_t} S_{t-1} + k̂_t u_tᵀ."""
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
    """The prep's scratch in fp64 (blk = chunk·Hv + head): U0, Wk, Kd [nb][64][128], Wqk [nb][64][64], gam [nb][64]."""
    L, nc, nb = s["L"], s["nc"], s["nb"]
    assert L % GC == 0
    x = s["qkv"].double()
    q = x[:, :HK * D].reshape(L, HK, D)
    k = x[:, HK * D:2 * HK * D].reshape(L, HK, D)
    v = x[:, 2 * HK * D:].reshape(L, HV, D)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(D)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    rep = HV // HK
    blocks = lambda t: t.repeat_interleave(rep, 1) if t.shape[1] == HK else t  # noqa: E731
    per = lambda t: blocks(t).reshape(nc, GC, HV, -1).permute(0, 2, 1, 3).reshape(nb, GC, -1)  # noqa: E731
    q, k, v = per(q), per(k), per(v)
    g = s["g"].double().reshape(nc, GC, HV).permute(0, 2, 1).reshape(nb, GC)
    beta = s["beta"].double().reshape(nc, GC, HV).permute(0, 2, 1).reshape(nb, GC)
    gam = g.cumsum(-1)
    dec = torch.exp(gam[:, :, None] - gam[:, None, :])
    ii = torch.arange(GC, device="cuda")
    low, lowd = (ii[:, None] > ii[None, :]).double(), (ii[:, None] >= ii[None, :]).double()
    A = beta[:, :, None] * (k @ k.transpose(1, 2)) * dec * low
    eye = torch.eye(GC, device="cuda", dtype=torch.float64).expand(nb, GC, GC)
    T = torch.linalg.solve_triangular(eye + A, eye.contiguous(), upper=False, unitriangular=True)
    return dict(U0=T @ (beta[:, :, None] * v), Wk=T @ ((beta * gam.exp())[:, :, None] * k),
                Kd=torch.exp(gam[:, -1:] - gam)[:, :, None] * k, Wqk=(q @ k.transpose(1, 2)) * dec * lowd, gam=gam)


def prep_errors(s, pref, name):
    """Run prep kernel `name` once on fresh NaN-poisoned scratch; rel L2 of each output vs pref."""
    o = s["old"]
    for t in o.values():
        t.fill_(float("nan"))
    launch_prep = old_steps(s, prep=name)[0][1]
    launch_prep()
    torch.cuda.synchronize()
    got = dict(U0=o["u0"], Wk=o["wk"], Kd=o["kd"], Wqk=o["wqk"], gam=o["gam"])
    return {f: rel(got[f].view(-1), pref[f].reshape(-1)) for f in pref}


def rel(a, ref):
    a = a.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).norm() / ref.norm()).item()


def timed(steps, reps=20):
    for _ in range(3):
        for _, fn in steps:
            fn()
    per = {n: [] for n, _ in steps}
    tot = []
    for _ in range(reps):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(steps) + 1)]
        ev[0].record()
        for i, (_, fn) in enumerate(steps):
            fn()
            ev[i + 1].record()
        torch.cuda.synchronize()
        for i, (n, _) in enumerate(steps):
            per[n].append(ev[i].elapsed_time(ev[i + 1]))
        tot.append(ev[0].elapsed_time(ev[-1]))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {n: med(v) for n, v in per.items()}, med(tot)


if len(sys.argv) > 2 and sys.argv[2] == "--ncu":  # for `ncu -k regex:gdr_prep`: prep_tc, prep_tc3, twice, L = 4096
    s = setup(4096)
    for _ in range(2):
        for kn in ["moss_enc_gdr_prep_tc_bf16", "moss_enc_gdr_prep_tc3_bf16"]:
            old_steps(s, prep=kn)[0][1]()
    torch.cuda.synchronize()
    sys.exit(0)

res = []
for L in [128, 4096]:
    s = setup(L)
    ref = reference(s)
    row = {"L": L}
    variants = [("tc", old_steps(s)), ("v2", v2_steps(s)), ("v2 control", v2_steps(s, "moss_ctl_enc_gdr_out2_bf16"))]
    if "moss_enc_gdr_prep_tc3_bf16" in K:
        variants += [("tc3", old_steps(s, prep="moss_enc_gdr_prep_tc3_bf16")),
                     ("tc3 control", old_steps(s, prep="moss_ctl_enc_gdr_prep_tc3_bf16"))]
        if "moss_bench_hi_gdr_prep_tc3_bf16" in K:  # -DGDR_BENCH_VARIANTS: T' as bf16 hi only
            variants.append(("tc3 hi only", old_steps(s, prep="moss_bench_hi_gdr_prep_tc3_bf16")))
        pref = prep_reference(s)
        preps = [("tc", "moss_enc_gdr_prep_tc_bf16"), ("tc3", "moss_enc_gdr_prep_tc3_bf16")]
        if "moss_bench_hi_gdr_prep_tc3_bf16" in K:
            preps.append(("tc3 hi only", "moss_bench_hi_gdr_prep_tc3_bf16"))
        for nm, kn in preps:
            row.update({f"{nm} prep scratch relL2 {f}": e for f, e in prep_errors(s, pref, kn).items()})
        del pref
    if "moss_enc_gdr_prep_tc2_bf16" in K:
        variants.append(("tc2", old_steps(s, "tc2")))
    if "moss_enc_gdr_seq2_plain" in K:
        variants.append(("v2 plain seq", v2_steps(s, seq_kernel="moss_enc_gdr_seq2_plain")))
    for name, steps in variants:
        s["out"].fill_(float("nan"))
        for _, fn in steps:
            fn()
        torch.cuda.synchronize()
        row[f"{name} relL2"] = rel(s["out"], ref)
        if "control" not in name:
            per, tot = timed(steps)
            row[f"{name} ms"] = tot
            row.update({f"{name} {k} ms": v for k, v in per.items()})
            # the output of the timed runs must still be the same
            row[f"{name} relL2 after timing"] = rel(s["out"], ref)
    res.append(row)
    print(json.dumps(row), flush=True)
    del s, ref
    torch.cuda.empty_cache()
if len(sys.argv) > 2:
    json.dump(res, open(sys.argv[2], "w"), indent=1)
print()
print("| L | tc prep / seq / out ms | tc total ms | v2 prep2 / seq2 / out2 ms | v2 total ms | speedup | rel L2 vs fp64: tc / v2 / v2 control |")
print("|---|---|---|---|---|---|---|")
for r in res:
    print(f"| {r['L']} | {r['tc prep_tc ms']:.3f} / {r['tc seq_tc ms']:.3f} / {r['tc out_tc ms']:.3f} | {r['tc ms']:.3f} | "
          f"{r['v2 prep2 ms']:.3f} / {r['v2 seq2 ms']:.3f} / {r['v2 out2 ms']:.3f} | {r['v2 ms']:.3f} | {r['tc ms'] / r['v2 ms']:.2f}x | "
          f"{r['tc relL2']:.2e} / {r['v2 relL2']:.2e} / {r['v2 control relL2']:.2e} |")
for r in res:
    if "tc2 ms" in r:
        print(f"L={r['L']}: tc2 (batched row loads) prep / seq / out {r['tc2 prep_tc ms']:.3f} / {r['tc2 seq_tc ms']:.3f} / "
              f"{r['tc2 out_tc ms']:.3f} ms, total {r['tc2 ms']:.3f} ms ({r['tc ms'] / r['tc2 ms']:.2f}x tc), rel L2 {r['tc2 relL2']:.2e}")
    if "v2 plain seq ms" in r:
        print(f"L={r['L']}: v2 with the scalar-load seq2 (plain): seq2 {r['v2 plain seq seq2 ms']:.3f} ms, total {r['v2 plain seq ms']:.3f} ms, rel L2 {r['v2 plain seq relL2']:.2e}")

print()
print("| L | prep_tc ms | prep_tc3 ms | prep speedup | tc total ms | tc3 total ms | out rel L2 tc / tc3 / tc3 control | tc3 after timing |")
print("|---|---|---|---|---|---|---|---|")
for r in res:
    if "tc3 ms" in r:
        print(f"| {r['L']} | {r['tc prep_tc ms']:.4f} | {r['tc3 prep_tc ms']:.4f} | {r['tc prep_tc ms'] / r['tc3 prep_tc ms']:.2f}x | "
              f"{r['tc ms']:.4f} | {r['tc3 ms']:.4f} | {r['tc relL2']:.3e} / {r['tc3 relL2']:.3e} / {r['tc3 control relL2']:.3e} | "
              f"{r['tc3 relL2 after timing']:.3e} |")
    if "tc3 hi only ms" in r:
        print(f"L={r['L']}: tc3 with T' as bf16 hi only (no lo products): prep {r['tc3 hi only prep_tc ms']:.4f} ms, out rel L2 {r['tc3 hi only relL2']:.3e}")
print()
print("| L | prep | U0 | Wk | Kd | Wqk | gam |  (scratch rel L2 vs an fp64 prep)")
print("|---|---|---|---|---|---|---|")
for r in res:
    for nm in ["tc", "tc3", "tc3 hi only"]:
        if f"{nm} prep scratch relL2 U0" in r:
            print(f"| {r['L']} | {nm} | " + " | ".join(f"{r[f'{nm} prep scratch relL2 {f}']:.2e}" for f in ["U0", "Wk", "Kd", "Wqk", "gam"]) + " |")
