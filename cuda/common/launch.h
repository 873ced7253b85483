// Launch constants of the shared kernels (cuda/common): the kernels use them, and the host code
// launches with them (build.rs turns this file into Rust constants: src/backend/cuda/launch.rs).
// Only `#define NAME EXPR` lines (integers, names above, + - * / % and parentheses) and comments.
#pragma once

// cuda/common/fp8.cu, the row-wise e4m3 quantization: threads of a block (at most; a block of
// the register path holds whole rows: FP8_QUANT_ROWS(K) x FP8_QUANT_WARPS(K) warps).
#define FP8_QUANT_THREADS 256
// Vectors of 8 elements a thread holds in registers (a row is read from memory once).
#define FP8_QUANT_VECS 4
// Widest row the register path takes (K a multiple of 8): a whole block's registers. Wider rows
// and K not a multiple of 8 take one block a row, reading the row twice.
#define FP8_QUANT_MAX_K (FP8_QUANT_THREADS * FP8_QUANT_VECS * 8)
// Warps that share a row of K elements (K <= FP8_QUANT_MAX_K): 1 up to K = 1024, 3 at 3072, 8 at 8192.
#define FP8_QUANT_WARPS(K) (((K) + 32 * 8 * FP8_QUANT_VECS - 1) / (32 * 8 * FP8_QUANT_VECS))
// Rows a block of the register path.
#define FP8_QUANT_ROWS(K) (FP8_QUANT_THREADS / 32 / FP8_QUANT_WARPS(K))
