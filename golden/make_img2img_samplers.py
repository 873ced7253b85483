"""Writes golden/expected/img2img_samplers.{json,safetensors}: img2img and inpainting with every sampler of
issue 42, run the way diffusers 0.42.1's img2img and inpaint pipelines run a scheduler, on the synthetic
latents and velocity of make_samplers.py (no DiT needed).

Per sampler (diffusers' schedulers as make_samplers.py builds them; `euler_ancestral`: its ComfyUI
transcription) and per case (steps, strength, schedule, with a mask or not):
  - the scheduler is set to the whole schedule (its sigmas replaced by the case's, timesteps = sigmas * 1000;
    `heun`'s inner sigmas twice), then the pipelines' `get_timesteps`: `init_timestep = min(steps * strength,
    steps)`, `t_start = int(max(steps - init_timestep, 0))`, the loop over `timesteps[t_start * order:]` after
    `set_begin_index(t_start * order)` (Flux2/Flux img2img and Flux2KleinInpaintPipeline);
  - the start `scale_noise(z0, timesteps[:1], noise)` = `sigma * noise + (1 - sigma) * z0` at
    `sigma = sigmas[t_start]` (FlowMatchEulerDiscreteScheduler.scale_noise, which those pipelines call);
  - with a mask, after every `scheduler.step`: `latents = (1 - mask) * proper + mask * latents` with
    `proper = scale_noise(z0, timesteps[i + 1], noise)`, or `z0` after the last step (the inpaint pipeline's
    blend). `heun` is left out of the masked cases: its two `step` calls a step each blend there.
The noise: one CPU generator of `SEED`; its first `randn(shape)` is the noise the start mixes in, the
stochastic samplers draw their step noise from it after (what a pipeline given one generator does).
z0 = randn(shape) of seed 11; the mask [1, 1, 4, 6] holds 0, 1/4, 1/2, 3/4 and 1 (a latent mask's values).

    /work/gv/bin/python golden/make_img2img_samplers.py

Deterministic (CPU, fp32).
"""
from __future__ import annotations

import inspect
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402  (the MOSS schedule of spec 5.2)
import make_samplers as ms  # noqa: E402  (the synthetic velocity, the schedulers as tests/samplers.rs knows them)

EXPECTED = os.path.join(HERE, "expected")
SEED = 42
SAMPLERS = ["euler", "heun", "dpm++2m", "dpm++2m_sde", "unipc", "lcm", "euler_ancestral"]
# (name, steps, strength, schedule, masked)
CASES = [
    ("img2img", 8, 0.6, "moss", False),
    ("inpaint", 8, 0.8, "moss", True),
    ("img2img_karras", 10, 0.45, "karras", False),
    ("inpaint_karras", 10, 0.7, "karras", True),
]


def sigmas_of(schedule: str, steps: int) -> torch.Tensor:
    return (dit_ref.sigmas_for(steps) if schedule == "moss" else ms.diffusers_schedule(schedule, steps)).float()


def get_timesteps(steps: int, strength: float) -> int:
    """The pipelines' `get_timesteps`: the start index into the schedule."""
    init_timestep = min(steps * strength, steps)
    return int(max(steps - init_timestep, 0))


def scale_noise(z0: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """FlowMatchEulerDiscreteScheduler.scale_noise at a given sigma (float32)."""
    return sigma * noise + (1.0 - sigma) * z0


def ancestral_step(sigmas, i, x, gen, model, eta=1.0, s_noise=1.0):
    """One step of ComfyUI's `sample_euler_ancestral_RF` (make_samplers.run_euler_ancestral_rf's body)."""
    v = model(x, float(sigmas[i]))
    denoised = x - sigmas[i] * v
    if sigmas[i + 1] == 0:
        return denoised
    downstep_ratio = 1 + (sigmas[i + 1] / sigmas[i] - 1) * eta
    sigma_down = sigmas[i + 1] * downstep_ratio
    alpha_ip1 = 1 - sigmas[i + 1]
    alpha_down = 1 - sigma_down
    renoise_coeff = (sigmas[i + 1] ** 2 - sigma_down ** 2 * alpha_ip1 ** 2 / alpha_down ** 2) ** 0.5
    sigma_down_i_ratio = sigma_down / sigmas[i]
    x = sigma_down_i_ratio * x + (1 - sigma_down_i_ratio) * denoised
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float32)
    return (alpha_ip1 / alpha_down) * x + noise * s_noise * renoise_coeff


