#!/usr/bin/env bash
# The sampling loop (issue 42), one table of loops and one of the server, 1024x1024 (~4 min on an
# H200): the default 50-step loop, dbcache / fbcache / taylorseer at cache-dit's defaults and at a
# fixed 50% skip, the guidance window 0:0.5, lcm at 8 steps with CFG 1 (denoise time, speed-up,
# forwards computed / cached / left out, blocks, PSNR/SSIM against the default loop's picture:
# indicative only on random weights), then `moss serve` latency plain and with dbcache.
#   bench/sampling.sh BIN CKPT OUT_DIR
# BIN: a release moss with the CUDA kernels; CKPT: bench/full_ckpt.sh's folder. Environment
# (DEVICE, SIZE, STEPS, GUIDANCE, REPEAT) and the CPU smoke run: bench/sampling.py.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec python3 "$(dirname "$0")/sampling.py" "$@"
