// Pieces shared by the bf16 fused-attention kernels (attention_mma.cu on mma.sync, attention_wgmma.cu
// on Hopper's wgmma): asynchronous global -> shared copies, bf16 packing, and the order of the tiles.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "attention/attention.h"

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

// N accumulator fragments (16 x 8 each, of a warp) = 0
template <int N>
__device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
}

// probabilities (N accumulator fragments: 16 rows x 8 N columns of a warp) -> bf16 A fragments of the
// next MMA, k = those columns: k-step kk takes fragments 2 kk and 2 kk + 1 (mma.sync's m16n8k16 A
// layout, which is also wgmma's register A per warp)
template <int N>
__device__ __forceinline__ void to_a_frags(uint32_t (&a)[N / 2][4], const float (&p)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        a[j >> 1][(j & 1) * 2] = pack_bf16(p[j][0], p[j][1]);
        a[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p[j][2], p[j][3]);
    }
}

// Blocks start in blockIdx order, and under a causal mask their work differs: a query tile sees
// more keys the later it is, a key tile more queries the earlier it is. A 1-D grid enumerates groups
// of `group` (batch, head) pairs (the last group may hold fewer of the BH), and within a group (tile
// rank, pair), pair fastest, rank 0 the heaviest tile: each group's blocks go heaviest first, and
// the grid ends on light blocks instead of a long straggler. A group is as many heads as the L2
// holds the reread operand of (walk_group), so that a head's tiles find its K and V (forward) or Q
// and dO (backward) there; per batch element (group = H) the last group's heaviest tiles start when
// little else is left (B 16 H 12 T 1024, causal: 8% of the SMs' time idle in a model of the walk, 2%
// in groups of 64 heads; measured, docs/performance.md "Twelfth session").
struct TileOrder {
    int tile, bh;
};
// (work item `index` of a persistent kernel's walk, or the block's own)
__device__ __forceinline__ TileOrder tile_order(int tiles, int group, int BH, bool heavy_last, int index) {
    const int g0 = index / (tiles * group) * group, n = min(group, BH - g0);  // the group's first pair, pairs
    const int r = index - g0 * tiles, rank = r / n;
    return {heavy_last ? tiles - 1 - rank : rank, g0 + r % n};
}
__device__ __forceinline__ TileOrder tile_order(int tiles, int H, bool heavy_last) {  // groups of a batch element
    return tile_order(tiles, H, INT_MAX, heavy_last, (int)blockIdx.x);
}
// The group of tile_order for BH (batch, head) pairs whose reread operand takes bytes_per_head: BH split
// into equal groups of at most budget_mb of it, whole batch elements or not
inline int walk_group(int BH, int64_t bytes_per_head, int budget_mb) {
    const int64_t budget = (int64_t)budget_mb << 20;
    const int64_t groups = std::max<int64_t>(1, (BH * bytes_per_head + budget - 1) / budget);
    return (int)((BH + groups - 1) / groups);
}

// A forward block's work (attn::tile_order, the heaviest, last query tile first): its (batch, head),
// its first query q0 (tiles of R), the causal offset S - Tq (the mask is aligned bottom-right), and
// that (batch, head)'s Q, K and V
struct QuerySlice {
    int bh, b, h, q0, off;
    const __nv_bfloat16 *q, *k, *v;
};
template <int R>
__device__ __forceinline__ QuerySlice query_slice(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                  const __nv_bfloat16* v, AttnLayout lq, AttnLayout lk, AttnLayout lv,
                                                  int H, int Tq, int S) {
    const TileOrder at = tile_order((Tq + R - 1) / R, H, /*heavy_last=*/true);
    const int bh = at.bh, b = bh / H, h = bh % H;
    return {bh, b, h, at.tile * R, S - Tq, q + b * lq.sb + h * lq.sh, k + b * lk.sb + h * lk.sh,
            v + b * lv.sb + h * lv.sh};
}

// A backward block's work (attn::tile_order, heaviest key tile first): its (batch, head), its first key
// k0, the causal offset S - Tq (the mask is aligned bottom-right), the first query tile of R rows that
// sees its keys, and that (batch, head)'s Q, dO, lse, delta and dq_acc (rows of D floats)
struct KeySlice {
    int bh, b, h, k0, off, i_begin;
    const __nv_bfloat16 *q, *dout;
    const float *lse, *delta;
    float* dq;
};
template <int BK, int R>
__device__ __forceinline__ KeySlice key_slice(const __nv_bfloat16* q, const __nv_bfloat16* dout, const float* lse,
                                              const float* delta, float* dq_acc, AttnLayout lq, AttnLayout lo, int H,
                                              int Tq, int S, int D, bool causal) {
    const TileOrder at = tile_order((S + BK - 1) / BK, H, /*heavy_last=*/false);
    const int bh = at.bh, b = bh / H, h = bh % H, k0 = at.tile * BK, off = S - Tq;
    return {bh, b, h, k0, off, causal ? max(0, k0 - off) / R * R : 0, q + b * lq.sb + h * lq.sh,
            dout + b * lo.sb + h * lo.sh, lse + (int64_t)bh * Tq, delta + (int64_t)bh * Tq,
            dq_acc + (int64_t)bh * Tq * D};
}

// ---- the ends of the passes, on accumulators in the C-fragment layout (mma.sync's m16n8, and
// wgmma's per warp): frag[j][0..1] = (row g, cols 8 j + 2 t, + 1), frag[j][2..3] = (row g + 8, same)

