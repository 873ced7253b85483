"""Helper of bench/encoder.sh and bench/full_ckpt.sh: golden comparisons and the full-size Qwen3.5-9B side-by-side.

  ids       CKPT_JSON DIR            write DIR/<prompt>.txt, the golden prompts' token ids
  golden    CKPT_JSON CKPT_ST DIR    moss hidden states DIR/<dev>_<prompt>.st vs enc / enc64
  encode    A.safetensors B.safetensors   two `moss encode` files (cond, uncond)
  make      DIR                      random Qwen3.5-9B text weights (bf16, language_model.*), ids
  tf        DIR                      transformers Qwen3_5TextModel bf16 and fp32: hidden + times
  compare   DIR                      moss vs transformers (each side against the fp32 run)
  table     DIR MOSS.jsonl...        the speed table: each `moss bench-encode` file vs transformers bf16
"""
import glob
import json
import os
import sys
import time

import torch

DEV = os.environ.get("ENC_DEV", "cuda")
SMALL = os.environ.get("ENC_SMALL") == "1"
LENGTHS = [100, 200] if SMALL else [int(n) for n in os.environ.get("ENC_LENGTHS", "128,4096").split(",")]
REPS = int(os.environ.get("TF_REPS", "3"))  # timed runs of transformers at 4096 tokens (after one warm-up)
from safetensors.torch import load_file, save_file


def metrics(a, ref):
    a, ref = a.double().flatten(), ref.double().flatten()
    rel = ((a - ref).norm() / ref.norm()).item()
    cos = (a @ ref / (a.norm() * ref.norm())).item()
    return rel, cos


def per_token_cos(a, ref):
    a, ref = a.double(), ref.double()
    c = (a * ref).sum(-1) / (a.norm(dim=-1) * ref.norm(dim=-1))
    return c.min().item()


def cmd_ids(ck_json, out_dir):
    d = json.load(open(ck_json))
    os.makedirs(out_dir, exist_ok=True)
    for p in d["prompts"]:
        with open(os.path.join(out_dir, p["name"] + ".txt"), "w") as f:
            f.write(" ".join(map(str, p["ids"])))


def cmd_golden(ck_json, ck_st, moss_dir):
    d = json.load(open(ck_json))
    exp = load_file(ck_st)
    print(f"{'prompt':8} {'L':>4} {'moss run':14} {'vs enc64 relL2':>15} {'vs enc (fp32 tf) relL2':>23} {'min tok cos':>12}")
    worst = {}
    for p in d["prompts"]:
        e64, e32 = exp[p["key64"]], exp[p["key"]]
        for dev in ["cpu", "cuda_fp32", "cuda_bf16"]:
            f = os.path.join(moss_dir, f"{dev}_{p['name']}.st")
            if not os.path.exists(f):
                print(f"{p['name']:8} {len(p['ids']):4} {dev:14} MISSING")
                continue
            h = load_file(f)["hidden"]
            r64, _ = metrics(h, e64)
            r32, _ = metrics(h, e32)
            worst[dev] = max(worst.get(dev, 0), r64)
            print(f"{p['name']:8} {len(p['ids']):4} {dev:14} {r64:15.3e} {r32:23.3e} {per_token_cos(h, e64):12.6f}")
    # the fp32 transformers run itself against float64, for scale
    r = max(metrics(exp[p["key"]], exp[p["key64"]])[0] for p in d["prompts"])
    print(f"transformers fp32 vs enc64 (worst prompt): {r:.3e}")
    print("worst vs enc64: " + ", ".join(f"{k} {v:.3e}" for k, v in worst.items()))
    print(json.dumps({"worst_vs_enc64": worst, "tf_fp32_vs_enc64": r}))


def cmd_encode(a, b):
    ta, tb = load_file(a), load_file(b)
    for k in ["cond", "uncond"]:
        r, c = metrics(ta[k].float(), tb[k].float())
        print(f"{k}: {list(ta[k].shape)} relL2 {r:.3e} cos {c:.8f}")


def full_config():
    from transformers import Qwen3_5TextConfig

    if SMALL:  # a smoke test of this script on the CPU (ENC_SMALL=1 ENC_DEV=cpu)
        return Qwen3_5TextConfig(
            vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(4)],
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    n = 32
    return Qwen3_5TextConfig(
        vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=n,
        num_attention_heads=16, num_key_value_heads=4, head_dim=256, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        eos_token_id=248046, pad_token_id=None, bos_token_id=None,
    )


