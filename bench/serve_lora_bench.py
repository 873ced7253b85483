#!/usr/bin/env python3
"""Per-request LoRAs through `moss serve --lora-dir`: a change of set between requests against the
same set kept, at full size.

    python3 bench/serve_lora_bench.py BIN MODEL_DIR LORA_DIR A B

BIN is the moss binary, MODEL_DIR the checkpoint folder, LORA_DIR a folder of adapters with two
named A and B (e.g. the rank-64 files bench/lora_bench.sh writes: r64-bf16, r64-f16). Environment:
DEVICE (cuda), SIZE (1024x1024), STEPS (50), REPEAT (4), SEED (42), MAX_VRAM (GiB, passed to
`moss serve --max-vram`: the streamed blocks merge at each fetch). Prints one table:

- the same set kept: REPEAT requests with A after one that merged it (each `lora_switch_s` 0);
- a change every request: REPEAT requests alternating B and A; `lora_switch_s` is the change
  (the weights either set updates read again from the checkpoint, the new set merged);
- wall seconds per request (median) for both, and their difference;
- peak GPU memory while serving (nvidia-smi every 100 ms, less what was used before; "n/a"
  without it);
- byte identity: the served picture with A against `moss generate --lora LORA_DIR/A.safetensors`.

A smoke run on the CPU:
DEVICE=cpu SIZE=64x64 STEPS=2 python3 bench/serve_lora_bench.py target/debug/moss golden/tiny-a DIR kohya qkv
Standard library only.
"""

import base64
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

if len(sys.argv) < 6:
    sys.exit(__doc__)
BIN, MODEL, LORAS, A, B = sys.argv[1:6]
DEVICE = os.environ.get("DEVICE", "cuda")
SIZE = os.environ.get("SIZE", "1024x1024")
STEPS = int(os.environ.get("STEPS", "50"))
REPEAT = int(os.environ.get("REPEAT", "4"))
SEED = int(os.environ.get("SEED", "42"))
MAX_VRAM = os.environ.get("MAX_VRAM", "")
PROMPT = "a lighthouse at dusk, oil painting"


def gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


class Peak(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.base, self.peak, self.stop = gpu_used_mib(), 0, False

    def run(self):
        while not self.stop and self.base is not None:
            self.peak = max(self.peak, gpu_used_mib() or 0)
            time.sleep(0.1)


def request(port, lora, seed):
    body = {"prompt": PROMPT, "seed": seed, "size": SIZE, "num_inference_steps": STEPS,
            "lora": [{"name": lora, "scale": 0.8}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/images/generations", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=3600) as r:
        d = json.load(r)["data"][0]
    return time.time() - t0, d["timings"], base64.b64decode(d["b64_json"])


def main():
    peak = Peak()
    peak.start()
    cmd = [BIN, "serve", "--model", MODEL, "--device", DEVICE, "--port", "0", "--lora-dir", LORAS,
           "--max-steps", str(max(STEPS, 100))]
    if MAX_VRAM:
        cmd += ["--max-vram", MAX_VRAM]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    log, port = [], None
    while True:
        line = server.stderr.readline()
        if not line:
            sys.exit("moss serve exited:\n" + "".join(log))
        log.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        port = int(m.group(1)) if m else port
        if "ready in" in line:
            break
    threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()
    try:
        request(port, A, SEED)  # merges A
        kept = [request(port, A, SEED + 1 + i) for i in range(REPEAT)]
        switched = [request(port, B if i % 2 == 0 else A, SEED + 1 + i) for i in range(REPEAT)]
        _, _, served_a = request(port, A, SEED)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=600)
        peak.stop = True
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "a.png")
        lora_file = next(os.path.join(LORAS, f) for f in (f"{A}.safetensors", os.path.join(A, "adapter_model.safetensors"))
                         if os.path.exists(os.path.join(LORAS, f)))
        subprocess.run([BIN, "generate", "--model", MODEL, "--device", DEVICE, "--prompt", PROMPT, "--seed", str(SEED),
                        "--size", SIZE, "--steps", str(STEPS), "--lora", f"{lora_file}:0.8", "--out", out, "--quiet"], check=True)
        same = open(out, "rb").read() == served_a
    med = lambda xs: statistics.median(xs)
    wall_k, wall_s = med([w for w, _, _ in kept]), med([w for w, _, _ in switched])
    sw_k, sw_s = [t["lora_switch_s"] for _, t, _ in kept], [t["lora_switch_s"] for _, t, _ in switched]
    rows = [
        ("device / size / steps", f"{DEVICE} / {SIZE} / {STEPS}" + (f" / --max-vram {MAX_VRAM}" if MAX_VRAM else "")),
        ("same set kept: wall s (median)", f"{wall_k:.3f}  (lora_switch_s {max(sw_k):.3f} at most)"),
        ("a change every request: wall s (median)", f"{wall_s:.3f}"),
        ("  lora_switch_s (median, min..max)", f"{med(sw_s):.3f}  ({min(sw_s):.3f}..{max(sw_s):.3f})"),
        ("  wall difference", f"{wall_s - wall_k:+.3f}"),
        ("peak GPU memory (MiB above the start)", "n/a" if peak.base is None else str(peak.peak - peak.base)),
        ("served with A == generate --lora A", "yes" if same else "NO"),
    ]
    for k, v in rows:
        print(f"{k:42} {v}")
    print("".join(l for l in log if "LoRA set" in l), end="")
    if not same or max(sw_k) != 0.0:
        sys.exit(1)


if __name__ == "__main__":
    main()
