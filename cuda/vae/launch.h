// Launch constants of the VAE decoder's kernels: the kernels use them, and the host code
// launches with them (build.rs turns this file into Rust constants: crates/moss-cuda/src/launch.rs).
// Only `#define NAME EXPR` lines (integers, names above, + - * / % and parentheses) and
// comments. Where a kernel derives a size from its own layout, it static_asserts it against the
// value here.
#pragma once

// vae_ops.cu, the split-TF32 implicit GEMM convolutions: output channels and pixels a block
// (grid: images x ceil(Cout / BM) x ceil(pixels / BN)), threads.
#define VAE_CONV_BM 128
#define VAE_CONV_BN 128
#define VAE_CONV_THREADS 256
// conv_tf32.cu (split-TF32 halo) and conv_fp16.cu (split fp16): the output tile in pixels (rows x
// columns; grid: images x tiles x output-channel blocks of 96 or 128) and the threads.
#define VAE_HALO_TH 8
#define VAE_HALO_TW 16
#define VAE_HALO_THREADS 256
// The halo's channel stride for HN halo pixels: the smallest stride >= HN that is 8 or 24 mod 32
// (the B fragment loads hit 32 banks).
#define VAE_HALO_CS(HN) ((HN) - (HN) % 32 + 8 + 16 * (((HN) % 32 + 7) / 16))
// The halo kernel's dynamic shared memory in bytes for BM output channels and a K x K kernel:
// two weight stages (hi and lo) and two halo buffers (hi and lo) of 8 channels.
#define VAE_HALO_SMEM(BM, K) (4 * (2 * ((K) * (K) * (BM) * 16) + 2 * 2 * 8 * VAE_HALO_CS((VAE_HALO_TH + (K) - 1) * (VAE_HALO_TW + (K) - 1))))
// The fp16 kernel's: two weight stages (BM / 16 fragments x hi / lo x 512 bytes a tap) and two
// halo stages (hi / lo x two channel halves x pixels x 16 bytes).
#define VAE_CONV16_SMEM(BM, K) (2 * ((K) * (K) * ((BM) / 16) * 2 * 512) + 2 * 4 * (VAE_HALO_TH + (K) - 1) * (VAE_HALO_TW + (K) - 1) * 16)

// The mid block's attention (attention_tf32.cu, attention_fp16.cu): head width, query rows a
// block (grid: ceil(L / rows) x images), threads.
#define VAE_ATTN_D 384
#define VAE_ATTN_ROWS 64
#define VAE_ATTN_THREADS 256
// attention_tf32.cu's dynamic shared memory: Q (64 rows of 388 floats), K (32 of 388), V (32 of
// 392), S (64 of 36).
#define VAE_ATTN_TF32_SMEM (4 * (64 * 388 + 32 * 388 + 32 * 392 + 64 * 36))
// attention_fp16.cu's: Q 64, K 32, V 32 rows of 776 halves, the partial-score exchange 8 x 4 x 32
// float4.
#define VAE_ATTN_FP16_SMEM ((64 + 2 * 32) * 776 * 2 + 8 * 4 * 32 * 16)
