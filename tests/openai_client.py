#!/usr/bin/env python3
"""The official OpenAI Python client against `moss serve` (CI runs this after `cargo test`).

Starts `moss serve` on the golden checkpoint tiny-a (CPU, an ephemeral port on 127.0.0.1, an API
key, `--served-model-name dall-e-3 --served-model-name gpt-image-1`), generates two pictures with
`client.images.generate(..., response_format="b64_json", extra_body={"seed": ...})`, checks each
against `moss generate` with the same settings byte for byte, asks for the model by its aliases
(`dall-e-3`, `gpt-image-1`: a client's fixed name) and for `output_format="jpeg"` with
`output_compression` (the bytes of `moss generate -o x.jpg --quality N`), checks that the models
list is the folder's name and the aliases, that a wrong key raises AuthenticationError, a bad
size BadRequestError and an unknown model NotFoundError, then stops the server with SIGTERM and
checks it exits 0,
chooses LoRAs per request from the server's `--lora-dir` (each picture byte-identical to `moss generate
--lora`), reads `GET /v1/loras`, and checks that bad LoRA names raise BadRequestError;
streams one with `stream=True, partial_images=2` (and moss's `sampler` and `cache` fields) through the
client's iterator, which must read two `image_generation.partial_image` events (PNGs, indexed 0
and 1) and the completed picture, equal to `moss generate`'s with the same flags; edits a picture with a
mask through `client.images.edit(image=..., mask=..., ...)` (two pictures, each byte-identical to
`moss generate --init-image --mask` with the same settings) and checks that a mask of another size
raises BadRequestError.

    python3 tests/openai_client.py [target/debug/moss]
"""

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOSS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "moss")
MODEL = os.path.join(ROOT, "golden", "tiny-a")
KEY = "sk-moss-ci"


def start(lora_dir):
    env = dict(os.environ, MOSS_API_KEY=KEY)
    p = subprocess.Popen(
        [MOSS, "serve", "--model", MODEL, "--device", "cpu", "--port", "0", "--lora-dir", lora_dir,
         "--served-model-name", "dall-e-3", "--served-model-name", "gpt-image-1"],
        env=env, stderr=subprocess.PIPE, text=True,
    )
    port, deadline = None, time.time() + 120
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            sys.exit(f"moss serve exited early ({p.wait()})")
        print(line, end="", file=sys.stderr)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "ready in" in line:
            return p, port
    sys.exit("moss serve did not get ready")


def generate_cli(prompt, seed, size, steps, negative, out, loras=(), extra=()):
    lora_flags = [a for path, scale in loras for a in ("--lora", f"{path}:{scale}")]
    subprocess.run(
        [MOSS, "generate", "--model", MODEL, "--device", "cpu", "--prompt", prompt, "--seed", str(seed),
         "--size", size, "--steps", str(steps), "--negative", negative, "--out", out, "--quiet", "--force",
         *extra] + lora_flags,
        check=True,
    )
    with open(out, "rb") as f:
        return f.read()


def edit_cli(prompt, seed, steps, strength, image, mask, out):
    subprocess.run(
        [MOSS, "generate", "--model", MODEL, "--device", "cpu", "--prompt", prompt, "--seed", str(seed),
         "--steps", str(steps), "--strength", str(strength), "--init-image", image, "--mask", mask, "--out", out,
         "--quiet"],
        check=True,
    )
    with open(out, "rb") as f:
        return f.read()


