#!/usr/bin/env bash
# Quantized single-file components on the GPU (issue 43), 1024x1024, 50 steps, one table per format:
#   bench/quant.sh CKPT OUT_DIR MOSS_BIN [FORMATS...]
# FORMATS (default: q8_0 q6_k q5_k q4_k int8 int8-convrot) are `moss quantize --to` names; each is written
# from CKPT's bf16 transformer (and, for TE_FORMATS, default "int8", empty for none, its text encoder too) into $WORK, then
# for the bf16 folder and each format, at no cap and at --max-vram 8 and 6 (CAPS):
#   - moss generate --json -v: single-shot wall time, the denoise stage's time (--json timings), the plan
#     (each network's placement and planned peak bytes), the peak GPU memory sampled from outside
#     (nvidia-smi every 50 ms, less the memory used before the run);
#   - the file bytes of the quantized components (what stays resident: the matrices are kept as stored);
#   - the error against the bf16 folder: velocity rel L2 of one DiT forward (moss bench-dit --forward-only
#     --save-velocity, from CKPT's embeds) and the picture's PSNR (moss bench-compare, same seed and prompt).
# A format `te-X` runs the bf16 folder's transformer with the text encoder written `--to X` (w4a8, w6a8,
# int8: the encoder's error shows in the picture only); `F+te-X` both (e.g. q4_k+te-w4a8).
# REUSE_REF=1 keeps the bf16 reference runs (velocity, pictures) an earlier run left in $WORK.
# PRECISION (default bf16): the --precision of every run but the bf16 reference (int8: the main blocks in
# INT8, the int8 files' codes as stored); the format name `folder` is the bf16 folder at PRECISION.
# CKPT: bench/full_ckpt.sh's folder (random full-size weights: the errors are the formats' on random weights).
# Out: OUT_DIR/quant.md (the tables), the runs' .json/.err, the velocities and pictures under $WORK.
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
F=$1; OUT=$2; BIN=$3; shift 3
FORMATS=${*:-q8_0 q6_k q5_k q4_k int8 int8-convrot}; TE_FORMATS=${TE_FORMATS-int8}; CAPS=${CAPS:-none 8 6}
PRECISION=${PRECISION:-bf16}
prec() { if [ "$1" = bf16 ]; then echo bf16; else echo "$PRECISION"; fi; }
W=${WORK:-/tmp/moss-bench}/quant; mkdir -p "$OUT" "$W"
P="a lighthouse at dusk, oil painting"
chmod +x "$BIN" 2>/dev/null; echo "moss: $($BIN --version 2>&1 | head -1)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1; }
ext() { case $1 in int8*) echo safetensors ;; *) echo gguf ;; esac; }
dit_of() { case $1 in te-*) ;; *) echo "${1%%+te-*}" ;; esac; } # the transformer format of a format name
te_of() { case $1 in *te-*) echo "${1##*te-}" ;; esac; }         # its text encoder format (te-X)

# the files
for f in $FORMATS; do
  d=$(dit_of "$f"); t=$(te_of "$f")
  if [ -n "$d" ] && [ "$d" != folder ]; then
    [ -s "$W/dit_$d.$(ext "$d")" ] || { echo "== quantize transformer $d"; $BIN quantize --model "$F" --to "$d" --out "$W/dit_$d.$(ext "$d")" -q || echo "quantize $d failed"; }
  fi
  [ -n "$t" ] && TE_ONLY="${TE_ONLY:-} $t"
done
for f in $TE_FORMATS ${TE_ONLY:-}; do
  [ -s "$W/te_$f.safetensors" ] || { echo "== quantize text encoder $f"; $BIN quantize --model "$F" --component text-encoder --to "$f" --out "$W/te_$f.safetensors" -q || echo "quantize te $f failed"; }
done

flags() { # FORMAT: the component flags of a run
  case $1 in bf16 | folder) return ;; esac
  local d t; d=$(dit_of "$1"); t=$(te_of "$1")
  [ -n "$d" ] && echo "--transformer $W/dit_$d.$(ext "$d")"
  [ -n "$t" ] && echo "--text-encoder $W/te_$t.safetensors"
  case " $TE_FORMATS " in *" $1 "*) echo "--text-encoder $W/te_$1.safetensors" ;; esac
}
run() { # FORMAT CAP: one generate, sampled
  local f=$1 c=$2 t="$1_$2" cap=() base smi s rc
  [ "$c" = none ] || cap=(--max-vram "$c")
  base=$(used)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 50 > "$W/smi_$t.txt" & smi=$!
  s=$(date +%s.%N)
  # shellcheck disable=SC2046
  timeout 540 "$BIN" generate --device cuda --model "$F" $(flags "$f") --prompt "$P" --size 1024x1024 --steps 50 --seed 42 --precision "$(prec "$f")" \
    "${cap[@]}" --json -v --force --out "$W/$t.png" > "$OUT/gen_$t.json" 2> "$OUT/gen_$t.err"; rc=$?
  python3 -c "import time; print(f'{time.time() - $s:.2f}')" > "$W/wall_$t.txt"
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "$rc $base $(sort -n "$W/smi_$t.txt" | tail -1)" > "$W/rc_$t.txt"
  echo "$t: rc=$rc $(tail -1 "$OUT/gen_$t.err")"
}
vel() { # FORMAT: one DiT forward's velocity (a te-X format's transformer is the folder's)
  [ -n "${NO_VEL:-}" ] && return
  case $1 in te-*) return ;; esac
  # shellcheck disable=SC2046
  timeout 300 "$BIN" bench-dit --device cuda --model "$F" $(flags "$1" | grep -- --transformer) --embeds "$F/embeds.safetensors" \
    --size 1024x1024 --precision "$(prec "$1")" --forwards 1 --forward-only --save-velocity "$W/vel_$1.f32" > "$OUT/dit_$1.json" 2> "$OUT/dit_$1.err"
  echo "velocity $1: rc=$?"
}

