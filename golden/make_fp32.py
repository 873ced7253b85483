"""Writes golden/expected/fp32.{json,safetensors}: the golden loop (make_golden.py's LOOP: plain prompt,
negative "", seed 42, 4 steps, guidance 3, uncond skip [22]) run fp32 end to end, the encoder's hidden
states NOT rounded to bf16 at the stage boundary (what `moss generate --precision fp32` does). Run after
make_golden.py, with the same pins (requirements.txt). Deterministic: CPU, fp32.

Inputs: the checkpoints and `expected/<ckpt>.safetensors` `enc.N` (transformers' fp32 last_hidden_state of
each prompt, written by make_golden.py). Per checkpoint: `<ckpt>.loop.latents` f32 [1,128,h,w] (final latents)
and `<ckpt>.loop.latents.step1`; the json records how far the bf16-rounded loop (`loop.latents` of
`expected/<ckpt>.safetensors`) is from it (relative L2), the gap --precision fp32 closes.
"""
from __future__ import annotations

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402
import make_golden  # noqa: E402


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main():
    from safetensors.torch import load_file, save_file

    tensors, meta = {}, {"loop": make_golden.LOOP, "ctx_rounding": "none: encoder last_hidden_state (fp32) fed to the fp32 DiT",
                         "checkpoints": {}}
    for name in make_golden.CKPTS:
        exp = load_file(os.path.join(make_golden.EXPECTED, f"{name}.safetensors"))
        with open(os.path.join(make_golden.EXPECTED, f"{name}.json")) as f:
            ej = json.load(f)
        key = {p["name"]: p["key"] for p in ej["prompts"]}
        lp = ej["loop"]
        pos, neg = exp[key[lp["prompt"]]], exp[key["empty"]]
        assert lp["negative"] == "", "the loop's negative is the empty prompt"
        dit = dit_ref.load_transformer(os.path.join(HERE, name, "transformer"), dtype=torch.float32)
        h, w = lp["height"] // 16, lp["width"] // 16
        noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(lp["seed"]), dtype=torch.float32)
        steps_out = {}
        lat = dit_ref.sample(dit, noise, pos, neg, steps=lp["steps"], guidance=lp["guidance"],
                             uncond_skip=tuple(lp["uncond_skip"]), callback=lambda i, xx: steps_out.setdefault(i, xx.clone()))
        tensors[f"{name}.loop.latents"] = lat.contiguous()
        tensors[f"{name}.loop.latents.step1"] = steps_out[0].contiguous()
        gap = rel_l2(exp["loop.latents"], lat)
        meta["checkpoints"][name] = {"latents": f"{name}.loop.latents", "step1": f"{name}.loop.latents.step1",
                                     "width": lp["width"], "height": lp["height"],
                                     "bf16_ctx_loop_rel_l2": gap}
        print(f"{name}: fp32-ctx loop latents std={lat.std():.4f}; the bf16-ctx loop.latents are {gap:.3e} (rel L2) away")
    meta["versions"] = {"torch": torch.__version__}
    save_file(tensors, os.path.join(make_golden.EXPECTED, "fp32.safetensors"))
    make_golden.write_json(os.path.join(make_golden.EXPECTED, "fp32.json"), meta)


if __name__ == "__main__":
    main()
