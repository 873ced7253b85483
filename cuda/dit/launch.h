// Launch constants of the DiT kernels: the kernels use them, and the host code launches with
// them (build.rs turns this file into Rust constants: crates/moss-cuda/src/launch.rs). Only
// `#define NAME EXPR` lines (integers, names above, + - * / % and parentheses) and comments.
#pragma once

// Head dim of the flash attention kernels (bf16 q, k, v, o).
#define DIT_FLASH_HEAD_DIM 128
// cuda/dit/flash_attention.cu (every GPU): query rows a block (grid: ceil(N / rows) x heads).
#define DIT_FLASH_ROWS 64
// Its threads (4 warps of 16 query rows).
#define DIT_FLASH_THREADS 128
// Its dynamic shared memory: four [64][128] bf16 tiles (K and V double-buffered, Q in the second
// K buffer), 64 KiB: three blocks an SM.
#define DIT_FLASH_SMEM (4 * 64 * DIT_FLASH_HEAD_DIM * 2)
// cuda/dit/sm90a/flash_attention_ws.cu (Hopper): query rows a block.
#define DIT_FLASH_WS_ROWS 128
// Its threads: a producer warpgroup and two consumer warpgroups.
#define DIT_FLASH_WS_THREADS 384
// Its dynamic shared memory: the Q tile and three-stage K and V rings of 32 KiB tiles, 128 bytes
// of mbarriers and scratch, 1024 bytes to align the base.
#define DIT_FLASH_WS_SMEM (32768 * 7 + 128 + 1024)
// cuda/dit/sm90a/linear_situ_glu.cu (Hopper): x rows an output tile.
#define DIT_SITU_GEMM_ROWS 128
// CTAs a thread-block cluster (sm90a/gemm_tile.cuh: the x tile's two 64-row halves multicast to
// both; the grid is whole clusters, the x map's box half a tile's rows).
#define DIT_SITU_GEMM_CLUSTER 2
// Output (F) columns an output tile: the tile reads the matching 128 up rows and 128 gate rows of W.
#define DIT_SITU_GEMM_COLS 128
// K a pipeline stage: 64 bf16, one 128-byte swizzled row (K must be a multiple of it).
#define DIT_SITU_GEMM_KTILE 64
// K a stage of the e4m3 form (moss_dit_linear_situ_glu_fp8): 128 codes, the same 128-byte row.
#define DIT_SITU_GEMM_KTILE_FP8 128
// Its threads: a producer warpgroup (TMA) and two consumer warpgroups (wgmma, 64 rows each).
#define DIT_SITU_GEMM_THREADS 384
// Bytes of a pipeline stage: the x tile and the up and gate tiles of W, (128 + 2 x 128) rows x 64 bf16.
#define DIT_SITU_GEMM_STAGE ((DIT_SITU_GEMM_ROWS + 2 * DIT_SITU_GEMM_COLS) * DIT_SITU_GEMM_KTILE * 2)
// Its pipeline stages (the ring of x and W tiles).
#define DIT_SITU_GEMM_STAGES 4
// Its dynamic shared memory: the stages, the output staging (128 x 128 bf16), 64 bytes of
// mbarriers, 1024 bytes to align the base.
#define DIT_SITU_GEMM_SMEM (DIT_SITU_GEMM_STAGES * DIT_SITU_GEMM_STAGE + DIT_SITU_GEMM_ROWS * DIT_SITU_GEMM_COLS * 2 + 64 + 1024)
// The SiTU kernels' ring with the epilogue on the producer warpgroup's spare warps
// (sm90a/gemm_tile.cuh EPI_WARPS): its stages, and its dynamic shared memory: the stages, the
// tile's 128 x 128 words of staged (h, g), 64 bytes of mbarriers, 1024 bytes to align the base.
#define DIT_SITU_EPI_STAGES 3
#define DIT_SITU_EPI_SMEM (DIT_SITU_EPI_STAGES * DIT_SITU_GEMM_STAGE + DIT_SITU_GEMM_ROWS * DIT_SITU_GEMM_COLS * 4 + 64 + 1024)
// cuda/dit/sm90a/linear_qkv_norm_rope.cu (Hopper, sm90a/gemm_tile.cuh's GEMM and launch as above):
// product columns a tile, two heads of 128 (D must be a multiple of it).
#define DIT_QKV_GEMM_COLS 256
// cuda/dit/situ_fp8.cu (SiTU-GLU into fp8 codes, one block a row): vectors of 8 outputs a thread
// holds in registers.
#define DIT_SITU_FP8_VECS 4
// Its most threads a block: with the vectors, the widest F it takes (8192, the DiT's).
#define DIT_SITU_FP8_THREADS 256
#define DIT_SITU_FP8_MAX_F (8 * DIT_SITU_FP8_VECS * DIT_SITU_FP8_THREADS)
// cuda/dit/dit_ops.cu's one-block-a-row norm (the gated residual + norm + modulation): its most
// threads, each holding 8 values of the row (d <= 8 * DIT_ROW_THREADS; 384 threads at d = 3072).
#define DIT_ROW_THREADS 1024
// cuda/dit/dequant.cu (quantized weights dequantized before each product): the int8 + ConvRot
// kernel's shared-memory tile of 64-bit sums; the largest ConvRot group it turns (moss-core's
// `kept::MAX_CONVROT_GROUP`).
#define DIT_DEQ_ROT_TILE 4096
// The dequantize kernels' threads a block.
#define DIT_DEQ_THREADS 256
// cuda/dit/int8.cu (`--precision int8`): the row quantization's threads a block (one row a block).
#define DIT_INT8_THREADS 256
// The ConvRot turn's shared-memory tile of f64 values: whole groups of a row, up to the largest
// group the GPU keeps (DIT_DEQ_ROT_TILE).
#define DIT_INT8_ROT_TILE 4096
