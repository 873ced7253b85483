"""CPU emulation of cuda/vae_attn.cu's `moss_vae_flash2_d384` (MOSS_VAE_ATTN=flash2): the prep
split (hi = tf32(x), lo = tf32(x - hi), round to nearest away, as cvt.rna.tf32), the flat shared
memory with the kernel's row strides (Q 388, K hi/lo 388, V hi/lo 392, S partials 20 at D = 384;
D + 4 / D + 8 here), the fragment index expressions, the D-half partial scores and their
exchange, masking of keys past L, online softmax with the warp-uniform rescale skip, the three
tf32 products per mma (lo*hi, hi*lo, hi*hi) and the output stores, against a float64 softmax
attention. Small D and L (the layout code needs D % 16 == 0 only). Products are exact (float64),
so the error left is the split's (~1e-6 relative) and any index bug shows as far more.
`EXACT=1` (hi = x, lo = 0, float64 everywhere) checks the index math alone (bound 1e-12).
`python3 bench/vae_flash2_emu.py` prints the max abs error per case; planted bugs (BUG=1: the
second D-half partial dropped, as moss_ctl_vae_flash2_d384; BUG=2: K lo read from K hi; BUG=3: V
fragment rows t and t + 4 swapped) must give large ones."""
import os
import numpy as np

BUG = int(os.environ.get("BUG", "0"))
EXACT = os.environ.get("EXACT") == "1"  # hi = x, lo = 0, float64 throughout: index math only
LANE = np.arange(32)
G, T = LANE >> 2, LANE & 3


def tf32(x):
    """cvt.rna.tf32.f32 on float32 values (finite): round the 13 low mantissa bits, ties away."""
    if EXACT:
        return np.asarray(x, dtype=float)
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return b.view(np.float32)


def mma(a, b, c):
    """a[32][4], b[32][2], c[32][4] in the m16n8k8 fragment layouts -> d (float64, exact products)."""
    A = np.zeros((16, 8)); B = np.zeros((8, 8))
    A[G, T], A[G + 8, T], A[G, T + 4], A[G + 8, T + 4] = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    B[T, G], B[T + 4, G] = b[:, 0], b[:, 1]
    C = A @ B
    return c + np.stack([C[G, 2 * T], C[G, 2 * T + 1], C[G + 8, 2 * T], C[G + 8, 2 * T + 1]], 1)


def mma3(ah, al, bh, bl, c):
    return mma(ah.astype(float), bh, mma(ah.astype(float), bl, mma(al.astype(float), bh, c)))


