#!/usr/bin/env python3
"""`moss serve` (weights resident, or under a --max-vram cap) against a fresh `moss generate`, at full size.

    python3 bench/serve_bench.py BIN MODEL_DIR [WORK_DIR]

BIN is the moss binary (e.g. target/release/moss), MODEL_DIR the checkpoint folder. Environment:
DEVICE (cuda), SIZE (1024x1024), STEPS (50), N (8, the queued requests of the throughput run),
REPEAT (3, latency requests), SEED (42), MAX_VRAM (GiB, passed to `moss serve --max-vram`; unset: the
server's default cap). Measures, printing one table:

- a fresh `moss generate` (wall, and its own encode/denoise/decode timings from --json);
- the server's start-up (to /health 200);
- latency of one picture through the server, weights resident (median of REPEAT, after one
  untimed warm-up request), next to generate's denoise + decode (the target: within 0.3 s);
- throughput: N requests sent at once (one picture each, seeds SEED+1..SEED+N), queued FIFO;
- peak GPU memory used while serving (nvidia-smi sampled every 100 ms, less what the device used
  before the server started; "n/a" without it), and with MAX_VRAM whether it stayed under the cap;
- byte identity: the served picture of seed SEED against generate's file (generate runs uncapped);
- SIGTERM: the server's exit code.

A smoke run on the CPU: DEVICE=cpu SIZE=64x64 STEPS=2 N=3 python3 bench/serve_bench.py target/debug/moss golden/tiny-a
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

if len(sys.argv) < 3:
    sys.exit(__doc__)
BIN, MODEL = sys.argv[1], sys.argv[2]
WORK = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="moss-serve-bench.")
DEVICE = os.environ.get("DEVICE", "cuda")
SIZE = os.environ.get("SIZE", "1024x1024")
STEPS = int(os.environ.get("STEPS", "50"))
N = int(os.environ.get("N", "8"))
REPEAT = int(os.environ.get("REPEAT", "3"))
SEED = int(os.environ.get("SEED", "42"))
MAX_VRAM = os.environ.get("MAX_VRAM", "")
PROMPT = "a lighthouse at dusk, oil painting"
os.makedirs(WORK, exist_ok=True)


class GpuMemory(threading.Thread):
    """Peak memory.used (MiB) of the device, from nvidia-smi's own 100 ms loop."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.samples, self.proc = None, [], None
        idx = DEVICE.split(":")[1] if ":" in DEVICE else "0"
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", idx, "-lms", "100"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
        except OSError:
            pass

    def run(self):
        if self.proc is None:
            return
        for line in self.proc.stdout:
            try:
                self.samples.append(int(line.strip()))
            except ValueError:
                pass

    def now(self):
        """memory.used (MiB) now, from a one-off query (None without nvidia-smi)."""
        idx = DEVICE.split(":")[1] if ":" in DEVICE else "0"
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", idx],
                                 capture_output=True, text=True, check=True)
            return int(out.stdout.strip().splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
            return None

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        return max(self.samples) if self.samples else None


def post(port, body, timeout=3600):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/images/generations", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def body(seed):
    return {"prompt": PROMPT, "seed": seed, "size": SIZE, "num_inference_steps": STEPS, "response_format": "b64_json"}


def main():
    rows = []
    # 1. A fresh moss generate (loads every weight, then renders).
    ref = os.path.join(WORK, "generate.png")
    t = time.time()
    out = subprocess.run(
        [BIN, "generate", "--model", MODEL, "--device", DEVICE, "--prompt", PROMPT, "--seed", str(SEED),
         "--size", SIZE, "--steps", str(STEPS), "--out", ref, "--json", "--quiet"],
        check=True, capture_output=True, text=True,
    )
    gen_wall = time.time() - t
    gt = json.loads(out.stdout.strip().splitlines()[-1])["timings"]
    rows.append(("moss generate (fresh process), wall", f"{gen_wall:.2f} s"))
    rows.append(("  its encode / denoise / decode", f"{gt['encode_s']:.2f} / {gt['denoise_s']:.2f} / {gt['decode_s']:.2f} s"))

    # 2. The server: start-up to ready.
    mem = GpuMemory()
    idle = mem.now()
    mem.start()
    cap = ["--max-vram", MAX_VRAM] if MAX_VRAM else []
    log = open(os.path.join(WORK, "serve.log"), "w")
    t = time.time()
    srv = subprocess.Popen(
        [BIN, "serve", "--model", MODEL, "--device", DEVICE, "--port", "0", "--max-queue", str(max(N, 16)),
         "--max-size", SIZE, "--max-steps", str(max(STEPS, 1))] + cap,
        stderr=subprocess.PIPE, text=True,
    )
    port, plan = None, ""
    for line in srv.stderr:
        log.write(line)
        if "memory plan under" in line:
            plan = line.strip().removeprefix("moss serve: ")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "ready in" in line:
            break
        if "error" in line:
            sys.exit(f"moss serve failed: {line}")
    rows.append(("moss serve start-up (to ready)", f"{time.time() - t:.2f} s"))
    rows.append(("  memory plan (start-up log)", plan or "n/a"))
    threading.Thread(target=lambda: [log.write(l) for l in srv.stderr], daemon=True).start()

    # 3. Latency, weights resident.
    t = time.time()
    post(port, body(SEED))
    rows.append(("first request (warm-up, untimed below)", f"{time.time() - t:.2f} s"))
    walls, served = [], None
    for _ in range(REPEAT):
        t = time.time()
        r = post(port, body(SEED))
        walls.append(time.time() - t)
        served = r["data"][0]
    lat = statistics.median(walls)
    target = gt["denoise_s"] + gt["decode_s"]
    rows.append((f"server latency, 1 picture (median of {REPEAT})", f"{lat:.2f} s"))
    st = served["timings"]
    rows.append(("  server's encode / denoise / decode", f"{st['encode_s']:.2f} / {st['denoise_s']:.2f} / {st['decode_s']:.2f} s"))
    rows.append(("  vs generate's denoise + decode", f"{target:.2f} s (latency - that = {lat - target:+.2f} s; target <= +0.30)"))
    rows.append(("  vs a fresh moss generate", f"{gen_wall / lat:.2f}x faster"))

    # 4. Throughput: N requests queued at once.
    results, errors = [None] * N, []

    def one(i):
        try:
            results[i] = post(port, body(SEED + 1 + i))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"request {i}: {e}")

    t = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.time() - t
    ok = sum(1 for i, r in enumerate(results) if r and r["data"][0]["seed"] == SEED + 1 + i)
    rows.append((f"throughput, {N} queued requests", f"{wall:.2f} s: {wall / N:.2f} s/picture, {N / wall * 60:.1f} pictures/min ({ok}/{N} ok)"))
    for e in errors:
        print(e, file=sys.stderr)

    # 5. Byte identity and shutdown.
    same = base64.b64decode(served["b64_json"]) == open(ref, "rb").read()
    rows.append(("served PNG == moss generate PNG (seed %d)" % SEED, "identical" if same else "DIFFERENT"))
    srv.send_signal(signal.SIGTERM)
    code = srv.wait(timeout=120)
    peak = mem.stop()
    over = (peak - idle) / 1024 if peak and idle is not None else None
    rows.append(("peak GPU memory while serving (nvidia-smi, over the idle device)", f"{over:.2f} GiB" if over is not None else "n/a"))
    under = over is None or not MAX_VRAM or over <= float(MAX_VRAM)
    if MAX_VRAM:
        rows.append((f"  under --max-vram {MAX_VRAM}", "n/a" if over is None else ("yes" if under else "NO")))
    rows.append(("SIGTERM exit code", str(code)))
    with open(os.path.join(WORK, "metrics.txt"), "w") as f:
        f.write("\n".join(f"{k}\t{v}" for k, v in rows) + "\n")

    capped = f", --max-vram {MAX_VRAM}" if MAX_VRAM else ""
    print(f"moss serve bench: {DEVICE}{capped}, {SIZE}, {STEPS} steps, model {MODEL} (work dir {WORK})")
    w = max(len(k) for k, _ in rows)
    print(f"| {'what'.ljust(w)} | value |\n|{'-' * (w + 2)}|-------|")
    for k, v in rows:
        print(f"| {k.ljust(w)} | {v} |")
    if not same or code != 0 or errors or ok != N or not under:
        sys.exit(1)


if __name__ == "__main__":
    main()
