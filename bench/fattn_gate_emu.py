# Host emulation of the index math of the gated epilogue of cuda/attention_causal.cu
# (moss_enc_fattn_gated_bf16, MOSS_ENC_ATTN_GATE=fused) and of the host arguments
# (src/backend/cuda/encoder.rs causal_attention_gated_fused): every (block, warp, lane, r, dt, pair)
# store, its output element and the gate element it reads, for L = 777 (partial tile) and 4096,
# H = 16, Hkv = 4, hd = 256. Checks: each output element of [L, H·256] is written exactly once, and
# the gate it is multiplied by is qg[t, h, 256 + c] (the q_proj output [L, H, 512], in place).
# Planted control (the kernel's BUG 2, the gate at the KV head's column) must fail the check.
#   python3 bench/fattn_gate_emu.py
import numpy as np

D, BM = 256, 64


def emulate(L, H, Hkv, bug):
    hd = D
    ldq = H * D                      # output row stride (elements)
    gate_off = hd                    # host: qg.ptr() + hd * 2 bytes
    ldg, gh = H * 2 * hd, 2 * hd     # host: Arg::L(nh * 2 * hd), Arg::L(2 * hd)
    writes = np.zeros(L * ldq, np.int32)
    gate_of = np.full(L * ldq, -1, np.int64)
    nblk = (L + BM - 1) // BM
    lane = np.arange(32)
    for bx in range(nblk):
        m0 = (nblk - 1 - bx) * BM
        for h in range(H):
            kvh = h // (H // Hkv)
            for warp in range(4):
                qrow0 = m0 + warp * 16 + (lane >> 2)
                for r in range(2):
                    row = qrow0 + r * 8
                    ok = row < L
                    for dt in range(32):
                        for e in range(2):
                            dst = row * ldq + h * D + (lane & 3) * 2 + dt * 8 + e
                            g = gate_off + row * ldg + (kvh if bug == 2 else h) * gh + (lane & 3) * 2 + dt * 8 + e
                            np.add.at(writes, dst[ok], 1)
                            gate_of[dst[ok]] = g[ok]
    t = np.arange(L)[:, None, None]
    hh = np.arange(H)[None, :, None]
    c = np.arange(D)[None, None, :]
    want_gate = (t * (H * 2 * hd) + hh * 2 * hd + hd + c).reshape(-1)
    once = bool((writes == 1).all())
    gate_ok = bool((gate_of == want_gate).all())
    return once, gate_ok


bad = 0
for L in [777, 4096]:
    once, gate_ok = emulate(L, 16, 4, 0)
    print(f"L={L}: every output once {once}, gate element right {gate_ok}")
    bad += not (once and gate_ok)
    once, gate_ok = emulate(L, 16, 4, 2)
    print(f"L={L}: control (gate of the KV head): gate element right {gate_ok} (must be False)")
    bad += gate_ok
print("OK" if bad == 0 else f"FAILED ({bad})")
raise SystemExit(bad != 0)
