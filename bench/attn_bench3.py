"""DiT attention kernels (cuda/attention.cu, cuda/sm90a/attention_wgmma.cu, cuda/sm90a/attention_ws.cu) against
torch SDPA, one run. Same as attn_bench2.py plus the warp-specialised TMA kernels (`_ws*`), whose q/k/v
arguments are CUtensorMaps encoded here with the driver's cuTensorMapEncodeTiled.

Loads the cubins through the CUDA driver API (ctypes; torch owns the context and the stream),
runs every variant on q/k/v that are column slices of one fused [N, 3*24*128] bf16 projection
(and, once, on separate contiguous tensors), and prints a table: relative L2 against torch SDPA on
fp32-upcast inputs, NaN check (outputs are NaN-poisoned first), the planted control's error (must
be rejected), and CUDA-event medians of moss and torch SDPA (bf16).

    python3 bench/attn_bench3.py OLD_CUBIN(sm_90) WS_CUBIN(sm_90a: attention_ws.cu, includes the wgmma kernels) [LOG]
"""
import ctypes
import math
import sys

import torch

OLD, NEW = sys.argv[1], sys.argv[2]
LOG = open(sys.argv[3], "w") if len(sys.argv) > 3 else sys.stdout
BOUND, CONTROL_MIN = 2.5e-3, 2e-2
torch.zeros(1, device="cuda")  # context
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
    ok(cu.cuFuncSetAttribute(f, 8, smem), f"max dynamic smem {name}")  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return f


mods = {"old": load(OLD), "new": load(NEW)}
# name -> (module, rows per block, threads, dynamic smem)
SPEC = {
    "moss_attn_d128_bf16_v2": ("old", 64, 128, 64 * 1024),
    "moss_attn_d128_bf16_wgmma_serial": ("new", 128, 256, 230400),
    "moss_attn_d128_bf16_wgmma": ("new", 128, 256, 230400),
    "moss_attn_d128_bf16_ws_nopp": ("new", 128, 384, 230528),
    "moss_attn_d128_bf16_ws": ("new", 128, 384, 230528),
}
FN = {}
for name, (m, rows, thr, smem) in SPEC.items():
    FN[name] = func(mods[m], name, smem)
    FN[name + "_control"] = func(mods[m], name + "_control", smem)


class TMap:
    """A CUtensorMap (128 bytes, 128-byte aligned) over the bf16 columns [0, cols) of n rows at ptr, row
    stride ld elements: box {64 columns, 128 rows}, 128-byte swizzle, zero fill past the edges."""

    def __init__(self, ptr, n, cols, ld):
        self.buf = ctypes.create_string_buffer(128 + 128)
        self.addr = (ctypes.addressof(self.buf) + 127) & ~127
        dims = (ctypes.c_uint64 * 2)(cols, n)
        strides = (ctypes.c_uint64 * 1)(ld * 2)
        box = (ctypes.c_uint32 * 2)(64, 128)
        es = (ctypes.c_uint32 * 2)(1, 1)
        # BFLOAT16 = 9, INTERLEAVE_NONE, SWIZZLE_128B = 3, L2_PROMOTION_L2_256B = 3, OOB_FILL_NONE (zeros)
        ok(cu.cuTensorMapEncodeTiled(self.addr, 9, 2, ctypes.c_void_p(ptr), dims, strides, box, es, 0, 3, 3, 0),
           "cuTensorMapEncodeTiled")


def prep(name, q, k, v, o, n, ldq, ldk, ldv, ldo, heads, scale=128 ** -0.5):
    """A closure launching `name` (its arguments made once)."""
    base = name.replace("_control", "")
    _, rows, thr, smem = SPEC[base]
    sl2 = ctypes.c_float(scale * math.log2(math.e))
    if "_ws" in base:
        maps = [TMap(p, n, heads * 128, ld) for p, ld in ((q, ldq), (k, ldk), (v, ldv))]
        vals = [ctypes.c_uint64(o), ctypes.c_int32(n), ctypes.c_int32(ldo), sl2]
        ptrs = [m.addr for m in maps] + [ctypes.addressof(x) for x in vals]
    else:
        maps = []
        vals = [ctypes.c_uint64(q), ctypes.c_uint64(k), ctypes.c_uint64(v), ctypes.c_uint64(o), ctypes.c_int32(n),
                ctypes.c_int32(ldq), ctypes.c_int32(ldk), ctypes.c_int32(ldv), ctypes.c_int32(ldo), sl2]
        ptrs = [ctypes.addressof(x) for x in vals]
    args = (ctypes.c_void_p * len(ptrs))(*ptrs)
    f, gx = FN[name], (n + rows - 1) // rows

    def go():
        _keep = (maps, vals)
        ok(cu.cuLaunchKernel(f, gx, heads, 1, thr, 1, 1, smem, torch.cuda.current_stream().cuda_stream, args, None),
           f"launch {name}")
    return go


