"""The encoder's gated delta rule alone (cuda/gdr.cu): the default TF32 kernels (prep_tc, seq_tc,
out_tc) against MOSS_GDR=v2 (prep2, seq2, out2, cuda/gdr_v2.cuh) at the real shapes (Hk = 16,
Hv = 32, dk = dv = 128, q k v read strided out of one [L, 8192] bf16 conv output), L = 4096 and
128. Loads the kernels from a cubin through CuPy; CUDA-event medians per kernel and for the three
together; relative L2 of each output (bf16) against a per-token fp64 recurrence in torch, and the
planted control (v2 out with the state read undecayed, must be far off).

    python3 bench/gdr_bench.py CUBIN [OUT.json] [FUSED_CUBIN] [--ncu]

FUSED_CUBIN (cuda/sm90a/gdr_fused.cu built for sm_90a): adds MOSS_GDR_STATE=fused4 / fused2 / fused1
/ fused4c / fused2c (the default prep_tc, then the state pass and the output in one clustered kernel)
and their controls.
--ncu: L = 4096 only, each variant run once, no reference and no timing (for Nsight Compute).
"""
import json
import math
import sys

import cupy
import torch

NCU = "--ncu" in sys.argv
argv = [a for a in sys.argv if a != "--ncu"]
cubin = argv[1]
mod = cupy.RawModule(path=cubin)
fmod = cupy.RawModule(path=argv[3]) if len(argv) > 3 else None
FUSED_BYTES, FUSED_THREADS = 210736, 288
HK, HV, D, GC = 16, 32, 128, 64
C = 2 * HK * D + HV * D
# dynamic shared memory (floats) as in src/backend/cuda/encoder.rs
PREP = 2 * 64 * 132 + 64 * 68 + 4 * 64
SEQ_TC = 2 * (64 * 132 + 64 * 136 + 64 * 36) + 128 * 40 + 64 * 40
OUT_TC = 64 * 132 + 128 * 72 + 64 * 68 + 64 * 72 + 64
PREP2 = 2 * 64 * 132 + 2 * 64 * 68 + 4 * 64
SEQ2 = 2 * (128 * 132 + 128 * 36) + 2 * 128 * 40
OUT2 = 64 * 132 + 128 * 72 + 64
K = {}
for n, f in [("moss_enc_gdr_prep_tc_bf16", PREP), ("moss_enc_gdr_seq_tc", SEQ_TC), ("moss_enc_gdr_out_tc_bf16", OUT_TC),
             ("moss_enc_gdr_prep2_bf16", PREP2), ("moss_enc_gdr_seq2", SEQ2), ("moss_enc_gdr_out2_bf16", OUT2),
             ("moss_ctl_enc_gdr_out2_bf16", OUT2), ("moss_enc_gdr_seq2_plain", SEQ2),
             ("moss_enc_gdr_prep_tc2_bf16", PREP), ("moss_enc_gdr_out_tc2_bf16", OUT_TC)]:
    try:
        K[n] = (mod.get_function(n), f * 4)
    except Exception:  # seq2_plain: only with -DGDR_BENCH_VARIANTS; tc2: not in older cubins
        continue
    K[n][0].max_dynamic_shared_size_bytes = f * 4


if fmod is not None:
    FUSED = []  # variants in the cubin: fused4, fused2, fused1 (measured 2026-12-03), fused4c, fused2c
    for v in ["4", "2", "1", "4c", "2c"]:
        try:
            for pfx in ["moss_enc", "moss_ctl_enc"]:
                n = f"{pfx}_gdr_fused{v}_bf16"
                fn = fmod.get_function(n)
                fn.max_dynamic_shared_size_bytes = FUSED_BYTES
                K[n] = (fn, FUSED_BYTES)
            FUSED.append(v)
        except Exception:  # noqa: BLE001 (older cubins: no fused4c / fused2c)
            continue
    # (ncu 2026-12-03: Max Active Clusters 30 for clusters of 4 (grid: 32 clusters, so two waves), 66 for 2)


def P(t, off=0):
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t)
    return cupy.ndarray((1,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, off))


def launch(name, grid, args, threads=256):
    """A launcher with its arguments built once (host overhead stays out of the timed loop)."""
    f, sm = K[name]
    return lambda: f(grid, (threads,), args, shared_mem=sm)


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


