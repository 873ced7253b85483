"""The DiT precision benchmark's PyTorch side and its table (bench/dit_precision.sh runs it).

    python3 bench/dit_precision.py settings            # "SIZE STEPS DEVICE" for the shell script
    python3 bench/dit_precision.py ckpt DIR            # the random full-size DiT + VAE, unless DIR has them
    python3 bench/dit_precision.py torch DIR WORK OUT.json
    python3 bench/dit_precision.py report DIR WORK OUT_DIR

`torch` runs golden/dit_ref.py on the checkpoint's weights and inputs (bench/dit.py's seed-42
noise, random embeds, 1024x1024, 50 guided steps, CFG 3, the uncond pass skipping block 22), in
this order: fp32 (SDPA, TF32 off; the accuracy reference), bf16 eager (SDPA), bf16 with every
block torch.compile'd, and the bf16 model with torchao's float8 dynamic row-wise quantization
(`Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())`: e4m3 weights with one scale
per output channel, activations quantized per token on the fly) on the 42 main blocks' linears
(q, k, v, o, ffn_up_gate, ffn_down: what `moss --precision fp8` quantizes), every block
torch.compile'd (torchao's recommended inductor settings, its default). For each: one forward of
the cond pass at the first step's timestep (median of 5 after a warm-up, CUDA events), its
velocity, and the 50-step loop (LOOP_REPS timed runs, default 1; the fp32 row: one forward, one
loop) and its latents, written to WORK as raw f32 (vel_<row>.f32, lat_<row>.f32).
OUT.json is rewritten after every row, so a run stopped by the time limit keeps what it measured;
a row that fails records why ("not_run").

The torch step first measures the GEMM and attention ceilings of this GPU (bench/dit_profile.py).
`report` reads moss's rows (OUT_DIR/moss_<bf16|fp8>.json from `moss bench-dit`, .err, .rc; its
files WORK/vel_moss_<p>.f32, lat_moss_<p>.f32) and OUT_DIR/torch.json, computes every row's error
against torch fp32 (velocity rel L2, latents rel L2, PSNR of the decoded picture's RGB8 pixels,
every latent decoded by the same decoder: diffusers AutoencoderKLFlux2 fp32, TF32 off, through
golden/dit_ref.py's decode), prints the markdown table (with the speed ratios, issue 22's targets
and bars), then the per-op profiles (moss_<p>.json, and moss_base_<p>.json when BASE_BIN ran: the
build before) with the floor and the fraction of it reached, and writes OUT_DIR/dit_precision.json.

DIT_FULL_SMOKE=1 (bench/dit.py) runs all of it at a tiny size on the CPU (3 steps, 64x64; the
"compiled" rows stay eager there, torchao's row-wise float8 and moss fp8 report "not run").
"""

import gc
import json
import math
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit  # noqa: E402
import dit_profile  # noqa: E402
from dit import DEV, GUIDANCE, SIZE, STEPS, dit_ref  # noqa: E402
from timing import cuda_ms  # noqa: E402

FORWARDS = 5
LOOP_REPS = int(os.environ.get("LOOP_REPS", "1"))
TARGET_S = {"moss_bf16": 7.2, "moss_fp8": 4.8}  # issue 22: DiT 50 steps on the H200
ROWS = [
    ("moss_bf16", "moss bf16"),
    ("moss_fp8", "moss fp8 (e4m3 linears, bf16 attention)"),
    ("torch_bf16_eager", "torch bf16 eager (SDPA)"),
    ("torch_bf16_compiled", "torch bf16, torch.compile per block"),
    ("torchao_fp8_compiled", "torchao float8 row-wise, torch.compile per block"),
    ("torch_fp32", "torch fp32, TF32 off (the reference)"),
]
REF = "torch_fp32"


def settings():
    print(SIZE, STEPS, DEV)


def ckpt(d):
    """The full-size DiT (bench/dit.py write) and VAE (bench/vae.py full_vae) that
    bench/full_ckpt.sh writes, each unless DIR has it already; the text encoder is not needed."""
    if not os.path.exists(f"{d}/transformer/diffusion_pytorch_model.safetensors"):
        dit.write(d)
    if not os.path.exists(f"{d}/vae/diffusion_pytorch_model.safetensors"):
        from vae import full_vae

        full_vae().save_pretrained(f"{d}/vae", safe_serialization=True)
        print("vae written", flush=True)