def check_edits(client):
    image = os.path.join(ROOT, "golden", "expected", "enc-64x64.png")
    mask = os.path.join(ROOT, "golden", "expected", "mask-64x64.png")
    with open(image, "rb") as im, open(mask, "rb") as mk:
        r = client.images.edit(
            image=im, mask=mk, prompt="a lighthouse at dusk", n=2, response_format="b64_json",
            extra_body={"seed": 5, "num_inference_steps": 3, "strength": 0.7},
        )
    assert len(r.data) == 2, r
    with tempfile.TemporaryDirectory() as d:
        for i, item in enumerate(r.data):
            want = edit_cli("a lighthouse at dusk", 5 + i, 3, 0.7, image, mask, os.path.join(d, f"e{i}.png"))
            got = base64.b64decode(item.b64_json)
            assert got == want, f"edited picture {i} (seed {5 + i}) differs from moss generate --init-image --mask"
    with open(image, "rb") as im, open(os.path.join(ROOT, "golden", "expected", "mask-96x64.png"), "rb") as mk:
        try:
            client.images.edit(image=im, mask=mk, prompt="x", response_format="b64_json")
            sys.exit("a mask of another size was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == "mask", e


def lora_dir(d):
    """The golden adapters as a --lora-dir: kohya, qkv (files) and peft (a PEFT folder)."""
    g = os.path.join(ROOT, "golden", "lora")
    for f in ("kohya.safetensors", "qkv.safetensors"):
        shutil.copy(os.path.join(g, f), os.path.join(d, f))
    shutil.copytree(os.path.join(g, "peft"), os.path.join(d, "peft"))
    return {"kohya": os.path.join(d, "kohya.safetensors"), "qkv": os.path.join(d, "qkv.safetensors"),
            "peft": os.path.join(d, "peft", "adapter_model.safetensors")}


def check_loras(client, files, d):
    """Pictures with LoRAs chosen per request against `moss generate --lora`, /v1/loras, bad names."""
    listed = client.get("/loras", cast_to=object)
    assert [x["id"] for x in listed["data"]] == ["kohya", "peft", "qkv"], listed
    assert d not in str(listed), "a path in /v1/loras"
    sets = [[("kohya", 0.7), ("peft", 0.9)], [("qkv", -0.5)], [], [("kohya", 0.7), ("peft", 0.9)]]
    for i, chosen in enumerate(sets):
        r = client.images.generate(
            model=MODEL, prompt="a fox in snow", size="64x64", response_format="b64_json",
            extra_body={"seed": 8, "num_inference_steps": 2, "lora": [{"name": n, "scale": s} for n, s in chosen]},
        )
        want = generate_cli("a fox in snow", 8, "64x64", 2, "", os.path.join(d, f"lora{i}.png"),
                            [(files[n], s) for n, s in chosen])
        assert base64.b64decode(r.data[0].b64_json) == want, f"LoRA request {i} ({chosen}) differs from moss generate --lora's"
    for lora, what in [([{"name": "nope"}], "unknown"), ([{"name": "../kohya"}], "path-like"),
                       ([{"name": files["kohya"]}], "a path"), ([{"name": "kohya"}] * 5, "too many")]:
        try:
            client.images.generate(prompt="x", size="64x64", response_format="b64_json", extra_body={"lora": lora})
            sys.exit(f"a {what} LoRA name was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == "lora", e


def main():
    scratch = tempfile.TemporaryDirectory()
    files = lora_dir(scratch.name)
    server, port = start(scratch.name)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
        r = client.images.generate(
            model="tiny-a", prompt="a lighthouse at dusk", n=2, size="64x64", response_format="b64_json",
            extra_body={"seed": 31, "num_inference_steps": 3, "negative_prompt": "fog"},
        )
        assert len(r.data) == 2, r
        with tempfile.TemporaryDirectory() as d:
            for i, item in enumerate(r.data):
                want = generate_cli("a lighthouse at dusk", 31 + i, "64x64", 3, "fog", os.path.join(d, f"{i}.png"))
                got = base64.b64decode(item.b64_json)
                assert got == want, f"picture {i} (seed {31 + i}) differs from moss generate's"
                extra = item.model_extra or {}
                assert extra.get("seed") == 31 + i, extra
            # The fixed names clients send, and OpenAI's output_format / output_compression.
            for alias in ("dall-e-3", "gpt-image-1"):
                r = client.images.generate(
                    model=alias, prompt="a fox", n=1, size="64x64", response_format="b64_json",
                    output_format="jpeg", output_compression=80,
                    extra_body={"seed": 5, "num_inference_steps": 2},
                )
                want = generate_cli("a fox", 5, "64x64", 2, "", os.path.join(d, "fox.jpg"), extra=["--quality", "80"])
                assert base64.b64decode(r.data[0].b64_json) == want, f"{alias}: the JPEG differs from moss generate --quality 80's"
                assert r.output_format == "jpeg", r
        try:
            client.images.generate(model="dall-e-2", prompt="x", size="64x64", response_format="b64_json")
            sys.exit("an unknown model was accepted")
        except openai.NotFoundError as e:
            assert e.status_code == 404 and "dall-e-2" in str(e), e
        stream = client.images.generate(
            model=MODEL, prompt="a lighthouse at dusk", size="64x64", response_format="b64_json", stream=True,
            partial_images=2,
            extra_body={"seed": 33, "num_inference_steps": 3, "negative_prompt": "fog", "sampler": "dpm++2m",
                        "cache": "fbcache"},
        )
        partial, completed = [], []
        for event in stream:
            if event.type == "image_generation.partial_image":
                partial.append(event)
            elif event.type == "image_generation.completed":
                completed.append(event)
        assert [type(e).__name__ for e in partial] == ["ImageGenPartialImageEvent"] * 2, partial
        assert [e.partial_image_index for e in partial] == [0, 1], partial
        for e in partial:
            assert base64.b64decode(e.b64_json).startswith(b"\x89PNG"), "a partial image is not a PNG"
            assert (e.size, e.output_format) == ("64x64", "png"), e
        assert [type(e).__name__ for e in completed] == ["ImageGenCompletedEvent"], completed
        with tempfile.TemporaryDirectory() as d:
            want = generate_cli("a lighthouse at dusk", 33, "64x64", 3, "fog", os.path.join(d, "s.png"),
                                extra=["--sampler", "dpm++2m", "--cache", "fbcache"])
        assert base64.b64decode(completed[0].b64_json) == want, "the streamed picture differs from moss generate's"
        bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-wrong", max_retries=0)
        try:
            bad.images.generate(prompt="x", size="64x64", response_format="b64_json")
            sys.exit("a wrong key was accepted")
        except openai.AuthenticationError as e:
            assert e.status_code == 401
        try:
            client.images.generate(prompt="x", size="100x100", response_format="b64_json")
            sys.exit("a bad size was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and "size" in str(e), e
        models = client.models.list()
        assert [m.id for m in models.data] == ["tiny-a", "dall-e-3", "gpt-image-1"], models
        check_loras(client, files, scratch.name)
        check_edits(client)
    finally:
        server.send_signal(signal.SIGTERM)
        rest = server.stderr.read()
        print(rest, end="", file=sys.stderr)
        code = server.wait(timeout=60)
    assert code == 0, f"moss serve exited {code} after SIGTERM"
    print(f"openai {openai.__version__}: 2 pictures byte-identical to moss generate; aliases dall-e-3 and gpt-image-1 "
          "with JPEG output equal to moss generate --quality 80; a stream with 2 partial images and the same picture; "
          "401, 400, 404, models; 4 LoRA requests byte-identical to moss generate --lora, /v1/loras, "
          "4 bad LoRA choices 400; 2 edits byte-identical to moss generate --init-image --mask, a mask of another size 400; "
          "SIGTERM exit 0: ok")


if __name__ == "__main__":
    main()
