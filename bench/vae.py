"""The VAE stage benchmark's PyTorch side (bench/run_all.sh runs it on the GPU machine, diffusers from .whl/).

  table WORK OUT SIZE CKPT  moss bench-vae results (OUT/vae_<tag>.json, WORK/vae_<tag>.f32) vs diffusers fp32, a table

  golden-z DIR            write DIR/<name>.z.f32 and DIR/<name>.pixels.u8 from golden/expected/<name>.safetensors
  cmp-png A.png B.png REF.u8   pixels of two PNGs against each other and against raw HWC bytes
  make-ckpt DIR           a full-size random checkpoint (decoder widths 96/192/384/384; the rest copied from
                          golden/tiny-a) and random latents DIR/z1024.f32, DIR/z2048.f32
  ref DIR SIZE            diffusers fp32 (TF32 off) timing and picture, float64 picture, then the error table
                          against moss's DIR/moss<SIZE>.f32 / .rgb (written by `moss bench-vae`)
"""
import json, math, os, shutil, sys, time

import numpy as np
import torch


def golden_z(out):
    from safetensors.numpy import load_file
    for name in ("tiny-a", "tiny-b"):
        t = load_file(f"golden/expected/{name}.safetensors")
        t["vae.z"].astype("<f4").tofile(f"{out}/{name}.z.f32")
        t["vae.pixels"].astype(np.uint8).tofile(f"{out}/{name}.pixels.u8")
        print(name, "z", t["vae.z"].shape, "pixels", t["vae.pixels"].shape)


def cmp_png(a, b, ref):
    from PIL import Image
    pa = np.asarray(Image.open(a).convert("RGB")).astype(np.int32)
    pb = np.asarray(Image.open(b).convert("RGB")).astype(np.int32)
    r = np.fromfile(ref, dtype=np.uint8).reshape(pa.shape).astype(np.int32)
    for what, x, y in (("cuda vs cpu", pa, pb), ("cuda vs golden", pa, r), ("cpu vs golden", pb, r)):
        d = np.abs(x - y)
        print(f"  {what:16s} {pa.shape}: {int((d > 0).sum())} values differ, {int((d > 1).sum())} by more than 1, max {int(d.max())}")


def init_vae(vae, gen):
    # As golden/make_golden.py's init_vae: weights N(0, 1/fan_in), GroupNorm affine near identity.
    with torch.no_grad():
        for _, m in vae.named_modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                m.weight.normal_(0, 1 / math.sqrt(m.weight[0].numel()), generator=gen)
                if m.bias is not None:
                    m.bias.normal_(0, 0.02, generator=gen)
            elif isinstance(m, torch.nn.GroupNorm):
                m.weight.normal_(1.0, 0.1, generator=gen)
                m.bias.normal_(0, 0.05, generator=gen)
        bn = vae.bn
        bn.running_mean.normal_(0, 0.3, generator=gen)
        bn.running_var.copy_(torch.exp(torch.randn(bn.running_var.shape, generator=gen) * 0.4) * 0.8)
        bn.num_batches_tracked.fill_(1000)


def full_vae():
    """The full-size FLUX.2 small decoder (widths 96/192/384/384) with init_vae's random weights."""
    from diffusers import AutoencoderKLFlux2
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, block_out_channels=(32, 32, 32, 32),
                             decoder_block_out_channels=(96, 192, 384, 384), layers_per_block=2, latent_channels=32,
                             norm_num_groups=32, act_fn="silu", sample_size=1024, use_quant_conv=True,
                             use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4,
                             batch_norm_momentum=0.1, patch_size=(2, 2))
    init_vae(vae, torch.Generator().manual_seed(7))
    return vae


