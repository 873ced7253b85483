"""The DiT stage benchmark's PyTorch side (bench/run_all.sh runs it on the GPU machine).

    python3 bench/dit.py write DIR            # random full-size DiT in the real layout + embeds
    python3 bench/dit.py torch DIR MOSS_VEL.f32 [MOSS_FP32_VEL.f32] OUT.json
    python3 bench/dit.py tiny CK CPU_LAT CUDA_LAT [...]   # golden comparisons (prints JSON)
    python3 bench/dit.py table OUTDIR          # the table: OUTDIR/dit_<tag>.json (moss bench-dit) vs dit_torch.json

`write` builds golden/dit_ref.py's MOSSImageTransformer at the real configuration (42 blocks, dim
3072, 24 heads of 128, ffn 8192, text_dim 4096) on the GPU with torch's default init (norm weights
1 + N(0, 0.1²); the shared modulation scaled x4 so the gates are O(0.3) and the blocks matter),
saves its bf16 state dict as transformer/diffusion_pytorch_model.safetensors with the config,
plus the minimal rest of a pipeline folder that `Checkpoint::open` reads (model_index.json,
scheduler, the tiny-a text_encoder/vae configs, an empty tokenizer/), and random bf16 hidden
states (cond L=128, uncond L=12, N(0,1)) in the moss embeds format (crates/moss-core/src/embeds.rs).

`torch` runs the reference on the same weights and inputs: one forward of the cond pass at the
first step's timestep on the seed-42 torch.randn noise, in bf16 eager (SDPA), bf16 with every
block torch.compile'd, and fp32 (SDPA, TF32 off); relative L2 of the velocities; and 50 guided
steps (CFG 3, uncond skipping block 22, the spec's loop) eager and compiled, timed with CUDA
events after a warm-up.
"""

import json
import os
import shutil
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "golden"))
import dit_ref  # noqa: E402

FULL = dict(dim=3072, ffn_dim=8192, num_heads=24, num_layers=42, text_dim=4096, freq_dim=256,
            latent_channels=128, rope_base=10000.0)
SEED, STEPS, GUIDANCE, SIZE = 42, 50, 3.0, 1024
L_COND, L_UNCOND = 128, 12
DEV = "cuda"
if os.environ.get("DIT_FULL_SMOKE"):  # a CPU smoke test of this script at a tiny size
    FULL.update(dim=256, ffn_dim=128, num_heads=2, num_layers=3, text_dim=64)
    SIZE, STEPS, DEV = 64, 3, "cpu"


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


def write(d):
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device(DEV):
        m = dit_ref.MOSSImageTransformer(**FULL).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith(".weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
        m.shared_block_modulation.weight.mul_(4)
        m.shared_block_modulation.bias.mul_(4)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in m.state_dict().items()}
    del m
    os.makedirs(f"{d}/transformer", exist_ok=True)
    from safetensors.torch import save_file

    save_file(sd, f"{d}/transformer/diffusion_pytorch_model.safetensors", metadata={"format": "pt"})
    cfg = {"_class_name": "MOSSImageTransformer", "_diffusers_version": "0.42.1", **FULL}
    json.dump(cfg, open(f"{d}/transformer/config.json", "w"), indent=2)
    tiny = os.path.join(HERE, "..", "golden", "tiny-a")
    shutil.copy(f"{tiny}/model_index.json", f"{d}/model_index.json")
    for c in ["scheduler", "text_encoder", "vae", "tokenizer"]:
        os.makedirs(f"{d}/{c}", exist_ok=True)
    shutil.copy(f"{tiny}/scheduler/scheduler_config.json", f"{d}/scheduler/")
    shutil.copy(f"{tiny}/text_encoder/config.json", f"{d}/text_encoder/")
    shutil.copy(f"{tiny}/vae/config.json", f"{d}/vae/")
    g = torch.Generator().manual_seed(1)
    cond = torch.randn(L_COND, FULL["text_dim"], generator=g).to(torch.bfloat16)
    unc = torch.randn(L_UNCOND, FULL["text_dim"], generator=g).to(torch.bfloat16)
    meta = {"format": "moss-embeds-1", "model": "random-full-size", "prompt": "(random hidden states)",
            "negative": "(random hidden states)", "prompt_ids": json.dumps(list(range(L_COND))),
            "negative_ids": json.dumps(list(range(L_UNCOND)))}
    save_file({"cond": cond, "uncond": unc}, f"{d}/embeds.safetensors", metadata=meta)
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {n / 1e9:.2f} B parameters ({n * 2 / 2**30:.1f} GiB bf16) to {d} in {time.time() - t0:.0f} s", flush=True)