def quantize_fp8_rowwise(m):
    """torchao float8 dynamic activation + weight, row-wise scales, on the main blocks' linears
    (`layers.N.proj.*`); returns (the number of linears quantized, torchao's version)."""
    import torchao
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Float8Tensor, PerRow, quantize_

    def main_block_linear(mod, fqn):
        return isinstance(mod, torch.nn.Linear) and fqn.startswith("layers.")

    quantize_(m, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), filter_fn=main_block_linear)
    n = sum(1 for mod in m.modules() if isinstance(mod, torch.nn.Linear) and isinstance(mod.weight, Float8Tensor))
    return n, torchao.__version__


def measure(name, m, x, t, c, u, work, res, out_json, forwards=FORWARDS, warmup=1, loops=LOOP_REPS):
    """One row: forward median (CUDA events), velocity, `loops` timed loops, latents; saved."""
    ms, all_ms, v = cuda_ms(lambda: m(x, t, c, impl="sdpa"), forwards, warmup=warmup)
    v.float().cpu().numpy().astype("<f4").tofile(f"{work}/vel_{name}.f32")
    loop_ms, loops_ms, lat = cuda_ms(lambda: dit_ref.sample(m, x, c, u, STEPS, GUIDANCE), loops, warmup=0)
    lat.float().cpu().numpy().astype("<f4").tofile(f"{work}/lat_{name}.f32")
    res[name].update(forward_ms=ms, forward_all_ms=all_ms, loop_s=loop_ms / 1e3, loop_all_s=[s / 1e3 for s in loops_ms])
    save(res, out_json)
    print(name, json.dumps(res[name]), flush=True)


def save(res, out_json):
    with open(out_json, "w") as f:
        json.dump(res, f, indent=1)


def release():
    """Give the memory of the models no longer referenced back to the device."""
    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()


