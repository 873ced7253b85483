"""Thread-level emulation of cuda/vae/conv_tf32.cu's halo conv index math, no GPU needed.

Re-implements moss_vae_wprep_* (weight -> fragment order) and moss_vae_conv_halo_* (halo gather
per thread, shared-memory slots, A/B fragment loads per lane, the m16n8k8 fragment layouts, the
epilogue's pixel mapping, split-K over images) in exact float64 arithmetic (hi = w, lo = 0) and
compares with a direct convolution. It checks layouts and indices only: not TF32 rounding,
cp.async, timing. Expected: max err ~1e-14, nan 0.

    python3 tools/vae_conv_emu.py      # numpy; a few seconds
"""
import numpy as np
TH, TW, THREADS = 8, 16, 256
def halo_cs(hn):
    r = hn % 32
    return hn - r + (8 if r <= 8 else 24 if r <= 24 else 40)

def wprep(w, BM, KS, cout, cin):
    mblocks = -(-cout // BM); chunks = cin // 8
    total = mblocks * chunks * KS * KS * (BM // 16) * 2 * 128
    wf = np.zeros(total)
    wflat = w.reshape(-1)
    for idx in range(total):
        r = idx & 3; lane = (idx >> 2) & 31; hl = (idx >> 7) & 1
        q = idx >> 8
        mt = q % (BM // 16); q //= BM // 16
        tap = q % (KS * KS); q //= KS * KS
        ch = q % chunks; mb = q // chunks
        g, t = lane >> 2, lane & 3
        o = mb * BM + mt * 16 + g + 8 * (r & 1)
        i = ch * 8 + t + 4 * (r >> 1)
        v = wflat[(o * cin + i) * KS * KS + tap] if o < cout else 0.0
        wf[idx] = v if hl == 0 else 0.0   # lo = 0 in exact emulation
    return wf

def mma(a_fr, b_fr):  # a_fr[lane][4], b_fr[lane][2] -> d[lane][4]
    A = np.zeros((16, 8)); B = np.zeros((8, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4] = a_fr[lane]
        B[t][g], B[t + 4][g] = b_fr[lane]
    D = A @ B
    d = np.zeros((32, 4))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        d[lane] = [D[g][2 * t], D[g][2 * t + 1], D[g + 8][2 * t], D[g + 8][2 * t + 1]]
    return d

def conv_halo(x, wf, bias, n, cin, h, w, cout, up, BM, KS, wsplit=0):
    MT = BM // 32; HR, HC = TH + KS - 1, TW + KS - 1; HN = HR * HC; CS = halo_cs(HN)
    NB = (8 * HN + THREADS - 1) // THREADS; AST = KS * KS * BM * 16; PAD = KS // 2
    oh, ow = (2 * h, 2 * w) if up else (h, w)
    tiles_x, tiles_y = -(-ow // TW), -(-oh // TH); mblocks = -(-cout // BM)
    hw = h * w; chunks = cin // 8
    out = np.full(n * cout * oh * ow, np.nan)
    grid = n * tiles_y * tiles_x * mblocks
    xf = x.reshape(-1)
    for blk0 in range(grid):
        blk = blk0
        mb = blk % mblocks; blk //= mblocks
        tx0 = (blk % tiles_x) * TW; blk //= tiles_x
        ty0 = (blk % tiles_y) * TH; ni = blk // tiles_y
        nimg = grid // (mblocks * tiles_x * tiles_y)
        wb = ((mb * nimg + ni) * chunks if wsplit else mb * chunks) * AST
        xn = ni * cin * hw
        # per-thread halo slots
        src = np.full((THREADS, NB), -1); dst = np.full((THREADS, NB), -1)
        for tid in range(THREADS):
            for j in range(NB):
                e = tid + THREADS * j
                if e < 8 * HN:
                    c = e // HN; rem = e - c * HN; hy = rem // HC; hx = rem - hy * HC
                    dst[tid, j] = c * CS + hy * HC + hx
                    Y, X = ty0 + hy - PAD, tx0 + hx - PAD
                    if 0 <= Y < oh and 0 <= X < ow:
                        sy, sx = (Y >> 1, X >> 1) if up else (Y, X)
                        src[tid, j] = c * hw + sy * w + sx
        acc = np.zeros((8, MT, 4, 32, 4))
        for chunk in range(chunks):
            Bh = np.full(8 * CS, np.nan)
            for tid in range(THREADS):
                for j in range(NB):
                    if dst[tid, j] >= 0:
                        Bh[dst[tid, j]] = xf[xn + chunk * 8 * hw + src[tid, j]] if src[tid, j] >= 0 else 0.0
            A = wf[wb + chunk * AST: wb + (chunk + 1) * AST]
            for warp in range(8):
                wm, wn = warp >> 2, warp & 3
                for tap in range(KS * KS):
                    ky, kx = tap // KS, tap % KS
                    ah = [[A[((tap * (BM // 16) + wm * MT + mt) * 2) * 128 + lane * 4 + r] for r in range(4)] for mt in range(MT) for lane in range(32)]
                    ah = np.array(ah).reshape(MT, 32, 4)
                    bh = np.zeros((4, 32, 2))
                    for nt in range(4):
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            o = t * CS + (wn * 2 + (nt >> 1) + ky) * HC + 8 * (nt & 1) + kx + g
                            bh[nt, lane] = [Bh[o], Bh[o + 4 * CS]]
                    for mt in range(MT):
                        for nt in range(4):
                            acc[warp, mt, nt] += mma(ah[mt], bh[nt])
        P = oh * ow
        for warp in range(8):
            wm, wn = warp >> 2, warp & 3
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for mt in range(MT):
                    for hf in range(2):
                        o = mb * BM + wm * 16 * MT + mt * 16 + g + 8 * hf
                        if o >= cout: continue
                        bb = bias[o] if bias is not None else 0.0
                        for nt in range(4):
                            Y = ty0 + wn * 2 + (nt >> 1); X = tx0 + 8 * (nt & 1) + 2 * t
                            if Y >= oh: continue
                            for e in range(2):
                                if X + e < ow:
                                    out[ni * cout * P + o * P + Y * ow + X + e] = acc[warp, mt, nt, lane, 2 * hf + e] + bb
    return out.reshape(n, cout, oh, ow)

def ref_conv(x, wt, b, up):
    if up: x = x.repeat(2, axis=2).repeat(2, axis=3)
    n, cin, H, W = x.shape; cout, _, k, _ = wt.shape; p = k // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    out = np.zeros((n, cout, H, W))
    for ky in range(k):
        for kx in range(k):
            out += np.einsum('oi,nihw->nohw', wt[:, :, ky, kx], xp[:, :, ky:ky + H, kx:kx + W])
    return out + (b[None, :, None, None] if b is not None else 0)

rng = np.random.default_rng(0)
for (n, cin, cout, h, w, k, up, BM) in [(1, 16, 20, 9, 21, 3, 0, 96), (2, 8, 33, 5, 7, 3, 1, 128), (1, 16, 130, 8, 16, 1, 0, 128), (1, 8, 96, 11, 17, 3, 1, 96)]:
    x = rng.standard_normal((n, cin, h, w)); wt = rng.standard_normal((cout, cin, k, k)); b = rng.standard_normal(cout)
    wf = wprep(wt, BM, k, cout, cin)
    got = conv_halo(x, wf, b, n, cin, h, w, cout, up, BM, k)
    want = ref_conv(x, wt, b, up)
    print((n, cin, cout, h, w, k, up, BM), "max err", np.nanmax(np.abs(got - want)), "nan", np.isnan(got).sum(), flush=True)
# split-K as matmul_split does it: a [M, K] . b [K, N], ks images
M, K, N, ks = 40, 32, 48, 2
a = rng.standard_normal((M, K)); bm_ = rng.standard_normal((K, N))
wf = wprep(a.reshape(M, K, 1, 1), 128, 1, M, K)
x = bm_.reshape(ks, K // ks, N // 16, 16)
got = conv_halo(x, wf, None, ks, K // ks, N // 16, 16, M, 0, 128, 1, wsplit=1)
print("splitK max err", np.abs(got.sum(0).reshape(M, N) - a @ bm_).max())
