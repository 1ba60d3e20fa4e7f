// Hopper warpgroup MMA (wgmma, sm_90a) for bf16 with float32 accumulators: shared-memory matrix
// descriptors, the fences around the asynchronous MMAs, and the shapes the attention kernels use.
//
// A warpgroup is 4 consecutive warps (128 threads). In an m64nN accumulator, warp w of the group
// holds rows 16 w .. 16 w + 15 as N / 8 fragments laid out as mma.sync's m16n8 C fragment:
// d[j][0..1] = (row g, cols 8 j + 2 t, + 1), d[j][2..3] = (row g + 8, same cols), g = lane / 4,
// t = lane % 4. An A operand in registers (64 x 16) is mma.sync's m16n8k16 A fragment per warp.
//
// Shared-memory tiles here are (rows, 64) bf16 with the 128-byte swizzle: each row is 128 bytes and
// its 16-byte chunk c is stored at chunk c ^ (row % 8), tiles 1024-byte aligned. The same layout
// serves as a K-major operand (rows = M or N, 64 = K) and as an N-major one (rows = K, 64 = N); an
// operand of 32 columns uses the first half of each row (K-major: two k-steps; N-major: n32 shapes).
#pragma once
#include <cstdint>

namespace engine {
namespace wgmma {

// byte offset of (row, 16-byte chunk) in a swizzled (rows, 64) bf16 tile
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// descriptor of a swizzled tile at shared address `addr`: 8-row groups 1024 bytes apart (stride
// byte offset), 128-byte swizzle mode; the leading byte offset is unused by these layouts (one
// 64-element atom spans the whole K of a K-major tile and the whole N of an N-major one).
// K-major: step K by 16 elements with +2 (32 bytes); N-major: step K by 16 rows with +128 (2048 bytes).
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// shared-memory writes of the generic proxy (st.shared, cp.async) made visible to wgmma's reads
__device__ __forceinline__ void fence_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// After wait(): a new definition of each accumulator register, so that the compiler cannot move
// their reads above the wait (the asm statements keep their order; plain arithmetic would not).
template <int N>
__device__ __forceinline__ void hold(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
        asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}
template <int N>
__device__ __forceinline__ void hold(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
        asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3])::"memory");
}

#define FRAG(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])

// d (64 x N) = (accumulate ? d : 0) + A (64 x 16) B (16 x N), N 128, 64 or 32, both tiles in shared memory:
// K-major, or M-major (A) / N-major (B) where TransA / TransB is 1
template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void mma_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, "
        "%32, %33, p, 1, 1, %35, %36;\n}\n"
        : FRAG(d, 0), FRAG(d, 1), FRAG(d, 2), FRAG(d, 3), FRAG(d, 4), FRAG(d, 5), FRAG(d, 6), FRAG(d, 7)
        : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(TransA), "n"(TransB));
}
template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void mma_ss(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, "
        "%64, %65, p, 1, 1, %67, %68;\n}\n"
        : FRAG(d, 0), FRAG(d, 1), FRAG(d, 2), FRAG(d, 3), FRAG(d, 4), FRAG(d, 5), FRAG(d, 6), FRAG(d, 7),
          FRAG(d, 8), FRAG(d, 9), FRAG(d, 10), FRAG(d, 11), FRAG(d, 12), FRAG(d, 13), FRAG(d, 14), FRAG(d, 15)
        : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(TransA), "n"(TransB));
}
template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void mma_ss(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, %19, %20;\n}\n"
        : FRAG(d, 0), FRAG(d, 1), FRAG(d, 2), FRAG(d, 3)
        : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(TransA), "n"(TransB));
}

// d (64 x N) += A (64 x 16, registers) B (16 x N, N-major tile), N 64 or 32
__device__ __forceinline__ void mma_rs_n_major(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : FRAG(d, 0), FRAG(d, 1), FRAG(d, 2), FRAG(d, 3), FRAG(d, 4), FRAG(d, 5), FRAG(d, 6), FRAG(d, 7)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
__device__ __forceinline__ void mma_rs_n_major(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, 1, 1, 1, 1;\n"
        : FRAG(d, 0), FRAG(d, 1), FRAG(d, 2), FRAG(d, 3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// the N / 8 accumulator fragments of columns [first, first + N) of a wider accumulator (the panels of
// a head dim of 128)
template <int N, int M>
__device__ __forceinline__ float (&columns(float (&d)[M][4], int first))[N / 8][4] {
    return *reinterpret_cast<float(*)[N / 8][4]>(&d[first / 8]);
}

#undef FRAG

}  // namespace wgmma
}  // namespace engine
