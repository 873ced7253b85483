// The warpgroup tensor-core helpers of the Hopper kernels (sm_90a only): shared-memory
// addresses, the wgmma fence / commit / wait, register pins, 128-byte-swizzle matrix descriptors
// and the bf16 products with both operands in shared memory, K-major (m64n128k16, m64n256k16; fp32
// accumulate). Used by sm90a/wgmma_attention.cuh (the attention kernels) and
// dit/sm90a/linear_situ_glu.cu.
#pragma once
#include "common.cuh"

// The operand lists of the wgmma wrappers: the accumulator registers d[o .. o + 63] ("+f") and
// their placeholders in the instruction's register list.
#define MOSS_WG_D8(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7])
#define MOSS_WG_D64(o) \
    MOSS_WG_D8(o), MOSS_WG_D8(o + 8), MOSS_WG_D8(o + 16), MOSS_WG_D8(o + 24), MOSS_WG_D8(o + 32), MOSS_WG_D8(o + 40), MOSS_WG_D8(o + 48), MOSS_WG_D8(o + 56)
#define MOSS_WG_R64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MOSS_WG_R128 MOSS_WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

namespace moss_wg {
__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// cp.async writes shared memory through the generic proxy; wgmma reads it through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// setmaxnreg: a warpgroup hands registers back to the CTA's pool (dec) or takes them (inc).
template <int N>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory"); }
template <int N>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Pin registers at this point of the instruction stream (reads of a wgmma result must not move
// above its wait; writes of an operand must not move above the wait either).
__device__ __forceinline__ void pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
template <int K>
__device__ __forceinline__ void pin_all(float (&x)[K]) {
#pragma unroll
    for (int i = 0; i < K; i++) pin(x[i]);
}
template <int K>
__device__ __forceinline__ void pin_all(uint32_t (&x)[K]) {
#pragma unroll
    for (int i = 0; i < K; i++) pin(x[i]);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory matrix descriptor, 128-byte swizzle. lbo/sbo in bytes.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// d (the m64n128 fp32 accumulator, 64 per thread) = A * B (+ d when accumulate != 0); A and B in
// shared memory (descriptors), both K-major.
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MOSS_WG_R64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : MOSS_WG_D64(0)
        : "l"(da), "l"(db), "r"(accumulate));
}
// The same with N = 256 (the m64n256 fp32 accumulator, 128 per thread: d[4i + 2r + e] is row
// 16·warp + lane/4 + 8r, column 8i + 2·(lane%4) + e, i < 32).
__device__ __forceinline__ void wgmma_ss_n256(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MOSS_WG_R128 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : MOSS_WG_D64(0), MOSS_WG_D64(64)
        : "l"(da), "l"(db), "r"(accumulate));
}
// The e4m3 form (`--precision fp8`): d += A * B over 32 codes of K (32 bytes, as the bf16 form's
// 16 values), both K-major in shared memory; 8-bit operands take no transpose immediates.
__device__ __forceinline__ void wgmma_ss_n256_e4m3(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" MOSS_WG_R128 "}, %128, %129, p, 1, 1;\n}\n"
        : MOSS_WG_D64(0), MOSS_WG_D64(64)
        : "l"(da), "l"(db), "r"(accumulate));
}
}  // namespace moss_wg
