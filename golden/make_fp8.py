"""Writes the fp8 references (`--precision fp8`): golden/expected/fp8.{json,safetensors} and the float8-stored
transformer golden/tiny-b-fp8/transformer/. Run after make_golden.py, with the same pins (requirements.txt).
Deterministic: CPU; the quantization in fp32, the fp8 products summed in float64 (~2 min).

The quantization, written here in torch independently of crates/moss-core/src/fp8.rs:
  a weight, per output row:  scale = amax(|w|).clamp(min=1e-12) / 448 (fp32),
                             q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
  an activation, per token:  the same on each row of x
  the linear:                y = (q_x · q_wᵀ) · s_x · s_w  (codes' values multiplied and summed in float64, times
                             s_x, times s_w, rounded to fp32)
applied to the 6 matrices of every main block (`layers.N.proj.{q,k,v,o,ffn_up_gate,ffn_down}`) of the fp32 DiT
reference (dit_ref.py); everything else (refiner, embedders, modulation, final linear, attention, norms) as the
golden fp32 run.

Conditioning: fp8 makes the forward discontinuous (a value one fp32 rounding from an e4m3 rounding boundary takes
the other code), so two correct fp32 implementations can disagree by far more than their rounding. Every output
below records `cond`: the farthest the same fp8 model lands with the other attention implementation of dit_ref
(`math` instead of `sdpa`) or with its inputs perturbed by a relative 1e-6. On these tiny random checkpoints
no fp8 forward is (1e-3 to 8e-2, against an fp8 error of 1e-2 to 9e-2): whole forwards and loops can only be
compared by the size of their fp8 error; the matrices (`mats` below) are compared exactly on the same inputs.

Tensors (f32 unless noted):
- `table.inputs` [N], `table.codes` u8 [N]: torch's float8_e4m3fn code of `x.clamp(-448, 448)` for a few thousand
  f32 values (every e4m3 value, the midpoints between neighbours and one f32 ulp either side, subnormals, ties at
  zero, saturation, infinities, +NaN, random values over the whole range).
- per checkpoint `<ckpt>` (tiny-a, tiny-b): `<ckpt>.dit.out.N` the velocity of the golden forward `dit.out.N`
  (same x, ctx, t, skip) with the fp8 DiT; `<ckpt>.loop.latents` the golden loop (make_golden.py's LOOP:
  bf16-rounded hidden states, 4 steps, CFG 3, uncond skip [22]).
- the stored checkpoint `tiny-b-fp8`: `tiny-b-fp8.dit.out.N` and `tiny-b-fp8.loop.latents` (fp8: its codes and
  scales used as stored), `tiny-b-fp8.dequant.dit.out.N` (W = q · scale in fp32, fp32 compute: what moss computes
  on the CPU at --precision bf16/fp32 with that checkpoint).
- `<tag>.mats.<block>.<matrix>.x` / `.y` for tag tiny-b, tiny-b-fp8 (fp8) and tiny-b-fp8.dequant (fp32): every
  main-block matrix's input and output in the forward `dit.out.0`, as moss stacks them (`qkv` = q, k, v outputs
  side by side): a matrix compared on the same input is exact to fp32 rounding, whatever the conditioning.

golden/tiny-b-fp8/transformer/: tiny-b's transformer, every tensor as stored there (bf16) but the main blocks'
matrices, stored F8_E4M3 with their scales in the community namings, a different one for each matrix
(STORAGE): `<stem>.weight_scale` f32 of one value a row ([out] or [out, 1]), one value for the tensor ([] or [1]),
ComfyUI's `<stem>.scale_weight` [], a bf16 [out] scale; q, k and v each their own. The per-row matrices hold
exactly the codes and scales of the quantization above applied to tiny-b's weights.
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
STORED = os.path.join(HERE, "tiny-b-fp8")
# Conditioning: perturbed runs per output, and the distance past which it is plainly ill conditioned.
PERTURBED = 4
COND_SEEN = 1e-5
# Block -> matrix -> (scale naming, shape): every naming in both blocks, q/k/v mixed within a stack.
STORAGE = [
    dict(q="row", k="row_col", v="tensor", o="tensor1", ffn_up_gate="comfy", ffn_down="row_bf16"),
    dict(q="comfy", k="tensor", v="row_bf16", o="row", ffn_up_gate="row_col", ffn_down="tensor1"),
]


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
    """golden/tiny-b-fp8/transformer/ from tiny-b's transformer; returns mats[(i, name)] = (codes, row scales)."""
    from safetensors.torch import save_file

    sd = dit_ref.load_state_dict(os.path.join(src_root, "transformer"))
    out, mats = dict(sd), {}
    assert len(STORAGE) == make_golden.CKPTS["tiny-b"]["dit"]["num_layers"]
    for i, kinds in enumerate(STORAGE):
        for n in MATS:
            stem, kind = f"layers.{i}.proj.{n}", kinds[n]
            w = sd[f"{stem}.weight"].float()
            rows = w.shape[0]
            key = f"{stem}.scale_weight" if kind == "comfy" else f"{stem}.weight_scale"
            if kind in ("tensor", "tensor1", "comfy"):  # one scale for the tensor
                scale = w.abs().amax().clamp(min=MIN_AMAX) / E4M3_MAX
                q = to_e4m3(w / scale)
                stored = scale.reshape([1] if kind == "tensor1" else [])
                row_scale = scale.expand(rows).clone()
            elif kind == "row_bf16":
                scale = (w.abs().amax(dim=1).clamp(min=MIN_AMAX) / E4M3_MAX).to(torch.bfloat16)
                q = to_e4m3(w / scale.float()[:, None])
                stored, row_scale = scale, scale.float()
            else:
                q, row_scale = quantize_rows(w)
                stored = row_scale[:, None] if kind == "row_col" else row_scale
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


