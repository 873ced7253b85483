"""Encoder kernels old vs new (helper encew, issue #7), standalone, at the real Qwen3.5-9B shapes.

    python3 bench/encew_bench.py MAIN_CUBIN SM90A_CUBIN [OUT_DIR]

MAIN_CUBIN: cuda/attention_causal.cu + encoder.cu + enc_addnorm.cu + enc_conv.cu (bench/encew_unit.cu);
SM90A_CUBIN: cuda/sm90a/attention_causal_wgmma.cu. Kernels run on torch tensors through CuPy.
Correctness: relative L2 against fp32/fp64 references on fresh random inputs, NaN never passes,
each new kernel's planted control must be rejected. Times: CUDA-event medians of 20 after 3
warm-ups. The table is printed last.
"""
import math
import sys

import cupy
import numpy as np
import torch

main_mod = cupy.RawModule(path=sys.argv[1])
wg_mod = cupy.RawModule(path=sys.argv[2])
K = {}


def fn(mod, name, smem=0):
    f = mod.get_function(name)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    K[name] = (f, smem)


SM_OLD, SM_WG = 96 * 1024, 197632
for n in ["moss_enc_fattn_bf16", "moss_ctl_enc_fattn_bf16", "moss_enc_fattn_gated_bf16"]:
    fn(main_mod, n, SM_OLD)
for n in ["moss_enc_fattn_wg_bf16", "moss_ctl_enc_fattn_wg_bf16", "moss_enc_fattn_wg_gated_bf16",
          "moss_ctl_enc_fattn_wg_gated_bf16"]:
    fn(wg_mod, n, SM_WG)
for n in ["moss_enc_conv8_bf16", "moss_enc_add_rms_bf16", "moss_enc_silu_mul8_bf16"]:
    fn(main_mod, n)
try:  # conv8t (cuda/enc_conv.cu) exists at commit 886f2c5 only: measured, no gain, removed
    for n in ["moss_enc_conv8t_bf16", "moss_ctl_enc_conv8t_bf16"]:
        fn(main_mod, n)
except Exception:  # noqa: BLE001
    pass

P = lambda t: np.uint64(t.data_ptr())  # noqa: E731
I = np.int32  # noqa: E741
L64 = np.int64
F = np.float32
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def launch(name, grid, block, args):
    f, smem = K[name]
    f(grid, (block,), args, shared_mem=smem)


