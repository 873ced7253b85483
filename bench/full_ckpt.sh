#!/usr/bin/env bash
# Writes a complete full-size checkpoint folder with random weights in the real layout (the GPU
# machine, ~2 minutes): transformer (42 blocks, bench/dit.py write: also model_index.json,
# scheduler/ and random embeds), text_encoder (random Qwen3.5-9B text weights, `language_model.*`,
# bf16 shards, bench/encoder.py make), vae (AutoencoderKLFlux2 decoder widths 96/192/384/384,
# fp32, bench/vae.py's init; needs diffusers importable), tokenizer copied from golden/tiny-a
# (its ids are all < the 248320-row embedding).
#   bench/full_ckpt.sh DIR
set -euo pipefail
D=$1
python3 bench/dit.py write "$D"
cp golden/tiny-a/tokenizer/* "$D/tokenizer/"
python3 bench/encoder.py make "$D/text_encoder" 2>&1 | grep -v Warning | tail -3
python3 -c "import sys; sys.path.insert(0, 'bench'); from vae import full_vae; full_vae().save_pretrained('$D/vae', safe_serialization=True); print('vae written')"
du -sh "$D"/*
