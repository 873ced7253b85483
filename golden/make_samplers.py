"""Writes golden/expected/samplers.{json,safetensors}: the samplers and sigma schedules of issue 42, run by
their upstream implementations on synthetic data (no DiT needed).

Samplers (diffusers 0.42.1, CPU, fp32), each given the same sigmas and the same velocity function:
  euler          FlowMatchEulerDiscreteScheduler
  heun           FlowMatchHeunDiscreteScheduler (2 model calls a step, Euler on the last)
  dpm++2m        DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", use_flow_sigmas, flow_prediction)
  dpm++2m_sde    DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", ...)
  unipc          UniPCMultistepScheduler(use_flow_sigmas, flow_prediction; bh2, order 2)
  lcm            FlowMatchLCMScheduler
  euler_ancestral  diffusers has no rectified-flow ancestral Euler: ComfyUI's `sample_euler_ancestral_RF`
                 (comfy/k_diffusion/sampling.py, v0.3.75; the function KSampler dispatches to for a CONST/flow
                 model), transcribed below (eta 1, s_noise 1).
The scheduler's own sigmas are replaced by the test's sigmas (with timesteps = sigmas * 1000) after
set_timesteps, so every scheduler walks exactly the sigmas given. The stochastic ones (dpm++2m_sde, lcm,
euler_ancestral) take their step noise from one torch CPU generator, `Generator().manual_seed(seed)`, that
first drew the initial latents: noise k = the (k+2)-th `torch.randn(shape)` of that generator (the first is
the initial latent), one draw per step, every step (diffusers draws one on the last step too; ComfyUI's
ancestral Euler draws none on the step to sigma 0).

The velocity: v(x, sigma) = A * x + float32(B * sin(3 * sigma)) * F, F = randn(shape) of seed 7, all fp32.

Schedules (steps n -> n + 1 sigmas ending in 0), for the MOSS scheduler config (shift 5, 1000 train steps):
  karras, exponential, beta   FlowMatchEulerDiscreteScheduler(shift=5, use_{karras,exponential,beta}_sigmas)
  simple, sgm_uniform         ComfyUI comfy/samplers.py `simple_scheduler`, `normal_scheduler(sgm=True)` on
                              comfy/model_sampling.py `ModelSamplingDiscreteFlow(shift=5, multiplier=1000)`,
                              transcribed below (float32 tables as ComfyUI builds them).
"""
from __future__ import annotations

import inspect
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402  (the MOSS schedule of spec 5.2)

EXPECTED = os.path.join(HERE, "expected")
SHAPE = [1, 128, 4, 6]
SEED = 42
A, B = -0.75, 0.5
SHIFT, T = 5.0, 1000


# ----------------------------------------------------------------------------------------------------------
# the synthetic model
# ----------------------------------------------------------------------------------------------------------
class Velocity:
    def __init__(self):
        self.field = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7), dtype=torch.float32)
        self.calls = []

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        sigma = float(torch.tensor(sigma, dtype=torch.float32))
        self.calls.append(sigma)
        c = float(torch.tensor(B * math.sin(3.0 * sigma), dtype=torch.float32))
        return A * x.float() + c * self.field


# ----------------------------------------------------------------------------------------------------------
# diffusers schedulers walking given sigmas
# ----------------------------------------------------------------------------------------------------------
def make_scheduler(name: str):
    from diffusers import (DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
                           FlowMatchHeunDiscreteScheduler, FlowMatchLCMScheduler, UniPCMultistepScheduler)

    flow = dict(num_train_timesteps=T, use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=SHIFT)
    return {
        "euler": lambda: FlowMatchEulerDiscreteScheduler(num_train_timesteps=T, shift=SHIFT),
        "heun": lambda: FlowMatchHeunDiscreteScheduler(num_train_timesteps=T, shift=SHIFT),
        "lcm": lambda: FlowMatchLCMScheduler(num_train_timesteps=T, shift=SHIFT),
        "dpm++2m": lambda: DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", **flow),
        "dpm++2m_sde": lambda: DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", **flow),
        "unipc": lambda: UniPCMultistepScheduler(**flow),
    }[name]()


def run_diffusers(name: str, sigmas: torch.Tensor, x: torch.Tensor, gen: torch.Generator, model: Velocity):
    """Walk `sigmas` (ending in 0) with diffusers' scheduler `name`; returns the final latents."""
    sch = make_scheduler(name)
    n = len(sigmas) - 1
    sch.set_timesteps(n)
    s = sigmas.clone()
    if name == "heun":  # sigma_0, then each inner sigma twice, then 0 (2n - 1 model calls)
        s = torch.cat([s[:1], s[1:-1].repeat_interleave(2), s[-1:]])
    ts = s[:-1] * T
    sch.sigmas, sch.timesteps = s, ts
    sch.set_begin_index(0)
    for k, t in enumerate(ts):
        v = model(x, float(s[k]))
        kw = {"generator": gen} if "generator" in inspect.signature(sch.step).parameters else {}
        x = sch.step(v, t, x, return_dict=False, **kw)[0]
    return x


