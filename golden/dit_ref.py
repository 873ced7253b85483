"""Reference torch implementation of the MOSS-Image DiT, scheduler and sampling loop.

Written from docs/spec `moss-image.md` sections 4 (MOSSImageTransformer), 5.2 (sigmas), 5.3 (CFG + Euler),
6 (noise) and 7.2 (latent -> VAE input). It is the project's own reference, used by `make_golden.py`
(fp32, CPU) and, later, for a full-size bf16 comparison on a GPU.

Precision model (`dtype` = activation dtype = weight dtype):
  * linear layers, residual stream, modulation arithmetic, gates, RoPE rotation and attention run in `dtype`;
  * RMSNorm reduces in fp32, casts to `dtype`, then multiplies by the plain weight in `dtype`;
  * SiTU-GLU is computed in fp32 and rounded once to `dtype`;
  * the timestep sinusoid is float64 -> fp32 -> `dtype`; RoPE angles are fp32, cos/sin cast to `dtype`;
  * the returned velocity is fp32.
With dtype=float32 everything is plain fp32.

Tensor names follow spec 4.2 exactly, so `state_dict()` of `MOSSImageTransformer` is the checkpoint layout
(plus the `rope.bands` bf16 buffer, which is stored but never used: bands are recomputed in fp32).
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
HEAD_DIM = 128
ROPE_AXES = 4
ROPE_BANDS = 16
TIME_SCALE = 1000.0


# ----------------------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """y = (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(dtype) * w   (plain weight, not 1+w)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
        return y.to(x.dtype) * self.weight


def situ(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """SiTU-GLU: (4 tanh(g/4) sigmoid(g)) * (25 tanh(h/25)), fp32, rounded once."""
    hf, gf = h.float(), g.float()
    return (4.0 * torch.tanh(gf / 4.0) * torch.sigmoid(gf) * (25.0 * torch.tanh(hf / 25.0))).to(h.dtype)


def timestep_sinusoid(t: float, freq_dim: int) -> torch.Tensor:
    """[cos | sin] of t * 10000^(-k/half), k = 0..half-1, in float64; returned as fp32 [freq_dim]."""
    half = freq_dim // 2
    t64 = torch.tensor(float(torch.tensor(t, dtype=torch.float32)), dtype=torch.float64)  # fp32 t promoted
    k = torch.arange(half, dtype=torch.float64)
    freqs = torch.pow(torch.tensor(10000.0, dtype=torch.float64), -k / half)
    ang = t64 * freqs
    return torch.cat([torch.cos(ang), torch.sin(ang)]).float()


def rope_bands(base: float = 10000.0) -> torch.Tensor:
    """bands_j = 1 / base^(j/16), j = 0..15, fp32."""
    return 1.0 / (base ** (torch.arange(ROPE_BANDS, dtype=torch.float32) / ROPE_BANDS))


def joint_positions(h: int, w: int, text_len: int) -> torch.Tensor:
    """[h*w + L, 4] fp32 positions (r, t, y, x): image tokens first (row-major), then text tokens.

    image (y, x): (0, L, y - (h-1)/2, x - (w-1)/2);  text i: (0, i, 0, 0).
    """
    ys = torch.arange(h, dtype=torch.float32) - (h - 1) / 2.0
    xs = torch.arange(w, dtype=torch.float32) - (w - 1) / 2.0
    img = torch.zeros(h * w, 4)
    img[:, 1] = float(text_len)
    img[:, 2] = ys.repeat_interleave(w)
    img[:, 3] = xs.repeat(h)
    txt = torch.zeros(text_len, 4)
    txt[:, 1] = torch.arange(text_len, dtype=torch.float32)
    return torch.cat([img, txt])


def text_positions(text_len: int) -> torch.Tensor:
    txt = torch.zeros(text_len, 4)
    txt[:, 1] = torch.arange(text_len, dtype=torch.float32)
    return txt


def rope_tables(pos: torch.Tensor, base: float, dtype: torch.dtype):
    """cos/sin [N, 128]: theta[16a+j] = p_a * bands_j (fp32), duplicated cat(theta, theta), cast to dtype."""
    bands = rope_bands(base).to(pos.device)
    theta = (pos[:, :, None] * bands[None, None, :]).reshape(pos.shape[0], ROPE_AXES * ROPE_BANDS)
    theta = torch.cat([theta, theta], dim=-1)
    return theta.cos().to(dtype), theta.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, N, 128]; pairs (m, m+64): x'[m] = x[m]cos - x[m+64]sin, x'[m+64] = x[m+64]cos + x[m]sin."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str) -> torch.Tensor:
    """q, k, v [heads, N, 128] -> [N, heads*128]; bidirectional, scale 128^-0.5, no mask."""
    scale = HEAD_DIM ** -0.5
    if impl == "sdpa":
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale)[0]
    else:  # "math": explicit softmax in the activation dtype's accumulation (fp32 for golden data)
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        o = (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype)
    return o.transpose(0, 1).reshape(q.shape[1], -1)