def init_weights(model, seed):
    """The golden init at full size: linears N(0, 1/fan_in), embedding N(0, 1), zero-centred norms
    N(0, 0.1), the gated norm N(1, 0.1), conv taps N(0, 1/4), A_log = ln U(0.01, 16), dt_bias N(1, 0.1)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    g = torch.Generator(device=DEV).manual_seed(seed)

    def normal(t, std, mean=0.0):
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=g, device=DEV, dtype=torch.float32) * std + mean)

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            normal(m.weight, m.weight.shape[1] ** -0.5)
        elif isinstance(m, torch.nn.Embedding):
            normal(m.weight, 1.0)
        elif isinstance(m, torch.nn.Conv1d):
            normal(m.weight, m.weight.shape[-1] ** -0.5)
        elif isinstance(m, mq.Qwen3_5RMSNormGated):
            normal(m.weight, 0.1, 1.0)
        elif isinstance(m, mq.Qwen3_5RMSNorm):
            normal(m.weight, 0.1)
        if isinstance(m, mq.Qwen3_5GatedDeltaNet):
            with torch.no_grad():
                u = torch.rand(m.A_log.shape, generator=g, device=DEV) * (16 - 0.01) + 0.01
                m.A_log.copy_(u.log())
            normal(m.dt_bias, 0.1, 1.0)


def cmd_make(out_dir):
    from transformers import Qwen3_5TextModel

    os.makedirs(out_dir, exist_ok=True)
    cfg = full_config()
    t = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(DEV):
        model = Qwen3_5TextModel(cfg)
    torch.set_default_dtype(torch.float32)
    init_weights(model, 1234)
    model = model.to(torch.bfloat16)
    sd = model.state_dict()
    print(f"built {sum(v.numel() for v in sd.values()) / 1e9:.2f} B parameters in {time.time() - t:.1f} s", flush=True)
    shard, shards, size, wmap = {}, [], 0, {}

    def flush():
        nonlocal shard, size
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, os.path.join(out_dir, name))
            shards.append(name)
            for k in shard:
                wmap[k] = name
            shard, size = {}, 0

    for k, v in sd.items():
        shard["language_model." + k] = v.detach().to("cpu").contiguous()
        size += v.numel() * v.element_size()
        if size > 4 << 30:
            flush()
    flush()
    json.dump({"metadata": {}, "weight_map": wmap}, open(os.path.join(out_dir, "model.safetensors.index.json"), "w"))
    json.dump({"model_type": "qwen3_5", "architectures": ["Qwen3_5Model"], "text_config": cfg.to_dict()},
              open(os.path.join(out_dir, "config.json"), "w"), indent=1)
    gi = torch.Generator().manual_seed(99)
    for n in LENGTHS:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=gi)
        open(os.path.join(out_dir, f"ids{n}.txt"), "w").write(" ".join(map(str, ids.tolist())))
    print(f"wrote {len(shards)} shards in {time.time() - t:.1f} s", flush=True)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps):
    """fn once as a warm-up, then reps runs timed with CUDA events: (last output, median ms, all ms)."""
    from timing import cuda_ms

    med, ts, out = cuda_ms(fn, reps)
    return out, med, ts


def cmd_tf(d):
    from transformers import Qwen3_5TextModel

    t = time.time()
    # The text model from the same config, loaded from the same files (keys without the
    # `language_model.` prefix), strictly: every tensor moss reads, nothing left at its init.
    cfg = full_config()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(DEV):
        model = Qwen3_5TextModel(cfg)
    torch.set_default_dtype(torch.float32)
    wmap = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
    sd = {}
    for shard in sorted(set(wmap.values())):
        for k, v in load_file(os.path.join(d, shard), device=DEV).items():
            sd[k.removeprefix("language_model.")] = v
    model.load_state_dict(sd, strict=True)
    model.eval()
    del sd
    print(f"transformers load {time.time() - t:.1f} s; attn {model.config._attn_implementation}", flush=True)
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    print("fast path (fla/causal-conv1d kernels):", getattr(mq, "is_fast_path_available", "?"), flush=True)
    res = {}
    # TF_DTYPES=bf16: a second timing of bf16 only (tf_times.json and the fp32 hidden states of an
    # earlier run are kept: its times go to tf_times_bf16_again.json)
    dtypes = [(torch.bfloat16, "bf16"), (torch.float32, "fp32")]
    only_bf16 = os.environ.get("TF_DTYPES") == "bf16"
    if only_bf16:
        dtypes = dtypes[:1]
    for dt, name in dtypes:
        if dt == torch.float32:
            model = model.float()
        for n in LENGTHS:
            ids = torch.tensor([[int(x) for x in open(os.path.join(d, f"ids{n}.txt")).read().split()]], device=DEV)
            with torch.inference_mode():
                out, med, ts = timed(lambda: model(input_ids=ids, use_cache=False).last_hidden_state[0], REPS if n > 128 else max(REPS, 5))
            if not only_bf16:
                save_file({"hidden": out.float().cpu().contiguous()}, os.path.join(d, f"tf_{name}_{n}.st"))
            res[f"{name}_{n}"] = {"median_ms": med, "ms": ts}
            print(f"transformers {name} L={n}: median {med:.1f} ms {['%.1f' % x for x in ts]}", flush=True)
            if DEV == "cuda":
                torch.cuda.empty_cache()
    # TF_TAG: a name for this process's bf16-only timing (several transformers processes in a call)
    again = f"tf_times_bf16_again{os.environ.get('TF_TAG', '')}.json"
    json.dump(res, open(os.path.join(d, again if only_bf16 else "tf_times.json"), "w"))


def cmd_table(d, *jsonls):
    """One row per moss binary (the file name's last _part: enc_base.jsonl -> base) and length, next
    to the transformers bf16 median of the same length (tf_times*.json in DIR, the latest run)."""
    tfs = sorted(glob.glob(os.path.join(d, "tf_times*.json")), key=os.path.getmtime)
    tf = json.load(open(tfs[-1])) if tfs else {}
    print("| encoder, one H200 | tokens | median ms | transformers bf16 ms | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for f in jsonls:
        tag = os.path.basename(f).rsplit(".", 1)[0].rsplit("_", 1)[-1]
        for line in open(f):
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            n = j["tokens"]
            ms = j.get("device_median_ms") or j["median_ms"]
            ref = tf.get(f"bf16_{n}", {}).get("median_ms")
            up = f"{ref / ms:.2f}x" if ref else "-"
            print(f"| moss {tag} (bf16, device) | {n} | {ms:.2f} | {ref if ref is None else round(ref, 2)} | {up} |")


def cmd_compare(d):
    tf = json.load(open(os.path.join(d, "tf_times.json")))
    moss = {}
    for line in open(os.path.join(d, "moss_bf16.jsonl")):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            moss[j["tokens"]] = j
    rows = []
    for n in LENGTHS:
        ref = load_file(os.path.join(d, f"tf_fp32_{n}.st"))["hidden"]
        row = {"L": n}
        for name, f in [("moss_bf16", f"moss_bf16_{n}.st"), ("tf_bf16", f"tf_bf16_{n}.st")]:
            p = os.path.join(d, f)
            if os.path.exists(p):
                h = load_file(p)["hidden"]
                rel, cos = metrics(h, ref)
                row[name] = {"relL2_vs_tf_fp32": rel, "cos_vs_tf_fp32": cos, "min_token_cos": per_token_cos(h, ref)}
        mb = os.path.join(d, f"moss_bf16_{n}.st")
        tb = os.path.join(d, f"tf_bf16_{n}.st")
        if os.path.exists(mb) and os.path.exists(tb):
            row["moss_bf16_vs_tf_bf16_relL2"] = metrics(load_file(mb)["hidden"], load_file(tb)["hidden"])[0]
        row["tf_bf16_ms"] = tf[f"bf16_{n}"]["median_ms"]
        row["tf_fp32_ms"] = tf[f"fp32_{n}"]["median_ms"]
        agains = sorted(glob.glob(os.path.join(d, "tf_times_bf16_again*.json")))
        if agains:
            # more transformers processes in the same call: their medians, and the median of every run's reps
            t2 = [json.load(open(a))[f"bf16_{n}"] for a in agains]
            pooled = sorted(tf[f"bf16_{n}"]["ms"] + [x for t in t2 for x in t["ms"]])
            row["tf_bf16_again_ms"] = t2[0]["median_ms"] if len(t2) == 1 else [t["median_ms"] for t in t2]
            row["tf_bf16_pooled_ms"] = pooled[len(pooled) // 2]
        if n in moss:
            row["moss_bf16_ms"] = moss[n]["median_ms"]
            row["speedup_vs_tf_bf16"] = row["tf_bf16_ms"] / moss[n]["median_ms"]
            if moss[n].get("device_median_ms"):
                # hidden states left on the GPU, as the transformers timing leaves them
                row["moss_bf16_device_ms"] = moss[n]["device_median_ms"]
                row["speedup_device_vs_tf_bf16"] = row["tf_bf16_ms"] / moss[n]["device_median_ms"]
                if "tf_bf16_pooled_ms" in row:
                    row["speedup_device_vs_tf_bf16_pooled"] = row["tf_bf16_pooled_ms"] / moss[n]["device_median_ms"]
        rows.append(row)
        print(json.dumps(row))


if __name__ == "__main__":
    c, args = sys.argv[1], sys.argv[2:]
    {"ids": cmd_ids, "golden": cmd_golden, "encode": cmd_encode, "make": cmd_make, "tf": cmd_tf,
     "compare": cmd_compare, "table": cmd_table}[c](*args)
