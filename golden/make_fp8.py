"""Writes the fp8 references (`--precision fp8`): golden/expected/fp8.{json,safetensors} and the float8-stored
transformer golden/tiny-a-fp8/transformer/. Run after make_golden.py, with the same pins (requirements.txt).
Deterministic: CPU; the quantization in fp32, the fp8 products summed in float64.

The quantization, written here in torch independently of src/fp8.rs:
  a weight, per output row:  scale = amax(|w|).clamp(min=1e-12) / 448 (fp32),
                             q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
  an activation, per token:  the same on each row of x
  the linear:                y = (q_x · q_wᵀ) · s_x · s_w  (codes' values multiplied and summed in float64, times
                             s_x, times s_w, rounded to fp32)
applied to the 6 matrices of every main block (`layers.N.proj.{q,k,v,o,ffn_up_gate,ffn_down}`) of the fp32 DiT
reference (dit_ref.py); everything else (refiner, embedders, modulation, final linear, attention, norms) as the
golden fp32 run.

Tensors (f32 unless noted):
- `table.inputs` [N], `table.codes` u8 [N]: torch's float8_e4m3fn code of `x.clamp(-448, 448)` for a few thousand
  f32 values (every e4m3 value, the midpoints between neighbours and one f32 ulp either side, subnormals, ties at
  zero, saturation, infinities, +NaN, random values over the whole range).
- per checkpoint `<ckpt>` (tiny-a, tiny-b): `<ckpt>.dit.out` the velocity of one forward (`dit.x`, `dit.ctx`, the
  t and skip of the golden `dit.out.0`), `<ckpt>.loop.latents` / `.loop.latents.step1` the golden loop
  (make_golden.py's LOOP: bf16-rounded hidden states, 4 steps, CFG 3, uncond skip [22]) with the fp8 DiT.
- the stored checkpoint `tiny-a-fp8`: `tiny-a-fp8.dit.out` and `tiny-a-fp8.loop.latents` (fp8 mode: its codes and
  scales used as stored), `tiny-a-fp8.dequant.dit.out` (W = q · scale in fp32, fp32 compute: what moss computes on
  the CPU at --precision bf16/fp32 with that checkpoint).

golden/tiny-a-fp8/transformer/: tiny-a's transformer in one file, every tensor as stored there (bf16) but the main
blocks' matrices, stored F8_E4M3 with their scales in the community namings: `<stem>.weight_scale` f32 of one
value a row ([out]) for most blocks, [out, 1] in block 1, one value for the tensor ([]) in block 2 (q, k and v
each their own), [1] in block 3, ComfyUI's `<stem>.scale_weight` [] in block 4, a bf16 [out] scale in block 5.
The per-row blocks hold exactly the codes and scales of the quantization above applied to tiny-a's weights.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402
import make_golden  # noqa: E402

E4M3_MAX = 448.0
MIN_AMAX = 1e-12
MATS = ["q", "k", "v", "o", "ffn_up_gate", "ffn_down"]
STORED = os.path.join(HERE, "tiny-a-fp8")


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_rows(w: torch.Tensor):
    """-> (codes float8_e4m3fn [N, K], scale fp32 [N])"""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=MIN_AMAX) / E4M3_MAX
    return to_e4m3(w / scale[:, None]), scale


class Fp8Linear(torch.nn.Module):
    """A bias-free linear over float8 codes with one scale per output row; activations quantized per token."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.q, self.scale = q, scale.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qx, sx = quantize_rows(x.reshape(-1, x.shape[-1]))
        y = (qx.double() @ self.q.double().T) * sx.double()[:, None] * self.scale.double()[None, :]
        return y.float().reshape(*x.shape[:-1], -1)


def make_fp8(dit: dit_ref.MOSSImageTransformer, mats: dict) -> dit_ref.MOSSImageTransformer:
    """Replace the main blocks' matrices: mats[(i, name)] = (codes, row scales)."""
    for i, blk in enumerate(dit.layers):
        for n in MATS:
            setattr(blk.proj, n, Fp8Linear(*mats[(i, n)]))
    return dit