def launch(name, q, k, v, o, n, ldq, ldk, ldv, ldo, heads, scale=128 ** -0.5):
    prep(name, q, k, v, o, n, ldq, ldk, ldv, ldo, heads, scale)()


def debug_kernels():
    """S = Q K^T and Q V for one 128 x 128 tile (cubin built with -DMOSS_ATTN_DEBUG), vs torch fp32."""
    try:
        f = func(mods["new"], "moss_attn_wgmma_debug", 230400)
    except RuntimeError as e:
        print("debug kernel absent:", e)
        return
    n, ld = 128, 3 * 24 * 128
    qkv = torch.randn(n, ld, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :128].float(), qkv[:, 3072:3200].float(), qkv[:, 6144:6272].float()
    for mode, ref in ((0, q @ k.T), (1, q @ v)):
        out = torch.full((128, 128), float("nan"), device="cuda", dtype=torch.float32)
        p = qkv.data_ptr()
        vals = [ctypes.c_uint64(p), ctypes.c_uint64(p + 2 * 3072), ctypes.c_uint64(p + 4 * 3072),
                ctypes.c_uint64(out.data_ptr()), ctypes.c_int32(n), ctypes.c_int32(ld), ctypes.c_int32(mode)]
        args = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(x) for x in vals])
        ok(cu.cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 230400, torch.cuda.current_stream().cuda_stream, args, None), "debug")
        torch.cuda.synchronize()
        e = rel(out, ref)
        msg = f"debug mode {mode} ({'Q K^T' if mode == 0 else 'Q V'}): relL2 {e:.2e}"
        print(msg)
        print(msg, file=LOG)
        if not e < 1e-5:
            d = (out - ref).abs().view(16, 8, 16, 8).amax(dim=(1, 3))
            print("  max |err| per 8x8 block (rows down, cols across):", file=LOG)
            for r in range(16):
                print("  " + " ".join(f"{x:6.1f}" for x in d[r].tolist()), file=LOG)
            # is out a permutation of ref? best matching ref row/col for a few entries
            for r in (0, 1, 8, 16, 64):
                j = (ref - out[r:r + 1]).abs().sum(1).argmin().item()
                print(f"  out row {r} closest ref row {j}", file=LOG)
            for c in (0, 1, 2, 8, 16, 64):
                j = (ref - out[:, c:c + 1]).abs().sum(0).argmin().item()
                print(f"  out col {c} closest ref col {j}", file=LOG)


def breakdown(out, ref, n, heads):
    o, r = out.view(n, heads, 128).double(), ref.view(n, heads, 128).double()
    parts = {"cols<64": (slice(None), slice(None), slice(0, 64)), "cols>=64": (slice(None), slice(None), slice(64, 128)),
             "rows<128": (slice(0, 128), slice(None), slice(None)), "rows>=128": (slice(128, None), slice(None), slice(None))}
    msg = "  breakdown: " + ", ".join(f"{k} {((o[s] - r[s]).norm() / r[s].norm()).item():.2e}" for k, s in parts.items())
    m = (torch.arange(n, device=out.device) % 128) < 64
    msg += f", row%128<64 {((o[m] - r[m]).norm() / r[m].norm()).item():.2e}, >=64 {((o[~m] - r[~m]).norm() / r[~m].norm()).item():.2e}"
    return msg


def fused(name, qkv, out, n, heads):
    fused_prep(name, qkv, out, n, heads)()


def fused_prep(name, qkv, out, n, heads):
    d, ld, p = heads * 128, qkv.shape[1], qkv.data_ptr()
    return prep(name, p, p + 2 * d, p + 4 * d, out.data_ptr(), n, ld, ld, ld, d, heads)


def ref_attn(qkv, n, heads, dtype):
    d = heads * 128
    q, k, v = (qkv[:, i * d:(i + 1) * d].to(dtype).view(n, heads, 128).transpose(0, 1) for i in range(3))
    o = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    return o.transpose(0, 1).reshape(n, d)