@torch.no_grad()
def torch_rows(d, work, out_json):
    from vae import tf32_off

    tf32_off()
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
           "steps": STEPS, "size": SIZE, "loop_reps": LOOP_REPS}
    c, u = dit.embeds(d)
    x = dit.noise()
    t = float(dit_ref.sigmas_for(STEPS)[0] * dit_ref.TIME_SCALE)

    def row(name, build):
        res[name] = {}
        save(res, out_json)
        try:
            build()
        except Exception as e:  # a row that cannot run says why; the others go on
            traceback.print_exc()
            res[name]["not_run"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            save(res, out_json)
            print(name, "not run:", res[name]["not_run"], flush=True)

    def fp32():
        measure(REF, dit_ref.load_transformer(f"{d}/transformer", torch.float32, DEV), x, t, c, u, work, res,
                out_json, forwards=1, warmup=0, loops=1)

    m = None  # the bf16 model, eager then compiled

    def eager():
        nonlocal m
        m = dit_ref.load_transformer(f"{d}/transformer", torch.bfloat16, DEV)
        measure("torch_bf16_eager", m, x, t, c, u, work, res, out_json)

    def compiled():
        nonlocal m
        if m is None:  # the eager row failed before loading it
            m = dit_ref.load_transformer(f"{d}/transformer", torch.bfloat16, DEV)
        res["torch_bf16_compiled"]["compile_warmup_s"] = dit.compile_blocks(m, x, t, c, u)
        measure("torch_bf16_compiled", m, x, t, c, u, work, res, out_json)

    def torchao_fp8():
        torch._dynamo.reset()
        q = dit_ref.load_transformer(f"{d}/transformer", torch.bfloat16, DEV)
        s = time.time()
        n, ver = quantize_fp8_rowwise(q)
        res["torchao_fp8_compiled"].update(torchao=ver, quantized_linears=n, quantize_s=time.time() - s)
        res["torchao_fp8_compiled"]["compile_warmup_s"] = dit.compile_blocks(q, x, t, c, u)
        measure("torchao_fp8_compiled", q, x, t, c, u, work, res, out_json)

    if DEV == "cuda":
        try:
            res["ceilings"] = dit_profile.ceilings((SIZE // 16) ** 2 + c.shape[-2])
        except Exception as e:  # the table says the floor was not measured
            res["ceilings"] = {"not_run": f"{type(e).__name__}: {e}"}
        save(res, out_json)
        print("ceilings", json.dumps(res["ceilings"]), flush=True)
    row(REF, fp32)
    release()
    row("torch_bf16_eager", eager)
    row("torch_bf16_compiled", compiled)
    m = None
    release()
    row("torchao_fp8_compiled", torchao_fp8)


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------
def moss_row(out, p):
    """moss bench-dit's row for precision p: its times, or {"not_run": why}."""
    rc = open(f"{out}/moss_{p}.rc").read().strip() if os.path.exists(f"{out}/moss_{p}.rc") else "?"
    err = open(f"{out}/moss_{p}.err").read().strip().splitlines() if os.path.exists(f"{out}/moss_{p}.err") else []
    lines = [ln for ln in open(f"{out}/moss_{p}.json").read().splitlines() if ln.startswith("{")] \
        if os.path.exists(f"{out}/moss_{p}.json") else []
    if rc != "0" or not lines:
        said = [ln for ln in err if ln.lower().startswith("error")] or [ln for ln in err if ln.strip()] or ["no output"]
        return {"not_run": f"moss bench-dit --precision {p} exit {rc}: {said[0]}"}
    j = json.loads(lines[-1])
    if j.get("precision") != p and not (DEV == "cpu" and j.get("precision") == "fp32"):  # the CPU computes fp32
        return {"not_run": f"moss bench-dit --precision {p} reported precision {j.get('precision')!r}"}
    return {"forward_ms": j["forward_ms_median"], "forward_all_ms": j["forward_ms"], "loop_s": j.get("loop_s"),
            "device": j.get("device")}


def psnr(px, ref_px):
    mse = float((px.double() - ref_px.double()).pow(2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


@torch.no_grad()
def errors(d, work, rows):
    """Velocity / latents rel L2 and picture PSNR of every row that has its files, against REF."""
    from diffusers import AutoencoderKLFlux2
    from vae import tf32_off

    tf32_off()
    vae = AutoencoderKLFlux2.from_pretrained(f"{d}/vae", torch_dtype=torch.float32).to(DEV).eval()
    ref_v, ref_l = dit.read_f32(f"{work}/vel_{REF}.f32"), dit.read_f32(f"{work}/lat_{REF}.f32")
    _, ref_px = dit_ref.decode(vae, ref_l)
    for name, r in rows.items():
        vf, lf = f"{work}/vel_{name}.f32", f"{work}/lat_{name}.f32"
        if "not_run" in r:
            continue
        if os.path.exists(vf):
            r["velocity_rel_l2"] = dit.rel(dit.read_f32(vf), ref_v)
        if os.path.exists(lf):
            lat = dit.read_f32(lf)
            r["latents_rel_l2"] = dit.rel(lat, ref_l)
            r["psnr_db"] = psnr(dit_ref.decode(vae, lat)[1], ref_px)


def fmt(v, f):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, f)


def ratio(rows, slow, fast, key):
    a, b = rows.get(slow, {}).get(key), rows.get(fast, {}).get(key)
    return f"{a / b:.2f}x" if a and b else "-"


def bar(rows, moss, other):
    """moss no worse than other on all three errors: 'met', 'NOT met' or 'not run' (with why)."""
    a, b = rows.get(moss, {}), rows.get(other, {})
    keys = ("velocity_rel_l2", "latents_rel_l2", "psnr_db")
    missing = [k for k in keys if k not in a or k not in b]
    if missing:
        return f"not run ({', '.join(missing)} missing)"
    worse = [k for k in keys[:2] if a[k] > b[k]] + (["psnr_db"] if a["psnr_db"] < b["psnr_db"] else [])
    return "met" if not worse else f"NOT met ({', '.join(worse)})"


def table(rows, meta):
    """The markdown report (a list of lines) from the rows with their times and errors."""
    lines = [f"DiT {meta['size']}x{meta['size']}, {meta['steps']} guided steps, CFG {GUIDANCE:g}, the uncond pass "
             f"skipping block 22; {meta['device']}, torch {meta['torch']}; forwards: median of {FORWARDS} after a "
             f"warm-up (torch fp32: one); loops: torch {meta['loop_reps']} timed run(s), moss one run; errors against "
             "torch fp32 on the same weights and inputs; pictures decoded by diffusers AutoencoderKLFlux2 fp32.", "",
             f"| row | forward ms | {meta['steps']} steps s | target | velocity rel L2 | latents rel L2 | PSNR dB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, label in ROWS:
        r = rows.get(key, {})
        target = f"<= {TARGET_S[key]} s" if key in TARGET_S else ""
        if "not_run" in r:
            lines.append(f"| {label} | not run: {r['not_run']} | | {target} | | | |")
            continue
        lines.append(f"| {label} | {fmt(r.get('forward_ms'), '.1f')} | {fmt(r.get('loop_s'), '.2f')} | {target} | "
                     f"{fmt(r.get('velocity_rel_l2'), '.3e')} | {fmt(r.get('latents_rel_l2'), '.3e')} | "
                     f"{fmt(r.get('psnr_db'), '.2f')} |")
    lines += ["", f"| speed-up (time of the second / time of the first) | forward | {meta['steps']} steps |", "|---|---:|---:|"]
    for fast, slow, label in (("moss_bf16", "torch_bf16_compiled", "moss bf16 vs torch.compile bf16 (target >= 1.19x)"),
                              ("moss_fp8", "torchao_fp8_compiled", "moss fp8 vs torchao fp8 + torch.compile"),
                              ("moss_fp8", "moss_bf16", "moss fp8 vs moss bf16"),
                              ("torchao_fp8_compiled", "torch_bf16_compiled", "torchao fp8 vs torch.compile bf16")):
        lines.append(f"| {label} | {ratio(rows, slow, fast, 'forward_ms')} | {ratio(rows, slow, fast, 'loop_s')} |")
    lines += ["", "| issue 22 bar | verdict |", "|---|---|"]
    for key, target in TARGET_S.items():
        s = rows.get(key, {}).get("loop_s")
        verdict = "not run" if s is None else ("met" if s <= target else "NOT met")
        lines.append(f"| {dict(ROWS)[key]}: {meta['steps']} steps <= {target} s | {verdict} |")
    for moss, other in (("moss_bf16", "torch_bf16_eager"), ("moss_bf16", "torch_bf16_compiled"),
                        ("moss_fp8", "torchao_fp8_compiled")):
        lines.append(f"| {dict(ROWS)[moss]} no less accurate than {dict(ROWS)[other]} | {bar(rows, moss, other)} |")
    return lines


def report(d, work, out):
    tj = f"{out}/torch.json"
    meta = json.load(open(tj)) if os.path.exists(tj) else {}
    rows = {}
    for key, _ in ROWS:
        if key.startswith("moss_"):
            rows[key] = moss_row(out, key[5:])
        elif key in meta and ("loop_s" in meta[key] or "not_run" in meta[key]):
            rows[key] = meta[key]
        else:
            rows[key] = {"not_run": "the torch side stopped (time limit or crash, see the log) before this row finished"}
    for k, v in (("size", SIZE), ("steps", STEPS), ("device", "?"), ("torch", torch.__version__), ("loop_reps", LOOP_REPS)):
        meta.setdefault(k, v)
    if "not_run" in rows[REF]:
        print(f"no fp32 reference ({rows[REF]['not_run']}): no errors", flush=True)
    else:
        errors(d, work, rows)
    lines = table(rows, meta)
    runs = {}
    for p in ("bf16", "fp8"):
        for tag, label in (("base_", f"{p} before"), ("", p)):
            f = f"{out}/moss_{tag}{p}.json"
            js = [ln for ln in open(f).read().splitlines() if ln.startswith("{")] if os.path.exists(f) else []
            if js:
                runs[label] = json.loads(js[-1])
    lines += ["", "## Where a forward's time goes", ""] + dit_profile.lines(runs, meta.get("ceilings"))
    with open(f"{out}/dit_precision.json", "w") as f:
        json.dump({"rows": rows, "meta": {k: meta[k] for k in ("size", "steps", "device", "torch", "loop_reps")}}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"settings": settings, "ckpt": ckpt, "torch": torch_rows, "report": report}[cmd](*args)