def make_ckpt(out):
    ck = f"{out}/full"
    if os.path.exists(ck):
        shutil.rmtree(ck)
    shutil.copytree("golden/tiny-a", ck, ignore=shutil.ignore_patterns("vae"))
    vae = full_vae()
    vae.save_pretrained(f"{ck}/vae", safe_serialization=True)
    g = torch.Generator().manual_seed(11)
    for side in (64, 1024, 2048):
        torch.randn(1, 128, side // 16, side // 16, generator=g).numpy().astype("<f4").tofile(f"{out}/z{side}.f32")
    print("checkpoint", ck, "decoder params", sum(p.numel() for n, p in vae.named_parameters() if not n.startswith("encoder")))


def to_input(vae, z):
    bn = vae.bn
    z = z * torch.sqrt(bn.running_var.to(z.dtype) + bn.eps).view(1, -1, 1, 1) + bn.running_mean.to(z.dtype).view(1, -1, 1, 1)
    b, c, h, w = z.shape
    return z.view(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, 2 * h, 2 * w)


def tf32_off():
    try:
        torch.backends.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    except Exception as e:  # older torch
        print("fp32_precision API:", e)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def stats(img, ref):
    """img, ref: float [3,H,W] (clamped here). Pixels of img via its own dtype's formula."""
    a = img.double().clamp(-1, 1)
    r = ref.double().clamp(-1, 1)
    d = (a - r).abs()
    return float(d.mean()), float(d.max())


def px_f64(ref):
    return ((ref.double().clamp(-1, 1) / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)


def px_f32(img):
    return ((img.float().clamp(-1, 1) / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)


def off(px, ref_px):
    d = (px.int() - ref_px.int()).abs()
    return int((d > 0).sum()), int((d > 1).sum()), int(d.max())


@torch.no_grad()
def ref(out, side):
    from diffusers import AutoencoderKLFlux2
    tf32_off()
    dev = os.environ.get("VAE_REF_DEV", "cuda")
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    z = torch.from_numpy(np.fromfile(f"{out}/z{side}.f32", dtype="<f4").reshape(1, 128, side // 16, side // 16))
    vae = AutoencoderKLFlux2.from_pretrained(f"{out}/full/vae", torch_dtype=torch.float32).to(dev).eval()
    zg = z.to(dev)
    times = []
    for i in range(4):
        sync()
        t = time.perf_counter()
        img32 = vae.decode(to_input(vae, zg)).sample[0]
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    t32 = sorted(times[1:])[1]
    img32 = img32.cpu()
    # TF32 on, for reference
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    tt = []
    for i in range(3):
        sync()
        t = time.perf_counter()
        imgtf = vae.decode(to_input(vae, zg)).sample[0]
        sync()
        tt.append((time.perf_counter() - t) * 1e3)
    ttf = sorted(tt[1:])[0]
    imgtf = imgtf.cpu()
    tf32_off()
    vae = vae.double()
    img64 = vae.decode(to_input(vae, zg.double())).sample[0].cpu()
    del vae
    if dev == "cuda":
        torch.cuda.empty_cache()
    ref_px = px_f64(img64)
    h = w = side
    moss = torch.from_numpy(np.fromfile(f"{out}/moss{side}.f32", dtype="<f4").reshape(3, h, w))
    moss_px = torch.from_numpy(np.fromfile(f"{out}/moss{side}.rgb", dtype=np.uint8).reshape(h, w, 3))
    mj = json.load(open(f"{out}/moss{side}.json"))
    rows = []
    for name, img, px, ms in (("moss cuda fp32 (default kernels)", moss, moss_px, mj["forward_ms_median"]),
                              ("diffusers fp32, TF32 off", img32, px_f32(img32), t32),
                              ("diffusers fp32, TF32 on", imgtf, px_f32(imgtf), ttf)):
        mean, mx = stats(img, img64)
        n1, n2, dm = off(px, ref_px)
        rows.append(dict(what=name, side=side, mean_abs=mean, max_abs=mx, px_off=n1, px_off_gt1=n2, px_maxdiff=dm, ms=ms))
    # VAE_EXTRA="name=PREFIX,...": more moss outputs (PREFIX.f32 / .rgb / .json of `moss bench-vae`,
    # e.g. another build or MOSS_KERNELS=portable) against the same float64 decode
    for item in filter(None, os.environ.get("VAE_EXTRA", "").split(",")):
        name, pre = item.rsplit("=", 1)  # the name may hold '=' (e.g. "MOSS_KERNELS=portable")
        img = torch.from_numpy(np.fromfile(f"{pre}.f32", dtype="<f4").reshape(3, h, w))
        px = torch.from_numpy(np.fromfile(f"{pre}.rgb", dtype=np.uint8).reshape(h, w, 3))
        mean, mx = stats(img, img64)
        n1, n2, dm = off(px, ref_px)
        rows.append(dict(what=name, side=side, mean_abs=mean, max_abs=mx, px_off=n1, px_off_gt1=n2, px_maxdiff=dm,
                         ms=json.load(open(f"{pre}.json"))["forward_ms_median"],
                         max_abs_vs_default=float((img.double() - moss.double()).abs().max())))
    rows.append(dict(what="moss decode_rgb8 (upload+forward+bytes back)", side=side, ms=mj["decode_rgb8_ms_median"]))
    # moss's own rgb8 against its float output (the GPU rounding path)
    n1, _, _ = off(moss_px, px_f32(moss))
    print(f"  moss rgb8 bytes vs its float output rounded in torch fp32: {n1} values differ")
    print(f"  diffusers fp32 times {['%.1f' % t for t in times]}, TF32 {['%.1f' % t for t in tt]}")
    for r in rows:
        print("  " + json.dumps(r))
    with open(f"{out}/table{side}.json", "w") as f:
        json.dump(rows, f)


def table(work, out, side, ckpt):
    """The speed table: every OUT/vae_<tag>.json (`moss bench-vae`, one per binary; its picture in
    WORK/vae_<tag>.f32) next to diffusers fp32 (TF32 off) on the same latents WORK/z<side>.f32 and
    the checkpoint CKPT/vae, timed with CUDA events (median of 5 after a warm-up)."""
    import glob
    from diffusers import AutoencoderKLFlux2
    tf32_off()
    z = torch.from_numpy(np.fromfile(f"{work}/z{side}.f32", dtype="<f4").reshape(1, 128, side // 16, side // 16)).cuda()
    vae = AutoencoderKLFlux2.from_pretrained(f"{ckpt}/vae", torch_dtype=torch.float32).cuda().eval()
    from timing import cuda_ms
    with torch.no_grad():
        ref_ms, ts, img = cuda_ms(lambda: vae.decode(to_input(vae, z)).sample[0], 5)
    img = img.double().cpu()
    print(f"| VAE decode {side}x{side} | ms (median) | speed-up | max abs vs diffusers fp32 |")
    print("|---|---:|---:|---:|")
    for f in sorted(glob.glob(f"{out}/vae_*.json")):
        tag = os.path.basename(f)[4:-5]
        ms = json.load(open(f))["forward_ms_median"]
        m = torch.from_numpy(np.fromfile(f"{work}/vae_{tag}.f32", dtype="<f4").reshape(3, side, side)).double()
        print(f"| moss {tag} (fp32) | {ms:.1f} | {ref_ms / ms:.2f}x | {float((m - img).abs().max()):.2e} |")
    print(f"| diffusers AutoencoderKLFlux2 fp32, TF32 off | {ref_ms:.1f} | 1.00x | 0 |")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "golden-z":
        golden_z(sys.argv[2])
    elif cmd == "cmp-png":
        cmp_png(*sys.argv[2:5])
    elif cmd == "make-ckpt":
        make_ckpt(sys.argv[2])
    elif cmd == "ref":
        ref(sys.argv[2], int(sys.argv[3]))
    elif cmd == "table":
        table(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