def old_steps(s, sx="tc"):
    """sx = "tc" (the default kernels) or "tc2" (MOSS_GDR=tc2: batched row loads)."""
    o, (q, k, v) = s["old"], qkv_args(s)
    nb, nc = s["nb"], s["nc"]
    return [
        ("prep_tc", launch(f"moss_enc_gdr_prep_{sx}_bf16", (nb,), (P(o["kd"]), P(o["wk"]), P(o["u0"]), P(o["wqk"]), P(o["gam"]), q, k, v, P(s["g"]), P(s["beta"])) + dims(s) + (i64(C),))),
        ("seq_tc", launch("moss_enc_gdr_seq_tc", (HV * 4,), (P(o["S"]), P(o["u"]), P(o["wk"]), P(o["kd"]), P(o["u0"]), P(o["gam"]), i32(nc), i32(HV), i32(4)))),
        ("out_tc", launch(f"moss_enc_gdr_out_{sx}_bf16", (nb, 2), (P(s["out"]), q, P(o["S"]), P(o["u"]), P(o["wqk"]), P(o["gam"])) + dims(s) + (i64(C),))),
    ]


def fused_steps(s, cl, prefix="moss_enc"):
    """MOSS_GDR_STATE=fused{cl}: prep_tc, then gdr_fused (state pass + output, cluster of cl; "4c" /
    "2c": the U0 slice by cp.async)."""
    o, (q, k, v) = s["old"], qkv_args(s)
    nb = s["nb"]
    return [
        ("prep_tc", launch("moss_enc_gdr_prep_tc_bf16", (nb,), (P(o["kd"]), P(o["wk"]), P(o["u0"]), P(o["wqk"]), P(o["gam"]), q, k, v, P(s["g"]), P(s["beta"])) + dims(s) + (i64(C),))),
        ("fused", launch(f"{prefix}_gdr_fused{cl}_bf16", (HV * 4,), (P(s["out"]), q, P(o["wk"]), P(o["kd"]), P(o["u0"]), P(o["wqk"]), P(o["gam"])) + dims(s), FUSED_THREADS)),
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


if NCU:
    s = setup(4096)
    for steps in [old_steps(s)] + ([fused_steps(s, v) for v in FUSED] if fmod is not None else []):
        for _, fn in steps:
            fn()
    torch.cuda.synchronize()
    sys.exit(0)

res = []
for L in [128, 4096, 200]:
    s = setup(L)
    ref = reference(s)
    row = {"L": L}
    variants = [("tc", old_steps(s)), ("v2", v2_steps(s)), ("v2 control", v2_steps(s, "moss_ctl_enc_gdr_out2_bf16"))]
    if fmod is not None:
        for v in FUSED:
            variants += [(f"fused{v}", fused_steps(s, v)), (f"fused{v} control", fused_steps(s, v, "moss_ctl_enc"))]
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
        if not name.endswith("control"):
            per, tot = timed(steps)
            row[f"{name} ms"] = tot
            row.update({f"{name} {k} ms": v for k, v in per.items()})
            # the output of the timed runs must still be the same
            row[f"{name} relL2 after timing"] = rel(s["out"], ref)
    res.append(row)
    print(json.dumps(row), flush=True)
    del s, ref
    torch.cuda.empty_cache()
if len(argv) > 2:
    json.dump(res, open(argv[2], "w"), indent=1)
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
if fmod is not None:
    print()
    print("| L | tc prep / seq / out ms | tc seq + out ms | fused4: prep / fused ms | fused2: prep / fused ms | seq + out -> fused4 / fused2 | rel L2 vs fp64: tc / fused4 / fused2 / control4 / control2 |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        so = r["tc seq_tc ms"] + r["tc out_tc ms"]
        print(f"| {r['L']} | {r['tc prep_tc ms']:.3f} / {r['tc seq_tc ms']:.3f} / {r['tc out_tc ms']:.3f} | {so:.3f} | "
              f"{r['fused4 prep_tc ms']:.3f} / {r['fused4 fused ms']:.3f} | {r['fused2 prep_tc ms']:.3f} / {r['fused2 fused ms']:.3f} | "
              f"{so / r['fused4 fused ms']:.2f}x / {so / r['fused2 fused ms']:.2f}x | {r['tc relL2']:.2e} / {r['fused4 relL2']:.2e} / "
              f"{r['fused2 relL2']:.2e} / {r['fused4 control relL2']:.2e} / {r['fused2 control relL2']:.2e} |")
    print()
    print("| L | variant | fused kernel ms | vs seq_tc + out_tc | rel L2 | after timing | control |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        so = r["tc seq_tc ms"] + r["tc out_tc ms"]
        for v in FUSED:
            f = f"fused{v}"
            print(f"| {r['L']} | {f} | {r[f + ' fused ms']:.3f} | {so / r[f + ' fused ms']:.2f}x | {r[f + ' relL2']:.2e} | "
                  f"{r[f + ' relL2 after timing']:.2e} | {r[f + ' control relL2']:.2e} |")
