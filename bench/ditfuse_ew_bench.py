"""Elementwise DiT kernels, old vs fused, at the 1024x1024 shape (N = 4224), plus torch GEMMs.

    python3 .dev-ditfuse/ew_bench.py .dev-ditfuse/ew.cubin
"""
import sys
import cupy
import numpy as np
import torch

mod = cupy.RawModule(path=sys.argv[1])
K = lambda n: mod.get_function(n)  # noqa: E731
P = lambda t: np.uint64(t.data_ptr())  # noqa: E731
L, I, F = np.int64, np.int32, np.float32
N, D, H, HD, FF = 4224, 3072, 24, 128, 8192
SMS = torch.cuda.get_device_properties(0).multi_processor_count
grid_for = lambda w: max(1, min((w + 255) // 256, SMS * 16))  # noqa: E731
dev = "cuda"
bf = torch.bfloat16


def timed(fn, reps=30):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2] * 1e3  # us


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def diff(a, b):
    return (a != b).float().mean().item()


torch.manual_seed(0)
rows = []
# ---- qk norm + rope: two unfused kernels on contiguous q, k vs one in place on packed qkv
qkv = (torch.randn(N, 3 * D, device=dev) * torch.exp(torch.rand(N, 1, device=dev) * 4 - 2)).to(bf)
wq, wk = (0.5 + torch.rand(HD, device=dev)).to(bf), (0.5 + torch.rand(HD, device=dev)).to(bf)
th = torch.rand(N, HD // 2, device=dev) * 200 - 100
cs, sn = th.cos().to(bf), th.sin().to(bf)
q, k = qkv[:, :D].contiguous(), qkv[:, D:2 * D].contiguous()
qo, ko = torch.empty_like(q), torch.empty_like(k)
old = K("moss_qk_rope_bf16_bf16")
def run_old():
    old(((N * H + 7) // 8,), (256,), (P(qo), P(q), P(wq), P(cs), P(sn), L(N * H), I(H), I(HD), F(1e-6)))
    old(((N * H + 7) // 8,), (256,), (P(ko), P(k), P(wk), P(cs), P(sn), L(N * H), I(H), I(HD), F(1e-6)))
new = K("moss_qkv_rope_bf16_bf16")
work = qkv.clone()
def run_new():
    new(((N * 2 * H * 8 + 255) // 256,), (256,), (P(work), P(wq), P(wk), P(cs), P(sn), L(N), I(H), I(HD), F(1e-6)))
run_old(); work.copy_(qkv); run_new(); torch.cuda.synchronize()
same_q, same_k = diff(work[:, :D], qo), diff(work[:, D:2 * D], ko)
v_same = torch.equal(work[:, 2 * D:], qkv[:, 2 * D:])
t_old, t_new = timed(run_old), timed(run_new)  # run_new on its own output: same traffic
rows.append(("qk_norm_rope x2 (old) vs qkv_norm_rope (packed, in place)", t_old, t_new,
             f"q differs {same_q:.2e}, k differs {same_k:.2e} of values, v untouched {v_same}"))

# ---- gated residual + rms_norm_modulate vs fused
x = (torch.randn(N, D, device=dev) * 3).to(bf)
y = torch.randn(N, D, device=dev).to(bf)
g, w = torch.randn(D, device=dev).to(bf), (0.5 + torch.rand(D, device=dev)).to(bf)
sh, sc = torch.randn(D, device=dev).to(bf), torch.randn(D, device=dev).to(bf)
x1, n1, x2, n2 = (torch.empty_like(x) for _ in range(4))
gres, rmsmod, gm = K("moss_gres_bf16_bf16"), K("moss_rms_mod_bf16_bf16"), K("moss_gres_mod_bf16_bf16")
def run_gold():
    gres((grid_for(N * D // 8),), (256,), (P(x1), P(x), P(y), P(g), L(N * D), L(D)))
    rmsmod(((N + 7) // 8,), (256,), (P(n1), P(x1), P(w), P(sh), P(sc), L(N), I(D), F(1e-6)))
def run_gnew():
    gm(((N + 7) // 8,), (256,), (P(x2), P(n2), P(x), P(y), P(g), P(w), P(sh), P(sc), L(N), I(D), F(1e-6)))
run_gold(); run_gnew(); torch.cuda.synchronize()
rows.append(("gated_residual + rms_norm_modulate (old) vs fused", timed(run_gold), timed(run_gnew),
             f"x' differs {diff(x1, x2):.2e}, norm differs {diff(n1, n2):.2e} of values"))
rows.append(("  of which gated_residual alone", timed(lambda: gres((grid_for(N * D // 8),), (256,), (P(x1), P(x), P(y), P(g), L(N * D), L(D)))), 0, ""))

# ---- SiTU-GLU variants
u = (torch.randn(N, 2 * FF, device=dev) * 4).to(bf)
ref = None
hh, gg = u[:, :FF].double(), u[:, FF:].double()
ref = (4 * torch.tanh(gg / 4) * torch.sigmoid(gg)) * (25 * torch.tanh(hh / 25))
outs = {}
for name in ["moss_situ_bf16", "bench_situ_mid", "bench_situ_fast", "bench_situ_copy"]:
    o = torch.empty(N, FF, device=dev, dtype=bf)
    kf = K(name)
    fn = lambda kf=kf, o=o: kf((grid_for(N * FF // 8),), (256,), (P(o), P(u), L(N), L(FF)))  # noqa: E731
    fn(); torch.cuda.synchronize()
    outs[name] = o
    t = timed(fn)
    note = "" if name.endswith("copy") else f"rel L2 vs f64 {rel(o, ref):.3e}, differs from moss_situ {diff(o, outs['moss_situ_bf16']):.2e}"
    rows.append((f"situ {name}", t, 0, note))

# ---- torch (cuBLAS) GEMMs at the block's shapes, bf16
for (m, kk, n, what) in [(N, D, 3 * D, "qkv"), (N, D, D, "q or o"), (N, D, 2 * FF, "up_gate"), (N, FF, D, "down")]:
    a = torch.randn(m, kk, device=dev, dtype=bf)
    b = torch.randn(n, kk, device=dev, dtype=bf) * 0.02
    t = timed(lambda: torch.mm(a, b.t()))
    rows.append((f"torch.mm {what} {m}x{kk}x{n}", t, 0, f"{2 * m * n * kk / t / 1e6:.0f} TFLOP/s"))

print(f"{'op':<62} {'old/this us':>12} {'fused us':>9}  note")
for r in rows:
    print(f"{r[0]:<62} {r[1]:>12.1f} {r[2]:>9.1f}  {r[3]}")
