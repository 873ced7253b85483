#!/usr/bin/env python3
"""Writes golden/quant/ (single-file transformers in the formats people download) and
golden/expected/quant.{json,safetensors} (what the formats' own projects read out of them). Run after
make_golden.py, with the pins of requirements.txt (gguf 0.19.0, convert-to-quant 1.3.4).

- quant/blocks.gguf: one small tensor [4, 512] of every ggml type moss reads (Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32), random block bytes with random finite f16 scales, so every
  bit of every field is exercised; its values as gguf's `quants.dequantize` gives them are
  `blocks.<type>` in quant.safetensors.
- quant/tiny-b-mixed.gguf: tiny-b's transformer as ComfyUI-GGUF writes a mixed ("_M") file: no name
  prefix, ComfyUI's fused `layers.N.proj.qkv.weight`, general.architecture set, 1-D tensors F32 and
  the matrices spread over every type above (table TYPES_B).
- quant/tiny-a-Q4_0.gguf: tiny-a's transformer as stable-diffusion.cpp names it (`model.diffusion_model.`
  prefix, fused qkv), every matrix Q4_0, 1-D tensors F32.
  The k-quant blocks of these files are packed by this script's direct quantizer (gguf-py has none);
  only the dequantized values are reference data, and those are gguf's.
- quant/tiny-b-int8.safetensors: convert-to-quant 1.3.4 `--comfy_quant --int8 --scaling_mode row
  --simple` of tiny-b's transformer (one file, diffusers names), as written (its bias correction too).
- quant/tiny-a-int8-convrot.safetensors: the same with `--convrot` of tiny-a's, then laid out as
  ComfyUI's MOSS checkpoints are (`model.diffusion_model.` prefix, q/k/v codes and row scales
  concatenated into `layers.N.proj.qkv`): a re-layout, no value changes.

quant.json: per file, per tensor under moss's names (prefix dropped, qkv split into q/k/v), a checksum (`checksum`) of
the f32 values the format's project dequantizes to (gguf: `quants.dequantize`; comfy_quant:
convert-to-quant's `TensorWiseINT8Layout.dequantize` = codes · row scale in f32, and with ConvRot each
group turned back by convert-to-quant's `build_hadamard` matrix, `W = W_rot · H`, summed exactly in f64)
and its first values; and per model file the golden loop (make_golden.LOOP, fp32, transformers' fp32
encoder output) run by dit_ref with those dequantized weights: `<file>.loop.latents` in quant.safetensors.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402
import make_golden  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

OUT = os.path.join(HERE, "quant")
QK_K = 256
BLOCK_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# where each block type keeps its f16 scales (byte offsets in a block)
SCALE_AT = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
            Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


# ---------------------------------------------------------------------------------------------------------
# a direct k-quant packer (ggml's layouts; not ggml's scale search)
# ---------------------------------------------------------------------------------------------------------
def pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[n, 8] 6-bit scales and mins -> [n, 12] bytes as get_scale_min_k4 reads them."""
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return s


def q45_k(x: np.ndarray, levels: int) -> np.ndarray:
    n = x.shape[0] // QK_K
    b = x.reshape(n, 8, 32).astype(np.float32)
    lo = np.minimum(b.min(-1), 0)
    scale = (b.max(-1) - lo) / levels
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = ((-lo).max(-1) / 63).astype(np.float16)
    inv = lambda v: np.where(v == 0, 0, 1 / np.where(v == 0, 1, v))  # noqa: E731
    sc = np.clip(np.round(scale * inv(d.astype(np.float32))[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(-lo * inv(dmin.astype(np.float32))[:, None]), 0, 63).astype(np.uint8)
    dl = d.astype(np.float32)[:, None] * sc
    ml = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.round((b + ml[..., None]) * inv(dl)[..., None]), 0, levels).astype(np.uint8)
    parts = [d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), pack_scale_min_k4(sc, m)]
    if levels == 31:
        bits = (q >> 4) & 1  # [n, 8, 32]
        parts.append((bits << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8))
    lo4 = (q & 0xF).reshape(n, 4, 2, 32)
    parts.append((lo4[:, :, 0] | (lo4[:, :, 1] << 4)).reshape(n, 128))
    return np.concatenate(parts, axis=1)


