"""Writes golden/expected/cache.{json,safetensors}: cache-dit's step-caching decisions and the latents
they give, with cache-dit itself (PyPI cache-dit==1.5.3, CPU) wrapped around the project's torch
reference DiT (dit_ref.py) on golden/tiny-a's weights.

cache-dit wraps `transformer.layers` (`BlockAdapter`, `ForwardPattern.Pattern_3`: a block maps the
joint stream to the joint stream) with its DBCache: the first `Fn` blocks always run; the relative L1
change of their residual against the last computed step's (`mean|R_prev - R| / mean|R_prev|`) below
the threshold (after the warm-up steps, within the cached-step limits) replaces the middle blocks by
the middle blocks' last residual (or, with the TaylorSeer calibrator, its Taylor forecast); the last
`Bn` blocks always run. FBCache is DBCache with Fn=1, Bn=0. `enable_separate_cfg=True`: the
conditional and the unconditional pass (the MOSS pipeline runs them as separate batch-1 forwards,
cond first) each keep their own buffers, cached steps and residual differences.

The loop is dit_ref.sample (spec 5.3: MOSS sigmas, CFG 3, Euler) on tiny-a at 64x64, seed 42, the
prompt `dit.ctx` and negative `dit.ctx.neg` of expected/tiny-a.safetensors, WITHOUT the unconditional
skip of block 22 (cache-dit's wrapper runs the blocks as one module, which a per-block skip cannot
address). Per config: `cached` / `cfg_cached` (the steps served from the cache, cond / uncond),
`diffs` / `cfg_diffs` (the residual difference cache-dit measured at each step past the warm-up), the
closest any measured difference came to the threshold (`margin`), and the final latents; `plain` is
the same loop without cache-dit.
"""
from __future__ import annotations

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402

EXPECTED = os.path.join(HERE, "expected")
CKPT, SEED, STEPS, GUIDANCE = "tiny-a", 42, 24, 3.0

CONFIGS = [
    # name, DBCacheConfig fields, TaylorSeer order (0: none), guidance
    ("fbcache", dict(Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=0.95,
                     max_warmup_steps=2), 0, GUIDANCE),
    ("dbcache_f4b2_limits", dict(Fn_compute_blocks=4, Bn_compute_blocks=2, residual_diff_threshold=0.99,
                                 max_warmup_steps=3, max_cached_steps=3, max_continuous_cached_steps=1), 0, GUIDANCE),
    ("taylorseer_o1", dict(Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=0.9,
                           max_warmup_steps=2), 1, GUIDANCE),
    ("taylorseer_o2_f2b1", dict(Fn_compute_blocks=2, Bn_compute_blocks=1, residual_diff_threshold=0.95,
                                max_warmup_steps=4), 2, GUIDANCE),
    ("fbcache_unguided", dict(Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=0.9,
                              max_warmup_steps=2), 0, 1.0),
]


def run(cfg: dict | None, order: int, guidance: float, pos, neg, noise):
    import cache_dit
    from cache_dit import BlockAdapter, DBCacheConfig, ForwardPattern, TaylorSeerCalibratorConfig

    dit = dit_ref.load_transformer(os.path.join(HERE, CKPT, "transformer"), dtype=torch.float32)
    if cfg is not None:
        adapter = BlockAdapter(transformer=dit, blocks=dit.layers, forward_pattern=ForwardPattern.Pattern_3)
        cal = TaylorSeerCalibratorConfig(taylorseer_order=order) if order else None
        cache_dit.enable_cache(adapter, cache_config=DBCacheConfig(enable_separate_cfg=guidance != 1.0,
                                                                   num_inference_steps=STEPS, **cfg),
                               calibrator_config=cal)
    with torch.no_grad():
        lat = dit_ref.sample(dit, noise, pos, neg, steps=STEPS, guidance=guidance, uncond_skip=())
    stats = cache_dit.summary(dit)[0] if cfg is not None else None
    return lat, stats


def main():
    from safetensors.torch import load_file, save_file

    exp = load_file(os.path.join(EXPECTED, f"{CKPT}.safetensors"))
    pos, neg = exp["dit.ctx"], exp["dit.ctx.neg"]
    shape = [1, 128, 4, 4]
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(SEED), dtype=torch.float32)
    tensors, meta = {}, {"checkpoint": CKPT, "seed": SEED, "steps": STEPS, "shape": shape,
                         "prompt": "dit.ctx", "negative": "dit.ctx.neg", "uncond_skip": [], "configs": []}
    for guidance in sorted({c[3] for c in CONFIGS}):
        lat, _ = run(None, 0, guidance, pos, neg, noise)
        tensors[f"plain.g{guidance:g}"] = lat.contiguous()
    for name, cfg, order, guidance in CONFIGS:
        lat, s = run(cfg, order, guidance, pos, neg, noise)
        thr = cfg["residual_diff_threshold"]
        diffs = {int(k): float(v) for k, v in s.residual_diffs.items()}
        cfg_diffs = {int(k): float(v) for k, v in s.cfg_residual_diffs.items()}
        margin = min(abs(v - thr) for v in list(diffs.values()) + list(cfg_diffs.values()))
        tensors[f"{name}.latents"] = lat.contiguous()
        plain = tensors[f"plain.g{guidance:g}"]
        moved = float((lat.double() - plain.double()).norm() / plain.double().norm())
        entry = {"name": name, "config": cfg, "taylorseer_order": order, "guidance": guidance,
                 "cached": sorted(s.cached_steps), "cfg_cached": sorted(s.cfg_cached_steps),
                 "diffs": {str(k): v for k, v in sorted(diffs.items())},
                 "cfg_diffs": {str(k): v for k, v in sorted(cfg_diffs.items())},
                 "margin": margin, "latents": f"{name}.latents", "plain": f"plain.g{guidance:g}",
                 "rel_l2_from_plain": moved}
        meta["configs"].append(entry)
        print(f"{name}: cached {entry['cached']} cfg_cached {entry['cfg_cached']} margin {margin:.3e} "
              f"moved {moved:.3e}")
        assert margin > 1e-3, f"{name}: a residual difference within {margin:.1e} of the threshold"
    import cache_dit

    meta["versions"] = {"torch": torch.__version__, "cache_dit": cache_dit.__version__}
    save_file(tensors, os.path.join(EXPECTED, "cache.safetensors"))
    with open(os.path.join(EXPECTED, "cache.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
