"""CPU emulation of cuda/vae/attention_fp16.cu (its MODE 0 | 1 | 2; 1 has no kernel now, 2 is moss_ctl3), D = 384, small L:
moss_vae_f16_maxabs + moss_vae_f16_prep's index math (power-of-two scales, fp16 hi/lo, rows past L
zero, [3][N][Lq][hi D | lo D]), the shared-memory rows of 776 halves, every ldmatrix (x4 and
x4.trans: each lane's row address, the 8x8 matrices, the fragment each lane gets; every 8-address
phase checked for bank-group conflicts), mma.sync m16n8k16 in its fragment layouts (exact products,
the sum rounded to fp32: the tensor cores' truncation is not modelled), the partial-score exchange
between warps w and w ^ 4, masking, online softmax, P·2^15 split into hi/lo A fragments straight
from the S accumulators, P V per n8 tile and the output stores with the scales undone; against a
float64 softmax attention.
`EXACT=1` (no fp16/fp32 rounding: hi = x, lo = 0, float64 everywhere) checks the index math alone.
`BUG=1` (V's scale not undone, = moss_ctl_vae_attn16_d384), `BUG=2` (small terms of S dropped,
= moss_ctl2), `BUG=3` (the exchange reads its own partial) must fail.
`python3 tools/vae_attn16_emu.py` prints the max abs error per case (bound 2e-5 relative L2)."""
import os
import sys

import numpy as np

BUG = int(os.environ.get("BUG", "0"))
EXACT = os.environ.get("EXACT") == "1"
D, BQ, BK, HALF, NT, RS, PEXP = 384, 64, 32, 192, 24, 776, 15
LANE = np.arange(32)
G, T = LANE >> 2, LANE & 3


def f16(x):
    return np.asarray(x, dtype=float) if EXACT else np.asarray(x, dtype=np.float32).astype(np.float16).astype(float)


def f32(x):
    return np.asarray(x, dtype=float) if EXACT else np.asarray(x, dtype=np.float32).astype(float)


def scale_exp(mx):
    if not (mx > 0) or np.isinf(mx):
        return 0
    _, e = np.frexp(np.float32(mx))
    return int(min(max(14 - e, -60), 60))


