#!/usr/bin/env python3
"""The signed C2PA manifest verified by C2PA's own reader (c2pa-python, pinned in .ci/run; CI runs
this after tests/provenance.py, which installs exiftool).

A throwaway CA and signing certificates (ES256, Ed25519) are made with the openssl command line.
`moss generate --c2pa-cert --c2pa-key` writes a PNG, a JPEG and a WebP (golden tiny-a, CPU), and
`moss serve` with the same flags serves a PNG and a JPEG. For each, c2pa-python must find the
manifest with a valid claim signature and data hash, the only failure being the test CA's
`signingCredential.untrusted`, and a `c2pa.created` action with IPTC's trainedAlgorithmicMedia and
moss as software agent. Signing is not deterministic (each manifest has a fresh random label), so
identity is checked on the picture without its manifest (a PNG's caBX chunk, a JPEG's APP11
segments, a WebP's C2PA chunk): it is the unsigned `moss generate` picture byte for byte, for the
CLI's files and the server's. exiftool still reads the XMP DigitalSourceType, `moss info` the same
settings, and `--from` each signed file renders the unsigned PNG again.

    python3 tests/c2pa_verify.py [target/debug/moss]
"""

import json
import os
import struct
import subprocess
import tempfile

import c2pa

# the same moss binary, model, picture settings and server driver as tests/provenance.py
from provenance import ARGS, MOSS, PICTURE, TRAINED, run, served

EE_EXT = """basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=emailProtection
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid:always
"""


def openssl(d, *args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)


def make_certs(d):
    """A CA (P-256) and, for es256 and ed25519, NAME.key and NAME.pem (signing certificate + CA)."""
    with open(os.path.join(d, "ee.ext"), "w") as f:
        f.write(EE_EXT)
    openssl(d, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key")
    openssl(d, "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/O=moss tests/CN=moss test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.pem")
    for name, alg in (("es256", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]), ("ed25519", ["-algorithm", "ED25519"])):
        openssl(d, "genpkey", *alg, "-out", f"{name}.key")
        openssl(d, "req", "-new", "-key", f"{name}.key", "-subj", f"/O=moss tests/CN=moss test signer {name}", "-out", f"{name}.csr")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-extfile", "ee.ext", "-out", f"{name}.ee.pem")
        with open(os.path.join(d, f"{name}.pem"), "wb") as out:
            for part in (f"{name}.ee.pem", "ca.pem"):
                with open(os.path.join(d, part), "rb") as f:
                    out.write(f.read())
    return {n: ["--c2pa-cert", os.path.join(d, f"{n}.pem"), "--c2pa-key", os.path.join(d, f"{n}.key")] for n in ("es256", "ed25519")}


def check_manifest(path, title, alg):
    """c2pa-python's reading of `path`: valid but for the untrusted test CA, and what moss signs."""
    with c2pa.Reader(path) as r:
        store = json.loads(r.json())
    what = f"{os.path.basename(path)} ({alg})"
    assert store.get("validation_state") == "Valid", f"{what}: {json.dumps(store, indent=1)}"
    results = store["validation_results"]["activeManifest"]
    failures = [s["code"] for s in results.get("failure", [])]
    assert failures == ["signingCredential.untrusted"], f"{what}: failures {failures} (only the test CA's untrusted expected)"
    success = [s["code"] for s in results.get("success", [])]
    for code in ("claimSignature.validated", "claimSignature.insideValidity", "assertion.dataHash.match"):
        assert code in success, f"{what}: no {code} in {success}"
    m = store["manifests"][store["active_manifest"]]
    assert m.get("title") == title, f"{what}: title {m.get('title')!r}"
    gen = m["claim_generator_info"][0]
    assert gen["name"] == "moss" and gen.get("version"), f"{what}: claim generator {gen}"
    assert m["signature_info"]["alg"].lower() == alg, f"{what}: {m['signature_info']}"
    actions = [a for x in m["assertions"] if x["label"].startswith("c2pa.actions") for a in x["data"]["actions"]]
    assert len(actions) == 1 and actions[0]["action"] == "c2pa.created", f"{what}: {actions}"
    assert actions[0]["digitalSourceType"] == TRAINED, f"{what}: {actions[0]}"
    assert actions[0]["softwareAgent"]["name"] == "moss", f"{what}: {actions[0]}"
    return gen["version"]


