// The QK-norm + rotate-half RoPE arithmetic shared by the attention inputs' kernels: the DiT's
// (cuda/dit/dit_ops.cu qk_rope and qkv_rope, and the Hopper GEMM epilogue
// cuda/dit/sm90a/linear_qkv_norm_rope.cu) and the encoder's (cuda/encoder/encoder_ops.cu head_rope,
// cuda/encoder/attention_qkv_gate.cu qkrope). A head row x of hd values, h = hd/2:
//   y = x · rsqrt(mean(x²) + eps) · g   (g = w, or 1 + w for the encoder's zero-centred norm),
//   out[m] = y[m]·c − y[m + h]·s,  out[m + h] = y[m + h]·c + y[m]·s   (c, s = cos, sin of m's angle),
// fp32 throughout; the kernels differ in who owns which columns and where c, s come from.
// The products are macros, not functions: nvcc fuses a multiply into an add within the caller's
// expression, and which product it fuses decides the rounding; an expanded macro is the caller's
// expression, so every kernel rounds as the formula written out in it would.
#pragma once

// y = x · inv · g.
#define MOSS_NORMED(x, inv, g) ((x) * (inv) * (g))
// The rotated value of y with its partner p (the column h away): y·c − p·s in the first half,
// y·c + p·s in the second.
#define MOSS_ROPE_FIRST(y, p, c, s) ((y) * (c) - (p) * (s))
#define MOSS_ROPE_SECOND(y, p, c, s) ((y) * (c) + (p) * (s))
// Columns m and m + h of a row at once: xa, xb their values, ga, gb their weights, written to the
// lvalues oa, ob.
#define MOSS_NORM_ROPE_PAIR(xa, xb, ga, gb, inv, c, s, oa, ob)                \
    do {                                                                      \
        const float ya_ = MOSS_NORMED(xa, inv, ga), yb_ = MOSS_NORMED(xb, inv, gb); \
        oa = MOSS_ROPE_FIRST(ya_, yb_, c, s);                                 \
        ob = MOSS_ROPE_SECOND(yb_, ya_, c, s);                                \
    } while (0)

namespace moss_rope {

// rsqrt(mean(x²) + eps) of a row of n values whose sum of squares is ss.
__device__ __forceinline__ float rms_inv(float ss, int n, float eps) { return rsqrtf(ss / (float)n + eps); }

}  // namespace moss_rope