def ldsm(sm, addr, trans=False):
    """ldmatrix x4: addr[32] half indices (lane 8i + r: row r of matrix i) -> regs [32][4][2]."""
    assert np.all(addr % 8 == 0)
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        a = addr[8 * i:8 * i + 8]
        seg = (a * 2 // 16) % 8
        assert len(set(seg.tolist())) == 8, f"bank conflict {seg}"
        M = np.stack([sm[s:s + 8] for s in a])  # [8 rows][8 cols]
        if trans:
            regs[:, i, 0], regs[:, i, 1] = M[2 * T, G], M[2 * T + 1, G]
        else:
            regs[:, i, 0], regs[:, i, 1] = M[G, 2 * T], M[G, 2 * T + 1]
    return regs


def mma16(c, a, b0, b1):
    """c[32][4] += A B: a[32][4][2] (m16n8k16 A fragments), b0, b1 [32][2] -> fp32-rounded sum."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for e in range(2):
        A[G, 2 * T + e], A[G + 8, 2 * T + e], A[G, 2 * T + 8 + e], A[G + 8, 2 * T + 8 + e] = a[:, 0, e], a[:, 1, e], a[:, 2, e], a[:, 3, e]
        B[2 * T + e, G], B[2 * T + 8 + e, G] = b0[:, e], b1[:, e]
    C = A @ B
    return f32(c + np.stack([C[G, 2 * T], C[G, 2 * T + 1], C[G + 8, 2 * T], C[G + 8, 2 * T + 1]], 1))


def prep(x3, L, Lq, N):
    """moss_vae_f16_maxabs + moss_vae_f16_prep: x3 = (q, k, v) [N][L][D] -> flat [3][N][Lq][2D], exps."""
    dst = np.zeros(3 * N * Lq * 2 * D)
    exps = []
    total = N * Lq * D // 4
    for y, x in enumerate(x3):
        s = scale_exp(float(np.max(np.abs(x))))
        exps.append(s)
        i = np.arange(total)
        c4, rr = i % (D // 4), i // (D // 4)
        r, img = rr % Lq, rr // Lq
        ok = r < L
        for e in range(4):
            val = np.where(ok, x[img, np.where(ok, r, 0), 4 * c4 + e], 0.0)
            yv = f32(val * 2.0 ** s)
            hi = f16(yv)
            lo = f16(f32(yv - hi)) if not EXACT else np.zeros_like(yv)
            o = y * (N * Lq * 2 * D) + rr * 2 * D + 4 * c4 + e
            dst[o], dst[o + D] = hi, lo
    return dst, exps


def attn(qkv, exps, L, Lq, N, img, mode):
    sq, sk, sv = exps
    scale = (1 / np.sqrt(D) if EXACT else f32(np.float32(1 / np.sqrt(D)))) * 2.0 ** (-(sq + sk))
    plane = N * Lq * 2 * D
    qb = img * Lq * 2 * D
    out = np.full((L, D), np.nan)
    nk = (L + BK - 1) // BK
    for blk in range(Lq // BQ):
        q0 = blk * BQ
        Qs = np.zeros(BQ * RS)
        for r in range(BQ):
            Qs[r * RS:r * RS + 2 * D] = qkv[qb + (q0 + r) * 2 * D: qb + (q0 + r + 1) * 2 * D]
        st = {w: dict(o=np.zeros((NT, 32, 4)), m=np.full((32, 2), -np.inf), l=np.zeros((32, 2))) for w in range(8)}
        for j in range(nk):
            Ks = np.zeros(BK * RS); Vs = np.zeros(BK * RS)
            for r in range(BK):
                kr = qb + plane + (j * BK + r) * 2 * D
                Ks[r * RS:r * RS + 2 * D] = qkv[kr:kr + 2 * D]
                Vs[r * RS:r * RS + 2 * D] = qkv[kr + plane:kr + plane + 2 * D]
            parts = {}
            for w in range(8):
                rg, hf = w & 3, w >> 2
                qa = (16 * rg + (LANE & 15)) * RS + HALF * hf + 8 * (LANE >> 4)
                ka = (LANE & 7) * RS + HALF * hf + 8 * ((LANE >> 3) & 1) + D * (LANE >> 4)
                s = np.zeros((4, 32, 4)); sm = np.zeros((4, 32, 4))
                for kk in range(HALF // 16):
                    qh = ldsm(Qs, qa + 16 * kk); ql = ldsm(Qs, qa + 16 * kk + D)
                    for nt in range(4):
                        kb = ldsm(Ks, ka + 8 * nt * RS + 16 * kk)
                        part = np.zeros((32, 4))
                        if BUG != 2:
                            if mode == 1:
                                sm[nt] = mma16(sm[nt], ql, kb[:, 0], kb[:, 1]); sm[nt] = mma16(sm[nt], qh, kb[:, 2], kb[:, 3])
                            else:
                                part = mma16(part, ql, kb[:, 0], kb[:, 1]); part = mma16(part, qh, kb[:, 2], kb[:, 3])
                        part = mma16(part, qh, kb[:, 0], kb[:, 1])
                        s[nt] = f32(s[nt] + part)
                if mode == 1:
                    s = f32(s + sm)
                parts[w] = s
            for w in range(8):
                rg, hf = w & 3, w >> 2
                S = st[w]
                s = f32(parts[w] + parts[w if BUG == 3 else w ^ 4])
                key = j * BK + 8 * np.arange(4)[:, None, None] + 2 * T[None, :, None] + (np.arange(4) & 1)[None, None, :]
                s = np.where(key < L, f32(s * scale), -np.inf)
                rowsel = [0, 0, 1, 1]
                mx = S["m"].copy()
                for r in range(2):
                    cs = [c for c in range(4) if rowsel[c] == r]
                    tm = np.max(s[:, :, cs], axis=(0, 2))
                    mx[:, r] = np.maximum(mx[:, r], tm)
                for r in range(2):  # quad shuffles
                    mx[:, r] = np.maximum.reduce([mx[(LANE & ~3) + q, r] for q in range(4)])
                alpha = f32(np.exp(S["m"] - mx))
                S["o"][:, :, 0] *= alpha[:, 0]; S["o"][:, :, 1] *= alpha[:, 0]
                S["o"][:, :, 2] *= alpha[:, 1]; S["o"][:, :, 3] *= alpha[:, 1]
                S["o"] = f32(S["o"])
                p = f32(np.exp(s - mx[None, :, rowsel]))
                sm_ = np.stack([p[:, :, [0, 1]].sum(axis=(0, 2)), p[:, :, [2, 3]].sum(axis=(0, 2))], 1)
                sm_ = np.stack([sm_[(LANE & ~3) + q] for q in range(4)]).sum(0)
                S["l"] = S["l"] * alpha + sm_
                S["m"] = mx
                ph = np.zeros((2, 32, 4, 2)); pl = np.zeros((2, 32, 4, 2))
                for kk in range(2):
                    for i in range(4):
                        nt, c = 2 * kk + (i >> 1), 2 * (i & 1)
                        for e in range(2):
                            x = f32(p[nt, :, c + e] * 2.0 ** PEXP)
                            h = f16(x)
                            ph[kk, :, i, e] = h
                            pl[kk, :, i, e] = f16(f32(x - h)) if not EXACT else 0.0
                va = ((LANE & 7) + 8 * ((LANE >> 3) & 1)) * RS + HALF * hf + D * (LANE >> 4)
                for nt in range(NT):
                    acc = S["o"][nt] if mode == 2 else np.zeros((32, 4))
                    for kk in range(2):
                        vb = ldsm(Vs, va + 16 * kk * RS + 8 * nt, trans=True)
                        acc = mma16(acc, pl[kk], vb[:, 0], vb[:, 1])
                        acc = mma16(acc, ph[kk], vb[:, 2], vb[:, 3])
                        acc = mma16(acc, ph[kk], vb[:, 0], vb[:, 1])
                    S["o"][nt] = acc if mode == 2 else f32(S["o"][nt] + acc)
        for w in range(8):
            rg, hf = w & 3, w >> 2
            S = st[w]
            undo = -PEXP if BUG == 1 else -(sv + PEXP)
            inv = f32(f32(1.0 / S["l"]) * 2.0 ** undo)
            for r in range(2):
                row = q0 + 16 * rg + G + 8 * r
                for nt in range(NT):
                    for e in range(2):
                        col = HALF * hf + 8 * nt + 2 * T + e
                        ok = row < L
                        out[row[ok], col[ok]] = f32(S["o"][nt][ok, 2 * r + e] * inv[ok, r])
    return out


def main():
    rng = np.random.default_rng(1)
    worst = 0.0
    cases = [(100, 1, 0), (64, 1, 0), (130, 2, 0), (100, 1, 1), (100, 1, 2)]
    if len(sys.argv) > 1:
        cases = cases[:int(sys.argv[1])]
    for L, N, mode in cases:
        q = rng.normal(0, 1.5, (N, L, D)); k = rng.normal(0, 1.5, (N, L, D)); v = rng.normal(0, 1.0, (N, L, D))
        if not EXACT:
            q, k, v = (x.astype(np.float32).astype(float) for x in (q, k, v))
        Lq = (L + BQ - 1) // BQ * BQ
        qkv, exps = prep((q, k, v), L, Lq, N)
        for img in range(N):
            o = attn(qkv, exps, L, Lq, N, img, mode)
            s = q[img] @ k[img].T / np.sqrt(D)
            p = np.exp(s - s.max(1, keepdims=True))
            want = (p / p.sum(1, keepdims=True)) @ v[img]
            err = np.abs(o - want).max()
            rel = np.sqrt(np.sum((o - want) ** 2) / np.sum(want ** 2))
            if not np.isfinite(rel):
                rel = np.inf
            worst = max(worst, rel)
            print(f"L {L} N {N} img {img} mode {mode} exps {exps}: max abs {err:.3e}, rel L2 {rel:.3e}")
    bound = 1e-12 if EXACT else 2e-5
    print(f"worst rel L2 {worst:.3e} (bound {bound}): {'ok' if worst <= bound else 'FAIL'}")
    sys.exit(0 if worst <= bound else 1)


if __name__ == "__main__":
    main()