def embeds(d):
    from safetensors.torch import load_file

    e = load_file(f"{d}/embeds.safetensors")
    return e["cond"].to(DEV), e["uncond"].to(DEV)


def noise():
    h = SIZE // 16
    return torch.randn([1, 128, h, h], generator=torch.Generator().manual_seed(SEED), dtype=torch.float32).to(DEV)


def read_f32(path):
    """A raw little-endian f32 latent/velocity file ([1, 128, SIZE/16, SIZE/16], as moss writes them) on DEV."""
    import numpy as np

    h = SIZE // 16
    return torch.from_numpy(np.fromfile(path, dtype="<f4")).reshape(1, 128, h, h).to(DEV)


def compile_blocks(m, x, t, c, u):
    """torch.compile every block of `m` (on the GPU; the CPU smoke test stays eager) and warm it up
    on the loop's three shapes (cond, uncond, uncond skipping block 22); returns the seconds."""
    for blk in m.layers:
        if DEV == "cuda":
            blk.compile()
    s = time.time()
    m(x, t, c, impl="sdpa")
    m(x, t, u, impl="sdpa")
    m(x, t, u, skip_layers=(22,), impl="sdpa")
    sync()
    return time.time() - s


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def cuda_ms(fn, reps):
    from timing import cuda_ms as timed

    return timed(fn, reps, warmup=0)


@torch.no_grad()
def torch_bench(d, moss_vel, moss_fp32_vel, out_json):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {}
    c, u = embeds(d)
    x = noise()
    sig = dit_ref.sigmas_for(STEPS)
    t = float(sig[0] * dit_ref.TIME_SCALE)
    res["t"] = t
    mv = read_f32(moss_vel)

    m = dit_ref.load_transformer(f"{d}/transformer", torch.bfloat16, DEV)
    fwd = lambda: m(x, t, c, impl="sdpa")  # noqa: E731
    fwd()
    ms, all_ms, v_eager = cuda_ms(fwd, 5)
    res["bf16_eager_forward_ms"], res["bf16_eager_forward_all_ms"] = ms, all_ms
    loop = lambda: dit_ref.sample(m, x, c, u, STEPS, GUIDANCE)  # noqa: E731
    sync()
    s = time.time()
    lat_eager = loop()
    sync()
    res["bf16_eager_50_steps_s"] = time.time() - s
    print("eager:", json.dumps(res), flush=True)

    res["compile_warmup_s"] = compile_blocks(m, x, t, c, u)
    ms, all_ms, v_comp = cuda_ms(fwd, 5)
    res["bf16_compiled_forward_ms"], res["bf16_compiled_forward_all_ms"] = ms, all_ms
    sync()
    s = time.time()
    lat_comp = loop()
    sync()
    res["bf16_compiled_50_steps_s"] = time.time() - s
    print("compiled:", json.dumps(res), flush=True)
    del m
    if DEV == "cuda":
        torch.cuda.empty_cache()

    m = dit_ref.load_transformer(f"{d}/transformer", torch.float32, DEV)
    v32 = m(x, t, c, impl="sdpa")
    sync()
    res["rel_l2"] = {
        "moss_bf16_vs_torch_bf16_eager": rel(mv, v_eager),
        "moss_bf16_vs_torch_bf16_compiled": rel(mv, v_comp),
        "torch_bf16_compiled_vs_eager": rel(v_comp, v_eager),
        "moss_bf16_vs_torch_fp32": rel(mv, v32),
        "torch_bf16_eager_vs_torch_fp32": rel(v_eager, v32),
        "torch_bf16_compiled_vs_torch_fp32": rel(v_comp, v32),
        "latents_50_steps_torch_compiled_vs_eager": rel(lat_comp, lat_eager),
    }
    if moss_fp32_vel and os.path.exists(moss_fp32_vel):
        m32 = read_f32(moss_fp32_vel)
        res["rel_l2"]["moss_fp32_vs_torch_fp32"] = rel(m32, v32)
    res["velocity_rms_fp32"] = float(v32.double().pow(2).mean().sqrt())
    json.dump(res, open(out_json, "w"), indent=1)
    print(json.dumps(res, indent=1), flush=True)



