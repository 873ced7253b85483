"""DiT attention kernel (cuda/attention.cu) against torch on the same GPU, in one run.

Loads the kernels from a cubin through CuPy, runs them on torch tensors, and prints a table:
relative L2 against an fp32 reference (torch on upcast inputs), the planted control's error
(must be large), and median times (CUDA events) of moss and torch SDPA (bf16, flash/cuDNN).

    python3 bench/attn_bench.py CUBIN
"""
import math
import sys

import cupy
import torch

cubin = sys.argv[1]
mod = cupy.RawModule(path=cubin)
# kernel -> dynamic shared memory; `_v2` aliases the Q tile into a K buffer (64 KiB, 3 blocks/SM)
SMEM = {"moss_attn_d128_bf16": 80 * 1024, "moss_attn_d128_bf16_control": 80 * 1024,
        "moss_attn_d128_bf16_v2": 64 * 1024, "moss_attn_d128_bf16_v2_control": 64 * 1024}
kern = {}
for n, b in SMEM.items():
    try:
        kern[n] = mod.get_function(n)
        kern[n].max_dynamic_shared_size_bytes = b
    except Exception:  # an older cubin without the _v2 kernels
        pass
VARIANTS = [v for v in ["moss_attn_d128_bf16", "moss_attn_d128_bf16_v2"] if v in kern]


def as_cupy(t):
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t)
    return cupy.ndarray((t.numel(),), dtype=cupy.uint16, memptr=cupy.cuda.MemoryPointer(mem, 0))


def moss_attn(name, qkv, out, n, heads):
    d = heads * 128
    ld = qkv.shape[1]
    q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
    args = (as_cupy(q), None, None, as_cupy(out))
    base = qkv.data_ptr()
    # column slices of the fused projection: pass pointers offset by d and 2d elements
    qp = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(base, qkv.numel() * 2, qkv), 0)
    kp = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(base, qkv.numel() * 2, qkv), d * 2)
    vp = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(base, qkv.numel() * 2, qkv), 2 * d * 2)
    mk = lambda p: cupy.ndarray((1,), dtype=cupy.uint16, memptr=p)  # noqa: E731
    scale_log2 = (128 ** -0.5) * math.log2(math.e)
    kern[name]((math.ceil(n / 64), heads), (128,),
               (mk(qp), mk(kp), mk(vp), args[3], cupy.int32(n), cupy.int32(ld), cupy.int32(ld), cupy.int32(ld),
                cupy.int32(d), cupy.float32(scale_log2)), shared_mem=SMEM[name])


def ref_attn(qkv, n, heads, dtype):
    d = heads * 128
    q, k, v = (qkv[:, i * d:(i + 1) * d].to(dtype).view(n, heads, 128).transpose(0, 1) for i in range(3))
    o = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    return o.transpose(0, 1).reshape(n, d)


def timed(fn, reps=20):
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
    return ts[len(ts) // 2]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


torch.manual_seed(0)
heads = 24
rows = []
for n in [4096 + 128, 4096 + 13, 1000, 77, 16384 + 128]:
    # realistic scales: post-QK-norm q/k have unit RMS per dim
    qkv = torch.randn(n, 3 * heads * 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full((n, heads * 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    ref = ref_attn(qkv, n, heads, torch.float32)
    e_torch = rel(ref_attn(qkv, n, heads, torch.bfloat16), ref)
    t_torch = timed(lambda: ref_attn(qkv, n, heads, torch.bfloat16))
    flop = 4 * n * n * 128 * heads
    for var in VARIANTS:
        out.fill_(float("nan"))
        moss_attn(var, qkv, out, n, heads)
        torch.cuda.synchronize()
        e = rel(out, ref)
        nan = torch.isnan(out).any().item()
        ctl = torch.full_like(out, float("nan"))
        moss_attn(var + "_control", qkv, ctl, n, heads)
        e_ctl = rel(ctl, ref)
        t_moss = timed(lambda: moss_attn(var, qkv, out, n, heads))
        rows.append((n, e, nan, e_ctl, e_torch, t_moss, t_torch, flop / t_moss / 1e9, flop / t_torch / 1e9, var))

print(f"{'kernel':<24} {'N':>6} {'relL2 moss':>11} {'nan':>4} {'control':>9} {'relL2 torch bf16':>16} {'moss ms':>8} {'torch ms':>9} {'moss TF/s':>9} {'torch TF/s':>10}")
for r in rows:
    print(f"{r[9]:<24} {r[0]:>6} {r[1]:>11.2e} {str(r[2]):>4} {r[3]:>9.2e} {r[4]:>16.2e} {r[5]:>8.3f} {r[6]:>9.3f} {r[7]:>9.0f} {r[8]:>10.0f}")
