#!/usr/bin/env python3
"""Writes golden/tiny-a/, golden/tiny-b/ (tiny random checkpoints in the real diffusers layout) and
golden/expected/ (reference outputs). Deterministic: fixed seeds, CPU, fp32 compute.

    python golden/make_golden.py            # regenerate everything
    python golden/make_golden.py --check    # only reload and summarise what is on disk

See golden/README.md for the data contract. The DiT reference is golden/dit_ref.py; the text encoder is
transformers' Qwen3_5Model; the VAE is diffusers' AutoencoderKLFlux2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_ref  # noqa: E402
from tiny_tokenizer import QWEN35_SPECIALS, build_tokenizer  # noqa: E402

torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
torch.use_deterministic_algorithms(True)

EXPECTED = os.path.join(HERE, "expected")

# ---------------------------------------------------------------------------------------------------------
# configuration of the two checkpoints
# ---------------------------------------------------------------------------------------------------------
CKPTS = {
    "tiny-a": dict(
        seed=1001,
        n_ranks=6000,
        width=64, height=64,
        dit=dict(dim=128, ffn_dim=96, num_heads=1, num_layers=23, text_dim=64, freq_dim=256,
                 latent_channels=128, rope_base=10000.0),
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=16, mrope_section=[2, 1, 1]),
        vae=dict(block_out_channels=[32, 32, 32, 32], decoder_block_out_channels=[32, 32, 64, 64],
                 layers_per_block=2),
        dit_skips=[[], [22]],
        shard=dict(text_encoder="300KB", transformer="2MB", vae=None),
    ),
    "tiny-b": dict(
        seed=2002,
        n_ranks=5000,
        width=96, height=64,
        dit=dict(dim=256, ffn_dim=128, num_heads=2, num_layers=2, text_dim=96, freq_dim=256,
                 latent_channels=128, rope_base=10000.0),
        text=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=4, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=48, linear_num_key_heads=2, linear_num_value_heads=6,
                  linear_key_head_dim=16, linear_value_head_dim=24, mrope_section=[2, 2, 2]),
        vae=dict(block_out_channels=[32, 32, 32, 32], decoder_block_out_channels=[32, 64, 64, 96],
                 layers_per_block=1),
        dit_skips=[[], [22], [1]],
        shard=dict(text_encoder=None, transformer=None, vae="3MB"),
    ),
}

PROMPTS = [
    ("empty", ""),
    ("unicode", "  Ein Café ☕ —\n\tüber 東京  \n"),
    ("marks", "नमस्ते ❤️ naïve ü"),
    ("long", None),  # filled in below
    ("plain", "a red fox sitting in the snow, photograph"),
]
LONG_PROMPT = (
    "A sprawling watercolor panorama of an old harbor town at dawn: narrow cobblestone streets wind down "
    "from a hilltop church to the water, where fishing boats with faded blue and orange hulls rock gently "
    "beside a stone pier. Gulls circle above stacks of wooden crates and coiled ropes. On the left, a row of "
    "tall, crooked houses with terracotta roofs and green shutters leans toward the sea; laundry hangs between "
    "the windows, and a cat sleeps on a sunlit balcony. In the middle distance, a lighthouse with red and white "
    "stripes stands on a rocky outcrop, its lamp still glowing faintly. Mist drifts over the bay, softening the "
    "outlines of distant islands. The sky shifts from deep violet at the top to pale peach near the horizon, "
    "and the first rays of the sun catch the wet stones and the brass fittings of the boats, 1024 by 576 pixels."
)
PROMPTS = [(n, LONG_PROMPT if t is None else t) for n, t in PROMPTS]

NEGATIVE = ""
LOOP = dict(prompt="plain", negative=NEGATIVE, seed=42, steps=4, guidance=3.0, uncond_skip=[22])
DIT_TIMESTEPS = [1000.0, 500.0]

# spec 5.2, the 50-step list (float32 shortest repr)
SPEC_SIGMAS_50 = [
    1., 0.996, 0.992, 0.987, 0.983, 0.978, 0.973, 0.968, 0.963, 0.957, 0.952, 0.946, 0.939, 0.93299997, 0.926,
    0.91899997, 0.912, 0.905, 0.897, 0.888, 0.88, 0.871, 0.861, 0.851, 0.84, 0.829, 0.817, 0.805, 0.791, 0.777,
    0.76199996, 0.746, 0.729, 0.71099997, 0.692, 0.671, 0.648, 0.62299997, 0.597, 0.56799996, 0.53599995, 0.501,
    0.46300003, 0.42100003, 0.37300003, 0.321, 0.261, 0.193, 0.115, 0.024, 0.,
]

NOISE_CASES = [
    (0, [1, 128, 4, 4]),
    (42, [1, 128, 4, 4]),
    (42, [1, 128, 4, 6]),
    (2**32 + 5, [1, 128, 4, 6]),
    (2**64 - 1, [1, 128, 4, 4]),
    (1, [1, 128, 8, 12]),
    (123456789, [1, 128, 8, 12]),
]


def wrap(prompt: str) -> str:
    return "<|im_start|>user\n" + prompt.strip() + "<|im_end|>\n<|im_start|>assistant\n<think>\n"


# ---------------------------------------------------------------------------------------------------------
# random initialisation at realistic scales
# ---------------------------------------------------------------------------------------------------------
def normal_(t: torch.Tensor, std: float, gen: torch.Generator, mean: float = 0.0):
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32) * std + mean)


def init_linear(m: torch.nn.Module, gen, bias_std=0.05, gain=1.0):
    fan_in = m.weight[0].numel()
    normal_(m.weight, gain / math.sqrt(fan_in), gen)
    if getattr(m, "bias", None) is not None:
        normal_(m.bias, bias_std, gen)


def init_dit(model: dit_ref.MOSSImageTransformer, gen):
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            init_linear(m, gen)
        elif isinstance(m, dit_ref.RMSNorm):
            normal_(m.weight, 0.1, gen, mean=1.0)  # plain weight, near 1


def init_text_encoder(model, gen):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            init_linear(m, gen, bias_std=0.02)
        elif isinstance(m, torch.nn.Embedding):
            normal_(m.weight, 1.0, gen)
        elif isinstance(m, (torch.nn.Conv1d, torch.nn.Conv3d)):
            init_linear(m, gen, bias_std=0.02)
        elif isinstance(m, mq.Qwen3_5RMSNormGated):
            normal_(m.weight, 0.1, gen, mean=1.0)  # plain weight
        elif isinstance(m, mq.Qwen3_5RMSNorm):
            normal_(m.weight, 0.1, gen)  # zero-centred: multiplies by 1 + w
        elif isinstance(m, torch.nn.LayerNorm):
            normal_(m.weight, 0.1, gen, mean=1.0)
            normal_(m.bias, 0.02, gen)
        if isinstance(m, mq.Qwen3_5GatedDeltaNet):
            with torch.no_grad():  # Qwen's init: A ~ U(0.01, 16), dt_bias ~ 1 (plus a little noise here)
                m.A_log.copy_((torch.rand(m.A_log.shape, generator=gen) * (16 - 0.01) + 0.01).log())
                normal_(m.dt_bias, 0.1, gen, mean=1.0)


def init_vae(vae, gen):
    for name, m in vae.named_modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            init_linear(m, gen, bias_std=0.02)
        elif isinstance(m, torch.nn.GroupNorm):
            normal_(m.weight, 0.1, gen, mean=1.0)
            normal_(m.bias, 0.05, gen)
    with torch.no_grad():
        bn = vae.bn
        normal_(bn.running_mean, 0.3, gen)
        bn.running_var.copy_(torch.exp(torch.randn(bn.running_var.shape, generator=gen) * 0.4) * 0.8)
        bn.num_batches_tracked.fill_(1000)


# ---------------------------------------------------------------------------------------------------------
# writers
# ---------------------------------------------------------------------------------------------------------
def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def save_diffusers_weights(sd: dict, folder: str, max_shard_size):
    """Same file naming / index format as diffusers ModelMixin.save_pretrained(safe_serialization=True)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    if max_shard_size is None:
        save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(folder, "diffusion_pytorch_model.safetensors"),
                  metadata={"format": "pt"})
        return
    split = split_torch_state_dict_into_shards(sd, max_shard_size=max_shard_size,
                                               filename_pattern="diffusion_pytorch_model{suffix}.safetensors")
    for fn, names in split.filename_to_tensors.items():
        save_file({k: sd[k].contiguous() for k in names}, os.path.join(folder, fn), metadata={"format": "pt"})
    assert split.is_sharded
    write_json(os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json"),
               {"metadata": dict(split.metadata), "weight_map": dict(sorted(split.tensor_to_filename.items()))})


