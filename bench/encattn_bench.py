"""The encoder attention layer's non-GEMM kernels old vs new (helper encattn, issue #7), standalone, at
the real Qwen3.5-9B shapes (16 query heads, 4 KV heads, head dim 256, rotary 64, theta 1e7).

    python3 bench/encattn_bench.py UNIT_CUBIN WG_CUBIN

UNIT_CUBIN: bench/encattn_unit.cu (cuda/encoder.cu + enc_strided.cu + enc_attn.cu); WG_CUBIN:
cuda/sm90a/attention_causal_wgmma.cu (wg = the current kernel, wg2 = the overlap variant, which
exists at commit 0a6bc6a only: run there, measured slower, removed; bench/notes-encattn.md).
Correctness: relative L2 against fp32 / fp64 torch references on fresh random inputs, NaN never
passes, every new kernel's planted control must be rejected. Times: CUDA-event medians of 30 after
3 warm-ups, old and new alternated. The table is printed last.
"""
import math
import sys

import cupy
import numpy as np
import torch

unit = cupy.RawModule(path=sys.argv[1])
wgm = cupy.RawModule(path=sys.argv[2])
K = {}
SM_WG = 197632


def fn(mod, name, smem=0):
    f = mod.get_function(name)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    K[name] = (f, smem)


for pf in ["moss_enc", "moss_ctl_enc"]:
    for n in ["qkrope", "gmulh", "gmul8", "head_rope"]:
        fn(unit, f"{pf}_{n}_bf16")
    for n in ["fattn_wg", "fattn_wg2", "fattn_wg_gated", "fattn_wg2_gated"]:
        fn(wgm, f"{pf}_{n}_bf16", SM_WG)

P = lambda t: np.uint64(t.data_ptr())  # noqa: E731
I = np.int32  # noqa: E741
L64 = np.int64
F = np.float32
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def launch(name, grid, block, args):
    f, smem = K[name]
    f(grid, (block,), args, shared_mem=smem)