def rowwise(dit) -> dict:
    return {(i, n): quantize_rows(getattr(blk.proj, n).weight) for i, blk in enumerate(dit.layers) for n in MATS}


def e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    vals = codes[torch.isfinite(codes)]
    pos = torch.unique(vals[vals >= 0])  # sorted
    mids = (pos[:-1] + pos[1:]) / 2  # exact in f32
    up = lambda t: torch.nextafter(t, torch.full_like(t, float("inf")))  # noqa: E731
    down = lambda t: torch.nextafter(t, torch.full_like(t, -float("inf")))  # noqa: E731
    g = torch.Generator().manual_seed(8)
    rnd = torch.exp2(torch.rand(2000, generator=g) * 24 - 14) * torch.where(torch.rand(2000, generator=g) < 0.5, -1.0, 1.0)
    special = torch.tensor([0.0, -0.0, 2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-9, 2.0**-7, 2.0**-6, 1e-30, 1e-45, 448.0,
                            449.0, 463.99, 464.0, 464.01, 479.99, 480.0, 500.0, 1e6, 3.4e38, float("inf"), float("nan")])
    sub = torch.arange(0, 80, dtype=torch.float32) * 2.0**-12
    parts = [vals, mids, up(mids), down(mids), -mids, -up(mids), -down(mids), sub, -sub, special, -special[:-1], rnd]
    x = torch.cat([p.float() for p in parts]).contiguous()
    return x, to_e4m3(x).view(torch.uint8).contiguous()


def write_stored(src_root: str) -> dict:
    """golden/tiny-a-fp8/transformer/ from tiny-a's transformer; returns mats[(i, name)] = (codes, row scales)."""
    from safetensors.torch import save_file

    sd = dit_ref.load_state_dict(os.path.join(src_root, "transformer"))
    out, mats = {}, {}
    for k, v in sd.items():
        out[k] = v
    layers = make_golden.CKPTS["tiny-a"]["dit"]["num_layers"]
    for i in range(layers):
        for n in MATS:
            stem = f"layers.{i}.proj.{n}"
            w = sd[f"{stem}.weight"].float()
            rows = w.shape[0]
            if i in (2, 3, 4):  # one scale for the tensor
                scale = w.abs().amax().clamp(min=MIN_AMAX) / E4M3_MAX
                q = to_e4m3(w / scale)
                stored = {2: scale.reshape([]), 3: scale.reshape([1]), 4: scale.reshape([])}[i]
                key = f"{stem}.scale_weight" if i == 4 else f"{stem}.weight_scale"
                row_scale = scale.expand(rows).clone()
            elif i == 5:  # a bf16 scale a row
                scale = (w.abs().amax(dim=1).clamp(min=MIN_AMAX) / E4M3_MAX).to(torch.bfloat16)
                q = to_e4m3(w / scale.float()[:, None])
                stored, key, row_scale = scale, f"{stem}.weight_scale", scale.float()
            else:
                q, row_scale = quantize_rows(w)
                stored = row_scale[:, None] if i == 1 else row_scale
                key = f"{stem}.weight_scale"
            out[f"{stem}.weight"] = q
            out[key] = stored.contiguous()
            mats[(i, n)] = (q, row_scale)
    folder = os.path.join(STORED, "transformer")
    if os.path.exists(STORED):
        shutil.rmtree(STORED)
    os.makedirs(folder)
    shutil.copy(os.path.join(src_root, "transformer", "config.json"), folder)
    save_file({k: v.contiguous() for k, v in sorted(out.items())}, os.path.join(folder, "diffusion_pytorch_model.safetensors"),
              metadata={"format": "pt"})
    return mats


