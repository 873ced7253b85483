"""Writes golden/expected/attention_fp8.{json,safetensors}: the e4m3 attention of `--precision fp8` (what moss runs
on Hopper; src/backend/cpu/attention_fp8.rs is its Rust twin), written here in torch independently of the Rust
code. Run after make_golden.py (which clears expected/), with the same pins (requirements.txt). CPU, float64
between the rounding points; deterministic (~2 s).

The attention over a packed projection [q | k | v] whose q and k are QK-normed (RMS norm over the head, times a
weight w) and rotated (RoPE), as moss's attention receives it (bf16 values):
  q, k codes:  s = (sqrt(hd) * max|w|).clamp(min=1e-12) / 448 (fp32), codes = (x / s).to(float8_e4m3fn)
  v codes:     per head and 128-token tile, s = amax(tile).clamp(min=1e-12) / 448, codes = (v / s).to(e4m3)
  scores:      S = (q_codes . k_codes) * s_q * s_k * hd^-0.5 (float64)
  softmax:     over key tiles of 128 in order: m_t = max(m_{t-1}, max S over the tile); the output so far and
               the normaliser times exp(m_{t-1} - m_t); P enters the product with V as the e4m3 of 256 exp(S - m_t)
               (rounded to fp32 first), the normaliser sums 256 exp(S - m_t) unrounded
  out:         sum_t sum_j e4m3(256 p) * s_v(t) * v_codes / normaliser

Tensors (f32 unless noted): `qkv` bf16 [N, 3D] the input, `wq`, `wk` [hd] (bf16 values), `q.codes`,
`k.codes`, `v.codes` u8 [N, D], `scales` [2 + heads * tiles] (s_q, s_k, then s_v head-major), `out` [N, D], and
`exact` [N, D] (the same attention without the e4m3 roundings). N = 300 (a partial last tile), 2 heads of 128.
"""
import json
import math
import os

import torch

import make_golden

N, HEADS, HD, TILE = 300, 2, 128, 128
D = HEADS * HD
E4M3_MAX = 448.0


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def inputs(g: torch.Generator):
    x = torch.randn(N, 3, HEADS, HD, generator=g, dtype=torch.float64)
    x = x * torch.exp(torch.rand(N, 1, 1, 1, generator=g, dtype=torch.float64) * 4 - 2)  # per-token scales e^±2
    wq = bf16(torch.rand(HD, generator=g) + 0.5)
    wk = bf16(torch.rand(HD, generator=g) + 0.5)
    theta = torch.rand(N, HD // 2, generator=g, dtype=torch.float64) * 200 - 100
    cos, sin = theta.cos(), theta.sin()
    for p, w in ((0, wq), (1, wk)):
        h = x[:, p]
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        a, b = y[..., : HD // 2], y[..., HD // 2:]
        x[:, p] = torch.cat([a * cos[:, None] - b * sin[:, None], b * cos[:, None] + a * sin[:, None]], -1)
    return bf16(x.reshape(N, 3 * D)), wq, wk


def operands(qkv: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor):
    q, k, v = qkv[:, :D], qkv[:, D:2 * D], qkv[:, 2 * D:]
    sqrt_hd = torch.tensor(float(HD)).sqrt()  # fp32
    sq = (sqrt_hd * wq.abs().max()).clamp(min=1e-12) / E4M3_MAX
    sk = (sqrt_hd * wk.abs().max()).clamp(min=1e-12) / E4M3_MAX
    tiles = math.ceil(N / TILE)
    v_codes = torch.empty(N, D, dtype=torch.float8_e4m3fn)
    sv = torch.empty(HEADS, tiles)
    for h in range(HEADS):
        for t in range(tiles):
            blk = v[t * TILE:(t + 1) * TILE, h * HD:(h + 1) * HD]
            s = blk.abs().max().clamp(min=1e-12) / E4M3_MAX
            sv[h, t] = s
            v_codes[t * TILE:(t + 1) * TILE, h * HD:(h + 1) * HD] = e4m3(blk / s)
    scales = torch.cat([sq.view(1), sk.view(1), sv.flatten()])
    return e4m3(q / sq), e4m3(k / sk), v_codes, scales


def attention(qc, kc, vc, scales) -> torch.Tensor:
    sq, sk, sv = scales[0].double(), scales[1].double(), scales[2:].view(HEADS, -1).double()
    out = torch.empty(N, D, dtype=torch.float64)
    for h in range(HEADS):
        cols = slice(h * HD, (h + 1) * HD)
        q, k, v = (c[:, cols].float().double() for c in (qc, kc, vc))
        s_all = (q @ k.T) * sq * sk / math.sqrt(HD)
        m = torch.full((N, 1), -math.inf, dtype=torch.float64)
        l = torch.zeros(N, 1, dtype=torch.float64)
        acc = torch.zeros(N, HD, dtype=torch.float64)
        for t in range(math.ceil(N / TILE)):
            keys = slice(t * TILE, min((t + 1) * TILE, N))
            s = s_all[:, keys]
            m_new = torch.maximum(m, s.max(-1, keepdim=True).values)
            corr = torch.exp(m - m_new)
            p256 = 256.0 * torch.exp(s - m_new)
            l = l * corr + p256.sum(-1, keepdim=True)
            acc = acc * corr + (e4m3(p256).double() * sv[h, t]) @ v[keys]
            m = m_new
        out[:, cols] = acc / l
    return out.float()


def exact(qkv: torch.Tensor) -> torch.Tensor:
    q, k, v = (qkv[:, i * D:(i + 1) * D].double().view(N, HEADS, HD).transpose(0, 1) for i in range(3))
    p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(HD), -1)
    return (p @ v).transpose(0, 1).reshape(N, D).float()


def main():
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(2212)
    qkv, wq, wk = inputs(g)
    qc, kc, vc, scales = operands(qkv, wq, wk)
    out, ex = attention(qc, kc, vc, scales), exact(qkv)
    u8 = lambda c: c.view(torch.uint8).contiguous()
    tensors = {"qkv": qkv.to(torch.bfloat16), "wq": wq, "wk": wk, "q.codes": u8(qc), "k.codes": u8(kc), "v.codes": u8(vc), "scales": scales,
               "out": out, "exact": ex}
    err = ((out - ex).norm() / ex.norm()).item()
    meta = {"tokens": N, "heads": HEADS, "head_dim": HD, "tile": TILE, "e4m3_vs_exact_rel_l2": err,
            "torch": torch.__version__}
    save_file(tensors, os.path.join(make_golden.EXPECTED, "attention_fp8.safetensors"))
    with open(os.path.join(make_golden.EXPECTED, "attention_fp8.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"attention_fp8: e4m3 against exact rel L2 {err:.3e}")


if __name__ == "__main__":
    main()
