// Launch constants of the text encoder's kernels: the kernels use them, and the host code
// launches with them (build.rs turns this file into Rust constants: crates/moss-cuda/src/launch.rs).
// Only `#define NAME EXPR` lines (integers, names above, + - * / % and parentheses) and
// comments. Where a kernel derives a size from its own layout, it static_asserts it against the
// value here.
#pragma once

// ---- causal attention, short prompts (encoder_ops.cu `attn`) ----
// Query rows a block (grid: ceil(L / rows) x heads).
#define ENC_ATTN_Q 32
// Keys a tile.
#define ENC_ATTN_K 32
// Threads a block; thread d owns output dim d, so the head dim is at most this.
#define ENC_ATTN_THREADS 256
// Dynamic shared memory in floats at head dim HD: Q and K tiles (rows of HD + 1), the V tile,
// the scores (rows of ENC_ATTN_K + 1), three row vectors.
#define ENC_ATTN_SMEM_FLOATS(HD) (ENC_ATTN_Q * ((HD) + 1) + ENC_ATTN_K * ((HD) + 1) + ENC_ATTN_K * (HD) + ENC_ATTN_Q * (ENC_ATTN_K + 1) + 3 * ENC_ATTN_Q)

// ---- causal flash attention, long prompts (bf16, head dim ENC_FLASH_HD) ----
#define ENC_FLASH_HD 256
// causal_flash_attention.cu (every GPU): query rows a block (grid: ceil(L / rows) x heads),
// threads, dynamic shared memory (the Q tile and double-buffered K and V tiles of 32 rows).
#define ENC_FLASH_ROWS 64
#define ENC_FLASH_THREADS 128
#define ENC_FLASH_SMEM 98304
// sm90a/causal_flash_attention_wgmma.cu (Hopper): query rows a block (grid: heads x
// ceil(L / rows)), threads, dynamic shared memory (+ 1024 to align the base).
#define ENC_FLASH_WG_ROWS 128
#define ENC_FLASH_WG_THREADS 256
#define ENC_FLASH_WG_SMEM 197632

// ---- q/k RMSNorm + RoPE + gate split (attention_qkv_gate.cu) ----
// Rows (a warp each) a block of 256 threads; the largest head dim (8 columns a lane).
#define ENC_QK_WARPS 8
#define ENC_QK_MAXHD 256

// ---- residual add + RMSNorm (add_rms_norm.cu), a block per row ----
#define ENC_ADD_RMS_THREADS 256
// 8-wide vectors a thread: rows up to 8 · 256 · 4 wide.
#define ENC_ADD_RMS_VECS 4
#define ENC_ADD_RMS_MAX_WIDTH (8 * ENC_ADD_RMS_THREADS * ENC_ADD_RMS_VECS)

// ---- row kernels (row_ops.cu) ----
// conv_silu_gates: channels and tokens a thread, threads a block (channel groups, or gates).
#define ENC_CONV_V 4
#define ENC_CONV_TT 4
#define ENC_CONV_THREADS 128
// rms1w / rms1w2: a block per row; 8-wide vectors a thread 4 (rms1w) or 2 (rms1w2).
#define ENC_RMS1_THREADS 256
#define ENC_RMS1_MAX_WIDTH (8 * ENC_RMS1_THREADS * 4)
#define ENC_RMS1_2_MAX_WIDTH (8 * ENC_RMS1_THREADS * 2)

// ---- the gated delta rule ----
// Chunk length and the padded head dim of the chunk-parallel kernels (head dims up to it).
#define ENC_GDR_CHUNK 64
#define ENC_GDR_MAX_DIM 128
// delta_rule.cu: threads of gdr_prep_f32, gdr_seq, gdr_seq_tc, gdr_out_*; value columns a
// block of the state pass and of the output.
#define ENC_GDR_THREADS 256
#define ENC_GDR_SEQ_COLS 32
#define ENC_GDR_OUT_COLS 64
// Dynamic shared memory (floats) of the fp32 SIMT kernels: prep (K, Q tiles of rows of 132, Aᵀ
// of rows of 68, 4 vectors), state pass (two stages of Wk, Kd, U0; S, U), output (Q, S, Wqk, U, e^γ).
#define ENC_GDR_PREP_FLOATS 21504
#define ENC_GDR_SEQ_FLOATS 45312
#define ENC_GDR_OUT_FLOATS 25920
// ... of the bf16 path's gdr_seq_tc, gdr_out_tc (delta_rule_tc.cuh: TQ_FLOATS, TO_FLOATS).
#define ENC_GDR_SEQ_TC_FLOATS 46592
#define ENC_GDR_OUT_TC_FLOATS 26688
// delta_rule_prep.cuh (bf16): threads (a block per chunk and pair of value heads) and dynamic
// shared memory in floats (P3P_FLOATS: 93 KiB, two blocks an SM).
#define ENC_GDR_PREP_BF16_THREADS 512
#define ENC_GDR_PREP_BF16_FLOATS 23680
// sm90a/delta_rule_tma.cu (Hopper): threads (8 compute warps and a producer), value columns a
// block, dynamic shared memory (TLay<bf16>::BYTES).
#define ENC_GDR_TMA_THREADS 288
#define ENC_GDR_TMA_COLS 32
#define ENC_GDR_TMA_BYTES 201776
// delta_rule_compact.cuh (every GPU; <= 96 KiB a block): value columns a block of
// gdr_seq_compact and gdr_out_compact, and their dynamic shared memory in floats (a ring of 3
// quarter tiles [64][72] of Wk / Kd, S [128][40], U [64][40]; Q̂ [64][132], S0 [128][40], Wqk
// [64][68], U [64][40], e^γ).
#define ENC_GDR_COMPACT_COLS 32
#define ENC_GDR_SEQ_COMPACT_FLOATS 21504
#define ENC_GDR_OUT_COMPACT_FLOATS 20544
// The one-kernel sequential version (encoder_ops.cu `gdr`): threads, value columns a block
// (or all of dv), dynamic shared memory in floats at key head dim DK and COLS columns.
#define ENC_GDR_SEQ1_THREADS 512
#define ENC_GDR_SEQ1_COLS 32
#define ENC_GDR_SEQ1_SMEM_FLOATS(DK, COLS) ((DK) * (COLS) + 2 * ENC_GDR_CHUNK * ((DK) + 1) + 2 * ENC_GDR_CHUNK * (COLS) + 2 * ENC_GDR_CHUNK * (ENC_GDR_CHUNK + 1) + 4 * ENC_GDR_CHUNK)
