// Hopper's asynchronous copies (sm_90): mbarriers, TMA loads of a tensor map's box into shared memory
// that complete on an mbarrier (cp.async.bulk.tensor), and TMA stores and bulk reductions back to
// global memory. The host side, making the tensor maps, is runtime/tma.h.
//
// An mbarrier counts arrivals and, with expect_tx, bytes still to land; a phase completes when both
// reach zero, and the barrier flips to the next phase. wait(bar, parity) returns once the phase of
// that parity has completed: a freshly initialised barrier is in phase 0, so wait(bar, 1) returns at
// once (the convention producers use for "this buffer was never used").
#pragma once
#include <cuda.h>

#include <cstdint>

namespace engine {
namespace tma {

__device__ __forceinline__ void init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// the barriers' initialisation made visible to the async proxy (TMA), before any thread uses them
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// one arrival, and `bytes` more to land in this phase (by the TMA loads that name this barrier)
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// the box of `map` at coordinates (c0 innermost .. c3) -> shared address dst (1024-byte aligned for
// the 128-byte swizzle); its bytes count against bar's expected transactions. Out-of-bounds
// elements land as zeros.
__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                        int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// bytes (a multiple of 16) at global src (16-byte aligned) -> shared address dst (16-byte aligned): a
// plain 1-D bulk copy (no tensor map), whose bytes count against bar's expected transactions
__device__ __forceinline__ void load_bytes(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// bytes (a multiple of 16) of float32 at shared address src added into global dst (16-byte aligned)
// by the L2, asynchronously: a bulk group of this thread's, which commit() closes
__device__ __forceinline__ void reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
// the box of `map` (a float32 tensor, runtime/tma.h's encode_f32) at coordinates (c0 innermost .. c2)
// += shared address src (1024-byte aligned, in the 128-byte swizzle), added by the L2; out-of-bounds
// elements are left out. Asynchronous: a bulk group of this thread's, which commit() closes
__device__ __forceinline__ void reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
// shared address src (1024-byte aligned, in the 128-byte swizzle) -> the box of `map` at coordinates (c0
// innermost .. c3); out-of-bounds elements are left out. Asynchronous: a bulk group of this thread's,
// which commit() closes; src may be rewritten once wait_read says the group has read it
__device__ __forceinline__ void store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// until at most N of this thread's bulk groups are still reading their shared memory
template <int N>
__device__ __forceinline__ void wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// until at most N of this thread's bulk groups are still running (their writes done)
template <int N>
__device__ __forceinline__ void wait_done() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Warp-specialised kernels hand registers from the warpgroup that only issues loads to the ones that
// compute (every warp of the warpgroup executes it; the counts are multiples of 8, 24 to 256)
template <int N>
__device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace tma
}  // namespace engine