def write_png(path: str, px: np.ndarray):
    """Plain RGB8 PNG (no ancillary chunks), filter 0 on every row."""
    h, w, c = px.shape
    assert c == 3 and px.dtype == np.uint8
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))


# ---------------------------------------------------------------------------------------------------------
# checkpoint construction
# ---------------------------------------------------------------------------------------------------------
def make_checkpoint(name: str, spec: dict) -> dict:
    import diffusers
    import transformers
    from diffusers import AutoencoderKLFlux2
    from transformers import Qwen3_5Config, Qwen3_5Model

    root = os.path.join(HERE, name)
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    dv = diffusers.__version__

    # model_index.json (class/library pairs: [I] in the spec; custom classes live in transformer/pipeline_moss_image.py)
    write_json(os.path.join(root, "model_index.json"), {
        "_class_name": "MOSSImagePipeline",
        "_diffusers_version": dv,
        "scheduler": ["pipeline_moss_image", "MOSSImageScheduler"],
        "text_encoder": ["transformers", "Qwen3_5Model"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["pipeline_moss_image", "MOSSImageTransformer"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    })
    os.makedirs(os.path.join(root, "scheduler"))
    write_json(os.path.join(root, "scheduler", "scheduler_config.json"), {
        "_class_name": "MOSSImageScheduler", "_diffusers_version": dv,
        "num_train_timesteps": 1000, "shift": 5.0, "training_shift": 1.0,
    })

    # tokenizer
    tok = build_tokenizer(spec["n_ranks"], os.path.join(root, "tokenizer"))
    V = tok["vocab_size"]
    sp = tok["specials"]

    # text encoder
    t = spec["text"]
    rotary = int(t["head_dim"] * 0.25)
    assert sum(t["mrope_section"]) == rotary // 2
    text_config = dict(
        vocab_size=V, hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
        num_hidden_layers=t["num_hidden_layers"], num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"], hidden_act="silu",
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        linear_conv_kernel_dim=4, linear_key_head_dim=t["linear_key_head_dim"],
        linear_value_head_dim=t["linear_value_head_dim"], linear_num_key_heads=t["linear_num_key_heads"],
        linear_num_value_heads=t["linear_num_value_heads"],
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(t["num_hidden_layers"])],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": t["mrope_section"], "mrope_interleaved": True},
        eos_token_id=sp["<|im_end|>"], pad_token_id=None, bos_token_id=None,
    )
    vision_config = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
                         temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=t["hidden_size"],
                         num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=text_config, vision_config=vision_config,
                        image_token_id=sp["<|image_pad|>"], video_token_id=sp["<|video_pad|>"],
                        vision_start_token_id=sp["<|vision_start|>"], vision_end_token_id=sp["<|vision_end|>"],
                        tie_word_embeddings=False)
    torch.manual_seed(spec["seed"])
    te = Qwen3_5Model(cfg)
    init_text_encoder(te, torch.Generator().manual_seed(spec["seed"] + 1))
    te = te.to(torch.bfloat16)
    te_dir = os.path.join(root, "text_encoder")
    kw = {"max_shard_size": spec["shard"]["text_encoder"]} if spec["shard"]["text_encoder"] else {"max_shard_size": "1GB"}
    te.save_pretrained(te_dir, **kw)
    del te

    # transformer
    tr_dir = os.path.join(root, "transformer")
    os.makedirs(tr_dir)
    torch.manual_seed(spec["seed"] + 2)
    dit = dit_ref.MOSSImageTransformer(**spec["dit"])
    init_dit(dit, torch.Generator().manual_seed(spec["seed"] + 3))
    sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in dit.state_dict().items()}
    assert sd["rope.bands"].dtype == torch.bfloat16 and sd["rope.bands"].shape == (16,)
    save_diffusers_weights(sd, tr_dir, spec["shard"]["transformer"])
    write_json(os.path.join(tr_dir, "config.json"),
               {"_class_name": "MOSSImageTransformer", "_diffusers_version": dv, **spec["dit"]})
    del dit, sd

    # vae
    v = spec["vae"]
    torch.manual_seed(spec["seed"] + 4)
    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, block_out_channels=tuple(v["block_out_channels"]),
                             decoder_block_out_channels=tuple(v["decoder_block_out_channels"]),
                             layers_per_block=v["layers_per_block"], latent_channels=32, norm_num_groups=32,
                             act_fn="silu", sample_size=1024, use_quant_conv=True, use_post_quant_conv=True,
                             mid_block_add_attention=True, batch_norm_eps=1e-4, batch_norm_momentum=0.1,
                             patch_size=(2, 2))
    init_vae(vae, torch.Generator().manual_seed(spec["seed"] + 5))
    vkw = {"max_shard_size": spec["shard"]["vae"]} if spec["shard"]["vae"] else {}
    vae.save_pretrained(os.path.join(root, "vae"), safe_serialization=True, **vkw)
    return dict(tok=tok, transformers_version=transformers.__version__)


