#!/usr/bin/env python3
"""The provenance mark read back by a third-party reader (CI runs this after `cargo test`).

`moss generate` writes a PNG, a JPEG and a WebP (golden checkpoint tiny-a, CPU) and `moss serve`
serves a PNG; exiftool (Debian's libimage-exiftool-perl) must read from each the XMP
`Iptc4xmpExt:DigitalSourceType` = IPTC's trainedAlgorithmicMedia and `xmp:CreatorTool` = moss's
version. `moss info` still reads each file, and `moss generate --from` each file renders the
first PNG again byte for byte (the marked files keep their settings).

    python3 tests/provenance.py [target/debug/moss]
"""

import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOSS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "moss")
MODEL = os.path.join(ROOT, "golden", "tiny-a")
TRAINED = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
ARGS = ["--model", MODEL, "--device", "cpu"]
PICTURE = ["--prompt", "a lighthouse at dusk", "--seed", "21", "--size", "64x48", "--steps", "2"]


def run(*args):
    return subprocess.run([MOSS, *args], check=True, capture_output=True, text=True).stdout


def marks(path):
    """DigitalSourceType and CreatorTool as exiftool reads them (-n: the raw values)."""
    out = subprocess.run(["exiftool", "-j", "-n", "-XMP-iptcExt:DigitalSourceType", "-XMP-xmp:CreatorTool", path],
                         check=True, capture_output=True, text=True).stdout
    tags = json.loads(out)[0]
    return tags.get("DigitalSourceType"), tags.get("CreatorTool")


def served(d, flags=(), formats=(("png", "png"),)):
    """Pictures from `moss serve` with `flags` (the settings of PICTURE), one a (output_format,
    extension): {extension: path}."""
    p = subprocess.Popen([MOSS, "serve", *ARGS, *flags, "--port", "0"], stderr=subprocess.PIPE, text=True)
    out = {}
    try:
        port, deadline = None, time.time() + 120
        while time.time() < deadline:
            line = p.stderr.readline()
            if not line:
                sys.exit(f"moss serve exited early ({p.wait()})")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else port
            if "ready in" in line:
                break
        for fmt, ext in formats:
            body = json.dumps({"prompt": "a lighthouse at dusk", "seed": 21, "size": "64x48", "num_inference_steps": 2,
                               "output_format": fmt, "output_compression": 90}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/images/generations", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                out[ext] = os.path.join(d, f"served.{ext}")
                with open(out[ext], "wb") as f:
                    f.write(base64.b64decode(json.load(r)["data"][0]["b64_json"]))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    return out


def main():
    version = run("--version").strip()
    with tempfile.TemporaryDirectory() as d:
        files = [os.path.join(d, f"a.{ext}") for ext in ("png", "jpg", "webp")]
        for f in files:
            run("generate", *ARGS, *PICTURE, "--out", f, "--quiet")
        files.append(served(d)["png"])
        with open(files[0], "rb") as f:
            first = f.read()
        with open(files[3], "rb") as f:
            assert f.read() == first, "the served PNG differs from moss generate's"
        for f in files:
            source, tool = marks(f)
            assert source == TRAINED, f"{f}: DigitalSourceType {source!r}"
            assert tool and tool in version, f"{f}: CreatorTool {tool!r} (moss --version: {version!r})"
            info = run("info", f)
            assert info.startswith("a lighthouse at dusk\n") and "Seed: 21" in info, f"{f}: moss info:\n{info}"
            again = os.path.join(d, f"again-{os.path.basename(f)}.png")
            run("generate", *ARGS, "--from", f, "--out", again, "--quiet")
            with open(again, "rb") as g:
                assert g.read() == first, f"moss generate --from {os.path.basename(f)} renders another picture"
    exiftool = subprocess.run(["exiftool", "-ver"], capture_output=True, text=True).stdout.strip()
    print(f"exiftool {exiftool}: trainedAlgorithmicMedia and CreatorTool read from PNG, JPEG, WebP and a served PNG; "
          "moss info and --from read all four: ok")


if __name__ == "__main__":
    main()