def run(dit, exp: dict, ej: dict, tag: str, tensors: dict, loop: bool = True) -> dict:
    d0 = ej["dit"][0]
    out = dit(exp[d0["x"]], d0["t"], exp[d0["ctx"]], skip_layers=d0["skip"])
    tensors[f"{tag}.dit.out"] = out.contiguous()
    res = {"dit_out": f"{tag}.dit.out", "dit": d0, "dit_vs_fp32": rel_l2(out, exp[d0["key"]])}
    if loop:
        key = {p["name"]: p["key"] for p in ej["prompts"]}
        lp = ej["loop"]
        bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
        pos, neg = bf(exp[key[lp["prompt"]]]), bf(exp[key["empty"]])
        h, w = lp["height"] // 16, lp["width"] // 16
        noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(lp["seed"]), dtype=torch.float32)
        steps = {}
        lat = dit_ref.sample(dit, noise, pos, neg, steps=lp["steps"], guidance=lp["guidance"],
                             uncond_skip=tuple(lp["uncond_skip"]), callback=lambda i, xx: steps.setdefault(i, xx.clone()))
        tensors[f"{tag}.loop.latents"] = lat.contiguous()
        tensors[f"{tag}.loop.latents.step1"] = steps[0].contiguous()
        res.update(latents=f"{tag}.loop.latents", step1=f"{tag}.loop.latents.step1", width=lp["width"], height=lp["height"],
                   loop_vs_fp32=rel_l2(lat, exp["loop.latents"]))
    print(tag, {k: v for k, v in res.items() if "vs" in k})
    return res


def main():
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    x, codes = e4m3_table()
    tensors = {"table.inputs": x, "table.codes": codes}
    meta = {"quantization": {"scale": "amax(|row|).clamp(min=1e-12) / 448, fp32",
                             "codes": "(row / scale).clamp(-448, 448).to(torch.float8_e4m3fn)",
                             "linear": "(q_x . q_w^T) in float64, * s_x * s_w, rounded to fp32",
                             "where": "layers.N.proj.{q,k,v,o,ffn_up_gate,ffn_down}; the rest fp32 as the golden run"},
            "table": {"inputs": "table.inputs", "codes": "table.codes", "count": int(x.numel()),
                      "codes_of": "torch x.clamp(-448, 448).to(torch.float8_e4m3fn)"},
            "loop": make_golden.LOOP, "checkpoints": {}}
    for name in make_golden.CKPTS:
        exp = load_file(os.path.join(make_golden.EXPECTED, f"{name}.safetensors"))
        with open(os.path.join(make_golden.EXPECTED, f"{name}.json")) as f:
            ej = json.load(f)
        dit = dit_ref.load_transformer(os.path.join(HERE, name, "transformer"), dtype=torch.float32)
        meta["checkpoints"][name] = run(make_fp8(dit, rowwise(dit)), exp, ej, name, tensors)
        if name == "tiny-a":
            mats = write_stored(os.path.join(HERE, name))
            base = dit_ref.load_transformer(os.path.join(HERE, name, "transformer"), dtype=torch.float32)
            per_row = rowwise(base)
            same = [i for i in range(len(base.layers)) if all(torch.equal(mats[(i, n)][0].view(torch.uint8), per_row[(i, n)][0].view(
                torch.uint8)) and torch.equal(mats[(i, n)][1], per_row[(i, n)][1]) for n in MATS)]
            stored = dit_ref.load_transformer(os.path.join(HERE, name, "transformer"), dtype=torch.float32)
            meta["checkpoints"]["tiny-a-fp8"] = run(make_fp8(stored, mats), exp, ej, "tiny-a-fp8", tensors)
            meta["checkpoints"]["tiny-a-fp8"]["blocks_with_the_rowwise_codes"] = same
            deq = dit_ref.load_transformer(os.path.join(HERE, name, "transformer"), dtype=torch.float32)
            for i, blk in enumerate(deq.layers):
                for n in MATS:
                    q, s = mats[(i, n)]
                    getattr(blk.proj, n).weight.copy_(q.float() * s[:, None])
            meta["checkpoints"]["tiny-a-fp8-dequant"] = run(deq, exp, ej, "tiny-a-fp8.dequant", tensors, loop=False)
    meta["versions"] = {"torch": torch.__version__}
    save_file(tensors, os.path.join(make_golden.EXPECTED, "fp8.safetensors"))
    make_golden.write_json(os.path.join(make_golden.EXPECTED, "fp8.json"), meta)


if __name__ == "__main__":
    main()