def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """[N, n*128] -> [n, N, 128]"""
    return x.view(x.shape[0], n, HEAD_DIM).transpose(0, 1)


# ----------------------------------------------------------------------------------------------------------
# modules (attribute names = checkpoint tensor names)
# ----------------------------------------------------------------------------------------------------------
class RefinerBlock(nn.Module):
    """Unmodulated text-refiner block, biased linears, attention over text tokens only."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q_norm, self.k_norm = RMSNorm(HEAD_DIM), RMSNorm(HEAD_DIM)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ffn_gate = nn.Linear(dim, ffn_dim)
        self.ffn_up = nn.Linear(dim, ffn_dim)
        self.ffn_down = nn.Linear(ffn_dim, dim)

    def forward(self, x, cos, sin, n_heads, impl):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = apply_rope(self.q_norm(heads(q, n_heads)), cos, sin)
        k = apply_rope(self.k_norm(heads(k, n_heads)), cos, sin)
        x = x + self.proj(attention(q, k, heads(v, n_heads), impl))
        y = self.norm2(x)
        return x + self.ffn_down(situ(self.ffn_up(y), self.ffn_gate(y)))


class TextEmbedder(nn.Module):
    def __init__(self, text_dim: int, dim: int, ffn_dim: int, n_blocks: int = 2):
        super().__init__()
        self.proj = nn.Linear(text_dim, dim)
        self.blocks = nn.ModuleList([RefinerBlock(dim, ffn_dim) for _ in range(n_blocks)])


class BlockProj(nn.Module):
    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.ffn_up_gate = nn.Linear(dim, 2 * ffn_dim, bias=False)  # rows [up ; gate]
        self.ffn_down = nn.Linear(ffn_dim, dim, bias=False)


class Block(nn.Module):
    """Main single-stream block with the shared adaLN modulation; no biases; raw gates."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q_norm, self.k_norm = RMSNorm(HEAD_DIM), RMSNorm(HEAD_DIM)
        self.proj = BlockProj(dim, ffn_dim)

    def forward(self, x, mod, cos, sin, n_heads, impl):
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mod
        p = self.proj
        y = self.norm1(x) * (1 + scale_a) + shift_a
        q = apply_rope(self.q_norm(heads(p.q(y), n_heads)), cos, sin)
        k = apply_rope(self.k_norm(heads(p.k(y), n_heads)), cos, sin)
        x = x + p.o(attention(q, k, heads(p.v(y), n_heads), impl)) * gate_a
        y = self.norm2(x) * (1 + scale_f) + shift_f
        hid, gate = p.ffn_up_gate(y).chunk(2, dim=-1)
        return x + p.ffn_down(situ(hid, gate)) * gate_f


class Rope(nn.Module):
    def __init__(self, base: float):
        super().__init__()
        self.register_buffer("bands", rope_bands(base).to(torch.bfloat16))  # stored, unused