def without_manifest(data):
    """The picture without its C2PA manifest store (PNG caBX chunks, JPEG APP11 segments, WebP C2PA chunks)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        out, i = [data[:8]], 8
        while i < len(data):
            n = struct.unpack(">I", data[i:i + 4])[0]
            if data[i + 4:i + 8] != b"caBX":
                out.append(data[i:i + 12 + n])
            i += 12 + n
        return b"".join(out)
    if data.startswith(b"\xff\xd8"):
        out, i = [data[:2]], 2
        while data[i + 1] != 0xDA:  # up to the start of scan
            n = struct.unpack(">H", data[i + 2:i + 4])[0]
            if data[i + 1] != 0xEB:
                out.append(data[i:i + 2 + n])
            i += 2 + n
        return b"".join(out) + data[i:]
    assert data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    body, i = [], 12
    while i < len(data):
        n = struct.unpack("<I", data[i + 4:i + 8])[0]
        if data[i:i + 4] != b"C2PA":
            body.append(data[i:i + 8 + n + (n & 1)])
        i += 8 + n + (n & 1)
    body = b"".join(body)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    with tempfile.TemporaryDirectory() as d:
        flags = make_certs(d)
        version = run("--version").strip()
        signed = {}
        for ext in ("png", "jpg", "webp"):
            plain, signed[ext] = os.path.join(d, f"plain.{ext}"), os.path.join(d, f"signed.{ext}")
            quality = ["--quality", "90"] if ext == "jpg" else []
            run("generate", *ARGS, *PICTURE, *quality, "--out", plain, "--quiet")
            run("generate", *ARGS, *PICTURE, *quality, *flags["es256"], "--out", signed[ext], "--quiet")
            signer = check_manifest(signed[ext], f"signed.{ext}", "es256")
            assert signer in version, f"claim generator version {signer!r}, moss --version {version!r}"
            assert without_manifest(read(signed[ext])) == read(plain), f"signed.{ext} without its manifest is not plain.{ext}"
        ed = os.path.join(d, "ed25519.png")
        run("generate", *ARGS, *PICTURE, *flags["ed25519"], "--out", ed, "--quiet")
        check_manifest(ed, "ed25519.png", "ed25519")
        assert without_manifest(read(ed)) == read(os.path.join(d, "plain.png"))
        for ext, path in served(d, flags["es256"], (("png", "png"), ("jpeg", "jpg"))).items():
            check_manifest(path, f"picture.{ext}", "es256")
            assert without_manifest(read(path)) == read(os.path.join(d, f"plain.{ext}")), f"the served {ext} differs from moss generate's"
            signed[f"served {ext}"] = path
        for name, path in signed.items():
            out = subprocess.run(["exiftool", "-j", "-n", "-XMP-iptcExt:DigitalSourceType", path], check=True, capture_output=True, text=True).stdout
            assert json.loads(out)[0].get("DigitalSourceType") == TRAINED, f"{name}: exiftool: {out}"
            plain = os.path.join(d, "plain." + name.split()[-1])
            assert run("info", path) == run("info", plain), f"{name}: moss info differs from the unsigned picture's"
            again = os.path.join(d, "again.png")
            run("generate", *ARGS, "--from", path, "--out", again, "--quiet", "--force")
            assert read(again) == read(os.path.join(d, "plain.png")), f"moss generate --from {name} renders another picture"
    print(f"c2pa-python {c2pa.sdk_version()}: the manifests of PNG, JPEG, WebP (ES256, Ed25519) and a served PNG and JPEG validate "
          "(the test CA untrusted, nothing else failing), trainedAlgorithmicMedia; without the manifest, the unsigned pictures; "
          "exiftool, moss info and --from read them: ok")


if __name__ == "__main__":
    main()