for f in bf16 $FORMATS; do
  # REUSE_REF=1: the bf16 reference of an earlier run of this script in $WORK is kept
  if [ "$f" = bf16 ] && [ -n "${REUSE_REF:-}" ] && [ -s "$W/vel_bf16.f32" ]; then echo "bf16: reusing $W's reference"; REUSED=1; continue; fi
  vel "$f"
  for c in $CAPS; do run "$f" "$c"; done
done
for f in $FORMATS; do
  for c in $CAPS; do "$BIN" bench-compare "$W/bf16_$c.png" "$W/${f}_$c.png" > "$W/cmp_${f}_$c.json" 2>/dev/null; done
done

REF=bf16; [ -n "${REUSED:-}" ] && REF=  # a reused reference's runs are in an earlier call's table
python3 - "$W" "$OUT" "$REF $FORMATS" "$CAPS" "$TE_FORMATS" <<'PY' | tee "$OUT/quant.md"
import json, os, sys
import numpy as np
W, OUT, formats, caps, te = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
gib = lambda b: f"{b / 2**30:.2f}"
def size(p):
    return os.path.getsize(p) if os.path.exists(p) else None
ref = np.fromfile(f"{W}/vel_bf16.f32", dtype=np.float32) if os.path.exists(f"{W}/vel_bf16.f32") else None
for f in formats:
    d = None if f.startswith("te-") else f.split("+te-")[0]
    t = f.split("te-")[1] if "te-" in f else (f if f in te else None)
    ext = "safetensors" if (d or "").startswith("int8") else "gguf"
    dit = size(f"{W}/dit_{d}.{ext}") if d not in (None, "bf16", "folder") else None
    tef = size(f"{W}/te_{t}.safetensors") if t else None
    v = f"{W}/vel_{f}.f32"
    if f.startswith("te-"):
        vl2 = "- (the folder's transformer)"
    elif f == "bf16" or ref is None or not os.path.exists(v):
        vl2 = "-" if f == "bf16" else "not run"
    else:
        x = np.fromfile(v, dtype=np.float32)
        vl2 = f"{np.linalg.norm(x - ref) / np.linalg.norm(ref):.3e}"
    print(f"\n### {f}: transformer file {gib(dit) + ' GiB' if dit else 'bf16 folder'}, text encoder {gib(tef) + ' GiB file (' + t + ')' if tef else 'bf16 folder'}, velocity rel L2 vs bf16 {vl2}\n")
    print("| cap GiB | exit | single shot s | denoise s | peak GiB (nvidia-smi) | plan: text encoder / transformer / vae (planned peak GiB) | PSNR vs bf16 dB |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for c in caps:
        t = f"{f}_{c}"
        try:
            rc, base, peak = open(f"{W}/rc_{t}.txt").read().split()
            wall = open(f"{W}/wall_{t}.txt").read().strip()
        except Exception:
            print(f"| {c} | not run | | | | | |"); continue
        try:
            j = json.load(open(f"{OUT}/gen_{t}.json"))
            den = f"{j['timings']['denoise_s']:.2f}"
            plan = " / ".join(f"{n['mode']}" + (f" {n['resident_blocks']}/{n['blocks']}" if n["mode"] == "streamed" else "") + f" ({gib(n['device_bytes'])})" for n in j["plan"]["networks"])
        except Exception as e:
            den, plan = "?", f"(no result: {e.__class__.__name__})"
        try:
            q = None if f == "bf16" else json.load(open(f"{W}/cmp_{t}.json"))["psnr_db"]
            psnr = "-" if f == "bf16" else ("inf (same pixels)" if q is None else f"{q:.2f}")
        except Exception:
            psnr = "?"
        print(f"| {c} | {rc} | {wall} | {den} | {(int(peak) - int(base)) / 1024:.2f} | {plan} | {psnr} |")
PY
echo "(each run's -v plan and timing lines: $OUT/gen_*.err)"