// Forward, a row's end: its softmax sum l summed over the quad (each lane holds a share), 1 / l (0 for
// a row that saw no key) ...
__device__ __forceinline__ void sum_row(float& l) {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
}
__device__ __forceinline__ float inverse_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }
// ... and its lse = (m + log2 l) ln 2, m being the scaled log2-domain max (-inf for a row that saw no key)
__device__ __forceinline__ float row_lse(float l, float m) { return l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY; }

// Forward: O = acc / l as bf16 for rows row[0], row[1] (< Tq), and their lse (l holds each lane's
// share, summed over the quad here). A row that saw no key gets O = 0 and lse = -inf.
template <int D>
__device__ __forceinline__ void store_output(__nv_bfloat16* ob, int64_t st, float* lse_bh, const float (&acc)[D / 8][4],
                                             float (&l)[2], const float (&m)[2], const int (&row)[2], int Tq, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum_row(l[r]);
        if (row[r] >= Tq) continue;
        const float inv = inverse_sum(l[r]);
        __nv_bfloat16* orow = ob + (int64_t)row[r] * st;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t) = pack_bf16(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
        if (t == 0) lse_bh[row[r]] = row_lse(l[r], m[r]);
    }
}

// The same for a warpgroup's 64 rows handed to a TMA store: O as bf16 into the warpgroup's swizzled
// (64, D) tile (panels of 64 rows x 128 bytes; chunk c of row r at chunk c ^ (r % 8), the maps'
// 128-byte swizzle, so that a warp's stores of one column chunk meet no bank twice), lse to global
// memory. `warp` is the warp's index in the warpgroup. Rows past Tq are staged too: the store leaves
// them out.
template <int D>
__device__ __forceinline__ void stage_output(unsigned char* tile, float* lse_bh, const float (&acc)[D / 8][4],
                                             float (&l)[2], const float (&m)[2], const int (&row)[2], int Tq,
                                             int warp, int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum_row(l[r]);
        const float inv = inverse_sum(l[r]);
        unsigned char* const trow = tile + (warp * 16 + g + 8 * r) * 128;  // (row % 8 = g)
#pragma unroll
        for (int j = 0; j < D / 8; ++j)  // columns 8 j + 2 t, + 1: panel j / 8, chunk j % 8
            *reinterpret_cast<uint32_t*>(trow + (j >> 3) * (64 * 128) + (((j & 7) ^ g) << 4) + 4 * t) =
                pack_bf16(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
        if (t == 0 && row[r] < Tq) lse_bh[row[r]] = row_lse(l[r], m[r]);
    }
}

// Backward: the R rows of a query tile at i0 that the elementwise step reads: lse in the log2 domain
// (+inf where the query saw no key or is past Tq, so that P = 2^(s - lse) = 0) and delta (0 past Tq)
template <int R, int NT>
__device__ __forceinline__ void stage_lse_delta(float* s_lse, float* s_delta, const float* lse_bh, const float* delta_bh,
                                                int i0, int Tq) {
    for (int i = threadIdx.x; i < R; i += NT) {
        const bool ok = i0 + i < Tq;
        const float v = ok ? lse_bh[i0 + i] : INFINITY;
        s_lse[i] = v == -INFINITY ? INFINITY : v * kLog2e;
        s_delta[i] = ok ? delta_bh[i0 + i] : 0.f;
    }
}

// Backward: dK (times the softmax scale) and dV as bf16 for keys key[0], key[1] (< S)
template <int D>
__device__ __forceinline__ void store_key_grads(__nv_bfloat16* dkb, int64_t sk, __nv_bfloat16* dvb, int64_t sv,
                                                const float (&dk)[D / 8][4], const float (&dv)[D / 8][4],
                                                const int (&key)[2], int S, int t, float scale) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (key[r] >= S) continue;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            const int c = j * 8 + 2 * t;
            *reinterpret_cast<uint32_t*>(dkb + (int64_t)key[r] * sk + c) =
                pack_bf16(dk[j][2 * r] * scale, dk[j][2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dvb + (int64_t)key[r] * sv + c) = pack_bf16(dv[j][2 * r], dv[j][2 * r + 1]);
        }
    }
}

// Backward: dq_acc (float32 rows of D) += a warp's N fragments of dQ, rows qrow + g and + 8 (< Tq),
// columns c0 ..; float2 atomics where the GPU has them (sm_90)
template <int N>
__device__ __forceinline__ void add_dq(float* dq_bh, int D, const float (&dq)[N][4], int qrow, int c0, int Tq, int g,
                                       int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int qi = qrow + g + 8 * r;
        if (qi >= Tq) continue;
        float* dst = dq_bh + (int64_t)qi * D + c0 + 2 * t;
#pragma unroll
        for (int j = 0; j < N; ++j) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst + j * 8), make_float2(dq[j][2 * r], dq[j][2 * r + 1]));
#else
            atomicAdd(dst + j * 8, dq[j][2 * r]);
            atomicAdd(dst + j * 8 + 1, dq[j][2 * r + 1]);
#endif
        }
    }
}

// the 16-byte copies need 16-byte aligned rows: base pointer and every stride a multiple of 8 elements
inline bool aligned16(const void* p, AttnLayout l) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && l.sb % 8 == 0 && l.sh % 8 == 0 && l.st % 8 == 0;
}

}  // namespace attn
}  // namespace engine