@torch.no_grad()
def compiled_only(d, moss_vel, out_json):
    """The short form of `torch` for a call with little device time: only the torch.compile'd
    bf16 reference (per block, SDPA): compile warm-up on all three shapes, one forward (median of
    3), 50 guided steps (one run), and moss's bf16 velocity against it."""
    res = {}
    c, u = embeds(d)
    x = noise()
    t = float(dit_ref.sigmas_for(STEPS)[0] * dit_ref.TIME_SCALE)
    mv = read_f32(moss_vel)
    m = dit_ref.load_transformer(f"{d}/transformer", torch.bfloat16, DEV)
    res["compile_warmup_s"] = compile_blocks(m, x, t, c, u)
    fwd = lambda: m(x, t, c, impl="sdpa")  # noqa: E731
    ms, all_ms, v = cuda_ms(fwd, 3)
    res["bf16_compiled_forward_ms"], res["bf16_compiled_forward_all_ms"] = ms, all_ms
    res["moss_bf16_vs_torch_bf16_compiled_rel_l2"] = rel(mv, v)
    sync()
    s = time.time()
    dit_ref.sample(m, x, c, u, STEPS, GUIDANCE)
    sync()
    res["bf16_compiled_50_steps_s"] = time.time() - s
    json.dump(res, open(out_json, "w"), indent=1)
    print(json.dumps(res), flush=True)

def tiny(name, cpu_lat, *cuda_lats):
    import numpy as np
    from safetensors.numpy import load_file

    g = load_file(os.path.join(HERE, "..", "golden", "expected", f"{name}.safetensors"))["loop.latents"].ravel().astype(np.float64)
    cpu = np.fromfile(cpu_lat, dtype="<f4").astype(np.float64)
    out = {"checkpoint": name, "moss_cpu_vs_golden": float(np.linalg.norm(cpu - g) / np.linalg.norm(g))}
    for p in cuda_lats:
        v = np.fromfile(p, dtype="<f4").astype(np.float64)
        k = os.path.basename(p)
        out[f"{k}_vs_moss_cpu"] = float(np.linalg.norm(v - cpu) / np.linalg.norm(cpu))
        out[f"{k}_vs_golden"] = float(np.linalg.norm(v - g) / np.linalg.norm(g))
    print(json.dumps(out))


def table(o):
    """The speed table from OUT: dit_<tag>.json (`moss bench-dit`, one per binary) and dit_torch.json."""
    import glob

    tr = json.load(open(f"{o}/dit_torch.json"))
    rows = []
    for f in sorted(glob.glob(f"{o}/dit_*.json")):
        tag = os.path.basename(f)[4:-5]
        if tag != "torch":
            m = json.load(open(f))
            rows.append((f"moss {tag} (bf16)", m["forward_ms_median"], m.get("loop_s")))
    rows += [
        ("torch bf16 eager (SDPA)", tr["bf16_eager_forward_ms"], tr["bf16_eager_50_steps_s"]),
        ("torch bf16 torch.compile per block (SDPA)", tr["bf16_compiled_forward_ms"], tr["bf16_compiled_50_steps_s"]),
    ]
    print("| DiT 1024x1024, L=128/12 | one forward (ms, median of 5) | 50 guided steps (s) |")
    print("|---|---:|---:|")
    for n, f, l in rows:
        print(f"| {n} | {f:.1f} | {l:.2f} |" if l is not None else f"| {n} | {f:.1f} | - |")
    print("\n| velocity, relative L2 | value |\n|---|---:|")
    for k, v in tr["rel_l2"].items():
        print(f"| {k} | {v:.3e} |")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2])
    elif cmd == "torch":
        torch_bench(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 5 else None, sys.argv[-1])
    elif cmd == "compiled":
        compiled_only(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "tiny":
        tiny(*sys.argv[2:])
    elif cmd == "table":
        table(sys.argv[2])