class MOSSImageTransformer(nn.Module):
    def __init__(self, dim=3072, ffn_dim=8192, num_heads=24, num_layers=42, text_dim=4096, freq_dim=256,
                 latent_channels=128, rope_base=10000.0, **_ignored):
        super().__init__()
        assert dim == num_heads * HEAD_DIM
        self.cfg = dict(dim=dim, ffn_dim=ffn_dim, num_heads=num_heads, num_layers=num_layers, text_dim=text_dim,
                        freq_dim=freq_dim, latent_channels=latent_channels, rope_base=rope_base)
        self.num_heads, self.freq_dim, self.rope_base = num_heads, freq_dim, float(rope_base)
        self.video_embedder = nn.Linear(latent_channels, dim)
        self.text_embedder = TextEmbedder(text_dim, dim, ffn_dim)
        self.rope = Rope(self.rope_base)
        self.time_embedding = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.shared_block_modulation = nn.Linear(dim, 6 * dim)
        self.layers = nn.ModuleList([Block(dim, ffn_dim) for _ in range(num_layers)])
        self.final_norm_video = RMSNorm(dim)
        self.final_linear_video = nn.Linear(dim, latent_channels, bias=False)
        self.video_head_modulation = nn.Linear(dim, 2 * dim)

    @property
    def dtype(self):
        return self.video_embedder.weight.dtype

    # -- pieces that depend only on t / only on the prompt (cacheable) --
    def time_vector(self, t: float) -> torch.Tensor:
        dev = self.video_embedder.weight.device
        e = timestep_sinusoid(t, self.freq_dim).to(dev).to(self.dtype)
        return self.time_embedding(e)  # Linear -> SiLU -> Linear; no activation before the modulations

    def refine_text(self, ctx: torch.Tensor, impl: str = "sdpa") -> torch.Tensor:
        """ctx [L, text_dim] -> [L, dim]"""
        txt = self.text_embedder.proj(ctx.to(self.dtype))
        cos, sin = rope_tables(text_positions(txt.shape[0]).to(txt.device), self.rope_base, self.dtype)
        for blk in self.text_embedder.blocks:
            txt = blk(txt, cos, sin, self.num_heads, impl)
        return txt

    def forward(self, x: torch.Tensor, t: float, ctx: torch.Tensor, skip_layers=(), impl: str = "sdpa",
                trace: dict | None = None) -> torch.Tensor:
        """x [1, C, h, w] fp32 latent, t = sigma*1000, ctx [L, text_dim] (or [1, L, text_dim]).
        Returns the velocity [1, C, h, w] fp32. `trace`, if a dict, receives intermediates."""
        if ctx.dim() == 3:
            ctx = ctx[0]
        _, c, h, w = x.shape
        dt = self.dtype
        img = self.video_embedder(x.reshape(c, h * w).T.to(dt))
        txt = self.refine_text(ctx, impl)
        L = txt.shape[0]
        time = self.time_vector(t)
        mod = self.shared_block_modulation(time).view(6, -1)  # shift_a, scale_a, gate_a, shift_f, scale_f, gate_f
        head = self.video_head_modulation(time).view(2, -1)   # shift, scale
        cos, sin = rope_tables(joint_positions(h, w, L).to(x.device), self.rope_base, dt)
        X = torch.cat([img, txt])
        skip = set(int(i) for i in skip_layers)
        for i, blk in enumerate(self.layers):
            if i not in skip:
                X = blk(X, mod, cos, sin, self.num_heads, impl)
        Z = self.final_norm_video(X[: h * w]) * (1 + head[1]) + head[0]
        out = self.final_linear_video(Z).float().T.reshape(1, c, h, w)
        if trace is not None:
            trace.update(time=time.float(), mod=mod.float(), head_mod=head.float(), refiner=txt.float(),
                         rope_cos=cos.float(), rope_sin=sin.float())
        return out