def timed(fn, reps=15, inner=10):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / inner)
    ts.sort()
    return ts[len(ts) // 2]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


torch.manual_seed(0)
debug_kernels()
heads = 24
rows, fails = [], []
CASES = [(4224, 1.0), (4108, 1.0), (4224, 4.0), (1000, 1.0), (77, 1.0), (1, 1.0), (129, 1.0), (255, 1.0), (16512, 1.0)]
for n, qscale in CASES:
    qkv = torch.randn(n, 3 * heads * 128, device="cuda", dtype=torch.bfloat16)
    if qscale != 1.0:
        qkv[:, :heads * 128] *= qscale  # peaked softmax: stresses the running-max rescale
    out = torch.empty(n, heads * 128, device="cuda", dtype=torch.bfloat16)
    ref = ref_attn(qkv, n, heads, torch.float32)
    e_torch = rel(ref_attn(qkv, n, heads, torch.bfloat16), ref)
    timing = qscale == 1.0
    t_torch = timed(lambda: ref_attn(qkv, n, heads, torch.bfloat16)) if timing else float("nan")
    flop = 4 * n * n * 128 * heads
    for var in SPEC:
        out.fill_(float("nan"))
        fused(var, qkv, out, n, heads)
        torch.cuda.synchronize()
        e = rel(out, ref)
        nan = bool(torch.isnan(out).any().item())
        ctl = torch.full_like(out, float("nan"))
        fused(var + "_control", qkv, ctl, n, heads)
        torch.cuda.synchronize()
        e_ctl = rel(ctl, ref)
        e_ctl = float("inf") if math.isnan(e_ctl) else e_ctl
        t = timed(fused_prep(var, qkv, out, n, heads)) if timing else float("nan")
        good = (not nan) and e <= BOUND and not math.isnan(e)
        # with one or two key tiles the running max rarely grows: the control is judged from N = 1000 up
        ctl_needed = n >= 1000
        ctl_ok = e_ctl > CONTROL_MIN if ctl_needed else True
        if not good or not ctl_ok:
            fails.append((var, n, qscale, e, nan, e_ctl))
            if not good and n > 128:
                print(f"{var} N={n}: relL2 {e:.2e}" + breakdown(out, ref, n, heads), file=LOG)
        rows.append((var, n, qscale, e, nan, e_ctl, e_torch, t, t_torch, flop / t / 1e9, flop / t_torch / 1e9,
                     "ok" if good and ctl_ok else "FAIL"))
        print("partial:", rows[-1], file=sys.stderr, flush=True)
    del qkv, out, ref
    torch.cuda.empty_cache()

# separate contiguous q/k/v (row stride 3072), N = 4108
n = 4108
q, k, v = (torch.randn(n, heads * 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
refs = torch.nn.functional.scaled_dot_product_attention(*(t.float().view(n, heads, 128).transpose(0, 1)[None] for t in (q, k, v)))[0]
refs = refs.transpose(0, 1).reshape(n, heads * 128)
for var in SPEC:
    out = torch.full((n, heads * 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = heads * 128
    launch(var, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), n, d, d, d, d, heads)
    torch.cuda.synchronize()
    e = rel(out, refs)
    nan = bool(torch.isnan(out).any().item())
    st = "ok" if (not nan and e <= BOUND) else "FAIL"
    if st != "ok":
        fails.append((var, n, "separate", e, nan, 0))
    print(f"separate q/k/v N={n} {var}: relL2 {e:.2e} nan {nan} {st}", file=LOG)
    print(f"separate q/k/v N={n} {var}: relL2 {e:.2e} nan {nan} {st}")

hdr = f"{'kernel':<34} {'N':>6} {'qx':>3} {'relL2':>9} {'nan':>5} {'control':>9} {'torch bf16':>10} {'moss ms':>8} {'torch ms':>9} {'moss TF/s':>9} {'torch TF/s':>10} verdict"
for f in ([LOG, sys.stdout] if LOG is not sys.stdout else [LOG]):
    print(hdr, file=f)
    for r in rows:
        print(f"{r[0]:<34} {r[1]:>6} {r[2]:>3.0f} {r[3]:>9.2e} {str(r[4]):>5} {r[5]:>9.2e} {r[6]:>10.2e} {r[7]:>8.3f} {r[8]:>9.3f} {r[9]:>9.0f} {r[10]:>10.0f} {r[11]}", file=f)
    print("FAILURES:" if fails else "all rows pass", fails if fails else "", file=f)
