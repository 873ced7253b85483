"""Writes golden/expected/img2img.{json,safetensors} and golden/expected/mask-96x64.png: the arithmetic of
img2img and inpainting with flow matching, pinned to diffusers 0.42.1 (pinned in requirements.txt) on synthetic
latents and velocities (no model: the transformer's velocity at step i is a fixed random tensor).

The code run is diffusers' own: `FlowMatchEulerDiscreteScheduler` (shift 1, no dynamic shifting) with
`set_timesteps(sigmas=...)` given the MOSS sigmas (spec 5.2, from dit_ref.sigmas_for, without the terminal 0
the scheduler appends itself), the img2img/inpaint pipeline's `get_timesteps` (Flux2KleinInpaintPipeline, the
FLUX.2-VAE inpaint pipeline; the same formula as Flux's img2img: `t_start = int(max(steps - min(steps*S,
steps), 0))`), `scale_noise` for the start latents, `step` for the Euler update, the pipeline's mask
processing (`mask_processor.preprocess`: grayscale, x/255, binarised at 0.5; `prepare_mask_latents`: bilinear
interpolation straight to the latent grid H/16 x W/16) and its latent blend after each step:
`(1 - mask) * scale_noise(z0, sigma_next) + mask * latents` (z0 itself after the last step).

Inputs per case: `z0` f32 [1, 128, h, w] (randn seed 5), `noise` (randn seed 6), `v.<i>` (randn seed 100 + i,
one per step of the full schedule). Per case (json `cases`): `t_start`, `sigmas` (the scheduler's, from
t_start), `<key>.start` (the start latents), `<key>.img2img.<j>` (latents after step j of the run, no mask),
`<key>.inpaint.<j>` (the same with the mask blend). `mask.latent` f32 [1, 1, h, w]: the mask at the latent
grid. Deterministic (CPU, fp32).
"""
from __future__ import annotations

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
H, W = 4, 6  # latent grid: a 96x64 picture
# (steps, strength): ordinary strengths, S = 1 (the whole schedule), a strength that leaves one step, the spec's
# 50 steps at 0.6, and products steps*S that are not exact in binary (0.3*10, 0.7*10).
CASES = [(10, 0.6), (50, 0.6), (4, 1.0), (3, 0.05), (10, 0.3), (10, 0.7), (7, 0.75)]


def mask_pixels() -> np.ndarray:
    """A uint8 [64, 96] mask: a disc, a bar, and a ramp through 127/128 (the binarisation threshold)."""
    y, x = np.mgrid[0:16 * H, 0:16 * W].astype(np.float64)
    m = np.zeros(x.shape)
    m[np.hypot(x - 30, y - 28) < 17] = 255
    m[40:52, 55:90] = 200
    ramp = (x >= 60) & (y < 24)
    m[ramp] = np.clip(127 + (x[ramp] - 75), 0, 255)
    return m.astype(np.uint8)


def main():
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
    from diffusers.pipelines.flux2.pipeline_flux2_klein_inpaint import Flux2KleinInpaintPipeline as P
    from safetensors.torch import save_file

    torch.set_grad_enabled(False)
    g = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    shape = (1, 128, H, W)
    z0 = torch.randn(shape, generator=g(5))
    noise = torch.randn(shape, generator=g(6))
    tensors = {"z0": z0, "noise": noise}

    png = f"mask-{16 * W}x{16 * H}.png"
    Image.fromarray(mask_pixels(), mode="L").save(os.path.join(EXPECTED, png))
    mask_img = Image.open(os.path.join(EXPECTED, png))
    # The pipeline's mask processor (vae_scale_factor 8 * 2) and prepare_mask_latents, bound to a holder.
    mask_processor = Flux2ImageProcessor(vae_scale_factor=16, vae_latent_channels=32, do_normalize=False,
                                         do_binarize=True, do_convert_rgb=False, do_convert_grayscale=True)
    cond = mask_processor.preprocess(mask_img, height=16 * H, width=16 * W)
    holder = types.SimpleNamespace(vae_scale_factor=8, _pack_latents=P._pack_latents)
    packed = P.prepare_mask_latents(holder, cond, 1, 1, 16 * H, 16 * W, torch.float32, "cpu")  # [1, h*w, 1]
    mask = packed.reshape(1, H, W, 1).permute(0, 3, 1, 2).contiguous()  # [1, 1, h, w]
    tensors["mask.pixels"] = cond.contiguous()
    tensors["mask.latent"] = mask

    cases = []
    v_max = max(s for s, _ in CASES)
    vs = [torch.randn(shape, generator=g(100 + i)) for i in range(v_max)]
    for i, v in enumerate(vs):
        tensors[f"v.{i}"] = v
    for n, (steps, strength) in enumerate(CASES):
        moss_sigmas = dit_ref.sigmas_for(steps)  # [steps + 1], ends in 0
        key = f"case.{n}"
        out = {}
        for blend in (False, True):
            sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)
            sched.set_timesteps(sigmas=moss_sigmas[:-1].tolist())
            assert torch.equal(sched.sigmas, moss_sigmas), "the scheduler changed the MOSS sigmas"
            pipe = types.SimpleNamespace(scheduler=sched)
            timesteps, left = P.get_timesteps(pipe, steps, strength, "cpu")
            t_start = steps - left
            latents = sched.scale_noise(z0, timesteps[:1], noise)
            out["start"] = latents
            for i, t in enumerate(timesteps):
                latents = sched.step(vs[t_start + i], t, latents, return_dict=False)[0]
                if blend:
                    proper = z0
                    if i < len(timesteps) - 1:
                        proper = sched.scale_noise(z0, torch.tensor([timesteps[i + 1]]), noise)
                    latents = (1 - mask) * proper + mask * latents
                out[f"{'inpaint' if blend else 'img2img'}.{i}"] = latents
        for k, t in out.items():
            tensors[f"{key}.{k}"] = t.contiguous()
        cases.append({"key": key, "steps": steps, "strength": strength, "t_start": t_start,
                      "run_steps": steps - t_start, "sigmas": moss_sigmas[t_start:].tolist()})
        print(f"steps {steps} strength {strength}: t_start {t_start}, {steps - t_start} steps")
    meta = {
        "what": "diffusers FlowMatchEulerDiscreteScheduler + Flux2KleinInpaintPipeline get_timesteps, mask "
                "processing and latent blend, on synthetic latents and velocities (v.<t_start + j> at step j)",
        "latent_grid": [H, W],
        "mask_png": png,
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    save_file(tensors, os.path.join(EXPECTED, "img2img.safetensors"))
    make_golden.write_json(os.path.join(EXPECTED, "img2img.json"), meta)


if __name__ == "__main__":
    main()
