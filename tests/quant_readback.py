#!/usr/bin/env python3
"""`moss quantize`'s files read back by the formats' own readers (CI: after `cargo build`).

    python3 tests/quant_readback.py target/debug/moss

- GGUF (q8_0, q4_0, q4_k, q5_k, q6_k of golden/tiny-b): the `gguf` package (pinned 0.19.0) reads
  the file; tensor names and shapes are ComfyUI's layout of the folder (fused `layers.N.proj.qkv`);
  `gguf.quants.dequantize` lands near the folder's values (a bound per type); Q8_0 and Q4_0 blocks
  are byte for byte the package's own `quants.quantize` of the same values.
- comfy_quant (int8, int8-convrot of golden/tiny-a): read with `safetensors`; each layer's JSON,
  codes and scales; dequantized with convert-to-quant's `TensorWiseINT8Layout.dequantize` and
  `build_hadamard` when convert-to-quant (and torch) are installed, else with their numpy twins here
  (the script says which); with convert-to-quant, the plain int8 codes and scales equal its
  quantizer's exactly and the ConvRot codes nearly (its rotation is an f32 matmul, moss's the
  fast Walsh-Hadamard transform in f64).
- comfy_quant W4A8 (w4a8, w6a8 of golden/tiny-a's text encoder): the file's header read as raw
  safetensors (numpy has no float8); each layer's JSON (`asym_w4a8_int8`), packed codes, e4m3 group
  scales, row scales and codebook; dequantized with comfy-kitchen's `dequantize_w4a8_int8_weight`
  when comfy-kitchen (and torch) are installed, else with a numpy twin of it here (the script says
  which), near the folder's weights. Prints 'N passed, 0 failed'.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "golden")
BOUNDS = {"q8_0": 1e-2, "q4_0": 0.12, "q4_k": 0.1, "q5_k": 0.05, "q6_k": 0.03}
passed = 0


def check(ok: bool, what: str):
    global passed
    if not ok:
        print(f"FAIL: {what}")
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1


def folder_values(ckpt: str) -> dict:
    """The folder's transformer in ComfyUI's layout, f32 numpy."""
    folder = os.path.join(GOLDEN, ckpt, "transformer")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    sd = {}
    for fn in files:
        # bf16 has no numpy dtype: read the raw u16 words and widen
        sd.update(read_bf16(os.path.join(folder, fn)))
    n = 0
    while f"layers.{n}.proj.q.weight" in sd:
        sd[f"layers.{n}.proj.qkv.weight"] = np.concatenate([sd.pop(f"layers.{n}.proj.{p}.weight") for p in "qkv"], 0)
        n += 1
    return sd


def read_bf16(path: str) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "BF16", (k, v["dtype"])
        s, e = v["data_offsets"]
        words = np.frombuffer(data[s:e], dtype="<u2").astype(np.uint32) << 16
        out[k] = words.view(np.float32).reshape(v["shape"])
    return out


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def moss_quantize(moss: str, ckpt: str, to: str, out: str):
    r = subprocess.run([moss, "quantize", "--model", os.path.join(GOLDEN, ckpt), "--to", to, "-o", out, "--quiet"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(out), f"moss quantize --to {to}: {r.stderr.strip()}")


def gguf_readback(moss: str, tmp: str):
    import gguf

    want = folder_values("tiny-b")
    for to, bound in BOUNDS.items():
        path = os.path.join(tmp, f"tiny-b-{to}.gguf")
        moss_quantize(moss, "tiny-b", to, path)
        r = gguf.GGUFReader(path)
        names = {t.name for t in r.tensors}
        check(names == set(want), f"{to}: names {sorted(names ^ set(want))[:4]} differ from the folder's")
        arch = r.get_field("general.architecture")
        check(arch is not None and bytes(arch.parts[arch.data[0]]).decode() == "moss_image", f"{to}: general.architecture")
        worst = 0.0
        for t in r.tensors:
            w = want[t.name]
            v = gguf.quants.dequantize(t.data, t.tensor_type).reshape(w.shape)
            e = rel(v, w)
            if t.tensor_type.name == to.upper():
                worst = max(worst, e)
            check(e < bound or (t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.BF16) and e < 4e-3),
                  f"{to}: `{t.name}` ({t.tensor_type.name}) is {e:.3e} from the folder's values")
            if t.tensor_type in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
                ref = gguf.quants.quantize(w.astype(np.float32), t.tensor_type)
                check(np.array_equal(np.asarray(t.data).reshape(-1), ref.reshape(-1)), f"{to}: `{t.name}` {t.tensor_type.name} bytes differ from gguf's quantizer")
        print(f"{to}: {len(names)} tensors read by the gguf package; worst {to.upper()} tensor {worst:.3e} (bound {bound})")


def hadamard(g: int):
    """convert-to-quant's build_hadamard (float64), or its numpy twin."""
    try:
        import torch
        from convert_to_quant.utils.convrot import build_hadamard

        return build_hadamard(g, dtype=torch.float64).numpy(), "convert-to-quant"
    except ImportError:
        h4 = np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=np.float64)
        h = h4
        while h.shape[0] < g:
            h = np.kron(h, h4)
        assert h.shape[0] == g, "a power of 4"
        return h / np.sqrt(g), "numpy twin"