def q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0] // QK_K
    b = x.reshape(n, 16, 16).astype(np.float32)
    idx = np.abs(b).argmax(-1)[..., None]
    scale = np.take_along_axis(b, idx, -1)[..., 0] / -32
    sidx = np.abs(scale).argmax(-1)[:, None]
    d = (np.take_along_axis(scale, sidx, -1)[:, 0] / -128).astype(np.float16)
    df = d.astype(np.float32)
    sc = np.clip(np.round(scale / np.where(df == 0, 1, df)[:, None]), -128, 127).astype(np.int8)
    step = df[:, None] * sc
    q = np.clip(np.round(b / np.where(step == 0, 1, step)[..., None]) + 32, 0, 63).astype(np.uint8).reshape(n, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4), (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2)
    qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(2).astype(np.uint8)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8).reshape(n, 2)], axis=1)


def quantize(w: np.ndarray, qtype) -> np.ndarray:
    """A matrix [rows, cols] (f32) as the bytes [rows, row_bytes] of `qtype`."""
    if qtype in (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        return gguf.quants.quantize(w.astype(np.float32), qtype)
    rows = w.shape[0]
    flat = w.astype(np.float32).reshape(-1)
    b = {Q.Q4_K: lambda v: q45_k(v, 15), Q.Q5_K: lambda v: q45_k(v, 31), Q.Q6_K: q6_k}[qtype](flat)
    return b.reshape(rows, -1)


def dequantize(raw: np.ndarray, qtype, shape) -> np.ndarray:
    return gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------------------
def checksum(v: np.ndarray) -> str:
    """Σ bits(v[i]) · (2i + 1) mod 2^64 over the f32 values in order (bits: the IEEE word): any
    changed value changes it (odd weights), cheap on both sides."""
    bits = np.ascontiguousarray(v, dtype="<f4").reshape(-1).view("<u4").astype(np.uint64)
    weights = np.arange(bits.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return f"{int((bits * weights).sum(dtype=np.uint64)):016x}"


def digest(v: np.ndarray) -> dict:
    return {"checksum": checksum(v), "shape": list(v.shape), "first": [float(x) for x in np.asarray(v, dtype=np.float32).reshape(-1)[:4]]}


def write_gguf(path: str, tensors: list, arch: str):
    """tensors: (name, raw bytes array [rows, row_bytes] or values, qtype)."""
    w = gguf.GGUFWriter(path, arch)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, raw, qtype in tensors:
        w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def blocks_file(rng: np.random.Generator) -> tuple[dict, dict]:
    tensors, values, meta = [], {}, {}
    for qtype in BLOCK_TYPES:
        bsize, tsize = gguf.GGML_QUANT_SIZES[qtype]
        n = 4 * 512 // bsize
        raw = rng.integers(0, 256, size=(n, tsize), dtype=np.uint8)
        for at in SCALE_AT[qtype]:
            raw[:, at:at + 2] = rng.uniform(-2, 2, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
        raw = raw.reshape(4, -1)
        tensors.append((f"blocks.{qtype.name}", raw, qtype))
        values[f"blocks.{qtype.name}"] = dequantize(raw, qtype, (4, 512))
    for qtype, dt in [(Q.F16, np.float16), (Q.BF16, None), (Q.F32, np.float32)]:
        v = rng.normal(size=(4, 512)).astype(np.float32) * 3
        raw = quantize(v, qtype) if dt is None else v.astype(dt)
        tensors.append((f"blocks.{qtype.name}", raw, qtype))
        values[f"blocks.{qtype.name}"] = dequantize(raw, qtype, (4, 512)) if dt is None else raw.astype(np.float32)
    write_gguf(os.path.join(OUT, "blocks.gguf"), tensors, "moss_blocks")
    for k, v in values.items():
        meta[k] = digest(v)
    return {k: torch.from_numpy(v.copy()) for k, v in values.items()}, meta


def comfy_layout(sd: dict) -> dict:
    """Diffusers names -> ComfyUI's (layers.N.proj.q/k/v fused into qkv), values as they are."""
    out = dict(sd)
    n = 0
    while f"layers.{n}.proj.q.weight" in out:
        parts = [out.pop(f"layers.{n}.proj.{p}.weight") for p in "qkv"]
        out[f"layers.{n}.proj.qkv.weight"] = torch.cat(parts, 0)
        n += 1
    return out


def types_b(name: str, shape) -> object:
    """tiny-b-mixed.gguf: the type of each tensor (every type moss reads appears)."""
    if len(shape) < 2:
        return Q.F32
    table = [(".proj.qkv.", Q.Q4_K), (".proj.o.", Q.Q5_K), (".proj.ffn_up_gate.", Q.Q6_K), (".proj.ffn_down.", Q.Q8_0),
             ("text_embedder.blocks.0.qkv.", Q.Q4_K), ("text_embedder.blocks.1.qkv.", Q.Q6_K), (".ffn_down.", Q.Q5_0),
             (".ffn_gate.", Q.Q4_1), (".ffn_up.", Q.Q5_1), ("text_embedder.blocks.0.proj.", Q.Q4_0),
             ("text_embedder.proj.", Q.F16), ("final_linear_video.", Q.BF16), ("video_embedder.", Q.Q8_0),
             ("time_embedding.0.", Q.Q5_K), ("time_embedding.2.", Q.Q6_K), ("shared_block_modulation.", Q.Q4_K)]
    for key, qtype in table:
        if key in name:
            return qtype
    return Q.Q8_0


def moss_names(name: str, v: np.ndarray, prefix: str) -> list:
    """A file tensor's (moss name, values): prefix dropped, fused qkv split."""
    name = name[len(prefix):] if prefix and name.startswith(prefix) else name
    if name.startswith("layers.") and name.endswith(".proj.qkv.weight"):
        stem = name[: -len(".qkv.weight")]
        r = v.shape[0] // 3
        return [(f"{stem}.{p}.weight", v[i * r:(i + 1) * r]) for i, p in enumerate("qkv")]
    return [(name, v)]


def model_gguf(ckpt: str, fname: str, arch: str, prefix: str, pick) -> dict:
    sd = comfy_layout(dit_ref.load_state_dict(os.path.join(HERE, ckpt, "transformer")))
    tensors, deq = [], {}
    for name, t in sorted(sd.items()):
        v = t.float().numpy()
        qtype = pick(name, v.shape)
        if v.ndim < 2:
            raw = v.astype(np.float32)
        elif qtype == Q.F16:
            raw = v.astype(np.float16)
        else:
            raw = quantize(v, qtype)
        tensors.append((prefix + name, raw, qtype))
        values = raw.astype(np.float32) if qtype in (Q.F32, Q.F16) else dequantize(raw, qtype, v.shape)
        deq.update(moss_names(name, values, ""))
    write_gguf(os.path.join(OUT, fname), tensors, arch)
    return deq


def hadamard(g: int) -> torch.Tensor:
    from convert_to_quant.utils.convrot import build_hadamard

    return build_hadamard(g, dtype=torch.float64)


def comfy_dequant(path: str) -> dict:
    """convert-to-quant's dequantization of every tensor (moss names), ConvRot groups turned back."""
    from safetensors.torch import load_file

    sd = load_file(path)
    prefix = "model.diffusion_model." if any(k.startswith("model.diffusion_model.") for k in sd) else ""
    out = {}
    for key, t in sd.items():
        if key.endswith((".comfy_quant", ".weight_scale", ".input_scale")):
            continue
        stem = key[: -len(".weight")] if key.endswith(".weight") else None
        cq = sd.get(f"{stem}.comfy_quant") if stem else None
        if cq is None:
            v = t.float()
        else:
            layer = json.loads(bytes(cq.tolist()).decode())
            assert layer["format"] == "int8_tensorwise", layer
            from convert_to_quant.comfy.quant_ops import TensorWiseINT8Layout

            v = TensorWiseINT8Layout.dequantize(t, sd[f"{stem}.weight_scale"], is_weight=True, orig_dtype=torch.float32)
            if layer.get("convrot"):
                g = layer["convrot_groupsize"]
                rows, cols = v.shape
                v = (v.double().reshape(rows, cols // g, g) @ hadamard(g)).reshape(rows, cols).float()
        out.update(moss_names(key, v.numpy(), prefix))
    return out


def convert_to_quant(src: dict, dst: str, convrot: bool):
    from safetensors.torch import save_file

    tmp = dst + ".in.safetensors"
    save_file(src, tmp)
    exe = os.path.join(os.path.dirname(sys.executable), "convert_to_quant")
    args = [exe, "-i", tmp, "-o", dst, "--comfy_quant", "--int8", "--scaling_mode", "row", "--simple",
            "--device", "cpu", "--manual_seed", "0", "--verbose", "MINIMAL"] + (["--convrot"] if convrot else [])
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    os.remove(tmp)


def to_comfy_checkpoint(path: str):
    """Re-lay convert-to-quant's file as ComfyUI's MOSS checkpoints: prefix, q/k/v rows fused."""
    from safetensors.torch import load_file, save_file

    sd = load_file(path)
    n = 0
    while f"layers.{n}.proj.q.weight" in sd:
        base = f"layers.{n}.proj"
        cqs = {bytes(sd[f"{base}.{p}.comfy_quant"].tolist()) for p in "qkv"}
        assert len(cqs) == 1, cqs
        sd[f"{base}.qkv.weight"] = torch.cat([sd.pop(f"{base}.{p}.weight") for p in "qkv"], 0)
        sd[f"{base}.qkv.weight_scale"] = torch.cat([sd.pop(f"{base}.{p}.weight_scale") for p in "qkv"], 0)
        sd[f"{base}.qkv.comfy_quant"] = sd.pop(f"{base}.q.comfy_quant")
        for p in "kv":
            sd.pop(f"{base}.{p}.comfy_quant")
        n += 1
    save_file({f"model.diffusion_model.{k}": v.contiguous() for k, v in sd.items()}, path)


def loop_latents(ckpt: str, weights: dict) -> torch.Tensor:
    """make_golden.LOOP at fp32 (transformers' fp32 encoder output) with `weights` (moss names)."""
    from safetensors.torch import load_file

    folder = os.path.join(HERE, ckpt, "transformer")
    with open(os.path.join(folder, "config.json")) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    with torch.device("meta"):
        model = dit_ref.MOSSImageTransformer(**cfg)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items() if k != "rope.bands"}
    sd["rope.bands"] = dit_ref.load_state_dict(folder)["rope.bands"]
    model.load_state_dict(sd, strict=True, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)
    model = model.eval()
    exp = load_file(os.path.join(make_golden.EXPECTED, f"{ckpt}.safetensors"))
    with open(os.path.join(make_golden.EXPECTED, f"{ckpt}.json")) as f:
        ej = json.load(f)
    key = {p["name"]: p["key"] for p in ej["prompts"]}
    lp = ej["loop"]
    h, w = lp["height"] // 16, lp["width"] // 16
    noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(lp["seed"]), dtype=torch.float32)
    return dit_ref.sample(model, noise, exp[key[lp["prompt"]]], exp[key["empty"]], steps=lp["steps"],
                          guidance=lp["guidance"], uncond_skip=tuple(lp["uncond_skip"])).contiguous()


def main():
    from safetensors.torch import save_file

    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(43)
    tensors, blocks_meta = blocks_file(rng)
    meta = {"files": {"blocks.gguf": blocks_meta}, "models": {}}
    b = dit_ref.load_state_dict(os.path.join(HERE, "tiny-b", "transformer"))
    a = dit_ref.load_state_dict(os.path.join(HERE, "tiny-a", "transformer"))
    convert_to_quant(b, os.path.join(OUT, "tiny-b-int8.safetensors"), convrot=False)
    convert_to_quant(a, os.path.join(OUT, "tiny-a-int8-convrot.safetensors"), convrot=True)
    to_comfy_checkpoint(os.path.join(OUT, "tiny-a-int8-convrot.safetensors"))
    models = [
        ("tiny-b-mixed.gguf", "tiny-b", lambda: model_gguf("tiny-b", "tiny-b-mixed.gguf", "moss_image", "", types_b)),
        ("tiny-a-Q4_0.gguf", "tiny-a", lambda: model_gguf("tiny-a", "tiny-a-Q4_0.gguf", "moss_image", "model.diffusion_model.",
                                                          lambda n, s: Q.F32 if len(s) < 2 else Q.Q4_0)),
        ("tiny-b-int8.safetensors", "tiny-b", lambda: comfy_dequant(os.path.join(OUT, "tiny-b-int8.safetensors"))),
        ("tiny-a-int8-convrot.safetensors", "tiny-a", lambda: comfy_dequant(os.path.join(OUT, "tiny-a-int8-convrot.safetensors"))),
    ]
    for fname, ckpt, make in models:
        deq = make()
        meta["files"][fname] = {k: digest(v) for k, v in sorted(deq.items())}
        lat = loop_latents(ckpt, deq)
        tensors[f"{fname}.loop.latents"] = lat
        meta["models"][fname] = {"checkpoint": ckpt, "latents": f"{fname}.loop.latents"}
        size = os.path.getsize(os.path.join(OUT, fname))
        print(f"{fname}: {size / 1e6:.2f} MB, {len(deq)} tensors, loop latents std {lat.std():.4f}")
    meta["versions"] = {"gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0", "convert_to_quant": "1.3.4",
                        "torch": torch.__version__}
    save_file(tensors, os.path.join(make_golden.EXPECTED, "quant.safetensors"))
    make_golden.write_json(os.path.join(make_golden.EXPECTED, "quant.json"), meta)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