# ----------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------
def load_state_dict(folder: str, stem: str = "diffusion_pytorch_model") -> dict:
    from safetensors.torch import load_file

    index = os.path.join(folder, stem + ".safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = [stem + ".safetensors"]
    sd = {}
    for fn in files:
        sd.update(load_file(os.path.join(folder, fn)))
    return sd


def load_transformer(folder: str, dtype=torch.float32, device="cpu") -> MOSSImageTransformer:
    """Build from `transformer/config.json` and load the bf16 weights by name, cast to `dtype`."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    with torch.device("meta"):
        model = MOSSImageTransformer(**cfg)
    sd = load_state_dict(folder)
    model.load_state_dict(sd, strict=True, assign=True)
    model.rope.bands = model.rope.bands.to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    bands = model.rope.bands
    model = model.to(device=device, dtype=dtype)
    model.rope.bands = bands.to(device)  # keep the stored buffer as stored (bf16)
    return model.eval()


# ----------------------------------------------------------------------------------------------------------
# scheduler (spec 5.2) and loop (spec 5.3)
# ----------------------------------------------------------------------------------------------------------
def _grid(n: int, s: float, T: int) -> torch.Tensor:
    v = torch.linspace(1.0, s / (T + s - 1), n, dtype=torch.float32)
    return s * v / (1 + (s - 1) * v)


def sigmas_for(steps: int, shift: float = 5.0, training_shift: float = 1.0, T: int = 1000) -> torch.Tensor:
    """fp32 [n+1]: shift-`shift` proposal snapped to the 1000-point training grid, terminal 0 appended."""
    proposed = _grid(steps, shift, T)
    training = _grid(T, training_shift, T).flip(0).contiguous()  # ascending
    upper = torch.searchsorted(training, proposed, right=False).clamp(max=T - 1)
    lower = (upper - 1).clamp(min=0)
    d_lo = (proposed - training[lower]).abs()
    d_up = (training[upper] - proposed).abs()
    snapped = torch.where(d_lo <= d_up, training[lower], training[upper])
    snapped = torch.unique_consecutive(snapped)
    return torch.cat([snapped, torch.zeros(1, dtype=torch.float32)])


def sample(model: MOSSImageTransformer, noise: torch.Tensor, pos_ctx: torch.Tensor, neg_ctx: torch.Tensor | None,
           steps: int, guidance: float = 3.0, shift: float = 5.0, uncond_skip=(22,), slg_start: float = 0.0,
           slg_stop: float = 1.0, impl: str = "sdpa", callback=None) -> torch.Tensor:
    """CFG + Euler flow matching. `noise` fp32 [1, C, h, w]. Returns fp32 latents.
    callback(i, x) is called after each step with the updated latents."""
    sig = sigmas_for(steps, shift)
    n = sig.shape[0] - 1
    x = noise.float().clone()
    for i in range(n):
        t = float(sig[i] * TIME_SCALE)  # fp32 multiply, as the reference
        skip_active = slg_start <= i / n < slg_stop
        v = model(x, t, pos_ctx, impl=impl).float()
        if guidance != 1.0:
            v_u = model(x, t, neg_ctx, skip_layers=uncond_skip if skip_active else (), impl=impl).float()
            v = v_u + guidance * (v - v_u)
        x = x + (sig[i + 1] - sig[i]) * v
        if callback is not None:
            callback(i, x)
    return x


# ----------------------------------------------------------------------------------------------------------
# pipeline glue around the diffusers VAE (spec 7.2)
# ----------------------------------------------------------------------------------------------------------
def latents_to_vae_input(vae, z: torch.Tensor) -> torch.Tensor:
    """Undo the BatchNorm (z*sqrt(var+eps)+mean) and unpatchify [1,128,h,w] -> [1,32,2h,2w]."""
    bn = vae.bn
    z = z.float() * torch.sqrt(bn.running_var.float() + bn.eps).view(1, -1, 1, 1) + bn.running_mean.float().view(1, -1, 1, 1)
    b, c, h, w = z.shape
    return z.view(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, 2 * h, 2 * w)


@torch.no_grad()
def decode(vae, z: torch.Tensor):
    """-> (picture fp32 [3, H, W] clamped to [-1, 1], pixels uint8 [H, W, 3], round half to even)."""
    img = vae.decode(latents_to_vae_input(vae, z)).sample[0].float().clamp(-1.0, 1.0)
    px = ((img / 2 + 0.5).clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return img, px