def load_quantized(path: str) -> dict:
    """The comfy_quant layers' tensors (numpy has no bf16: the bf16 biases and norms are left out)."""
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        keys = [k for k in f.keys() if k.endswith(".comfy_quant")]
        stems = [k[: -len(".comfy_quant")] for k in keys]
        return {k: f.get_tensor(k) for s in stems for k in (f"{s}.comfy_quant", f"{s}.weight", f"{s}.weight_scale")}


def comfy_readback(moss: str, tmp: str):
    try:
        import torch
        from convert_to_quant.comfy.quant_ops import TensorWiseINT8Layout
    except ImportError:
        torch = TensorWiseINT8Layout = None
    reader = "convert-to-quant 1.3.4" if TensorWiseINT8Layout else "numpy twins of convert-to-quant's dequantization"
    want = folder_values("tiny-a")
    for to in ["int8", "int8-convrot"]:
        path = os.path.join(tmp, f"tiny-a-{to}.safetensors")
        moss_quantize(moss, "tiny-a", to, path)
        sd = load_quantized(path)
        layers = [k[: -len(".comfy_quant")] for k in sd if k.endswith(".comfy_quant")]
        check(len(layers) == sum(1 for k, v in want.items() if k.endswith(".weight") and v.ndim == 2), f"{to}: one comfy_quant a matrix")
        same, total, worst = 0, 0, 0.0
        for stem in layers:
            layer = json.loads(bytes(sd[f"{stem}.comfy_quant"]).decode())
            q, s = sd[f"{stem}.weight"], sd[f"{stem}.weight_scale"]
            check(layer["format"] == "int8_tensorwise" and layer.get("per_row") is True, f"{to}: `{stem}` {layer}")
            check(q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (q.shape[0], 1), f"{to}: `{stem}` codes {q.dtype} scales {s.dtype} {s.shape}")
            if TensorWiseINT8Layout:
                v = TensorWiseINT8Layout.dequantize(torch.from_numpy(q), torch.from_numpy(s), is_weight=True, orig_dtype=torch.float32).numpy()
            else:
                v = q.astype(np.float32) * s
            g = layer.get("convrot_groupsize") if layer.get("convrot") else None
            check((g is not None) == (to == "int8-convrot" and q.shape[1] % 64 == 0), f"{to}: `{stem}` ConvRot {g} for {q.shape[1]} columns")
            w = want[f"{stem}.weight"]
            if g:
                h, hname = hadamard(g)
                v = (v.astype(np.float64).reshape(q.shape[0], -1, g) @ h).reshape(q.shape)
            e = rel(v, w)
            worst = max(worst, e)
            check(e < 2e-2, f"{to}: `{stem}` is {e:.3e} from the folder's values")
            if TensorWiseINT8Layout:
                # convert-to-quant's own quantizer of the same weight (its --simple arithmetic)
                wt = torch.from_numpy(w.astype(np.float32))
                if g:
                    from convert_to_quant.converters.learned_rounding import _quantize_convrot_int8_rowwise
                    from convert_to_quant.utils.convrot import build_hadamard, rotate_weight

                    rq, _ = _quantize_convrot_int8_rowwise(rotate_weight(wt, build_hadamard(g), g))
                else:
                    rq, params = TensorWiseINT8Layout.quantize(wt, is_weight=True)
                    check(np.array_equal(params["scale"].numpy(), s), f"{to}: `{stem}` scales differ from convert-to-quant's")
                rq = rq.numpy()
                same += int((rq == q).sum())
                total += q.size
                check(np.abs(rq.astype(int) - q).max() <= (1 if g else 0), f"{to}: `{stem}` codes differ from convert-to-quant's by more than rounding")
        if total:
            frac = same / total
            check(frac > (0.999 if to == "int8-convrot" else 1.0 - 1e-12), f"{to}: {frac:.6f} of the codes equal convert-to-quant's")
            print(f"{to}: {len(layers)} layers; codes equal to convert-to-quant's quantizer: {frac:.6f}")
        print(f"{to}: dequantized with {reader}{' + ' + hname if to == 'int8-convrot' else ''}; worst tensor {worst:.3e} from the folder")