def cond(f, out: torch.Tensor, inputs: list, seed: int) -> float:
    """How far `f` lands from `out` with a different fp32 rounding: `f("math", inputs)` (dit_ref's other attention),
    then, while under COND_SEEN, with the inputs perturbed by a relative 1e-6 (PERTURBED draws): the worst."""
    worst = rel_l2(f("math", inputs), out)
    g = torch.Generator().manual_seed(seed)
    for _ in range(PERTURBED):
        if worst > COND_SEEN:
            break
        moved = [t * (1 + 1e-6 * torch.randn(t.shape, generator=g)) for t in inputs]
        worst = max(worst, rel_l2(f("sdpa", moved), out))
    return worst


def capture(dit, exp: dict, ej: dict, tag: str, tensors: dict) -> list:
    """Each main block's matrices in the golden forward `dit.out.0`: their input and output, as moss stacks them
    (`qkv`: the input of q, k and v, and their outputs side by side; `o`, `ffn_up_gate`, `ffn_down`)."""
    seen, hooks = {}, []

    def keep(key):
        def hook(module, args, out):  # returns None: the output stays as it is
            seen.setdefault(key, (args[0].detach().clone(), out.detach().clone()))
        return hook

    for i, blk in enumerate(dit.layers):
        for n in MATS:
            hooks.append(getattr(blk.proj, n).register_forward_hook(keep((i, n))))
    d = ej["dit"][0]
    dit(exp[d["x"]], d["t"], exp[d["ctx"]], skip_layers=d["skip"])
    for h in hooks:
        h.remove()
    keys = []
    for i in range(len(dit.layers)):
        stacks = {"qkv": ["q", "k", "v"], "o": ["o"], "ffn_up_gate": ["ffn_up_gate"], "ffn_down": ["ffn_down"]}
        for name, parts in stacks.items():
            k = f"{tag}.mats.{i}.{name}"
            tensors[f"{k}.x"] = seen[(i, parts[0])][0].contiguous()
            tensors[f"{k}.y"] = torch.cat([seen[(i, p)][1] for p in parts], dim=-1).contiguous()
            keys.append({"block": i, "matrix": name, "x": f"{k}.x", "y": f"{k}.y"})
    return keys


