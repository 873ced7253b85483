"""Writes golden/lora/ (LoRA files for tiny-a in four namings) and golden/expected/lora.{json,safetensors}
(the reference merges and the 4-step picture with every LoRA merged). Run after make_golden.py, with the
same pins plus peft (requirements.txt). Deterministic: fixed seeds, CPU, fp32.

- peft/: made with peft on dit_ref's module (`adapter_model.safetensors` + `adapter_config.json`, alpha
  only in the config); expected merge from peft `merge_and_unload`.
- kohya.safetensors: lora_down/lora_up/alpha, underscore (`lora_unet_layers_3_proj_q`) and dotted
  (`diffusion_model.layers.4.proj.o`) names.
- qkv.safetensors: a fused `transformer.layers.N.proj.qkv` LoRA (lora_A/lora_B + alpha) for the split q, k, v.
- lokr.safetensors: LyCORIS LoKr (`lokr_w1` full, `lokr_w2_a`/`lokr_w2_b` factored, alpha).
The plain formula W + scale * alpha/r * B A (fp32) gives the expected merge of the last three.
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

OUT = os.path.join(HERE, "lora")
EXPECTED = os.path.join(HERE, "expected")
# (file, scale) as the test passes them; the picture merges all four.
SCALES = {"peft": 0.8, "kohya": 1.0, "qkv": 0.7, "lokr": 1.2}


def rnd(shape, std, g):
    return (torch.randn(shape, generator=g, dtype=torch.float32) * std).contiguous()


def main():
    import peft
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    os.makedirs(OUT, exist_ok=True)
    root = os.path.join(HERE, "tiny-a")
    base = dit_ref.load_transformer(os.path.join(root, "transformer"), dtype=torch.float32)
    W = {k: v.clone() for k, v in base.state_dict().items()}
    g = torch.Generator().manual_seed(1234)
    merged = {}  # name -> fp32 merged weight (the sum over LoRAs), for the picture
    expected = {}
    meta = {"scales": SCALES, "checks": [], "rows": "each check holds rows [:8] and [-8:] of the merged fp32 weight"}

    def add(name, delta, tag):
        merged[name] = merged.get(name, W[name].clone()) + delta
        key = f"{tag}.{name}"
        # the first and last 8 rows only (keeps the file small)
        full = W[name] + delta
        expected[key] = torch.cat([full[:8], full[-8:]]).contiguous()
        meta["checks"].append({"lora": tag, "tensor": name, "key": key})

    # --- PEFT, on the reference module, merged by peft ---
    targets = ["layers.0.proj.q", "layers.0.proj.ffn_up_gate", "layers.22.proj.ffn_down", "text_embedder.proj"]
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=True)
    model = get_peft_model(dit_ref.load_transformer(os.path.join(root, "transformer"), dtype=torch.float32), cfg)
    for n, p in model.named_parameters():
        if "lora_A" in n or "lora_B" in n:
            p.data.copy_(rnd(p.shape, 0.3 if "lora_A" in n else 0.02, g))
    # peft writes alpha into adapter_config.json only; the scale is applied by --lora PATH:0.8, so
    # the peft merge is done at scale 0.8 too (peft's own `scale_layer`).
    model.save_pretrained(os.path.join(OUT, "peft"))
    os.remove(os.path.join(OUT, "peft", "README.md"))
    sd_peft = load_file(os.path.join(OUT, "peft", "adapter_model.safetensors"))
    k0 = "base_model.model.layers.0.proj.q"
    by_formula = SCALES["peft"] * 8 / 4 * (sd_peft[f"{k0}.lora_B.weight"] @ sd_peft[f"{k0}.lora_A.weight"])
    for m in model.modules():
        if hasattr(m, "scale_layer") and hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {}):
            m.scale_layer(SCALES["peft"])
    pm = model.merge_and_unload().state_dict()
    assert torch.allclose(pm["layers.0.proj.q.weight"] - W["layers.0.proj.q.weight"], by_formula, atol=1e-6)
    for t in targets:
        add(f"{t}.weight", pm[f"{t}.weight"] - W[f"{t}.weight"], "peft")

    # --- kohya ---
    kohya = {}
    for name, stem, r, alpha in [("layers.3.proj.q", "lora_unet_layers_3_proj_q", 8, 4.0),
                                 ("layers.4.proj.o", "diffusion_model.layers.4.proj.o", 4, 4.0),
                                 ("shared_block_modulation", "lora_unet_shared_block_modulation", 2, 1.0)]:
        out_f, in_f = W[f"{name}.weight"].shape
        # stored as bf16 (as most kohya files are); the reference merge uses the stored values
        down = rnd([r, in_f], 0.3, g).to(torch.bfloat16).float()
        up = rnd([out_f, r], 0.02, g).to(torch.bfloat16).float()
        kohya[f"{stem}.lora_down.weight"], kohya[f"{stem}.lora_up.weight"] = down, up
        kohya[f"{stem}.alpha"] = torch.tensor(alpha)
        add(f"{name}.weight", SCALES["kohya"] * alpha / r * (up @ down), "kohya")
    save_file({k: v.to(torch.bfloat16) if v.dim() else v for k, v in kohya.items()}, os.path.join(OUT, "kohya.safetensors"))

    # --- fused q|k|v ---
    dim = W["layers.6.proj.q.weight"].shape[0]
    r, alpha = 4, 2.0
    A, B = rnd([r, dim], 0.3, g), rnd([3 * dim, r], 0.02, g)
    save_file({"transformer.layers.6.proj.qkv.lora_A.weight": A, "transformer.layers.6.proj.qkv.lora_B.weight": B,
               "transformer.layers.6.proj.qkv.alpha": torch.tensor(alpha)}, os.path.join(OUT, "qkv.safetensors"))
    d = SCALES["qkv"] * alpha / r * (B @ A)
    for i, x in enumerate("qkv"):
        add(f"layers.6.proj.{x}.weight", d[i * dim:(i + 1) * dim], "qkv")

    # --- LoKr ---
    out_f, in_f = W["layers.10.proj.ffn_down.weight"].shape  # [dim, ffn]
    w1 = rnd([4, 4], 1.0, g)
    r, alpha = 2, 1.0
    w2a, w2b = rnd([out_f // 4, r], 0.1, g), rnd([r, in_f // 4], 0.1, g)
    stem = "lycoris_layers_10_proj_ffn_down"
    save_file({f"{stem}.lokr_w1": w1, f"{stem}.lokr_w2_a": w2a, f"{stem}.lokr_w2_b": w2b,
               f"{stem}.alpha": torch.tensor(alpha)}, os.path.join(OUT, "lokr.safetensors"))
    add("layers.10.proj.ffn_down.weight", SCALES["lokr"] * alpha / r * torch.kron(w1, w2a @ w2b), "lokr")

    # --- the picture with all four merged: weights stored as bf16 after the merge, fp32 compute ---
    sd = dict(W)
    for k, v in merged.items():
        sd[k] = v.to(torch.bfloat16).float()
    dit = dit_ref.load_transformer(os.path.join(root, "transformer"), dtype=torch.float32)
    dit.load_state_dict(sd, strict=True)
    enc = load_file(os.path.join(EXPECTED, "tiny-a.safetensors"))
    names = [p[0] for p in make_golden.PROMPTS]
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    L = make_golden.LOOP
    pos, neg = bf(enc[f"enc.{names.index(L['prompt'])}"]), bf(enc[f"enc.{names.index('empty')}"])
    h = w = 64 // 16
    noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(L["seed"]), dtype=torch.float32)
    lat = dit_ref.sample(dit, noise, pos, neg, steps=L["steps"], guidance=L["guidance"], uncond_skip=tuple(L["uncond_skip"]))
    base_lat = load_file(os.path.join(EXPECTED, "tiny-a.safetensors"))["loop.latents"]
    expected["loop.latents"] = lat.contiguous()
    meta["loop"] = {**L, "width": 64, "height": 64, "loras": ["peft/adapter_model.safetensors:0.8", "kohya.safetensors:1",
                                                            "qkv.safetensors:0.7", "lokr.safetensors:1.2"],
                    "change_vs_plain": float((lat - base_lat).abs().max())}
    meta["versions"] = {"torch": torch.__version__, "peft": peft.__version__}
    save_file(expected, os.path.join(EXPECTED, "lora.safetensors"))
    with open(os.path.join(EXPECTED, "lora.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"latents change vs the plain picture: {meta['loop']['change_vs_plain']:.4f}")
    for c in meta["checks"]:
        print(c["key"], float(W[c["tensor"]].abs().max()))


if __name__ == "__main__":
    main()