def timed(f, reps=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def rel(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm()).item()


rows = []  # (what, L, variant, ms, relL2, note)
fails = []


def check(what, e, bound, control=False):
    ok = (e == e) and ((e > bound) if control else (e <= bound))
    if not ok:
        fails.append(f"{what}: {e:.3e} ({'control must exceed' if control else 'bound'} {bound})")
    return ok


torch.manual_seed(1)
H, HKV, HD = 16, 4, 256
SCALE = HD ** -0.5
SL2 = F(SCALE * math.log2(math.e))


def attn_ref(q, k, v, L):
    qf = q.float().view(L, H, HD).transpose(0, 1)
    kf = k.float().view(L, HKV, HD).repeat_interleave(H // HKV, 1).transpose(0, 1)
    vf = v.float().view(L, HKV, HD).repeat_interleave(H // HKV, 1).transpose(0, 1)
    o = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=SCALE)
    return o.transpose(0, 1).reshape(L, H * HD)


def old_attn(name, o, q, k, v, L, gate=None):
    extra = () if gate is None else (np.uint64(gate.data_ptr() + 2 * HD), L64(H * 2 * HD), L64(2 * HD))
    launch(name, (math.ceil(L / 64), H), 128, (P(o), P(q), P(k), P(v), I(L), I(H), I(HKV), SL2) + extra)


def wg_attn(name, o, q, k, v, L, gate=None):
    extra = () if gate is None else (np.uint64(gate.data_ptr() + 2 * HD), L64(H * 2 * HD), L64(2 * HD))
    launch(name, (H, math.ceil(L / 128)), 256, (P(o), P(q), P(k), P(v), I(L), I(H), I(HKV), SL2) + extra)


for L in [4096, 777, 128]:
    q = torch.randn(L, H * HD, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(L, HKV * HD, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(L, HKV * HD, device="cuda", dtype=torch.bfloat16)
    qg = torch.randn(L, H, 2 * HD, device="cuda", dtype=torch.bfloat16)
    ref = attn_ref(q, k, v, L)
    gate = qg[:, :, HD:].float().reshape(L, H * HD)
    sg = torch.sigmoid(gate).bfloat16().float()
    refg = ref.bfloat16().float() * sg
    flop = 4 * (L * (L + 1) / 2) * H * HD
    o = torch.full((L, H * HD), float("nan"), device="cuda", dtype=torch.bfloat16)
    res = {}
    for var, f in [("old mma.sync", lambda n, g=None: old_attn(n, o, q, k, v, L, g)),
                   ("new wgmma", lambda n, g=None: wg_attn(n, o, q, k, v, L, g))]:
        name = "moss_enc_fattn_bf16" if var.startswith("old") else "moss_enc_fattn_wg_bf16"
        o.fill_(float("nan"))
        f(name)
        torch.cuda.synchronize()
        e = rel(o, ref)
        res[var] = o.clone()
        check(f"attention {var} L={L}", e, 4e-3)
        t = timed(lambda: f(name))
        rows.append(("causal_attention", L, var, t, e, f"{flop / t / 1e9:.0f} TFLOP/s"))
        gname = name.replace("_bf16", "_gated_bf16")
        o.fill_(float("nan"))
        f(gname, qg)
        torch.cuda.synchronize()
        eg = rel(o, refg)
        res[var + " gated"] = o.clone()
        check(f"attention gated {var} L={L}", eg, 4e-3)
        tg = timed(lambda: f(gname, qg))
        rows.append(("attention+gate fused", L, var, tg, eg, ""))
    # planted controls of the new kernels
    o.fill_(float("nan"))
    wg_attn("moss_ctl_enc_fattn_wg_bf16", o, q, k, v, L)
    torch.cuda.synchronize()
    ec = rel(o, ref)
    check(f"control wgmma mask+1 L={L}", ec, 4e-3, control=True)
    rows.append(("  control: mask off by one", L, "new wgmma", 0.0, ec, "must be > 4e-3"))
    o.fill_(float("nan"))
    wg_attn("moss_ctl_enc_fattn_wg_gated_bf16", o, q, k, v, L, qg)
    torch.cuda.synchronize()
    ec = rel(o, refg)
    check(f"control wgmma gate of KV head L={L}", ec, 4e-3, control=True)
    rows.append(("  control: gate of the KV head", L, "new wgmma", 0.0, ec, "must be > 4e-3"))
    rows.append(("  new vs old (bf16 outputs)", L, "", 0.0, rel(res["new wgmma"], res["old mma.sync"].float()), ""))
    rows.append(("  new vs old gated", L, "", 0.0, rel(res["new wgmma gated"], res["old mma.sync gated"].float()), ""))
    # the unfused gate as the model runs it without the switch: attention, sigmoid, mul (torch ops for the two)
    # torch SDPA bf16 (flash / cuDNN) for scale
    qt = q.view(L, H, HD).transpose(0, 1)[None]
    kt = k.view(L, HKV, HD).transpose(0, 1)[None]
    vt = v.view(L, HKV, HD).transpose(0, 1)[None]
    sd = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=SCALE, enable_gqa=True)  # noqa: E731
    try:
        e = rel(sd()[0].transpose(0, 1).reshape(L, H * HD), ref)
        t = timed(sd)
        rows.append(("causal_attention", L, "torch SDPA bf16", t, e, f"{flop / t / 1e9:.0f} TFLOP/s"))
    except Exception as ex:  # noqa: BLE001
        rows.append(("causal_attention", L, f"torch SDPA failed: {ex}"[:60], 0.0, float("nan"), ""))
    del q, k, v, qg, ref, o, res
    torch.cuda.empty_cache()

# ---- causal conv1d + SiLU, C = 2·16·128 + 32·128 = 8192, K = 4 ----
C, KT = 8192, 4
for L in [4096, 128] if "moss_enc_conv8t_bf16" in K else []:
    x = torch.randn(L, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(C, KT, device="cuda", dtype=torch.float32) * 0.5
    wt = w.t().contiguous()  # [K, C]
    xp = torch.nn.functional.pad(x.double().t()[None], (KT - 1, 0))
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(xp, w.double()[:, None, :], groups=C))[0].t()
    o_old = torch.full_like(x, float("nan"))
    o_new = torch.full_like(x, float("nan"))
    work = L * C // 8
    g_old = min(math.ceil(work / 256), SMS * 16)
    g_new = math.ceil(math.ceil(L / 8) * (C // 8) / 256)
    f_old = lambda: launch("moss_enc_conv8_bf16", (g_old,), 256, (P(o_old), P(x), P(wt), L64(L), I(C), I(KT)))  # noqa: E731
    f_new = lambda: launch("moss_enc_conv8t_bf16", (g_new,), 256, (P(o_new), P(x), P(wt), L64(L), I(C), I(KT)))  # noqa: E731
    f_old()
    f_new()
    torch.cuda.synchronize()
    e_old, e_new = rel(o_old, ref), rel(o_new, ref)
    check(f"conv8 old L={L}", e_old, 4e-3)
    check(f"conv8t new L={L}", e_new, 4e-3)
    same = torch.equal(o_old, o_new)
    if not same:
        fails.append(f"conv8t not bit-identical to conv8 at L={L}")
    o_ctl = torch.full_like(x, float("nan"))
    launch("moss_ctl_enc_conv8t_bf16", (g_new,), 256, (P(o_ctl), P(x), P(wt), L64(L), I(C), I(KT)))
    torch.cuda.synchronize()
    e_ctl = rel(o_ctl, ref)
    check(f"conv8t control L={L}", e_ctl, 4e-3, control=True)
    gb = 2 * L * C * 2 / 1e9
    t_old, t_new = timed(f_old), timed(f_new)
    rows.append(("causal_conv1d_silu", L, "old conv8", t_old, e_old, f"{gb / t_old:.2f} TB/s"))
    rows.append(("causal_conv1d_silu", L, "new conv8t", t_new, e_new, f"{gb / t_new:.2f} TB/s, bit-identical {same}"))
    rows.append(("  control: taps reversed", L, "new conv8t", 0.0, e_ctl, "must be > 4e-3"))

# ---- timings only (old kernels, for the bounds) ----
for L in [4096, 128]:
    d = 4096
    x = torch.randn(L, d, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(L, d, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(d, device="cuda", dtype=torch.float32) * 0.1
    xo, no = torch.empty_like(x), torch.empty_like(x)
    f = lambda: launch("moss_enc_add_rms_bf16", (L,), 256, (P(xo), P(no), P(x), P(h), P(w), I(d), F(1e-6)))  # noqa: E731
    t = timed(f)
    gb = 4 * L * d * 2 / 1e9
    rows.append(("add_rms_norm", L, "current", t, float("nan"), f"{gb / t:.2f} TB/s"))
    n = L * 12288
    g = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    u = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    so = torch.empty_like(g)
    grid = min(math.ceil(n // 8 / 256), SMS * 16)
    f = lambda: launch("moss_enc_silu_mul8_bf16", (grid,), 256, (P(so), P(g), P(u), L64(n // 8)))  # noqa: E731
    t = timed(f)
    gb = 3 * n * 2 / 1e9
    rows.append(("silu_mul", L, "current", t, float("nan"), f"{gb / t:.2f} TB/s"))
    f2 = lambda: so.copy_(g)  # noqa: E731
    t2 = timed(f2)
    rows.append(("  (torch copy of the gate, for scale)", L, "torch", t2, float("nan"), f"{2 * n * 2 / 1e9 / t2:.2f} TB/s"))

print("\n== encew kernels, H200 (CUDA-event medians of 20; relL2 vs fp32/fp64 reference) ==")
print(f"{'op':<38} {'L':>5} {'variant':<18} {'ms':>8} {'relL2':>10}  note")
for r in rows:
    print(f"{r[0]:<38} {r[1]:>5} {r[2]:<18} {r[3]:>8.4f} {r[4]:>10.3e}  {r[5]}")
print("FAILURES:" if fails else "ALL CHECKS PASSED (incl. every planted control rejected)")
for f in fails:
    print("  " + f)