def run_euler_ancestral_rf(sigmas: torch.Tensor, x: torch.Tensor, gen: torch.Generator, model: Velocity,
                           eta: float = 1.0, s_noise: float = 1.0):
    """ComfyUI v0.3.75 comfy/k_diffusion/sampling.py `sample_euler_ancestral_RF`, with the model's
    denoised output x0 = x - sigma * v (ComfyUI's CONST model sampling) and the noise sampler
    `randn(shape, generator=gen)`."""
    for i in range(len(sigmas) - 1):
        v = model(x, float(sigmas[i]))
        denoised = x - sigmas[i] * v
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            downstep_ratio = 1 + (sigmas[i + 1] / sigmas[i] - 1) * eta
            sigma_down = sigmas[i + 1] * downstep_ratio
            alpha_ip1 = 1 - sigmas[i + 1]
            alpha_down = 1 - sigma_down
            renoise_coeff = (sigmas[i + 1] ** 2 - sigma_down ** 2 * alpha_ip1 ** 2 / alpha_down ** 2) ** 0.5
            sigma_down_i_ratio = sigma_down / sigmas[i]
            x = sigma_down_i_ratio * x + (1 - sigma_down_i_ratio) * denoised
            if eta > 0:
                noise = torch.randn(x.shape, generator=gen, dtype=torch.float32)
                x = (alpha_ip1 / alpha_down) * x + noise * s_noise * renoise_coeff
    return x


# ----------------------------------------------------------------------------------------------------------
# schedules
# ----------------------------------------------------------------------------------------------------------
def diffusers_schedule(kind: str, n: int) -> torch.Tensor:
    from diffusers import FlowMatchEulerDiscreteScheduler

    sch = FlowMatchEulerDiscreteScheduler(num_train_timesteps=T, shift=SHIFT, **{f"use_{kind}_sigmas": True})
    sch.set_timesteps(n)
    return sch.sigmas.clone()


class ModelSamplingDiscreteFlow:
    """comfy/model_sampling.py ModelSamplingDiscreteFlow (shift, multiplier 1000): the sigma table over
    t = k/1000, k = 1..1000, `time_snr_shift(shift, t) = shift*t / (1 + (shift-1)*t)`, float32."""

    def __init__(self, shift: float = SHIFT, multiplier: float = 1000.0, timesteps: int = 1000):
        self.shift, self.multiplier = shift, multiplier
        ts = self.sigma((torch.arange(1, timesteps + 1, 1) / timesteps) * multiplier)
        self.sigmas = ts

    def sigma(self, timestep):
        t = timestep / self.multiplier
        return self.shift * t / (1 + (self.shift - 1) * t)

    def timestep(self, sigma):
        return sigma * self.multiplier

    @property
    def sigma_min(self):
        return self.sigmas[0]

    @property
    def sigma_max(self):
        return self.sigmas[-1]


def comfy_simple(ms, steps):
    sigs = []
    ss = len(ms.sigmas) / steps
    for x in range(steps):
        sigs += [float(ms.sigmas[-(1 + int(x * ss))])]
    sigs += [0.0]
    return torch.FloatTensor(sigs)


def comfy_sgm_uniform(ms, steps):
    start, end = ms.timestep(ms.sigma_max), ms.timestep(ms.sigma_min)
    timesteps = torch.linspace(start, end, steps + 1)[:-1]
    sigs = [float(ms.sigma(ts)) for ts in timesteps]
    sigs += [0.0]
    return torch.FloatTensor(sigs)


# ----------------------------------------------------------------------------------------------------------
def main():
    from safetensors.torch import save_file

    tensors, meta = {}, {"shape": SHAPE, "seed": SEED, "a": A, "b": B, "shift": SHIFT,
                         "velocity": "v = a*x + f32(b*sin(3*sigma)) * field; field = randn(shape, seed 7)",
                         "runs": [], "schedules": []}
    model = Velocity()
    tensors["field"] = model.field.clone()
    for steps in (1, 2, 4, 8, 20, 30):
        for kind in ("karras", "exponential", "beta"):
            key = f"schedule.{kind}.{steps}"
            tensors[key] = diffusers_schedule(kind, steps)
            meta["schedules"].append({"key": key, "name": kind, "steps": steps})
        ms = ModelSamplingDiscreteFlow()
        for kind, f in (("simple", comfy_simple), ("sgm_uniform", comfy_sgm_uniform)):
            key = f"schedule.{kind}.{steps}"
            tensors[key] = f(ms, steps).float()
            meta["schedules"].append({"key": key, "name": kind, "steps": steps})

    samplers = ["euler", "heun", "dpm++2m", "dpm++2m_sde", "unipc", "lcm", "euler_ancestral"]
    runs = [("moss", 8, dit_ref.sigmas_for(8)), ("moss", 3, dit_ref.sigmas_for(3)),
            ("karras", 8, diffusers_schedule("karras", 8)), ("moss", 20, dit_ref.sigmas_for(20))]
    for sched, steps, sigmas in runs:
        skey = f"sigmas.{sched}.{steps}"
        tensors[skey] = sigmas.float().clone()
        for name in samplers:
            gen = torch.Generator().manual_seed(SEED)
            x = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
            if sched == "moss" and steps == 8:
                tensors["x_init"] = x.clone()
            model.calls = []
            with torch.no_grad():
                if name == "euler_ancestral":
                    out = run_euler_ancestral_rf(sigmas.float(), x, gen, model)
                else:
                    out = run_diffusers(name, sigmas.float(), x, gen, model)
            key = f"out.{name}.{sched}.{steps}"
            tensors[key] = out.float().contiguous()
            finite = bool(torch.isfinite(out).all())
            meta["runs"].append({"key": key, "sampler": name, "sigmas": skey, "calls": len(model.calls),
                                 "call_sigmas": model.calls, "finite": finite})
            print(f"{key}: calls {len(model.calls)} finite {finite} std {out.std():.4f}")
    import diffusers
    import scipy

    meta["versions"] = {"torch": torch.__version__, "diffusers": diffusers.__version__, "scipy": scipy.__version__}
    os.makedirs(EXPECTED, exist_ok=True)
    save_file(tensors, os.path.join(EXPECTED, "samplers.safetensors"))
    with open(os.path.join(EXPECTED, "samplers.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
