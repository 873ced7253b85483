#!/usr/bin/env python3
"""The sampling loop's speed and its pictures (issue 42): one table of loops, one of the server.

    python3 bench/sampling.py BIN CKPT OUT_DIR

BIN is the moss binary (release, with the CUDA kernels), CKPT a full-size checkpoint
(bench/full_ckpt.sh: random weights, so the quality columns are indicative only: they say how far
each loop's picture is from the full loop's, not how good either is). Environment: DEVICE (cuda),
SIZE (1024x1024), STEPS (50), GUIDANCE (3), REPEAT (3, served requests of each kind).

1. One `moss generate --prompts` run (the weights loaded once; every item seed 42, after an
   untimed 4-step warm-up item): the default loop (euler, the model's schedule, CFG on every
   step, no cache); `dbcache`, `fbcache`, `taylorseer` at cache-dit's defaults; each at a fixed
   50% skip (threshold 1, no warm-up, at most one cached call in a row: every other call of each
   pass served); the guidance window 0:0.5; `lcm` at 8 steps with CFG 1. Per row: the denoise
   time (`--json` `timings.denoise_s`), the speed-up over the default loop, the forwards computed /
   served from the cache / left out by the guidance window (of the 2n a full guided loop runs),
   the main blocks run and skipped, and PSNR / SSIM of the picture against the default loop's
   (`moss bench-compare`).
2. `moss serve` with the weights resident: the latency of one picture (client wall time, the
   median of REPEAT after one warm-up request), plain and with `"cache": "dbcache"`, alternating.

Tables on stdout and in OUT_DIR/sampling.md; the pictures, the batch's JSON lines and the server
log stay in OUT_DIR. A smoke run on the CPU:
DEVICE=cpu SIZE=64x64 STEPS=12 REPEAT=1 python3 bench/sampling.py target/debug/moss golden/tiny-a /tmp/s
Standard library only.
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

DEVICE = os.environ.get("DEVICE", "cuda")
SIZE = os.environ.get("SIZE", "1024x1024")
STEPS = int(os.environ.get("STEPS", "50"))
GUIDANCE = float(os.environ.get("GUIDANCE", "3"))
REPEAT = int(os.environ.get("REPEAT", "3"))
PROMPT = "a lighthouse at dusk, oil painting"
SEED = 42


def half(method):
    """A fixed 50% skip: every other model call of each pass served from the cache."""
    return {"method": method, "residual_diff_threshold": 1, "max_warmup_steps": 0, "max_continuous_cached_steps": 1}


ROWS = [
    ("default loop (euler, CFG every step)", {}),
    ("dbcache (cache-dit defaults: F8B0, 0.08, warm-up 8)", {"cache": "dbcache"}),
    ("fbcache (F1B0, 0.08, warm-up 8)", {"cache": "fbcache"}),
    ("taylorseer (F8B0, 0.08, warm-up 8, order 1)", {"cache": "taylorseer"}),
    ("dbcache, fixed 50% skip", {"cache": half("dbcache")}),
    ("fbcache, fixed 50% skip", {"cache": half("fbcache")}),
    ("taylorseer, fixed 50% skip", {"cache": half("taylorseer")}),
    ("guidance window 0:0.5", {"guidance_window": "0:0.5"}),
    ("lcm, 8 steps, CFG 1", {"sampler": "lcm", "steps": 8, "guidance": 1}),
]


def batch(bin_, ckpt, out):
    """The rows through one batch run: {index: --json line}."""
    pics = os.path.join(out, "pictures")
    os.makedirs(pics, exist_ok=True)
    items = [{"prompt": PROMPT, "seed": SEED, "steps": 4, "out": "warmup.png"}]
    items += [dict({"prompt": PROMPT, "seed": SEED, "out": f"{i}.png"}, **f) for i, (_, f) in enumerate(ROWS)]
    lst = os.path.join(out, "sampling_list.jsonl")
    with open(lst, "w") as f:
        f.write("".join(json.dumps(it) + "\n" for it in items))
    cmd = [bin_, "generate", "--device", DEVICE, "--model", ckpt, "--prompts", lst, "--out-dir", pics, "--size", SIZE,
           "--steps", str(STEPS), "--guidance", str(GUIDANCE), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(out, "sampling_batch.jsonl"), "w") as f:
        f.write(p.stdout)
    if p.returncode != 0:
        sys.exit(f"moss generate --prompts exited {p.returncode}:\n{p.stderr}")
    done = {}
    for line in p.stdout.splitlines():
        j = json.loads(line)
        if j["index"] > 0:
            done[j["index"] - 1] = j
    return pics, done


def compare(bin_, a, b):
    p = subprocess.run([bin_, "bench-compare", a, b], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


def loops_table(bin_, ckpt, out):
    pics, done = batch(bin_, ckpt, out)
    base = done[0]["timings"]["denoise_s"]
    lines = [f"| loop, {SIZE}, {STEPS} steps, CFG {GUIDANCE:g} ({DEVICE}) | denoise s | speed-up | forwards computed / cached / left out (of 2n) "
             "| blocks run / skipped | PSNR dB | SSIM |",
             "|---|---:|---:|---|---|---:|---:|"]
    for i, (name, fields) in enumerate(ROWS):
        j = done[i]
        f, t = j["forwards"], j["timings"]["denoise_s"]
        full = 2 * f["calls"] if fields.get("guidance", GUIDANCE) != 1 else f["calls"]
        q = compare(bin_, os.path.join(pics, "0.png"), os.path.join(pics, f"{i}.png")) if i else None
        psnr = "—" if q is None else ("inf" if q["psnr_db"] is None else f"{q['psnr_db']:.2f}")
        ssim = "—" if q is None else f"{q['ssim']:.4f}"
        lines.append(f"| {name} | {t:.2f} | {base / t:.2f}x | {f['computed']} / {f['cached']} / {f['skipped']} (of {full}) "
                     f"| {f['blocks_computed']} / {f['blocks_skipped']} | {psnr} | {ssim} |")
    return lines


class Server:
    def __init__(self, bin_, ckpt, out):
        self.log = open(os.path.join(out, "sampling_serve.log"), "w+")
        self.p = subprocess.Popen([bin_, "serve", "--model", ckpt, "--device", DEVICE, "--port", "0",
                                   "--max-size", SIZE, "--max-steps", str(max(STEPS, 8))],
                                  stderr=self.log, stdout=subprocess.DEVNULL)
        deadline, self.port = time.time() + 300, None
        while time.time() < deadline:
            self.log.seek(0)
            text = self.log.read()
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
            if m and "ready in" in text:
                self.port = int(m.group(1))
                return
            if self.p.poll() is not None:
                sys.exit(f"moss serve exited {self.p.returncode}:\n{text}")
            time.sleep(0.2)
        sys.exit("moss serve did not get ready")

    def post(self, extra):
        body = dict({"prompt": PROMPT, "size": SIZE, "num_inference_steps": STEPS, "guidance_scale": GUIDANCE, "seed": SEED}, **extra)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/images/generations", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            j = json.loads(r.read())
        return time.perf_counter() - t0, j["data"][0]

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=120)


def serve_table(bin_, ckpt, out):
    s = Server(bin_, ckpt, out)
    try:
        s.post({})
        kinds = [("plain", {}), ("dbcache", {"cache": "dbcache"})]
        runs = {k: [] for k, _ in kinds}
        last = {}
        for _ in range(REPEAT):
            for k, extra in kinds:
                wall, item = s.post(extra)
                runs[k].append(wall)
                last[k] = item
    finally:
        s.stop()
    base = statistics.median(runs["plain"])
    lines = [f"| moss serve, one picture {SIZE}, {STEPS} steps ({DEVICE}) | latency s (median of {REPEAT}) | speed-up | server denoise s | forwards computed / cached |",
             "|---|---:|---:|---:|---|"]
    for k, _ in kinds:
        m, it = statistics.median(runs[k]), last[k]
        lines.append(f"| {k} | {m:.2f} | {base / m:.2f}x | {it['timings']['denoise_s']:.2f} | {it['forwards']['computed']} / {it['forwards']['cached']} |")
    return lines


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bin_, ckpt, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    lines = loops_table(bin_, ckpt, out)
    print("\n".join(lines), flush=True)
    lines += [""] + serve_table(bin_, ckpt, out)
    print("\n".join(lines[-(2 + 2):]))
    lines += ["", "Random weights: PSNR/SSIM against the default loop's picture are indicative only."]
    with open(os.path.join(out, "sampling.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])


if __name__ == "__main__":
    main()
