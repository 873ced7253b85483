"""CPU emulation of cuda/vae/attention_tf32.cu's index math (fragment loads, mma m16n8k8 layouts, the
S exchange, online softmax, masking, output stores) in float64, against a direct softmax
attention. Small D and L (the kernel's D = 384 is a constant there; the layout code does not
depend on it beyond D % 16 == 0). `python3 tools/vae_flash_emu.py` prints the max error; a planted
layout bug (BUG=1 env: the P fragment's a1 and a2 swapped) must give a large one."""
import os
import numpy as np

BUG = int(os.environ.get("BUG", "0"))


def mma(a, b, c):
    """a[lane][4], b[lane][2], c[lane][4] in the m16n8k8 fragment layouts -> d."""
    A = np.zeros((16, 8)); B = np.zeros((8, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a[lane]
        B[t, g], B[t + 4, g] = b[lane]
    C = A @ B
    d = np.array(c, dtype=float).copy()
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        d[lane] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
    return d


def flash(q, k, v, D):
    L = q.shape[0]
    BQ, BK, HALF = 64, 32, D // 2
    NT = HALF // 8
    out = np.full((L, D), np.nan)
    scale = 1 / np.sqrt(D)
    for q0 in range(0, L, BQ):
        Qs = np.zeros((BQ, D)); n = min(BQ, L - q0); Qs[:n] = q[q0:q0 + n]
        o = np.zeros((8, 32, NT, 4)); m = np.full((8, 32, 2), -np.inf); l = np.zeros((8, 32, 2))
        for j in range((L + BK - 1) // BK):
            Ks = np.zeros((BK, D)); Vs = np.zeros((BK, D)); nk = min(BK, L - j * BK)
            Ks[:nk] = k[j * BK:j * BK + nk]; Vs[:nk] = v[j * BK:j * BK + nk]
            Ss = np.zeros((BQ, BK))
            for warp in range(8):
                rg, hf = warp & 3, warp >> 2
                s = np.zeros((2, 32, 4))
                for kk in range(D // 8):
                    a = [[Qs[16 * rg + (ln >> 2), 8 * kk + (ln & 3)], Qs[16 * rg + (ln >> 2) + 8, 8 * kk + (ln & 3)],
                          Qs[16 * rg + (ln >> 2), 8 * kk + (ln & 3) + 4], Qs[16 * rg + (ln >> 2) + 8, 8 * kk + (ln & 3) + 4]] for ln in range(32)]
                    for nt in range(2):
                        b = [[Ks[16 * hf + 8 * nt + (ln >> 2), 8 * kk + (ln & 3)], Ks[16 * hf + 8 * nt + (ln >> 2), 8 * kk + (ln & 3) + 4]] for ln in range(32)]
                        s[nt] = mma(a, b, s[nt])
                for ln in range(32):
                    g, t = ln >> 2, ln & 3
                    for nt in range(2):
                        col = 16 * hf + 8 * nt + 2 * t; key = j * BK + col
                        Ss[16 * rg + g, col] = s[nt][ln][0] * scale if key < L else -np.inf
                        Ss[16 * rg + g, col + 1] = s[nt][ln][1] * scale if key + 1 < L else -np.inf
                        Ss[16 * rg + g + 8, col] = s[nt][ln][2] * scale if key < L else -np.inf
                        Ss[16 * rg + g + 8, col + 1] = s[nt][ln][3] * scale if key + 1 < L else -np.inf
            for warp in range(8):
                rg, hf = warp & 3, warp >> 2
                p = np.zeros((32, 4, 4))
                for ln in range(32):
                    g, t = ln >> 2, ln & 3
                    for kk in range(4):
                        p[ln, kk] = [Ss[16 * rg + g, 8 * kk + t], Ss[16 * rg + g + 8, 8 * kk + t], Ss[16 * rg + g, 8 * kk + t + 4], Ss[16 * rg + g + 8, 8 * kk + t + 4]]
                mx = np.zeros((32, 2))
                for ln in range(32):
                    for r in range(2):
                        mx[ln, r] = max(m[warp, ln, r], p[ln, :, r].max(), p[ln, :, r + 2].max())
                for ln in range(32):  # quad reduction
                    for r in range(2):
                        mx[ln, r] = max(mx[(ln & ~3) + i, r] for i in range(4))
                sums = np.zeros((32, 2))
                for ln in range(32):
                    for kk in range(4):
                        for c in range(4):
                            p[ln, kk, c] = np.exp(p[ln, kk, c] - mx[ln, c & 1]); sums[ln, c & 1] += p[ln, kk, c]
                tot = np.array([[sums[(ln & ~3):(ln & ~3) + 4, r].sum() for r in range(2)] for ln in range(32)])
                alpha = np.exp(m[warp] - mx)
                l[warp] = l[warp] * alpha + tot; m[warp] = mx
                o[warp, :, :, 0:2] *= alpha[:, None, 0:1]; o[warp, :, :, 2:4] *= alpha[:, None, 1:2]
                for nt in range(NT):
                    for kk in range(4):
                        a = [p[ln, kk][[0, 2, 1, 3]] if BUG else p[ln, kk] for ln in range(32)]
                        b = [[Vs[8 * kk + (ln & 3), HALF * hf + 8 * nt + (ln >> 2)], Vs[8 * kk + (ln & 3) + 4, HALF * hf + 8 * nt + (ln >> 2)]] for ln in range(32)]
                        o[warp, :, nt] = mma(a, b, o[warp, :, nt])
        for warp in range(8):
            rg, hf = warp & 3, warp >> 2
            for ln in range(32):
                g, t = ln >> 2, ln & 3
                for r in range(2):
                    row = q0 + 16 * rg + g + 8 * r
                    if row >= L:
                        continue
                    for nt in range(NT):
                        c0 = HALF * hf + 8 * nt + 2 * t
                        out[row, c0] = o[warp, ln, nt, 2 * r] / l[warp, ln, r]
                        out[row, c0 + 1] = o[warp, ln, nt, 2 * r + 1] / l[warp, ln, r]
    return out


def ref(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    s -= s.max(1, keepdims=True)
    p = np.exp(s); p /= p.sum(1, keepdims=True)
    return p @ v


rng = np.random.default_rng(0)
for L, D in ((100, 32), (64, 16), (77, 48)):
    q, k, v = (rng.standard_normal((L, D)) * 1.5 for _ in range(3))
    e = np.abs(flash(q, k, v, D) - ref(q, k, v)).max()
    print(f"L {L} D {D}: max abs error {e:.3e}")
