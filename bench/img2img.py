#!/usr/bin/env python3
"""Pictures in (issue 41): what img2img costs beside text-to-image, and the VAE encoder beside diffusers'.

    python3 bench/img2img.py BIN CKPT OUT_DIR

BIN is the moss binary (release, with the CUDA kernels), CKPT a full-size checkpoint (bench/full_ckpt.sh).
Its VAE there has the FLUX.2 decoder but a narrow encoder, so OUT_DIR/ckpt is CKPT with every entry linked
but `vae/`, which is the full FLUX.2 VAE (encoder 128/256/512/512, decoder 96/192/384/384, random weights
by bench/vae.py's `init_vae`; VAE=keep links CKPT's own instead). Environment: DEVICE (cuda), SIZE
(1024x1024), STEPS (50), STRENGTH (0.6), SIDES (1024,2048: the encoder's pictures), REPS (5), REPEAT (2).

1. `moss generate --json` from text and from a SIZE picture at STRENGTH (`--init-image`), alternating,
   REPEAT each (every run a fresh process): the medians of moss's own stage times (`image_encode_s`,
   `denoise_compute_s`, `decode_compute_s`, `total_s`) and the ratio of img2img's denoise (and denoise plus
   encode) to text-to-image's; diffusers' `get_timesteps` runs `STEPS - int(STEPS - STEPS*STRENGTH)` steps
   (30 of 50 at 0.6), so the denoise ratio should be about 0.6.
2. The VAE encoder alone at each side of SIDES: `moss bench-vae-encode` (median of REPS after a warm-up,
   CUDA-synchronised; whole or in strips as its plan says) beside diffusers' `AutoencoderKLFlux2.encode` with
   the Flux2 pipelines' glue (`Flux2Pipeline._encode_vae_image`: the latent mean, patchify, BatchNorm
   normalisation) in fp32 with TF32 off and on (CUDA events, median of REPS), on the same picture and
   weights; the latents' max abs and relative L2 difference against diffusers' fp32 (TF32 off).

Tables on stdout and in OUT_DIR/img2img.md. A smoke run on the CPU (tiny-a's own VAE; the diffusers side
on the CPU too):
DEVICE=cpu VAE=keep SIZE=64x64 STEPS=8 SIDES=64,128 REPS=2 REPEAT=1 python3 bench/img2img.py target/debug/moss golden/tiny-a /tmp/i
"""

import json
import os
import statistics
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = os.environ.get("DEVICE", "cuda")
SIZE = os.environ.get("SIZE", "1024x1024")
STEPS = int(os.environ.get("STEPS", "50"))
STRENGTH = float(os.environ.get("STRENGTH", "0.6"))
SIDES = [int(s) for s in os.environ.get("SIDES", "1024,2048").split(",")]
REPS = int(os.environ.get("REPS", "5"))
REPEAT = int(os.environ.get("REPEAT", "2"))
VAE = os.environ.get("VAE", "full")
PROMPT = "a lighthouse at dusk, oil painting"


def checkpoint(ckpt, out):
    """OUT/ckpt: CKPT's entries linked, its vae/ the full FLUX.2 VAE (or CKPT's own with VAE=keep)."""
    ck = os.path.join(out, "ckpt")
    os.makedirs(ck, exist_ok=True)
    for name in os.listdir(ckpt):
        if name == "vae" and VAE != "keep":
            continue
        dst = os.path.join(ck, name)
        if not os.path.lexists(dst):
            os.symlink(os.path.abspath(os.path.join(ckpt, name)), dst)
    if VAE != "keep" and not os.path.exists(os.path.join(ck, "vae", "config.json")):
        import torch
        from diffusers import AutoencoderKLFlux2
        sys.path.insert(0, HERE)
        from vae import init_vae
        torch.manual_seed(0)
        vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512),
                                 decoder_block_out_channels=(96, 192, 384, 384), layers_per_block=2, latent_channels=32,
                                 norm_num_groups=32, act_fn="silu", sample_size=1024, use_quant_conv=True,
                                 use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4,
                                 batch_norm_momentum=0.1, patch_size=(2, 2))
        init_vae(vae, torch.Generator().manual_seed(7))
        vae.save_pretrained(os.path.join(ck, "vae"), safe_serialization=True)
        n = sum(p.numel() for k, p in vae.named_parameters() if k.startswith("encoder") or k.startswith("quant_conv"))
        print(f"vae written: the full FLUX.2 VAE, encoder {n / 1e6:.1f} M parameters")
    return ck


def picture(out, w, h):
    """A deterministic RGB picture with structure at every scale (gradients, rings, noise)."""
    from PIL import Image
    path = os.path.join(out, f"pic-{w}x{h}.png")
    if not os.path.exists(path):
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        r = np.hypot(x - 0.4 * w, y - 0.6 * h) / max(w, h)
        noise = np.random.default_rng(5).normal(0, 12, (h, w, 3))
        rgb = np.stack([255 * x / w, 255 * y / h, 127 + 120 * np.sin(40 * r)], axis=-1) + noise
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(path)
    return path


