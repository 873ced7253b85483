"""Writes golden/expected/vae_encoder.{json,safetensors} and the input pictures golden/expected/enc-*.png:
diffusers' FLUX.2 VAE encoder (`AutoencoderKLFlux2.encode`, diffusers 0.42.1) on small deterministic pictures,
followed by the glue of diffusers' Flux2 pipelines (`Flux2Pipeline._encode_vae_image`): the latent mean
(`retrieve_latents(..., sample_mode="argmax")`), `_patchify_latents` and the BatchNorm normalisation
`(z - running_mean) / sqrt(running_var + batch_norm_eps)`. Run after make_golden.py (which clears expected/),
with the pins of requirements.txt. Deterministic: CPU, fp32, pictures from a fixed formula and seed.

Also writes golden/vae-wide/ (config.json + weights): a FLUX.2 VAE whose encoder widths change from block to
block ([32, 64, 64, 64], so the first resnet of block 1 has a 1x1 `conv_shortcut`), which the tiny
checkpoints' encoders ([32, 32, 32, 32]) never exercise; its weights are random like make_golden.py's.

Per case (json `cases: [{"name", "vae", "png", "width", "height", "key"}]`):
- `<key>.pixels` f32 [1, 3, H, W]: diffusers' `VaeImageProcessor.preprocess` of the PNG (x/255, then 2x - 1);
- `<key>.moments` f32 [1, 64, H/8, W/8]: `encoder` + `quant_conv` (mean and log-variance);
- `<key>.mean` f32 [1, 32, H/8, W/8]: `encode(x).latent_dist.mode()`;
- `<key>.latents` f32 [1, 128, H/16, W/16]: patchified and normalised, what the DiT works in;
- `<key>.latents64`: the same run in float64 (stored as f32), how far fp32 itself lands (json `fp32_vs_f64`).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_golden  # noqa: E402

EXPECTED = os.path.join(HERE, "expected")
WIDE = os.path.join(HERE, "vae-wide")

# (name, vae folder relative to golden/, width, height)
CASES = [
    ("tiny-a", "tiny-a/vae", 64, 64),
    ("tiny-b", "tiny-b/vae", 48, 80),
    ("wide", "vae-wide", 48, 80),
]


def picture(width: int, height: int, seed: int) -> np.ndarray:
    """A deterministic RGB8 picture: smooth gradients, a ring, hard edges and some seeded noise (so every
    value range and the corners matter)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = np.hypot(x - width * 0.4, y - height * 0.55)
    rgb = np.stack([
        255 * x / max(width - 1, 1),
        127.5 + 127.5 * np.sin(r / 3.0),
        255 * ((x // 8 + y // 8) % 2) * (y / max(height - 1, 1)),
    ], axis=-1)
    rng = np.random.default_rng(seed)
    rgb = rgb + rng.normal(0.0, 12.0, rgb.shape)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def make_wide_vae():
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(3003)
    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, block_out_channels=(32, 64, 64, 64),
                             decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=1, latent_channels=32,
                             norm_num_groups=32, act_fn="silu", sample_size=1024, use_quant_conv=True,
                             use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4,
                             batch_norm_momentum=0.1, patch_size=(2, 2))
    make_golden.init_vae(vae, torch.Generator().manual_seed(3004))
    vae.save_pretrained(WIDE, safe_serialization=True)


def main():
    import diffusers
    from diffusers import AutoencoderKLFlux2
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline, retrieve_latents
    from safetensors.torch import save_file

    torch.set_grad_enabled(False)
    make_wide_vae()
    processor = VaeImageProcessor(vae_scale_factor=16)
    tensors, cases = {}, []
    for i, (name, folder, width, height) in enumerate(CASES):
        vae = AutoencoderKLFlux2.from_pretrained(os.path.join(HERE, folder), torch_dtype=torch.float32).eval()
        png = f"enc-{width}x{height}.png"
        path = os.path.join(EXPECTED, png)
        Image.fromarray(picture(width, height, 77 + width * height)).save(path)
        img = Image.open(path)
        assert img.mode == "RGB" and img.size == (width, height)
        x = processor.preprocess(img, height=height, width=width).float()
        # The formula the Rust side uses for the same pixels, checked here bit for bit.
        raw = torch.from_numpy(np.asarray(img).astype(np.float32)).permute(2, 0, 1)[None]
        assert torch.equal(x, 2.0 * (raw / 255.0) - 1.0), "VaeImageProcessor is not 2 * (x / 255) - 1"
        moments = vae.quant_conv(vae.encoder(x))
        mean = retrieve_latents(vae.encode(x), sample_mode="argmax")
        assert torch.equal(mean, moments[:, :32]), "latent_dist.mode() is not the first half of the moments"
        # Flux2Pipeline._encode_vae_image, with the VAE given (it reads self.vae).
        holder = type("Holder", (), {"vae": vae, "_patchify_latents": staticmethod(Flux2Pipeline._patchify_latents)})()
        latents = Flux2Pipeline._encode_vae_image(holder, image=x, generator=None)
        # The same encoder in float64 (stored as f32): the yardstick for how far fp32 itself lands.
        vae64 = AutoencoderKLFlux2.from_pretrained(os.path.join(HERE, folder), torch_dtype=torch.float64).eval()
        latents64 = Flux2Pipeline._encode_vae_image(
            type("Holder", (), {"vae": vae64, "_patchify_latents": staticmethod(Flux2Pipeline._patchify_latents)})(),
            image=x.double(), generator=None)
        key = f"enc.{i}"
        tensors[f"{key}.latents64"] = latents64.float().contiguous()
        tensors[f"{key}.pixels"] = x.contiguous()
        tensors[f"{key}.moments"] = moments.contiguous()
        tensors[f"{key}.mean"] = mean.contiguous()
        tensors[f"{key}.latents"] = latents.contiguous()
        e = float((latents.double() - latents64).norm() / latents64.norm())
        cases.append({"name": name, "vae": folder, "png": png, "width": width, "height": height, "key": key,
                      "latents_shape": list(latents.shape), "fp32_vs_f64": e})
        print(f"{name} {width}x{height}: latents {list(latents.shape)} std {latents.std():.3f}, fp32 vs f64 rel L2 {e:.2e}")
    meta = {
        "what": "diffusers AutoencoderKLFlux2.encode (mean) + Flux2Pipeline._encode_vae_image glue",
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    save_file(tensors, os.path.join(EXPECTED, "vae_encoder.safetensors"))
    make_golden.write_json(os.path.join(EXPECTED, "vae_encoder.json"), meta)


if __name__ == "__main__":
    main()
