"""Writes golden/expected/img2img_e2e.{json,safetensors} and golden/expected/mask-64x64.png: img2img and
inpainting end to end on tiny-a (64x64), the model and the recipe from upstream code: the init picture
(`expected/enc-64x64.png`, written by make_vae_encoder.py) encoded by diffusers' `AutoencoderKLFlux2` with the
Flux2 pipelines' glue (`Flux2Pipeline._encode_vae_image`: the latent mean, patchify, BatchNorm
normalisation); the schedule, start and steps by diffusers 0.42.1's `FlowMatchEulerDiscreteScheduler` over the
MOSS sigmas (`dit_ref.sigmas_for`; `get_timesteps` and `scale_noise` as `Flux2KleinInpaintPipeline` calls
them); the velocities by the project's torch DiT (`dit_ref`, fp32) with classifier-free guidance 3 and block 22
skipped in the unconditional pass (spec 5.3); the mask by the inpaint pipeline's mask processor and
`prepare_mask_latents`, its latent blend after every step; the latents decoded by `dit_ref.decode`.

The prompt contexts are tiny-a's golden hidden states (`expected/tiny-a.safetensors`, `plain` and `empty`)
rounded to bf16, as the pipeline hands them to the DiT. Noise: `torch.randn([1, 128, 4, 4])` of seed 42 (CPU
generator). `z0`: the init picture's latents; `mask.latent` [1, 1, 4, 4]: the mask at the latent grid. Per
case (json `cases`: name, steps, strength, mask, t_start): `<name>.start`, `<name>.latents` (after the last step), `<name>.pixels` u8 [64, 64, 3] (the
decoded latents: for inpainting, before moss's composite over the input). Run after make_golden.py and
make_vae_encoder.py. Deterministic (CPU, fp32).
"""
from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402
import make_golden  # noqa: E402

EXPECTED = os.path.join(HERE, "expected")
SIZE = 64
SEED = 42
GUIDANCE = 3.0
SKIP = (22,)
# (name, steps, strength, mask): img2img at the spec's strength, and an inpainting run.
CASES = [("img2img", 8, 0.6, None), ("inpaint", 8, 0.8, "mask-64x64.png")]


def mask_pixels() -> np.ndarray:
    """A uint8 [64, 64] mask: a disc off the latent grid (cells partly inside) and a bar."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    m = np.zeros(x.shape)
    m[np.hypot(x - 27, y - 30) < 15] = 255
    m[50:60, 8:56] = 255
    return m.astype(np.uint8)


def main():
    import diffusers
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
    from diffusers.pipelines.flux2.pipeline_flux2_klein_inpaint import Flux2KleinInpaintPipeline as P
    from safetensors.torch import load_file, save_file

    torch.set_grad_enabled(False)
    root = os.path.join(HERE, "tiny-a")
    golden = load_file(os.path.join(EXPECTED, "tiny-a.safetensors"))
    with open(os.path.join(EXPECTED, "tiny-a.json")) as f:
        meta_a = json.load(f)
    key = {p["name"]: p["key"] for p in meta_a["prompts"]}
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    pos, neg = bf(golden[key["plain"]]), bf(golden[key["empty"]])
    prompt = next(p["text"] for p in meta_a["prompts"] if p["name"] == "plain")

    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(root, "vae"), torch_dtype=torch.float32).eval()
    dit = dit_ref.load_transformer(os.path.join(root, "transformer"), dtype=torch.float32)
    init_png = f"enc-{SIZE}x{SIZE}.png"
    img = Image.open(os.path.join(EXPECTED, init_png))
    assert img.mode == "RGB" and img.size == (SIZE, SIZE)
    x = VaeImageProcessor(vae_scale_factor=16).preprocess(img, height=SIZE, width=SIZE).float()
    holder = types.SimpleNamespace(vae=vae, _patchify_latents=Flux2Pipeline._patchify_latents)
    z0 = Flux2Pipeline._encode_vae_image(holder, image=x, generator=None)
    h = w = SIZE // 16
    noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(SEED), dtype=torch.float32)

    mask_png = f"mask-{SIZE}x{SIZE}.png"
    Image.fromarray(mask_pixels(), mode="L").save(os.path.join(EXPECTED, mask_png))
    mask_processor = Flux2ImageProcessor(vae_scale_factor=16, vae_latent_channels=32, do_normalize=False,
                                         do_binarize=True, do_convert_rgb=False, do_convert_grayscale=True)
    cond = mask_processor.preprocess(Image.open(os.path.join(EXPECTED, mask_png)), height=SIZE, width=SIZE)
    mh = types.SimpleNamespace(vae_scale_factor=8, _pack_latents=P._pack_latents)
    packed = P.prepare_mask_latents(mh, cond, 1, 1, SIZE, SIZE, torch.float32, "cpu")
    mask = packed.reshape(1, h, w, 1).permute(0, 3, 1, 2).contiguous()

    tensors = {"z0": z0.contiguous(), "noise": noise, "mask.latent": mask}
    cases = []
    for name, steps, strength, mask_file in CASES:
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)
        moss_sigmas = dit_ref.sigmas_for(steps)
        sched.set_timesteps(sigmas=moss_sigmas[:-1].tolist())
        assert torch.equal(sched.sigmas, moss_sigmas), "the scheduler changed the MOSS sigmas"
        timesteps, left = P.get_timesteps(types.SimpleNamespace(scheduler=sched), steps, strength, "cpu")
        t_start = steps - left
        latents = sched.scale_noise(z0, timesteps[:1], noise)
        tensors[f"{name}.start"] = latents.contiguous()
        for i, t in enumerate(timesteps):
            tf = float(t)
            v = dit(latents, tf, pos).float()
            v_u = dit(latents, tf, neg, skip_layers=SKIP).float()
            v = v_u + GUIDANCE * (v - v_u)
            latents = sched.step(v, t, latents, return_dict=False)[0]
            if mask_file is not None:
                proper = z0
                if i < len(timesteps) - 1:
                    proper = sched.scale_noise(z0, torch.tensor([timesteps[i + 1]]), noise)
                latents = (1 - mask) * proper + mask * latents
        _, px = dit_ref.decode(vae, latents)
        tensors[f"{name}.latents"] = latents.contiguous()
        tensors[f"{name}.pixels"] = px
        cases.append({"name": name, "steps": steps, "strength": strength, "mask": mask_file, "t_start": t_start,
                      "sigmas": moss_sigmas[t_start:].tolist()})
        print(f"{name}: {steps} steps at strength {strength}: t_start {t_start}, latents std {latents.std():.4f}")
    meta = {
        "what": "img2img / inpainting on tiny-a: diffusers AutoencoderKLFlux2 encode + Flux2 glue, "
                "FlowMatchEulerDiscreteScheduler (get_timesteps, scale_noise, step), dit_ref CFG, "
                "Flux2KleinInpaintPipeline mask processing and latent blend, dit_ref.decode",
        "checkpoint": "tiny-a", "width": SIZE, "height": SIZE, "init_png": init_png, "prompt": prompt,
        "negative": "", "seed": SEED, "guidance": GUIDANCE, "uncond_skip": list(SKIP), "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    save_file(tensors, os.path.join(EXPECTED, "img2img_e2e.safetensors"))
    make_golden.write_json(os.path.join(EXPECTED, "img2img_e2e.json"), meta)


if __name__ == "__main__":
    main()
