"""VAE conv kernels (cuda/vae_conv.cu, cuda/vae.cu) at the full decoder's shapes, standalone.

Loads cubins through the CUDA driver API (ctypes), runs them on torch tensors, and prints a table:
relative L2 against a float64 torch conv (nearest x2 upsample first where marked), the planted
one-TF32-product control's error (must be large), and CUDA-event medians of: the halo kernel (per
cubin variant), its weight prep, the older tap-major kernel, and cuDNN fp32 (TF32 off).

    python3 bench/vae_conv_bench.py DIR   # DIR holds halo_u1.cubin [halo_u3.cubin] old.cubin
"""
import ctypes
import sys

import torch
import torch.nn.functional as F

d = sys.argv[1]
cuda = ctypes.CDLL("libcuda.so.1")
torch.zeros(1, device="cuda")
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def load(path):
    m = ctypes.c_void_p()
    check(cuda.cuModuleLoad(ctypes.byref(m), path.encode()), f"load {path}")
    return m


def func(m, name, smem=0):
    f = ctypes.c_void_p()
    check(cuda.cuModuleGetFunction(ctypes.byref(f), m, name.encode()), name)
    if smem > 48 * 1024:
        check(cuda.cuFuncSetAttribute(f, 8, smem), f"smem {name}")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    return f


def launch(f, grid, block, smem, args):
    vals = []
    for a in args:
        if isinstance(a, torch.Tensor):
            vals.append(ctypes.c_uint64(a.data_ptr()))
        elif isinstance(a, float):
            vals.append(ctypes.c_float(a))
        else:
            vals.append(ctypes.c_int32(a))
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    stream = torch.cuda.current_stream().cuda_stream
    check(cuda.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, ctypes.c_void_p(stream), ptrs, None), "launch")


def halo_cs(hn):
    r = hn % 32
    return hn - r + (8 if r <= 8 else 24 if r <= 24 else 40)


def halo_smem(bm, k):
    return 4 * (2 * (k * k * bm * 16) + 2 * 2 * 8 * halo_cs((8 + k - 1) * (16 + k - 1)))


def timed(fn, reps=10):
    for _ in range(2):
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
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a.double() - b).norm() / b.norm()).item()


variants = {}
for u in ["u1", "u3"]:
    try:
        variants[u] = load(f"{d}/halo_{u}.cubin")
    except Exception as e:
        print("no", u, e)
old = load(f"{d}/old.cubin")

# (cin, cout, h, w, k, up): the decoder's convs at 1024x1024 (input sizes)
SHAPES = [(384, 384, 128, 128, 3, 0), (384, 384, 256, 256, 3, 0), (384, 384, 256, 256, 3, 1),
          (192, 192, 512, 512, 3, 0), (384, 192, 512, 512, 3, 0), (192, 192, 512, 512, 3, 1),
          (96, 96, 1024, 1024, 3, 0), (192, 96, 1024, 1024, 3, 0), (384, 192, 512, 512, 1, 0),
          (192, 96, 1024, 1024, 1, 0), (96, 3, 1024, 1024, 3, 0), (40, 52, 37, 45, 3, 1)]
