#!/usr/bin/env python3
"""Writes the W4A8 golden files (comfy-kitchen's `asym_w4a8_int8`, the format of Comfy-Org's W4A8
text encoders) and what comfy-kitchen reads out of them. Run after make_golden.py, with
comfy-kitchen==0.2.40 and torch==2.11.0 (its eager backend runs on the CPU).

- quant/tiny-a-te-w4a8.safetensors: tiny-a's text encoder, every 2-D `.weight` but the norms and the
  embedding table quantized by comfy-kitchen's `quantize_w4a8_int8_weight` (ConvRot groups of 64:
  the tiny widths are 64 and 128; groups of 16), the layers taking comfy-kitchen's variants in turn:
  its default (4-bit codes, a codebook, float8 e4m3 group scales), `bits=6` (uniform 6-bit codes),
  `scale_dtype=float32` and `codebook=False` (uniform symmetric 4-bit codes). Laid out as
  `AsymW4A8Int8Layout.state_dict_tensors` names them under `<stem>.weight`, with ComfyUI's
  `<stem>.comfy_quant` JSON; the other tensors bf16 as in the folder, under the folder's names.
- quant/w4a8-asym.safetensors: two matrices with `symmetric=False` (a zero-point correction
  `[K/16, rows]` in bf16), comfy-kitchen's asymmetric variant.

expected/w4a8.json, per file and quantized tensor: `grid` = the checksum (make_quant.checksum) of
comfy-kitchen's int8 grid values (`_dequant_int4_grouped_to_int8`, exact); `values` = the digest of
the weight as comfy-kitchen's `_dequantize_w4a8_int8_weight_from_int8` makes it in f32 (int8 ·
s_channel, + correction), turned back by comfy-kitchen's `_build_hadamard` matrix in f64 and rounded
once to f32 (the normalized matrix is exact in f64 for powers of 4). expected/w4a8.safetensors:
`<file>:<name>` = comfy-kitchen's own `dequantize_w4a8_int8_weight(output_dtype=float32)` (the
rotation an f32 matmul) of a few tensors, for a rel-L2 comparison.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import comfy_kitchen as ck
from comfy_kitchen.backends.eager.w4a8_int8 import _dequant_int4_grouped_to_int8, _dequantize_w4a8_int8_weight_from_int8
from comfy_kitchen.tensor.int8_utils import _build_hadamard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_quant import checksum, digest  # noqa: E402

GROUP, CONVROT = 16, 64
VARIANTS = [
    ("default", dict()),
    ("6-bit", dict(bits=6)),
    ("f32 group scales", dict(scale_dtype=torch.float32)),
    ("uniform 4-bit", dict(codebook=False)),
]


def text_encoder(model: str) -> dict:
    d = os.path.join(HERE, model, "text_encoder")
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def quantizable(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.endswith(".weight") and not any(s in name for s in ("norm", "embed_tokens", "lm_head")) and t.shape[1] % CONVROT == 0


def quantize(stem: str, w: torch.Tensor, opts: dict) -> dict:
    qdata, s_rel, s_channel, correction, codebook = ck.quantize_w4a8_int8_weight(w.float(), group_size=GROUP, convrot_groupsize=CONVROT, **opts)
    out = {f"{stem}.weight": qdata, f"{stem}.weight_s_rel": s_rel, f"{stem}.weight_s_channel": s_channel}
    if codebook is not None:
        out[f"{stem}.weight_codebook"] = codebook
    if correction is not None:
        out[f"{stem}.weight_correction"] = correction.to(w.dtype)
    meta = {"format": "asym_w4a8_int8", "group_size": GROUP, "convrot_groupsize": CONVROT, "orig_dtype": str(w.dtype).replace("torch.", "")}
    out[f"{stem}.comfy_quant"] = torch.tensor(list(json.dumps(meta).encode()), dtype=torch.uint8)
    return out


def reference(t: dict, stem: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 grid, values turned back in f64, comfy-kitchen's own f32 dequantize) of layer `stem`."""
    q, s_rel, s_ch = t[f"{stem}.weight"], t[f"{stem}.weight_s_rel"], t[f"{stem}.weight_s_channel"]
    book, corr = t.get(f"{stem}.weight_codebook"), t.get(f"{stem}.weight_correction")
    grid = _dequant_int4_grouped_to_int8(q, s_rel, book, GROUP)
    rotated = _dequantize_w4a8_int8_weight_from_int8(grid, s_ch, corr, GROUP, torch.float32)
    n, k = rotated.shape
    h = _build_hadamard(CONVROT, dtype=torch.float64)
    turned = (rotated.double().reshape(n, k // CONVROT, CONVROT) @ h.T).reshape(n, k).float()
    own = ck.dequantize_w4a8_int8_weight(q, s_rel, s_ch, codebook=book, correction=corr, group_size=GROUP, convrot_groupsize=CONVROT, output_dtype=torch.float32)
    return grid.float().numpy(), turned.numpy(), own.float().numpy()


def main():
    torch.manual_seed(0)
    os.makedirs(os.path.join(HERE, "quant"), exist_ok=True)
    te = text_encoder("tiny-a")
    files = {}
    layers = [n for n in sorted(te) if quantizable(n, te[n])]
    main_file = {n: v.contiguous() for n, v in te.items() if n not in layers}
    chosen = {}
    for i, n in enumerate(layers):
        label, opts = VARIANTS[i % len(VARIANTS)]
        main_file.update(quantize(n[: -len(".weight")], te[n], opts))
        chosen[n] = label
    asym = {}
    for n in [layers[0], layers[-1]]:
        asym.update(quantize(n[: -len(".weight")], te[n], dict(symmetric=False, codebook=False)))
    own_values = {}
    for fname, tensors in [("tiny-a-te-w4a8.safetensors", main_file), ("w4a8-asym.safetensors", asym)]:
        save_file(tensors, os.path.join(HERE, "quant", fname))
        entry = {}
        stems = [k[: -len(".comfy_quant")] for k in tensors if k.endswith(".comfy_quant")]
        for j, stem in enumerate(sorted(stems)):
            grid, turned, own = reference(tensors, stem)
            name = f"{stem}.weight"
            variant = "asymmetric" if fname.startswith("w4a8-asym") else chosen[name]
            entry[name] = {"grid": checksum(grid), "values": digest(turned), "variant": variant}
            if fname.startswith("w4a8-asym") or j < 4:
                own_values[f"{fname}:{name}"] = torch.from_numpy(own)
        files[fname] = entry
    with open(os.path.join(HERE, "expected", "w4a8.json"), "w") as f:
        json.dump({"comfy_kitchen": ck.__version__ if hasattr(ck, "__version__") else "0.2.40", "group_size": GROUP, "convrot_groupsize": CONVROT, "files": files}, f, indent=1)
    save_file(own_values, os.path.join(HERE, "expected", "w4a8.safetensors"))
    print(f"{len(layers)} layers quantized; {sum(len(v) for v in files.values())} references")


if __name__ == "__main__":
    main()
