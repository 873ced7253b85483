#!/usr/bin/env python3
"""A third-party reader (sd-parsers, as PNG Info panels and civitai-style tools parse pictures)
reads back what `moss generate` records: prompt, negative, steps, sampler, CFG scale, seed, size,
model (its folder's name) and A1111's Model hash, and with a LoRA the resource hashes (civitai's
`Hashes` object; A1111's `Lora hashes` text), from a PNG (the `parameters` text chunk) and from a
JPEG and a WebP (EXIF UserComment, as A1111 writes them). The expected hashes are computed here
with hashlib as A1111 defines them. Fails (exit 1) when the reader finds another generator or
other values.

Usage: python3 tests/metadata_readers.py target/debug/moss   (needs `pip install sd-parsers==0.6`)
"""
import os
import glob
import hashlib
import re
import subprocess
import sys
import tempfile

from sd_parsers import ParserManager
from sd_parsers.data import Generators

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_hash(transformer_dir):
    """A1111's Model hash: sha256 of the weights file, 10 hex digits; for shards (moss's rule),
    the sha256 of their sha256 hex digests, one a line, in file-name order."""
    files = sorted(glob.glob(os.path.join(transformer_dir, "*.safetensors")))
    digests = [hashlib.sha256(open(f, "rb").read()).hexdigest() for f in files]
    if len(digests) == 1:
        return digests[0][:10]
    return hashlib.sha256("".join(d + "\n" for d in digests).encode()).hexdigest()[:10]


def lora_hash(path):
    """A1111's LoRA hash (kohya's addnet hash): sha256 of the file after its header, 12 digits."""
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    return hashlib.sha256(b[8 + n:]).hexdigest()[:12]


def main() -> int:
    moss = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/moss")
    model = os.path.join(ROOT, "golden", "tiny-a")
    prompt, negative = "a red fox, in snow: morning ☕", "blurry, dark"
    fails = []
    with tempfile.TemporaryDirectory() as d:
        for ext in ("png", "jpg", "webp"):
            out = os.path.join(d, "fox." + ext)
            subprocess.run(
                [moss, "generate", "--device", "cpu", "--model", model, "--prompt", prompt,
                 "--negative", negative, "--steps", "2", "--seed", "7", "--guidance", "2.5",
                 "--size", "64x48", "-q", "-o", out],
                check=True,
            )
            info = ParserManager().parse(out)

            def want(what, got, expected):
                if got != expected:
                    fails.append(f"{ext}: {what}: read {got!r}, want {expected!r}")

            if info is None:
                fails.append(f"{ext}: sd-parsers found no metadata")
                continue
            want("generator", info.generator, Generators.AUTOMATIC1111)
            want("prompt", info.full_prompt, prompt)
            want("negative prompt", info.full_negative_prompt, negative)
            s = info.samplers[0]
            want("sampler", s.name, "Euler")
            want("steps", str(s.parameters.get("steps")), "2")
            want("seed", str(s.parameters.get("seed")), "7")
            want("cfg scale", str(s.parameters.get("cfg_scale")), "2.5")
            want("size", info.metadata.get("Size"), "64x48")
            want("model", s.model.name if s.model else None, "tiny-a")
            want("model hash", s.model.hash if s.model else None, model_hash(os.path.join(model, "transformer")))
        # A prompt cut at --max-tokens: the note reaches the reader whole.
        out = os.path.join(d, "cut.jpg")
        subprocess.run([moss, "generate", "--device", "cpu", "--model", model, "--prompt", prompt, "--max-tokens", "12",
                        "--steps", "1", "--size", "64x48", "-q", "-o", out], check=True, stderr=subprocess.DEVNULL)
        info = ParserManager().parse(out)
        meta = info.metadata if info else {}
        if meta.get("Max tokens") != "12" or not re.fullmatch(r"prompt 12 of \d+ tokens", meta.get("Cut", "")):
            fails.append(f"cut.jpg: read Max tokens {meta.get('Max tokens')!r}, Cut {meta.get('Cut')!r}")
        # A LoRA: civitai's Hashes object (which sd-parsers reads) and A1111's Lora hashes text.
        lora = os.path.join(ROOT, "golden", "lora", "kohya.safetensors")
        out = os.path.join(d, "lora.png")
        subprocess.run([moss, "generate", "--device", "cpu", "--model", model, "--prompt", prompt, "--steps", "1",
                        "--size", "64x48", "--lora", lora + ":0.7", "-q", "-o", out], check=True)
        info = ParserManager().parse(out)
        mh, lh = model_hash(os.path.join(model, "transformer")), lora_hash(lora)
        hashes = info.metadata.get("Hashes") if info else None
        if hashes != {"model": mh, "lora:kohya": lh}:
            fails.append(f"lora.png: read Hashes {hashes!r}, want model {mh}, lora:kohya {lh}")
        if not info or info.samplers[0].model is None or info.samplers[0].model.hash != mh:
            fails.append(f"lora.png: the Model hash is not {mh}")
        raw = info.raw_parameters.get("parameters", "") if info else ""
        if f'Lora hashes: "kohya: {lh}"' not in raw:
            fails.append(f"lora.png: no `Lora hashes: \"kohya: {lh}\"` in {raw!r}")
    for f in fails:
        print(f"metadata_readers: {f}", file=sys.stderr)
    if not fails:
        print("metadata_readers: sd-parsers reads prompt, negative, sampler, steps, seed, CFG, size, model, "
              "Model hash from PNG, JPEG and WebP, and the LoRA's hash (Hashes, Lora hashes)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
