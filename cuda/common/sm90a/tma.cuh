// TMA tensor copies and mbarriers of the Hopper kernels (sm_90a only): the 2-D tensor map (made on
// the host by cuTensorMapEncodeTiled: crates/moss-cuda/src/ops.rs `tensor_map_2d`, passed to the kernel
// by value as a __grid_constant__ parameter), box copies global -> shared completing on an
// mbarrier's transaction count, and the mbarrier operations of a producer / consumer ring (a
// "full" barrier per stage the producer arms with the stage's bytes, an "empty" one the consumers
// arrive on), and the cluster forms (a box multicast to the CTAs of a thread-block cluster, an
// arrival on a peer CTA's mbarrier). Used by dit/sm90a/flash_attention_ws.cu and
// common/sm90a/gemm_tile.cuh.
#pragma once
#include "common.cuh"

namespace moss_tma {
struct alignas(64) TmaMap {
    uint64_t opaque[16];
};

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// After the initialising thread's mbarrier.init calls (before the block-wide barrier): the inits
// visible to the other threads and to the async proxy (TMA completions).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred P1;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@!P1 bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// The map's box (the host's box size: 64 bf16 columns = 128 bytes x rows) at (column c0, row c1)
// into shared memory at dst (1024-byte aligned: the 128-byte swizzle is the wgmma one), completing
// on mbarrier bar; elements past the tensor's edges are zeros (and count as bytes all the same).
__device__ __forceinline__ void tma_load(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
// The same box into shared memory at dst in every CTA of the cluster named by `mask` (bit r: CTA
// rank r), completing on the mbarrier at offset bar in each of them.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar, uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
        : "memory");
}
// Thread-block clusters: a barrier of every (non-exited) thread of the cluster; an arrival on the
// mbarrier at offset bar of CTA `rank` (default semantics: release at CTA scope, as CUTLASS's
// ClusterBarrier::arrive).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
        "r"(rank)
        : "memory");
}
__device__ __forceinline__ void prefetch_map(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
}  // namespace moss_tma