def run(name, sigmas, steps, strength, z0, mask, model):
    """One img2img (mask None) or inpainting run; returns (t_start, start latents, final latents)."""
    gen = torch.Generator().manual_seed(SEED)
    noise = torch.randn(ms.SHAPE, generator=gen, dtype=torch.float32)
    t_start = get_timesteps(steps, strength)
    latents = scale_noise(z0, sigmas[t_start], noise)
    start = latents.clone()

    def blend(latents, next_sigma):
        proper = z0 if next_sigma is None else scale_noise(z0, next_sigma, noise)
        return (1 - mask) * proper + mask * latents

    if name == "euler_ancestral":
        tail = sigmas[t_start:]
        for i in range(len(tail) - 1):
            latents = ancestral_step(tail, i, latents, gen, model)
            if mask is not None:
                latents = blend(latents, tail[i + 1] if i + 2 < len(tail) else None)
        return t_start, start, latents
    sch = ms.make_scheduler(name)
    sch.set_timesteps(steps)
    s = sigmas.clone()
    if name == "heun":
        s = torch.cat([s[:1], s[1:-1].repeat_interleave(2), s[-1:]])
    sch.sigmas, sch.timesteps = s, s[:-1] * ms.T
    timesteps = sch.timesteps[t_start * sch.order:]
    sch.set_begin_index(t_start * sch.order)
    kw = {"generator": gen} if "generator" in inspect.signature(sch.step).parameters else {}
    for i, t in enumerate(timesteps):
        v = model(latents, float(s[t_start * sch.order + i]))
        latents = sch.step(v, t, latents, return_dict=False, **kw)[0]
        if mask is not None:
            last = i == len(timesteps) - 1
            latents = blend(latents, None if last else s[t_start * sch.order + i + 1])
    return t_start, start, latents


def main():
    import diffusers
    from safetensors.torch import save_file

    torch.set_grad_enabled(False)
    model = ms.Velocity()
    z0 = torch.randn(ms.SHAPE, generator=torch.Generator().manual_seed(11), dtype=torch.float32)
    mask = torch.tensor([[0, 0, 0.25, 0.5, 1, 1], [0, 0, 0.5, 0.75, 1, 1], [0, 0.25, 0.5, 1, 1, 1], [0, 0, 0, 0.25, 0.5, 0.75]],
                        dtype=torch.float32).reshape(1, 1, 4, 6)
    noise = torch.randn(ms.SHAPE, generator=torch.Generator().manual_seed(SEED), dtype=torch.float32)
    tensors = {"field": model.field.clone(), "z0": z0, "mask": mask, "noise": noise}
    meta = {"shape": ms.SHAPE, "seed": SEED, "a": ms.A, "b": ms.B, "shift": ms.SHIFT,
            "velocity": "v = a*x + f32(b*sin(3*sigma)) * field (make_samplers.py)", "runs": []}
    for case, steps, strength, schedule, masked in CASES:
        sigmas = sigmas_of(schedule, steps)
        skey = f"sigmas.{schedule}.{steps}"
        tensors[skey] = sigmas.clone()
        for name in SAMPLERS:
            if masked and name == "heun":
                continue
            model.calls = []
            t_start, start, out = run(name, sigmas, steps, strength, z0, mask if masked else None, model)
            key = f"{case}.{name}"
            tensors[f"{key}.start"] = start.contiguous()
            tensors[f"{key}.out"] = out.contiguous()
            meta["runs"].append({"key": key, "case": case, "sampler": name, "steps": steps, "strength": strength,
                                 "schedule": schedule, "sigmas": skey, "masked": masked, "t_start": t_start,
                                 "calls": len(model.calls), "call_sigmas": model.calls})
            print(f"{key}: t_start {t_start}, {len(model.calls)} calls, std {out.std():.4f}")
    meta["versions"] = {"torch": torch.__version__, "diffusers": diffusers.__version__}
    save_file(tensors, os.path.join(EXPECTED, "img2img_samplers.safetensors"))
    with open(os.path.join(EXPECTED, "img2img_samplers.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
