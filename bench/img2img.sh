#!/usr/bin/env bash
# Pictures in (issue 41), 1024x1024 (a few minutes on an H200): `moss generate` from text against
# img2img at strength 0.6 (image encode, denoise, decode, total; the denoise ratio, about 0.6), then
# the VAE encoder alone at 1024x1024 and 2048x2048 (`moss bench-vae-encode`) beside diffusers'
# AutoencoderKLFlux2.encode fp32 (TF32 off and on) on the same picture and weights. One table each.
#   bench/img2img.sh BIN CKPT OUT_DIR
# BIN: a release moss with the CUDA kernels; CKPT: bench/full_ckpt.sh's folder (its VAE is replaced by
# the full FLUX.2 VAE in a linked copy, OUT_DIR/ckpt; needs diffusers importable). Environment (DEVICE,
# SIZE, STEPS, STRENGTH, SIDES, REPS, REPEAT, VAE) and the CPU smoke run: bench/img2img.py.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec python3 "$(dirname "$0")/img2img.py" "$@"