def flash2(q, k, v, D):
    L = q.shape[0]
    BQ, BK, HALF = 64, 16, D // 2
    NT = HALF // 8
    QST, KST, VST, SST = D + 4, D + 4, D + 8, BK + 4
    kh, vh = tf32(k), tf32(v)
    kl, vl = tf32(k - kh), tf32(v - vh)  # float32 arithmetic, as the prep kernel
    out = np.full((L, D), np.nan)
    scale = 1 / np.sqrt(D) if EXACT else np.float32(1 / np.sqrt(D))

    def load_rows(s, st, x, r0, rows):
        s[:] = 0
        for r in range(rows):
            if r0 + r < L:
                s[r * st:r * st + D] = x[r0 + r]

    for q0 in range(0, L, BQ):
        fd = float if EXACT else np.float32
        Qs = np.zeros(BQ * QST, fd); load_rows(Qs, QST, q, q0, BQ)
        Kh = np.zeros(BK * KST, fd); Kl = np.zeros(BK * KST, fd)
        Vh = np.zeros(BK * VST, fd); Vl = np.zeros(BK * VST, fd)
        Ss = np.zeros(2 * BQ * SST)
        o = np.zeros((8, 32, NT, 4)); m = np.full((8, 32, 2), -np.inf); l = np.zeros((8, 32, 2))
        for j in range((L + BK - 1) // BK):
            load_rows(Kh, KST, kh, j * BK, BK); load_rows(Kl, KST, kh if BUG == 2 else kl, j * BK, BK)
            load_rows(Vh, VST, vh, j * BK, BK); load_rows(Vl, VST, vl, j * BK, BK)
            for warp in range(8):  # partial S over half of D
                rg, hf = warp & 3, warp >> 2
                Qw = 16 * rg * QST + HALF * hf
                s = np.zeros((2, 32, 4))
                for kk in range(HALF // 8):
                    qa = Qw + G * QST + 8 * kk + T
                    x = np.stack([Qs[qa], Qs[qa + 8 * QST], Qs[qa + 4], Qs[qa + 8 * QST + 4]], 1)
                    ah = tf32(x); al = tf32(x - ah)
                    for nt in range(2):
                        kb = (8 * nt + G) * KST + HALF * hf + 8 * kk + T
                        bh = np.stack([Kh[kb], Kh[kb + 4]], 1).astype(float)
                        bl = np.stack([Kl[kb], Kl[kb + 4]], 1).astype(float)
                        s[nt] += mma3(ah, al, bh, bl, np.zeros((32, 4)))
                Sw = hf * BQ * SST
                for nt in range(2):
                    col = 8 * nt + 2 * T
                    Ss[Sw + (16 * rg + G) * SST + col] = s[nt][:, 0]; Ss[Sw + (16 * rg + G) * SST + col + 1] = s[nt][:, 1]
                    Ss[Sw + (16 * rg + G + 8) * SST + col] = s[nt][:, 2]; Ss[Sw + (16 * rg + G + 8) * SST + col + 1] = s[nt][:, 3]
            for warp in range(8):  # softmax and P V
                rg, hf = warp & 3, warp >> 2
                p = np.zeros((2, 32, 4))
                for kk in range(2):
                    o0 = (16 * rg + G) * SST + 8 * kk + T
                    offs = [o0, o0 + 8 * SST, o0 + 4, o0 + 8 * SST + 4]
                    for c in range(4):
                        key = j * BK + 8 * kk + T + 4 * (c >> 1)
                        x = Ss[offs[c]] if BUG == 1 else Ss[offs[c]] + Ss[BQ * SST + offs[c]]
                        p[kk][:, c] = np.where(key < L, x * scale, -np.inf)
                mx = np.stack([np.maximum(m[warp, :, 0], p[:, :, [0, 2]].max((0, 2))),
                               np.maximum(m[warp, :, 1], p[:, :, [1, 3]].max((0, 2)))], 1)
                mx = mx.reshape(8, 4, 2).max(1).repeat(4, 0)  # quad reduction
                p = np.exp(p - mx[None, :, [0, 1, 0, 1]])
                tot = np.stack([p[:, :, [0, 2]].sum((0, 2)), p[:, :, [1, 3]].sum((0, 2))], 1)
                tot = tot.reshape(8, 4, 2).sum(1).repeat(4, 0)
                alpha = np.exp(m[warp] - mx)
                l[warp] = l[warp] * alpha + tot; m[warp] = mx
                if np.any(alpha != 1):
                    o[warp, :, :, 0:2] *= alpha[:, None, 0:1]; o[warp, :, :, 2:4] *= alpha[:, None, 1:2]
                p32 = p if EXACT else p.astype(np.float32)
                ph = tf32(p32); pl = tf32(p32 - ph)
                for nt in range(NT):
                    vb = T * VST + HALF * hf + 8 * nt + G
                    part = np.zeros((32, 4))
                    for kk in range(2):
                        r0, r4 = (8 * kk + 4, 8 * kk) if BUG == 3 else (8 * kk, 8 * kk + 4)
                        bh = np.stack([Vh[vb + r0 * VST], Vh[vb + r4 * VST]], 1).astype(float)
                        bl = np.stack([Vl[vb + r0 * VST], Vl[vb + r4 * VST]], 1).astype(float)
                        part = mma3(ph[kk], pl[kk], bh, bl, part)
                    o[warp, :, nt] += part
        for warp in range(8):
            rg, hf = warp & 3, warp >> 2
            for r in range(2):
                row = q0 + 16 * rg + G + 8 * r
                for nt in range(NT):
                    c0 = HALF * hf + 8 * nt + 2 * T
                    ok = row < L
                    out[row[ok], c0[ok]] = o[warp, ok, nt, 2 * r] / l[warp, ok, r]
                    out[row[ok], c0[ok] + 1] = o[warp, ok, nt, 2 * r + 1] / l[warp, ok, r]
    return out


def ref(q, k, v):
    q, k, v = (x.astype(float) for x in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[1])
    s -= s.max(1, keepdims=True)
    p = np.exp(s); p /= p.sum(1, keepdims=True)
    return p @ v


rng = np.random.default_rng(0)
worst = 0.0
for L, D in ((100, 32), (64, 16), (77, 48), (130, 64)):
    q, k, v = ((rng.standard_normal((L, D)) * s).astype(np.float32) for s in (1.5, 1.5, 1.0))
    if EXACT:
        q, k, v = (x.astype(float) for x in (q, k, v))
    got = flash2(q, k, v, D)
    e = np.abs(got - ref(q, k, v)).max() if np.isfinite(got).all() else np.inf
    worst = max(worst, e)
    print(f"L {L} D {D}: max abs error {e:.3e}")
bound = 1e-12 if EXACT else 2e-5
print(f"BUG={BUG} EXACT={int(EXACT)} worst {worst:.3e}", "PASS" if worst < bound else f"FAIL (> {bound:g})")
