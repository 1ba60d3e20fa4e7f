// Pieces shared by the bf16 fused-attention kernels (attention_mma.cu on mma.sync, attention_wgmma.cu
// on Hopper's wgmma): asynchronous global -> shared copies, bf16 packing, and the order of the tiles.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "fused.h"

namespace engine {
namespace attn {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !pred
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) { cp_async16(smem_addr(dst), src, pred); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Blocks start in blockIdx order, and under a causal mask their work differs: a query tile sees
// more keys the later it is, a key tile more queries the earlier it is. A 1-D grid enumerates
// (batch, tile rank, head), head fastest, and rank 0 is the heaviest tile, so each batch element's
// blocks go heaviest first and the grid ends on light blocks instead of a long straggler.
struct TileOrder {
    int tile, bh;
};
__device__ __forceinline__ TileOrder tile_order(int tiles, int H, bool heavy_last) {
    const int per_b = tiles * H, r = blockIdx.x % per_b, rank = r / H;
    return {heavy_last ? tiles - 1 - rank : rank, (int)(blockIdx.x / per_b) * H + r % H};
}

// the 16-byte copies need 16-byte aligned rows: base pointer and every stride a multiple of 8 elements
inline bool aligned16(const void* p, AttnLayout l) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && l.sb % 8 == 0 && l.sh % 8 == 0 && l.st % 8 == 0;
}

}  // namespace attn
}  // namespace engine