def read_raw(path: str) -> dict:
    """Every tensor of a safetensors file as numpy (bf16 and float8 e4m3 widened to f32; U8 / I8 as
    stored), by its header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    e4m3 = np.array([(-1.0 if c & 0x80 else 1.0) * (((c & 7) * 2.0 ** -9) if (c >> 3) & 15 == 0 else (1 + (c & 7) / 8) * 2.0 ** (((c >> 3) & 15) - 7))
                     for c in range(256)], dtype=np.float32)
    e4m3[0x7F] = e4m3[0xFF] = np.nan
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = data[s:e]
        d = v["dtype"]
        if d == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif d == "F8_E4M3":
            a = e4m3[np.frombuffer(raw, dtype=np.uint8)]
        else:
            a = np.frombuffer(raw, dtype={"F32": "<f4", "I8": np.int8, "U8": np.uint8}[d])
        out[k] = (a.reshape(v["shape"]), d)
    return out


def w4a8_twin(q, s_rel, s_ch, book, group, g):
    """comfy-kitchen's dequantize_w4a8_int8_weight (no correction), in numpy."""
    n, cols = q.shape
    k = s_rel.shape[1] * group
    bits = cols * 8 // k
    u = q.view(np.uint8).astype(np.int32)
    codes = np.empty((n, k), dtype=np.int32)
    codes[:, 0::2] = u[:, : k // 2] & 0xF
    codes[:, 1::2] = (u[:, : k // 2] >> 4) & 0xF
    if bits == 6:
        hi = (u[:, k // 2:, None] >> np.array([0, 2, 4, 6])) & 3
        codes |= hi.reshape(n, k) << 4
    levels = book[codes] if book is not None else (codes - (1 << (bits - 1))).astype(np.float32)
    grid = np.clip(np.round((levels.reshape(n, -1, group) * s_rel[..., None]).astype(np.float32)), -127, 127).reshape(n, k)
    rotated = grid.astype(np.float32) * s_ch[:, None]
    h, _ = hadamard(g)
    return (rotated.astype(np.float64).reshape(n, -1, g) @ h.T).reshape(n, k), bits


def w4a8_readback(moss: str, tmp: str):
    try:
        import torch
        from comfy_kitchen import dequantize_w4a8_int8_weight
    except ImportError:
        torch = dequantize_w4a8_int8_weight = None
    reader = "comfy-kitchen" if dequantize_w4a8_int8_weight else "a numpy twin of comfy-kitchen's dequantize_w4a8_int8_weight"
    folder = os.path.join(GOLDEN, "tiny-a", "text_encoder")
    want = {}
    for fn in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        want.update({k: v for k, (v, _) in read_raw(os.path.join(folder, fn)).items()})
    for to, bound in [("w4a8", 0.12), ("w6a8", 0.03)]:
        path = os.path.join(tmp, f"te-{to}.safetensors")
        r = subprocess.run([moss, "quantize", "--model", os.path.join(GOLDEN, "tiny-a"), "--component", "text-encoder", "--to", to, "-o", path, "--quiet"],
                           capture_output=True, text=True)
        check(r.returncode == 0 and os.path.exists(path), f"moss quantize --to {to}: {r.stderr.strip()}")
        sd = read_raw(path)
        layers = [k[: -len(".comfy_quant")] for k in sd if k.endswith(".comfy_quant")]
        check(len(layers) > 40, f"{to}: {len(layers)} W4A8 layers")
        worst = 0.0
        for stem in layers:
            layer = json.loads(bytes(sd[f"{stem}.comfy_quant"][0]).decode())
            check(layer["format"] == "asym_w4a8_int8" and layer["group_size"] == 16, f"{to}: `{stem}` {layer}")
            (q, qd), (s_rel, sd_), (s_ch, cd) = sd[f"{stem}.weight"], sd[f"{stem}.weight_s_rel"], sd[f"{stem}.weight_s_channel"]
            book = sd.get(f"{stem}.weight_codebook", (None, None))[0]
            check(qd == "I8" and sd_ == "F8_E4M3" and cd == "F32" and (book is not None) == (to == "w4a8"), f"{to}: `{stem}` {qd} {sd_} {cd}")
            g = layer["convrot_groupsize"]
            if dequantize_w4a8_int8_weight:
                rel_t = torch.from_numpy(s_rel).to(torch.float8_e4m3fn)
                b = torch.from_numpy(book.copy()) if book is not None else None
                v = dequantize_w4a8_int8_weight(torch.from_numpy(q.copy()), rel_t, torch.from_numpy(s_ch.copy()), codebook=b, group_size=16,
                                                convrot_groupsize=g, output_dtype=torch.float32).numpy()
            else:
                v, bits = w4a8_twin(q, s_rel, s_ch, book, 16, g)
                check(bits == int(to[1]), f"{to}: `{stem}` is {bits}-bit")
            e = rel(v, want[f"{stem}.weight"])
            worst = max(worst, e)
            check(e < bound, f"{to}: `{stem}` is {e:.3e} from the folder's values")
        print(f"{to}: {len(layers)} layers dequantized with {reader}; worst tensor {worst:.3e} from the folder (bound {bound})")


def main():
    moss = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/moss"))
    with tempfile.TemporaryDirectory() as tmp:
        gguf_readback(moss, tmp)
        comfy_readback(moss, tmp)
        w4a8_readback(moss, tmp)
    print(f"{passed} passed, 0 failed")


if __name__ == "__main__":
    main()