def run(dit, exp: dict, ej: dict, tag: str, tensors: dict, loops=(4,)) -> dict:
    """Every golden forward and the golden loop at `loops` steps with `dit`; each output with its `cond`."""
    res = {"dit": []}
    for j, d in enumerate(ej["dit"]):
        fwd = lambda impl, xc: dit(xc[0], d["t"], xc[1], skip_layers=d["skip"], impl=impl)  # noqa: E731
        inputs = [exp[d["x"]], exp[d["ctx"]]]
        out = fwd("sdpa", inputs)
        key = f"{tag}.dit.out.{j}"
        tensors[key] = out.contiguous()
        res["dit"].append({"key": key, "of": d["key"], "cond": cond(fwd, out, inputs, j), "vs_fp32": rel_l2(out, exp[d["key"]])})
    key = {p["name"]: p["key"] for p in ej["prompts"]}
    lp = ej["loop"]
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    pos, neg = bf(exp[key[lp["prompt"]]]), bf(exp[key["empty"]])
    h, w = lp["height"] // 16, lp["width"] // 16
    noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(lp["seed"]), dtype=torch.float32)
    for steps in loops:
        def loop(impl, inputs, steps=steps):
            return dit_ref.sample(dit, inputs[0], inputs[1], inputs[2], steps=steps, guidance=lp["guidance"],
                                  uncond_skip=tuple(lp["uncond_skip"]), impl=impl)
        inputs = [noise, pos, neg]
        lat = loop("sdpa", inputs)
        name = "loop" if steps == lp["steps"] else f"loop{steps}"
        tensors[f"{tag}.{name}.latents"] = lat.contiguous()
        res[name] = {"latents": f"{tag}.{name}.latents", "steps": steps, "width": lp["width"], "height": lp["height"],
                     "cond": cond(loop, lat, inputs, 100 + steps)}
        if steps == lp["steps"]:
            res[name]["vs_fp32"] = rel_l2(lat, exp["loop.latents"])
    print(tag, [f"{d['cond']:.1e}/{d['vs_fp32']:.1e}" for d in res["dit"]],
          {k: (f"{v['cond']:.1e}", f"{v.get('vs_fp32', 0):.1e}") for k, v in res.items() if k != "dit"})
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
            "cond": "the largest rel L2 to the same fp8 model with dit_ref's `math` attention instead of `sdpa`, and (while "
                    "under 1e-5) with the inputs (x and the hidden states) perturbed by a relative 1e-6, 4 draws",
            "vs_fp32": "rel L2 to the golden fp32 output (make_golden.py)",
            "table": {"inputs": "table.inputs", "codes": "table.codes", "count": int(x.numel()),
                      "codes_of": "torch x.clamp(-448, 448).to(torch.float8_e4m3fn)"},
            "loop": make_golden.LOOP, "checkpoints": {}}
    for name in make_golden.CKPTS:
        exp = load_file(os.path.join(make_golden.EXPECTED, f"{name}.safetensors"))
        with open(os.path.join(make_golden.EXPECTED, f"{name}.json")) as f:
            ej = json.load(f)
        load = lambda: dit_ref.load_transformer(os.path.join(HERE, name, "transformer"), dtype=torch.float32)  # noqa: E731
        dit = load()
        dit = make_fp8(dit, rowwise(dit))
        meta["checkpoints"][name] = run(dit, exp, ej, name, tensors)
        if name == "tiny-b":
            meta["checkpoints"][name]["mats"] = capture(dit, exp, ej, name, tensors)
        if name == "tiny-b":
            mats = write_stored(os.path.join(HERE, name))
            per_row = rowwise(load())
            same = [f"{i}.{n}" for (i, n), (q, s) in mats.items()
                    if torch.equal(q.view(torch.uint8), per_row[(i, n)][0].view(torch.uint8)) and torch.equal(s, per_row[(i, n)][1])]
            fp8 = make_fp8(load(), mats)
            stored = run(fp8, exp, ej, "tiny-b-fp8", tensors)
            meta["checkpoints"]["tiny-b-fp8"] = {**stored, "storage": STORAGE, "matrices_with_the_rowwise_codes": same,
                                                 "mats": capture(fp8, exp, ej, "tiny-b-fp8", tensors)}
            deq = load()
            for i, blk in enumerate(deq.layers):
                for n in MATS:
                    q, s = mats[(i, n)]
                    getattr(blk.proj, n).weight.copy_(q.float() * s[:, None])
            meta["checkpoints"]["tiny-b-fp8-dequant"] = {**run(deq, exp, ej, "tiny-b-fp8.dequant", tensors, loops=()),
                                                         "mats": capture(deq, exp, ej, "tiny-b-fp8.dequant", tensors)}
    meta["versions"] = {"torch": torch.__version__}
    save_file(tensors, os.path.join(make_golden.EXPECTED, "fp8.safetensors"))
    make_golden.write_json(os.path.join(make_golden.EXPECTED, "fp8.json"), meta)
    for f in [os.path.join(make_golden.EXPECTED, "fp8.safetensors"), os.path.join(STORED, "transformer",
                                                                                "diffusion_pytorch_model.safetensors")]:
        os.chmod(f, 0o644)


if __name__ == "__main__":
    main()