# ---------------------------------------------------------------------------------------------------------
# expected outputs
# ---------------------------------------------------------------------------------------------------------
def common_expected():
    from safetensors.torch import save_file

    tensors, meta = {}, {"sigmas": [], "noise": []}
    for n in range(1, 201):
        s = dit_ref.sigmas_for(n)
        assert s.shape[0] == n + 1, (n, s.shape)  # no duplicates at shift 5 (spec 5.2)
        tensors[f"sigmas.{n}"] = s
        meta["sigmas"].append({"key": f"sigmas.{n}", "steps": n, "shift": 5.0})
    s50 = dit_ref.sigmas_for(50)
    assert s50.tolist() == torch.tensor(SPEC_SIGMAS_50, dtype=torch.float32).tolist(), "spec 5.2 50-step list"
    meta["sigmas_50"] = [float(x) for x in s50]
    for i, (seed, shape) in enumerate(NOISE_CASES):
        g = torch.Generator().manual_seed(seed)
        tensors[f"noise.{i}"] = torch.randn(shape, generator=g, dtype=torch.float32)
        meta["noise"].append({"key": f"noise.{i}", "seed": seed, "shape": shape})
    meta["versions"] = {"torch": torch.__version__}
    save_file(tensors, os.path.join(EXPECTED, "common.safetensors"))
    write_json(os.path.join(EXPECTED, "common.json"), meta)
    return s50