torch.manual_seed(0)
rows = []
for (cin, cout, h, w, k, up) in SHAPES:
    x = torch.randn(1, cin, h, w, device="cuda")
    wt = torch.randn(cout, cin, k, k, device="cuda") / (cin * k * k) ** 0.5
    b = torch.randn(cout, device="cuda") * 0.1
    xu = F.interpolate(x.double(), scale_factor=2, mode="nearest") if up else x.double()
    ref = F.conv2d(xu, wt.double(), b.double(), padding=k // 2)
    oh, ow = ref.shape[2], ref.shape[3]
    gflop = 2 * cin * cout * k * k * oh * ow / 1e9
    row = dict(shape=f"{cin}->{cout} k{k} {h}x{w}{' up' if up else ''}", gflop=gflop)
    out = torch.empty(1, cout, oh, ow, device="cuda")
    if cout <= 4:
        for name, m in variants.items():
            f = func(m, "moss_vae_conv_small")
            fc = func(m, "moss_ctl_vae_conv_small")
            grid = min((oh * ow + 255) // 256, 132 * 16)
            run = lambda f=f: launch(f, grid, 256, 0, [out, x, wt, b, cin, h, w, cout, k, up, 1])  # noqa: E731
            out.fill_(float("nan"))
            run()
            row[f"err_{name}"] = rel(out, ref)
            row[f"ms_{name}"] = timed(run)
            launch(fc, grid, 256, 0, [out, x, wt, b, cin, h, w, cout, k, up, 1])
            row["ctl"] = rel(out, ref)
    else:
        pad = lambda bm: -(-cout // bm) * bm - cout  # noqa: E731
        bm = 96 if pad(96) < pad(128) else 128
        sfx = f"b{bm}_k{k}"
        mb = -(-cout // bm)
        wf = torch.empty(mb * bm * cin * k * k * 2, device="cuda")
        blocks = -(-oh // 8) * -(-ow // 16) * mb
        smem = halo_smem(bm, k)
        for name, m in variants.items():
            fp = func(m, f"moss_vae_wprep_{sfx}")
            fh = func(m, f"moss_vae_conv_halo_{sfx}", smem)
            fc = func(m, f"moss_ctl_vae_conv_halo_{sfx}", smem)
            prep = lambda fp=fp: launch(fp, min((wf.numel() + 255) // 256, 132 * 16), 256, 0, [wf, wt, cout, cin])  # noqa: E731
            prep()
            run = lambda fh=fh: launch(fh, blocks, 256, smem, [out, x, wf, b, cin, h, w, cout, up, 0, 0])  # noqa: E731
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            row[f"err_{name}"] = rel(out, ref)
            row[f"ms_{name}"] = timed(run)
            row["ms_prep"] = timed(prep)
            out.fill_(float("nan"))
            launch(fc, blocks, 256, smem, [out, x, wf, b, cin, h, w, cout, up, 0, 0])
            row["ctl"] = rel(out, ref)
            if up:
                launch(fh, blocks, 256, smem, [out, x, wf, b, cin, h, w, cout, up, 1, 0])
                row["ctl_fold"] = rel(out, ref)
    # the older tap-major kernel (cin % 16 == 0) and cuDNN fp32
    if cin % 16 == 0:
        fo = func(old, f"moss_vae_conv_tf32x3t_k{k}")
        wp = wt.permute(0, 2, 3, 1).contiguous()
        blocks_o = -(-cout // 128) * -(-(oh * ow) // 128)
        run = lambda: launch(fo, blocks_o, 256, 0, [out, x, wp, b, cin, h, w, cout, k, up, 0])  # noqa: E731
        run()
        row["err_old"] = rel(out, ref)
        row["ms_old"] = timed(run)
    xf = F.interpolate(x, scale_factor=2, mode="nearest") if up else x
    row["ms_cudnn"] = timed(lambda: F.conv2d(F.interpolate(x, scale_factor=2, mode="nearest") if up else x, wt, b, padding=k // 2))
    row["err_cudnn"] = rel(F.conv2d(xf, wt, b, padding=k // 2), ref)
    for key in list(row):
        if key.startswith("ms_") and row[key] > 0:
            row["tf_" + key[3:]] = gflop / row[key]  # TFLOP/s useful
    print(row, flush=True)
    rows.append(row)
    del x, wt, out, ref, xu

print("\n| conv | GFLOP | err halo u1 | err u3 | control | old err | ms halo u1 | u3 | prep | old | cuDNN fp32 | TFLOP/s u1 / old / cuDNN |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
g = lambda r, k, f="%.2e": (f % r[k]) if k in r else "-"  # noqa: E731
for r in rows:
    print(f"| {r['shape']} | {r['gflop']:.1f} | {g(r, 'err_u1')} | {g(r, 'err_u3')} | {g(r, 'ctl')} {g(r, 'ctl_fold')} | {g(r, 'err_old')} | "
          f"{g(r, 'ms_u1', '%.3f')} | {g(r, 'ms_u3', '%.3f')} | {g(r, 'ms_prep', '%.3f')} | {g(r, 'ms_old', '%.3f')} | {g(r, 'ms_cudnn', '%.3f')} | "
          f"{g(r, 'tf_u1', '%.0f')} / {g(r, 'tf_old', '%.0f')} / {g(r, 'tf_cudnn', '%.0f')} |")
