#!/usr/bin/env bash
# Writes a complete full-size checkpoint folder with random weights in the real layout (the GPU
# machine, ~2 minutes): transformer (42 blocks, bench/dit_full.py write: also model_index.json,
# scheduler/ and random embeds), text_encoder (random Qwen3.5-9B text weights, `language_model.*`,
# bf16 shards, bench/encoder_gpu.py make), vae (AutoencoderKLFlux2 decoder widths 96/192/384/384,
# fp32, bench/vae_bench.py's init; needs diffusers importable), tokenizer copied from golden/tiny-a
# (its ids are all < the 248320-row embedding).
#   bench/full_ckpt.sh DIR
set -euo pipefail
D=$1
python3 bench/dit_full.py write "$D"
cp golden/tiny-a/tokenizer/* "$D/tokenizer/"
python3 bench/encoder_gpu.py make "$D/text_encoder" 2>&1 | grep -v Warning | tail -3
python3 - "$D" <<'PY'
import sys, torch
sys.path.insert(0, "bench")
from vae_bench import init_vae
from diffusers import AutoencoderKLFlux2
vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, block_out_channels=(32, 32, 32, 32),
                         decoder_block_out_channels=(96, 192, 384, 384), layers_per_block=2, latent_channels=32,
                         norm_num_groups=32, act_fn="silu", sample_size=1024, use_quant_conv=True,
                         use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4,
                         batch_norm_momentum=0.1, patch_size=(2, 2))
init_vae(vae, torch.Generator().manual_seed(7))
vae.save_pretrained(f"{sys.argv[1]}/vae", safe_serialization=True)
print("vae written")
PY
du -sh "$D"/*
