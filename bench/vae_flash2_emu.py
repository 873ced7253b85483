"""CPU emulation of cuda/vae_attn.cu's `moss_vae_flash2_d384` (MOSS_VAE_ATTN=flash2), one image:
the prep kernels' index math (Qp: each group of 8 d stored as (t, t+4) pairs; Kp [Lp][2D] and
Vp [Lp/8][D][16]: each mma B fragment as (hi, hi, lo, lo), hi = tf32(x), lo = tf32(x - hi) with
round to nearest away as cvt.rna.tf32, zeros past L), the flat shared memory with the kernel's row
strides (Q D + 8, K 2D + 16, V tiles contiguous, S partials 20), the 64/128-bit fragment loads,
the D-half partial scores and their exchange, masking of keys past L, online softmax, the three
tf32 products per mma (lo*hi, hi*lo, hi*hi) and the output stores, against a float64 softmax
attention. Small D and L (the layout code needs D % 16 == 0 only; the kernel has D = 384).
Products are exact here (float64), so what is left is the split's error (~5e-7) and any index bug
shows as far more. `EXACT=1` (hi = x, lo = 0, float64 everywhere) checks the index math alone
(bound 1e-12). `python3 bench/vae_flash2_emu.py` prints the max abs error per case; planted bugs
(BUG=1: the second D-half partial dropped, as moss_ctl_vae_flash2_d384; BUG=2: K's lo written as
hi; BUG=3: V keys t and t + 4 swapped in the prep) must fail."""
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


def prep(q, k, v, D):
    """The three prep kernels' index math (moss_vae_flash2_prep_rows split 0 / 1, _prep_v), one
    image: thread i -> (row, dk, t) or (kb, t, c) exactly as in the kernels."""
    L = q.shape[0]
    Lp = (L + 15) // 16 * 16
    fd = float if EXACT else np.float32
    qp = np.zeros(L * D, fd); kp = np.zeros(Lp * 2 * D, fd); vp = np.zeros(Lp * 2 * D, fd)
    for x, dst, rows, split in ((q, qp, L, 0), (k, kp, Lp, 1)):
        i = np.arange(rows * D // 2)
        t, dk, r = i & 3, (i >> 2) % (D // 8), (i // (D // 2)) % rows
        ok = r < L
        rr = np.where(ok, r, 0)
        x0 = np.where(ok, x[rr, 8 * dk + t], 0).astype(fd); x1 = np.where(ok, x[rr, 8 * dk + t + 4], 0).astype(fd)
        if split:
            h0, h1 = tf32(x0), tf32(x1)
            o = r * (2 * D) + 16 * dk + 4 * t
            dst[o], dst[o + 1], dst[o + 2], dst[o + 3] = h0, h1, tf32(x0 - h0), tf32(x1 - h1)
            if BUG == 2:  # lo := hi
                dst[o + 2], dst[o + 3] = h0, h1
        else:
            o = r * D + 8 * dk + 2 * t
            dst[o], dst[o + 1] = x0, x1
    i = np.arange(Lp // 8 * 4 * D)
    c, t, kb = i % D, (i // D) & 3, (i // (4 * D)) % (Lp // 8)
    r0 = 8 * kb + t; r1 = r0 + 4
    x0 = np.where(r0 < L, v[np.minimum(r0, L - 1), c], 0).astype(fd)
    x1 = np.where(r1 < L, v[np.minimum(r1, L - 1), c], 0).astype(fd)
    h0, h1 = tf32(x0), tf32(x1)
    o = (kb * D + c) * 16 + 4 * t
    vp[o], vp[o + 1], vp[o + 2], vp[o + 3] = h0, h1, tf32(x0 - h0), tf32(x1 - h1)
    if BUG == 3:  # keys t and t + 4 swapped in V's fragments
        vp[o], vp[o + 1], vp[o + 2], vp[o + 3] = h1, h0, tf32(x1 - h1), tf32(x0 - h0)
    return qp, kp, vp, Lp


def flash2(q, k, v, D):
    L = q.shape[0]
    BQ, BK, HALF = 64, 16, D // 2
    NT = HALF // 8
    QST, KST, SST = D + 8, 2 * D + 16, BK + 4
    qp, kp, vp, Lp = prep(q, k, v, D)
    fd = float if EXACT else np.float32
    out = np.full((L, D), np.nan)
    scale = 1 / np.sqrt(D) if EXACT else np.float32(1 / np.sqrt(D))
    TILE = BK * 2 * D  # floats of one K or V tile

    def load_tile(dst, st, src, w):  # contiguous src rows of w floats to dst rows of stride st
        for r in range(len(src) // w):
            dst[r * st:r * st + w] = src[r * w:(r + 1) * w]

    for q0 in range(0, L, BQ):
        Qs = np.zeros(BQ * QST, fd)
        for r in range(BQ):  # load_rows(Qs, QST2, qp, q0, BQ, L)
            if q0 + r < L:
                Qs[r * QST:r * QST + D] = qp[(q0 + r) * D:(q0 + r + 1) * D]
        Ks = np.zeros(BK * KST, fd); Vs = np.zeros(2 * D * 16, fd)
        Ss = np.zeros(2 * BQ * SST)
        o = np.zeros((8, 32, NT, 4)); m = np.full((8, 32, 2), -np.inf); l = np.zeros((8, 32, 2))
        for j in range(Lp // BK):
            load_tile(Ks, KST, kp[j * TILE:(j + 1) * TILE], 2 * D)
            load_tile(Vs, TILE, vp[j * TILE:(j + 1) * TILE], TILE)
            for warp in range(8):  # partial S over half of D
                rg, hf = warp & 3, warp >> 2
                Qw = (16 * rg + G) * QST + HALF * hf + 2 * T
                Kw = G * KST + 2 * HALF * hf + 4 * T
                s = np.zeros((2, 32, 4))
                for kk in range(HALF // 8):
                    x02 = (Qs[Qw + 8 * kk], Qs[Qw + 8 * kk + 1])
                    x13 = (Qs[Qw + 8 * QST + 8 * kk], Qs[Qw + 8 * QST + 8 * kk + 1])
                    x = np.stack([x02[0], x13[0], x02[1], x13[1]], 1)
                    ah = tf32(x); al = tf32(x - ah)
                    for nt in range(2):
                        kb = Kw + 8 * nt * KST + 16 * kk
                        b = [Ks[kb + e].astype(float) for e in range(4)]
                        part = mma(al.astype(float), np.stack([b[0], b[1]], 1), np.zeros((32, 4)))
                        part = mma(ah.astype(float), np.stack([b[2], b[3]], 1), part)
                        part = mma(ah.astype(float), np.stack([b[0], b[1]], 1), part)
                        s[nt] += part
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
                o[warp, :, :, 0:2] *= alpha[:, None, 0:1]; o[warp, :, :, 2:4] *= alpha[:, None, 1:2]
                p32 = p if EXACT else p.astype(np.float32)
                ph = tf32(p32); pl = tf32(p32 - ph)
                Vw = (HALF * hf + G) * 16 + 4 * T
                for nt in range(NT):
                    part = np.zeros((32, 4))
                    for kk in range(2):
                        vb = Vw + (kk * D + 8 * nt) * 16
                        b = [Vs[vb + e].astype(float) for e in range(4)]
                        part = mma(pl[kk].astype(float), np.stack([b[0], b[1]], 1), part)
                        part = mma(ph[kk].astype(float), np.stack([b[2], b[3]], 1), part)
                        part = mma(ph[kk].astype(float), np.stack([b[0], b[1]], 1), part)
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