@torch.inference_mode()
def ckpt_expected(name: str, spec: dict, built: dict):
    import diffusers
    import tokenizers
    import transformers
    from diffusers import AutoencoderKLFlux2
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, Qwen3_5Model

    root = os.path.join(HERE, name)
    tensors, meta = {}, {"checkpoint": name, "width": spec["width"], "height": spec["height"]}
    h, w = spec["height"] // 16, spec["width"] // 16

    # --- tokenizer (Python tokenizers, tokenizer.json as stored) ---
    tk = Tokenizer.from_file(os.path.join(root, "tokenizer", "tokenizer.json"))
    tt = built["tok"]["tiktoken"]
    hf = AutoTokenizer.from_pretrained(os.path.join(root, "tokenizer"))
    sp = built["tok"]["specials"]
    check = tk.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n").ids
    for c in ("<|im_start|>", "<|im_end|>", "<think>"):
        assert sp[c] in check
    assert check[0] == sp["<|im_start|>"] and check[-2:] == [sp["<think>"], tk.token_to_id("Ċ")], check

    # --- encoder ---
    te = Qwen3_5Model.from_pretrained(os.path.join(root, "text_encoder"), dtype=torch.float32).eval()
    lm = te.language_model  # Qwen3_5TextModel; last_hidden_state is after language_model.norm
    prompts, enc = [], {}
    notes = []
    for i, (pname, text) in enumerate(PROMPTS):
        wrapped = wrap(text)
        ids = tk.encode(wrapped).ids
        tt_ids = tt.encode(wrapped, allowed_special="all")
        assert ids == tt_ids, (pname, ids, tt_ids)
        tmpl = hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                      add_generation_prompt=True, enable_thinking=True)
        assert tmpl == wrapped, (tmpl, wrapped)
        hf_ids = hf(wrapped)["input_ids"]
        if hf_ids != ids:
            notes.append(f"transformers AutoTokenizer ids differ from tokenizer.json for prompt '{pname}'")
        assert tk.decode(ids, skip_special_tokens=False) == wrapped
        hs = lm(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0].float()
        full = te(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0].float()
        assert torch.equal(hs, full)
        key = f"enc.{i}"
        tensors[key] = hs.contiguous()
        enc[pname] = hs
        prompts.append({"name": pname, "text": text, "wrapped": wrapped, "ids": ids, "key": key})
    # The same text model in float64: the yardstick for the fp32 outputs themselves (an ill-
    # conditioned prompt can leave two correct fp32 implementations 1e-5 apart).
    lm64 = lm.double()
    for i, p in enumerate(prompts):
        hs64 = lm64(input_ids=torch.tensor([p["ids"]]), use_cache=False).last_hidden_state[0]
        tensors[f"enc64.{i}"] = hs64.float().contiguous()
        p["key64"] = f"enc64.{i}"
    meta["prompts"] = prompts
    meta["encoder"] = {"module": "Qwen3_5Model.language_model (Qwen3_5TextModel), output last_hidden_state",
                       "dtype": "float32 compute, bf16 weights upcast", "attn_implementation":
                       te.config._attn_implementation}
    meta["tokenizer_notes"] = notes
    del te, lm

    # --- DiT forwards ---
    dit = dit_ref.load_transformer(os.path.join(root, "transformer"), dtype=torch.float32)
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    g = torch.Generator().manual_seed(7)
    x = torch.randn([1, 128, h, w], generator=g, dtype=torch.float32)
    tensors["dit.x"] = x
    tensors["dit.ctx"] = bf(enc["plain"]).contiguous()
    tensors["dit.ctx.neg"] = bf(enc["empty"]).contiguous()
    runs = [("dit.ctx", t, sk) for t in DIT_TIMESTEPS for sk in spec["dit_skips"]]
    runs.append(("dit.ctx.neg", 500.0, [22]))
    meta["dit"] = []
    for j, (ck, t, sk) in enumerate(runs):
        trace = {} if j == 0 else None
        out = dit(x, t, tensors[ck], skip_layers=sk, trace=trace)
        ref = dit(x, t, tensors[ck], skip_layers=sk, impl="math")
        assert (out - ref).abs().max() < 1e-4 * out.abs().max()
        key = f"dit.out.{j}"
        tensors[key] = out.contiguous()
        meta["dit"].append({"key": key, "x": "dit.x", "ctx": ck, "t": t, "skip": sk})
        if trace is not None:  # intermediates of the first forward, for debugging
            for k2, v2 in trace.items():
                tensors[f"dit.trace.{k2}"] = v2.contiguous()
            meta["dit_trace"] = {"of": key, "keys": {k2: f"dit.trace.{k2}" for k2 in trace}}

    # --- loop ---
    pos_ctx, neg_ctx = bf(enc[LOOP["prompt"]]), bf(enc["empty"])
    noise = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(LOOP["seed"]), dtype=torch.float32)
    steps_out = {}
    lat = dit_ref.sample(dit, noise, pos_ctx, neg_ctx, steps=LOOP["steps"], guidance=LOOP["guidance"],
                         uncond_skip=tuple(LOOP["uncond_skip"]), callback=lambda i, xx: steps_out.setdefault(i, xx.clone()))
    tensors["loop.latents"] = lat.contiguous()
    tensors["loop.latents.step1"] = steps_out[0].contiguous()
    sig = dit_ref.sigmas_for(LOOP["steps"])
    meta["loop"] = {**LOOP, "width": spec["width"], "height": spec["height"], "sigmas": [float(s) for s in sig],
                    "timesteps": [float(s * 1000.0) for s in sig[:-1]], "noise": "torch.randn(CPU generator, seed)",
                    "ctx_rounding": "encoder last_hidden_state rounded to bf16, then fp32 DiT"}

    # --- VAE ---
    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(root, "vae"), torch_dtype=torch.float32).eval()
    z = torch.randn([1, 128, h, w], generator=torch.Generator().manual_seed(11), dtype=torch.float32)
    img, px = dit_ref.decode(vae, z)
    tensors["vae.z"], tensors["vae.out"], tensors["vae.pixels"] = z, img.contiguous(), px
    limg, lpx = dit_ref.decode(vae, lat)
    tensors["loop.out"], tensors["loop.pixels"] = limg.contiguous(), lpx
    write_png(os.path.join(EXPECTED, f"{name}.png"), lpx.numpy())
    meta["vae"] = {"z": "vae.z", "out": "vae.out", "pixels": "vae.pixels", "loop_out": "loop.out",
                   "loop_pixels": "loop.pixels", "png": f"{name}.png"}
    meta["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                        "diffusers": diffusers.__version__, "tokenizers": tokenizers.__version__}
    save_file(tensors, os.path.join(EXPECTED, f"{name}.safetensors"))
    write_json(os.path.join(EXPECTED, f"{name}.json"), meta)


# ---------------------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------------------
def summary():
    from safetensors import safe_open
    from safetensors.torch import load_file

    total, big = 0, []
    rows = []
    for dp, _, fns in os.walk(HERE):
        if "__pycache__" in dp:
            continue
        for fn in sorted(fns):
            p = os.path.join(dp, fn)
            sz = os.path.getsize(p)
            total += sz
            rows.append((os.path.relpath(p, HERE), sz))
            if sz > 5 * 2**20:
                big.append(p)
    for r, sz in sorted(rows):
        print(f"{sz:>10,d}  {r}")
    print(f"total {total / 2**20:.2f} MiB; files over 5 MiB: {big}")

    for name in CKPTS:
        root = os.path.join(HERE, name)
        for comp in ("text_encoder", "transformer", "vae"):
            keys = {}
            for fn in sorted(os.listdir(os.path.join(root, comp))):
                if fn.endswith(".safetensors"):
                    with safe_open(os.path.join(root, comp, fn), "pt") as f:
                        for k in f.keys():
                            keys[k] = f.get_slice(k).get_dtype()
            prefixes = sorted({k.split(".")[0] for k in keys})
            dts = sorted(set(keys.values()))
            print(f"{name}/{comp}: {len(keys)} tensors, top-level prefixes {prefixes}, dtypes {dts}")
            if comp == "vae":
                print("   bn keys:", sorted(k for k in keys if k.startswith("bn.")))
        e = load_file(os.path.join(EXPECTED, f"{name}.safetensors"))
        m = json.load(open(os.path.join(EXPECTED, f"{name}.json")))
        for p in m["prompts"]:
            hs = e[p["key"]]
            print(f"  {name} enc {p['name']:8s} L={len(p['ids']):4d} std={hs.std():.4f} absmax={hs.abs().max():.3f}")
        for d in m["dit"]:
            o = e[d["key"]]
            print(f"  {name} {d['key']} t={d['t']:6.1f} skip={d['skip']} ctx={d['ctx']}: std={o.std():.4f} "
                  f"mean={o.mean():+.4f}")
        outs = [e[d["key"]] for d in m["dit"]]
        diffs = [(outs[0] - o).abs().max().item() for o in outs[1:]]
        print(f"  {name} max|dit.out.0 - dit.out.k| = {['%.3g' % x for x in diffs]}")
        print(f"  {name} loop latents std={e['loop.latents'].std():.4f} step1 std={e['loop.latents.step1'].std():.4f}")
        for k in ("vae", "loop"):
            img, px = e[f"{k}.out"], e[f"{k}.pixels"]
            clipped = ((img <= -1.0) | (img >= 1.0)).float().mean().item()
            print(f"  {name} {k}.out shape {list(img.shape)} mean={img.mean():+.3f} std={img.std():.3f} "
                  f"clipped={clipped:.3%} pixels mean={px.float().mean():.1f} "
                  f"distinct={len(torch.unique(px))} px0={px[0, 0].tolist()}")
    c = load_file(os.path.join(EXPECTED, "common.safetensors"))
    print("common:", len(c), "tensors; sigmas.50[:5] =", c["sigmas.50"][:5].tolist(),
          "noise.0[:4] =", c["noise.0"].flatten()[:4].tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="only summarise existing outputs")
    args = ap.parse_args()
    if not args.check:
        if os.path.exists(EXPECTED):
            shutil.rmtree(EXPECTED)
        os.makedirs(EXPECTED)
        s50 = common_expected()
        print("sigmas(50) =", [float(x) for x in s50])
        for name, spec in CKPTS.items():
            print(f"== {name}: writing checkpoint", flush=True)
            built = make_checkpoint(name, spec)
            t = built["tok"]
            print(f"   tokenizer: vocab {t['vocab_size']} ({spec['n_ranks']} ranks + {len(QWEN35_SPECIALS)} added), "
                  f"{t['n_merges']} merges, unreachable ranks {t['unreachable']}", flush=True)
            print(f"== {name}: expected outputs", flush=True)
            ckpt_expected(name, spec, built)
    summary()


if __name__ == "__main__":
    main()
