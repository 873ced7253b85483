"""CPU emulation of cuda/vae/conv_fp16.cu (the split-fp16 conv) per lane: the weight prep's fragment
order and scale, the halo planes, ldmatrix.x4 row addresses and fragments, the m16n8k16 fragment
layouts, the epilogue. fp16 rounding with numpy, products and sums in float64 (no tensor-core
truncation: this checks the index math, not the rounding). Compares with a direct float64 conv;
planted layout bugs must give large errors.  Run: python3 tools/vae_conv16_emu.py
"""
import numpy as np

TH, TW, THREADS = 8, 16, 256


def f16(v):
    return np.float64(np.float16(v))


def wprep(w, BM, KS, LS, bug=None):
    cout, cin = w.shape[0], w.shape[1]
    KK = KS * KS
    mblocks = -(-cout // BM)
    chunks = -(-cin // 16)
    wf = np.zeros((mblocks * chunks * KK * (BM // 16) * 2 * 128, 2))
    rs = np.zeros(mblocks * BM)
    wflat = w.reshape(cout, cin * KK)
    for o in range(mblocks * BM):
        m = np.abs(wflat[o]).max() if o < cout else 0.0
        if m > 0:
            e = np.frexp(m)[1]
            s = max(-100, min(100, 14 - int(e)))
        else:
            s = 0
        sc = 2.0 ** s
        rs[o] = 2.0 ** -s
        mb, r = o // BM, o % BM
        mt, rr = r // 16, r % 16
        g, rh = rr & 7, rr >> 3
        for idx in range(chunks * KK * 8):
            cp, q = idx & 7, idx >> 3
            tap, ch = q % KK, q // KK
            t, kh = cp & 3, cp >> 2
            lane, reg = g * 4 + t, rh + 2 * kh
            if bug == "reg":
                reg = kh + 2 * rh
            i0 = ch * 16 + 2 * cp
            v = [w[o, i, tap // KS, tap % KS] * sc if (o < cout and i < cin) else 0.0 for i in (i0, i0 + 1)]
            hi = [f16(x) for x in v]
            lo = [f16((x - h) * 2.0 ** LS) for x, h in zip(v, hi)]
            base = ((((mb * chunks + ch) * KK + tap) * (BM // 16) + mt) * 2)
            wf[base * 128 + lane * 4 + reg] = hi
            wf[(base + 1) * 128 + lane * 4 + reg] = lo
    return wf, rs


def conv16(x, wf, rs, bias, cout, KS, BM, up, VAR, bug=None):
    n, cin, h, w = x.shape
    LS = 11 if VAR == 1 else 0
    MT = BM // 32
    HR, HC = TH + KS - 1, TW + KS - 1
    HN = HR * HC
    PAD = KS // 2
    oh, ow = (2 * h, 2 * w) if up else (h, w)
    tiles_x, tiles_y = -(-ow // TW), -(-oh // TH)
    mblocks = -(-cout // BM)
    chunks = -(-cin // 16)
    KK = KS * KS
    out = np.zeros((n, cout, oh, ow))
    # weight stage of (mb, chunk): [tap][BM/16][hl][lane][4][2]
    W = wf.reshape(mblocks, chunks, KK, BM // 16, 2, 32, 4, 2)
    for blk in range(n * tiles_y * tiles_x * mblocks):
        mb = blk % mblocks
        b2 = blk // mblocks
        tx0 = (b2 % tiles_x) * TW
        b2 //= tiles_x
        ty0 = (b2 % tiles_y) * TH
        ni = b2 // tiles_y
        acc = np.zeros((8, MT, 4, 4))
        sm = np.zeros((8, MT, 4, 4))
        for chunk in range(chunks):
            # halo planes: [hl][chh][pix][8] (flat by bytes/2 = halves)
            planes = np.zeros((2, 2, HN, 8))
            for u in range(2 * HN):
                c, pix = u // HN, u % HN
                hy, hx = pix // HC, pix % HC
                Y, X = ty0 + hy - PAD, tx0 + hx - PAD
                for cc in range(8):
                    ch = chunk * 16 + c * 8 + cc
                    v = 0.0
                    if 0 <= Y < oh and 0 <= X < ow and ch < cin:
                        sy, sx = (Y >> 1, X >> 1) if up else (Y, X)
                        v = x[ni, ch, sy, sx]
                    hi = f16(v)
                    planes[0, c, pix, cc] = hi
                    planes[1, c, pix, cc] = f16((v - hi) * 2.0 ** LS)
            flat = planes.reshape(2, 2 * HN * 8)  # halves; plane PL = HN*8 halves
            PLh = HN * 8
            for warp in range(8):
                wm, wn = warp >> 2, warp & 3
                for tap in range(KK):
                    ky, kx = tap // KS, tap % KS
                    # A fragments -> matrices [MT][hl][16][16]
                    Am = np.zeros((MT, 2, 16, 16))
                    for mt in range(MT):
                        for hl in range(2):
                            fr = W[mb, chunk, tap, wm * MT + mt, hl]  # [32][4][2]
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                for reg in range(4):
                                    row = g + 8 * (reg & 1)
                                    col = 2 * t + 8 * (reg >> 1)
                                    Am[mt, hl, row, col:col + 2] = fr[lane, reg]
                    # B via ldmatrix.x4: [nt][hl][16 k][8 n]
                    Bm = np.zeros((4, 2, 16, 8))
                    for hl in range(2):
                        for pr in range(2):
                            rows = {}
                            for lane in range(32):
                                j4, r8 = lane >> 3, lane & 7
                                boff_h = (j4 & 1) * PLh + ((wn * 2) * HC + 8 * (j4 >> 1) + r8) * 8
                                if bug == "ldsm":
                                    boff_h = (j4 >> 1) * PLh + ((wn * 2) * HC + 8 * (j4 & 1) + r8) * 8
                                addr = boff_h + ((pr + ky) * HC + kx) * 8
                                rows[(j4, r8)] = flat[hl, addr:addr + 8]
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                r = [rows[(j, g)][2 * t:2 * t + 2] for j in range(4)]
                                # r0 -> b0 of nt 2pr, r1 -> b1 of nt 2pr, r2/r3 -> nt 2pr+1
                                for j in range(4):
                                    nt = 2 * pr + (j >> 1)
                                    kb = 8 * (j & 1)
                                    Bm[nt, hl, kb + 2 * t:kb + 2 * t + 2, g] = r[j]
                    for mt in range(MT):
                        for nt in range(4):
                            ah, al = Am[mt, 0], Am[mt, 1]
                            bh, bl = Bm[nt, 0], Bm[nt, 1]
                            if VAR == 1:
                                small = al @ bh + ah @ bl
                                big = ah @ bh
                            else:
                                small = 0
                                big = al @ bh + ah @ bl + ah @ bh
                            # C fragment per lane -> [16][8] matrix; keep as matrix
                            acc_m = acc[warp, mt, nt]
                            # store matrices in 16x8 separately
                            if not hasattr(conv16, "_m"):
                                pass
                            key = (blk, warp, mt, nt)
                            conv16.bigs[key] = conv16.bigs.get(key, 0) + big
                            conv16.smalls[key] = conv16.smalls.get(key, 0) + small
        # epilogue from the matrices
        for warp in range(8):
            wm, wn = warp >> 2, warp & 3
            for mt in range(MT):
                for nt in range(4):
                    key = (blk, warp, mt, nt)
                    big = conv16.bigs.pop(key)
                    small = conv16.smalls.pop(key)
                    tot = big + (small * 2.0 ** -11 if VAR == 1 else 0)
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        for hf in range(2):
                            o = mb * BM + wm * 16 * MT + mt * 16 + g + 8 * hf
                            if o >= cout:
                                continue
                            sc = rs[o]
                            if bug == "scale" and o == 5:
                                sc = 1.0
                            Y = ty0 + wn * 2 + (nt >> 1)
                            X0 = tx0 + 8 * (nt & 1) + 2 * t
                            if Y >= oh:
                                continue
                            for e in range(2):
                                X = X0 + e
                                if X < ow:
                                    out[ni, o, Y, X] = tot[g + 8 * hf, 2 * t + e] * sc + (bias[o] if bias is not None else 0)
    return out


conv16.bigs = {}
conv16.smalls = {}


def direct(x, w, b, up):
    n, cin, h, wd = x.shape
    cout, _, k, _ = w.shape
    if up:
        x = x.repeat(2, axis=2).repeat(2, axis=3)
    p = k // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    H, Wd = x.shape[2], x.shape[3]
    out = np.zeros((n, cout, H, Wd))
    for ky in range(k):
        for kx in range(k):
            out += np.einsum("oi,nihw->nohw", w[:, :, ky, kx], xp[:, :, ky:ky + H, kx:kx + Wd])
    if b is not None:
        out += b[None, :, None, None]
    return out


def bm_for(cout):
    pad = lambda bm: -(-cout // bm) * bm - cout
    return 96 if pad(96) < pad(128) else 128


def run(xs, cout, k, up, VAR=1, bug=None, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs)
    x[0, 0, 0, 0] = 3e-6  # a tiny value (subnormal lo for VAR 0)
    w = rng.standard_normal((cout, xs[1], k, k)) / np.sqrt(xs[1] * k * k)
    w[min(3, cout - 1)] *= 1e-3  # a row with a different scale
    b = rng.standard_normal(cout) * 0.1 if bias else None
    BM = bm_for(cout)
    wf, rs = wprep(w, BM, k, 11 if VAR == 1 else 0, bug=bug if bug == "reg" else None)
    got = conv16(x, wf, rs, b, cout, k, BM, up, VAR, bug=bug)
    want = direct(x, w, b, up)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


if __name__ == "__main__":
    rows = [
        ((1, 24, 5, 7), 20, 3, True, 1, None, True),
        ((1, 32, 9, 17), 20, 3, False, 0, None, True),
        ((2, 16, 6, 5), 36, 1, False, 1, None, False),
        ((1, 40, 4, 9), 130, 3, False, 1, None, True),
        ((1, 24, 5, 7), 20, 3, True, 1, "reg", True),
        ((1, 24, 5, 7), 20, 3, True, 1, "ldsm", True),
        ((1, 24, 5, 7), 20, 3, True, 1, "scale", True),
    ]
    for xs, cout, k, up, var, bug, bias in rows:
        e = run(xs, cout, k, up, var, bug, bias)
        print(f"{str(xs):16} cout {cout:4d} k{k} up {int(up)} VAR {var} bias {int(bias)} bug {str(bug):6}  rel L2 {e:.2e}")