def timed_pair(fa, fb, reps=30):
    """Medians (ms) of fa and fb, alternated."""
    for _ in range(3):
        fa()
        fb()
    torch.cuda.synchronize()
    ta, tb = [], []
    for _ in range(reps):
        for f, ts in ((fa, ta), (fb, tb)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
    ta.sort()
    tb.sort()
    return ta[len(ta) // 2], tb[len(tb) // 2]


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


torch.manual_seed(7)
H, HKV, HD, ROT, THETA, EPS = 16, 4, 256, 64, 1e7, 1e-6
W = (2 * H + 2 * HKV) * HD  # 10240: [q|gate per head | k | v]
SCALE = HD ** -0.5
SL2 = F(SCALE * math.log2(math.e))
BOUND = 4e-3


def attn_ref(q, k, v, L):
    qf = q.float().view(L, H, HD).transpose(0, 1)
    kf = k.float().view(L, HKV, HD).repeat_interleave(H // HKV, 1).transpose(0, 1)
    vf = v.float().view(L, HKV, HD).repeat_interleave(H // HKV, 1).transpose(0, 1)
    o = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=SCALE)
    return o.transpose(0, 1).reshape(L, H * HD)


def wg(name, o, q, k, v, L, y=None):
    extra = () if y is None else (np.uint64(y.data_ptr() + 2 * HD), L64(W), L64(2 * HD))
    launch(name, (H, math.ceil(L / 128)), 256, (P(o), P(q), P(k), P(v), I(L), I(H), I(HKV), SL2) + extra)


# ---- causal attention: wg (current default) vs wg2 (overlap) ----
for L in [4096, 777, 128]:
    q = torch.randn(L, H * HD, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(L, HKV * HD, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(L, HKV * HD, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(L, W, device="cuda", dtype=torch.bfloat16) * 2
    ref = attn_ref(q, k, v, L)
    gate = y[:, : 2 * H * HD].view(L, H, 2 * HD)[:, :, HD:].float().reshape(L, H * HD)
    refg = ref.bfloat16().float() * torch.sigmoid(gate).bfloat16().float()
    flop = 4 * (L * (L + 1) / 2) * H * HD
    oa = torch.full((L, H * HD), float("nan"), device="cuda", dtype=torch.bfloat16)
    ob = torch.full_like(oa, float("nan"))
    fa = lambda: wg("moss_enc_fattn_wg_bf16", oa, q, k, v, L)  # noqa: E731
    fb = lambda: wg("moss_enc_fattn_wg2_bf16", ob, q, k, v, L)  # noqa: E731
    fa()
    fb()
    torch.cuda.synchronize()
    ea, eb = rel(oa, ref), rel(ob, ref)
    check(f"attention wg L={L}", ea, BOUND)
    check(f"attention wg2 L={L}", eb, BOUND)
    same = torch.equal(oa, ob)
    ta, tb = timed_pair(fa, fb)
    rows.append(("causal_attention", L, "wg (default)", ta, ea, f"{flop / ta / 1e9:.0f} TFLOP/s"))
    rows.append(("causal_attention", L, "wg2 (overlap)", tb, eb, f"{flop / tb / 1e9:.0f} TFLOP/s; bit-identical to wg: {same}"))
    # gated, gate read in place out of y
    oa.fill_(float("nan"))
    ob.fill_(float("nan"))
    ga = lambda: wg("moss_enc_fattn_wg_gated_bf16", oa, q, k, v, L, y)  # noqa: E731
    gb = lambda: wg("moss_enc_fattn_wg2_gated_bf16", ob, q, k, v, L, y)  # noqa: E731
    ga()
    gb()
    torch.cuda.synchronize()
    ea, eb = rel(oa, refg), rel(ob, refg)
    check(f"attention+gate wg L={L}", ea, BOUND)
    check(f"attention+gate wg2 L={L}", eb, BOUND)
    ta, tb = timed_pair(ga, gb)
    rows.append(("attention + fused gate (y)", L, "wg", ta, ea, ""))
    rows.append(("attention + fused gate (y)", L, "wg2", tb, eb, ""))
    for name, r, what in [("moss_ctl_enc_fattn_wg2_bf16", ref, "mask off by one"),
                          ("moss_ctl_enc_fattn_wg2_gated_bf16", refg, "gate of the KV head")]:
        ob.fill_(float("nan"))
        wg(name, ob, q, k, v, L, y if "gated" in name else None)
        torch.cuda.synchronize()
        ec = rel(ob, r)
        check(f"control wg2 {what} L={L}", ec, BOUND, control=True)
        rows.append((f"  control: {what}", L, "wg2", 0.0, ec, f"must be > {BOUND}"))
    # torch SDPA bf16 for scale
    qt = q.view(L, H, HD).transpose(0, 1)[None]
    kt = k.view(L, HKV, HD).transpose(0, 1)[None]
    vt = v.view(L, HKV, HD).transpose(0, 1)[None]
    sd = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=SCALE, enable_gqa=True)  # noqa: E731
    try:
        e = rel(sd()[0].transpose(0, 1).reshape(L, H * HD), ref)
        t, _ = timed_pair(sd, sd)
        rows.append(("causal_attention", L, "torch SDPA bf16", t, e, f"{flop / t / 1e9:.0f} TFLOP/s"))
    except Exception as ex:  # noqa: BLE001
        rows.append(("causal_attention", L, f"torch SDPA failed: {ex}"[:60], 0.0, float("nan"), ""))
    del q, k, v, y, ref, refg, oa, ob
    torch.cuda.empty_cache()


# ---- q/k norm + RoPE: old (narrow copy of q + head_rope twice) vs qkrope (one launch, v copied) ----
def rope_ref(x, w, L, nh):
    """fp64 per-head zero-centred RMSNorm + rotate-half RoPE on dims 0..ROT, angles as the CPU twin."""
    x = x.double().view(L, nh, HD)
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * (1 + w.double())
    e = (torch.arange(ROT // 2, device="cuda", dtype=torch.float32) * 2) / ROT
    inv = 1.0 / (THETA ** e.double()).float()
    ang = (torch.arange(L, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]).double()
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    half = ROT // 2
    a, b = y[..., :half], y[..., half:ROT]
    out = y.clone()
    out[..., :half] = a * c - b * s
    out[..., half:ROT] = b * c + a * s
    return out.reshape(L, nh * HD)


for L in [4096, 128]:
    y = torch.randn(L, W, device="cuda", dtype=torch.bfloat16) * 3
    wq = (torch.randn(HD, device="cuda") * 0.3).bfloat16()
    wk = (torch.randn(HD, device="cuda") * 0.3).bfloat16()
    qsrc = y[:, : 2 * H * HD].view(L, H, 2 * HD)[:, :, :HD]
    ksrc = y[:, 2 * H * HD: (2 * H + HKV) * HD]
    vsrc = y[:, (2 * H + HKV) * HD:]
    rq, rk = rope_ref(qsrc, wq, L, H), rope_ref(ksrc, wk, L, HKV)
    qo = torch.full((L, H * HD), float("nan"), device="cuda", dtype=torch.bfloat16)
    ko = torch.full((L, HKV * HD), float("nan"), device="cuda", dtype=torch.bfloat16)
    vo = torch.full_like(ko, float("nan"))
    rws = L * (H + 2 * HKV)
    new = lambda pf="moss_enc": launch(f"{pf}_qkrope_bf16", (math.ceil(rws / 8),), 256, (  # noqa: E731
        P(qo), P(ko), P(vo), P(y), P(wq), P(wk), L64(L), I(H), I(HKV), I(HD), L64(W), L64(2 * HD),
        L64(2 * H * HD), L64((2 * H + HKV) * HD), F(EPS), I(ROT), L64(np.float64(THETA).view(np.int64))))
    # old: q narrowed to a contiguous copy, k out of its own GEMM (contiguous), head_rope on each
    qc = torch.empty(L, H, HD, device="cuda", dtype=torch.bfloat16)
    kc = ksrc.contiguous()
    wqf, wkf = wq.float(), wk.float()
    e32 = (torch.arange(ROT // 2, device="cuda", dtype=torch.float32) * 2) / ROT
    inv = (1.0 / (THETA ** e32.double()).float()).float().contiguous()
    qo2 = torch.full_like(qo, float("nan"))
    ko2 = torch.full_like(ko, float("nan"))

    def old():
        qc.copy_(qsrc)
        launch("moss_enc_head_rope_bf16", (math.ceil(L * H / 8),), 256,
               (P(qo2), P(qc), P(wqf), P(inv), L64(L * H), I(H), I(HD), F(EPS), I(ROT)))
        launch("moss_enc_head_rope_bf16", (math.ceil(L * HKV / 8),), 256,
               (P(ko2), P(kc), P(wkf), P(inv), L64(L * HKV), I(HKV), I(HD), F(EPS), I(ROT)))
    new()
    old()
    torch.cuda.synchronize()
    eq, ek, ev = rel(qo, rq), rel(ko, rk), rel(vo, vsrc.float())
    eq2, ek2 = rel(qo2, rq), rel(ko2, rk)
    check(f"qkrope q L={L}", eq, BOUND)
    check(f"qkrope k L={L}", ek, BOUND)
    check(f"qkrope v copy L={L}", ev, 0.0)
    check(f"old head_rope q L={L}", eq2, BOUND)
    same = torch.equal(qo, qo2) and torch.equal(ko, ko2)
    to, tn = timed_pair(old, new)
    rows.append(("q/k norm+RoPE", L, "old: narrow + head_rope x2", to, eq2, f"k {ek2:.2e}"))
    rows.append(("q/k norm+RoPE", L, "new: qkrope (+ v copy)", tn, eq, f"k {ek:.2e}, v {ev:.1e}; bit-identical q,k to old: {same}"))
    qo.fill_(float("nan"))
    new("moss_ctl_enc")
    torch.cuda.synchronize()
    ec = rel(qo, rq)
    check(f"control qkrope t+1 L={L}", ec, BOUND, control=True)
    rows.append(("  control: position t+1", L, "qkrope", 0.0, ec, f"must be > {BOUND}"))

    # ---- the output gate: old gmul8 on q_proj's contiguous [L, H, 2hd] vs gmulh on y ----
    # (gmul8 was removed after this call: attn_gate_with now runs gmulh; the kernel as measured is
    # `git show 5925cbe:cuda/enc_strided.cu`)
    o = torch.randn(L, H * HD, device="cuda", dtype=torch.bfloat16)
    qg = y[:, : 2 * H * HD].contiguous()
    gref = o.float() * torch.sigmoid(qg.view(L, H, 2 * HD)[:, :, HD:].float().reshape(L, H * HD))
    ga = torch.full_like(o, float("nan"))
    gb = torch.full_like(o, float("nan"))
    n8 = L * H * HD // 8
    grid = (min(math.ceil(n8 / 256), SMS * 16),)
    g_old = lambda: launch("moss_enc_gmul8_bf16", grid, 256, (P(ga), P(o), np.uint64(qg.data_ptr() + 2 * HD), L64(L * H), I(HD), L64(2 * HD)))  # noqa: E731
    g_new = lambda pf="moss_enc": launch(f"{pf}_gmulh_bf16", grid, 256, (P(gb), P(o), np.uint64(y.data_ptr() + 2 * HD), L64(L), I(H), I(HD), L64(W), L64(2 * HD)))  # noqa: E731
    g_old()
    g_new()
    torch.cuda.synchronize()
    e1, e2 = rel(ga, gref), rel(gb, gref)
    check(f"gmul8 L={L}", e1, BOUND)
    check(f"gmulh L={L}", e2, BOUND)
    t1, t2 = timed_pair(g_old, g_new)
    rows.append(("attn gate", L, "old: gmul8 (qg contiguous)", t1, e1, ""))
    rows.append(("attn gate", L, "new: gmulh (gate in y)", t2, e2, f"bit-identical: {torch.equal(ga, gb)}"))
    gb.fill_(float("nan"))
    g_new("moss_ctl_enc")
    torch.cuda.synchronize()
    ec = rel(gb, gref)
    check(f"control gmulh head+1 L={L}", ec, BOUND, control=True)
    rows.append(("  control: gate of head h+1", L, "gmulh", 0.0, ec, f"must be > {BOUND}"))

    # ---- projections: q_proj, k_proj, v_proj as three GEMMs vs one over the joined weights ----
    x = torch.randn(L, 4096, device="cuda", dtype=torch.bfloat16)
    wqp = torch.randn(2 * H * HD, 4096, device="cuda", dtype=torch.bfloat16) * 0.015
    wkp = torch.randn(HKV * HD, 4096, device="cuda", dtype=torch.bfloat16) * 0.015
    wvp = torch.randn(HKV * HD, 4096, device="cuda", dtype=torch.bfloat16) * 0.015
    wj = torch.cat([wqp, wkp, wvp], 0)
    lin = torch.nn.functional.linear
    three = lambda: (lin(x, wqp), lin(x, wkp), lin(x, wvp))  # noqa: E731
    one = lambda: lin(x, wj)  # noqa: E731
    t3, t1 = timed_pair(three, one)
    fl = 2 * L * 4096 * W
    rows.append(("q|k|v projection (torch)", L, "three GEMMs", t3, 0.0, f"{fl / t3 / 1e9:.0f} TFLOP/s"))
    rows.append(("q|k|v projection (torch)", L, "one joined GEMM", t1, 0.0, f"{fl / t1 / 1e9:.0f} TFLOP/s"))
    del y, x, wqp, wkp, wvp, wj
    torch.cuda.empty_cache()

print("== encattn kernels (CUDA-event medians, ms; rel L2 vs fp32/fp64 torch references)")
print(f"{'op':<30} {'L':>5} {'variant':<30} {'ms':>9} {'rel L2':>9}  note")
for what, L, var, t, e, note in rows:
    print(f"{what:<30} {L:>5} {var:<30} {t:>9.4f} {e:>9.2e}  {note}")
print("FAILS:" if fails else "all correctness checks passed, all controls rejected")
for f in fails:
    print("  " + f)