def run(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def generate_table(bin_, ck, out):
    w, h = (int(v) for v in SIZE.split("x"))
    init = picture(out, w, h)
    base = [bin_, "generate", "--model", ck, "--device", DEVICE, "--prompt", PROMPT, "--seed", "42", "--size", SIZE,
            "--steps", str(STEPS), "--json", "--force"]
    runs = {"t2i": [], "i2i": []}
    for r in range(REPEAT):
        for kind, extra in (("t2i", []), ("i2i", ["--init-image", init, "--strength", str(STRENGTH)])):
            j = json.loads(run(base + extra + ["-o", os.path.join(out, f"{kind}-{r}.png")]).strip().splitlines()[-1])
            runs[kind].append(j["timings"])
            print(f"{kind} run {r}: {json.dumps(j['timings'])}")
    med = {k: {f: statistics.median(t[f] for t in v) for f in v[0]} for k, v in runs.items()}
    t_start = int(max(STEPS - min(STEPS * STRENGTH, STEPS), 0))
    lines = [f"| {SIZE}, {STEPS} steps, {DEVICE} | image encode s | denoise compute s | decode compute s | total s |",
             "|---|---:|---:|---:|---:|"]
    for k, what in (("t2i", "text to image"), ("i2i", f"img2img, strength {STRENGTH} ({STEPS - t_start} steps)")):
        m = med[k]
        lines.append(f"| {what} | {m['image_encode_s']:.3f} | {m['denoise_compute_s']:.3f} | {m['decode_compute_s']:.3f} | {m['total_s']:.3f} |")
    d0, d1, e1 = med["t2i"]["denoise_compute_s"], med["i2i"]["denoise_compute_s"], med["i2i"]["image_encode_s"]
    lines.append("")
    lines.append(f"img2img denoise / text-to-image denoise: {d1 / d0:.3f} (steps {(STEPS - t_start) / STEPS:.3f}); "
                 f"with the encoder: {(d1 + e1) / d0:.3f}")
    return "\n".join(lines)


def encoder_table(bin_, ck, out):
    import torch
    from diffusers import AutoencoderKLFlux2
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
    from PIL import Image
    sys.path.insert(0, HERE)
    from timing import cuda_ms
    from vae import tf32_off
    import types

    dev = "cuda" if DEVICE.startswith("cuda") else "cpu"
    tf32_off()
    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(ck, "vae"), torch_dtype=torch.float32).to(dev).eval()
    holder = types.SimpleNamespace(vae=vae, _patchify_latents=Flux2Pipeline._patchify_latents)
    lines = ["| VAE encoder | picture | ms (median) | speed-up | latents max abs vs diffusers fp32 | rel L2 |",
             "|---|---|---:|---:|---:|---:|"]
    for side in SIDES:
        pic = picture(out, side, side)
        zf = os.path.join(out, f"moss-enc-{side}.f32")
        j = json.loads(run([bin_, "bench-vae-encode", "--model", ck, "--device", DEVICE, "--image", pic, "--reps", str(REPS),
                            "--out-f32", zf]).strip())
        print(f"moss bench-vae-encode {side}: {json.dumps(j)}")
        rgb = torch.from_numpy(np.array(Image.open(pic).convert("RGB"))).permute(2, 0, 1)[None].float()
        x = ((rgb / 255.0) * 2.0 - 1.0).to(dev)
        enc = lambda: Flux2Pipeline._encode_vae_image(holder, image=x, generator=None)  # noqa: E731
        with torch.no_grad():
            tf32_off()
            ref_ms, _, ref = cuda_ms(enc, REPS)
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"
            tf_ms, _, tf = cuda_ms(enc, REPS)
            tf32_off()
        ref = ref.double().cpu()
        moss = torch.from_numpy(np.fromfile(zf, dtype="<f4").reshape(ref.shape)).double()

        def err(a):
            return float((a - ref).abs().max()), float((a - ref).norm() / ref.norm())

        ma, rl = err(moss)
        ta, tl = err(tf.double().cpu())
        ms = j["encode_ms_median"]
        lines.append(f"| moss (fp32, {j['split']}) | {side}x{side} | {ms:.1f} | {ref_ms / ms:.2f}x | {ma:.2e} | {rl:.2e} |")
        lines.append(f"| diffusers AutoencoderKLFlux2.encode fp32, TF32 off | {side}x{side} | {ref_ms:.1f} | 1.00x | 0 | 0 |")
        lines.append(f"| diffusers AutoencoderKLFlux2.encode fp32, TF32 on | {side}x{side} | {tf_ms:.1f} | {ref_ms / tf_ms:.2f}x | {ta:.2e} | {tl:.2e} |")
        if dev == "cuda":
            torch.cuda.empty_cache()
    return "\n".join(lines)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bin_, ckpt, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    ck = checkpoint(ckpt, out)
    parts = [generate_table(bin_, ck, out), encoder_table(bin_, ck, out)]
    text = "\n\n".join(parts) + "\n"
    print(text)
    with open(os.path.join(out, "img2img.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
