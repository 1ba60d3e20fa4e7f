// dq written by the backward's main pass itself (attention_bwd_ws.cu, kernels + 512), instead of a
// pass over all of dq_acc after it: each warp that adds its 16 rows of a query tile's dQ into dq_acc
// draws a ticket for those rows, and the warp that draws the last one (every key tile that sees the
// rows has added its part) converts them to bf16 dq straight from the L2, where the adds were made.
//
// The ticket is drawn one hand-off late and read two late: at each hand-off a warp fences (its adds of
// the last hand-off, long since made, are ordered before the ticket), draws the last hand-off's ticket,
// and reads the ticket it drew the time before, so neither the fence nor the atomic's round trip
// stalls it. `flush` settles what is left at the end.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "attention/attention.h"
#include "attention/attention_tiles.cuh"

namespace engine {
namespace attn {

// 16 rows x D of dq_acc (float32, rows of D, read from the L2) * scale -> dq (bf16, rows st apart),
// rows < `rows`; one warp
template <int D>
__device__ __forceinline__ void convert_dq_rows(__nv_bfloat16* dq, int64_t st, const float* acc, int rows,
                                                float scale, int lane) {
    constexpr int kChunks = D / 8;  // 8 floats a chunk, kChunks a row
#pragma unroll
    for (int i = lane; i < 16 * kChunks; i += 32) {
        const int r = i / kChunks, c = i % kChunks * 8;
        if (r >= rows) continue;
        const float4 a = __ldcg(reinterpret_cast<const float4*>(acc + r * D + c));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(acc + r * D + c + 4));
        const uint4 v = {pack_bf16(a.x * scale, a.y * scale), pack_bf16(a.z * scale, a.w * scale),
                         pack_bf16(b.x * scale, b.y * scale), pack_bf16(b.z * scale, b.w * scale)};
        *reinterpret_cast<uint4*>(dq + r * st + c) = v;
    }
}

// One warp's tickets in flight: the 16-row group of its last hand-off (`fresh`, its adds issued, no
// ticket yet) and of the one before (`drawn`, with the ticket it drew); -1: none. A group is
// bh * groups + row / 16, groups = ceil(Tq / 16).
struct DqTickets {
    int fresh = -1, drawn = -1;
    unsigned ticket = 0;  // lane 0's: the partials of `drawn` added before this warp's

    // before a hand-off's adds: the fence, `fresh`'s ticket, `drawn`'s settled; then `group` is fresh.
    // last(row): the tickets a group whose first row (in its head) is `row` takes in all; convert(bh, row):
    // the warp's conversion of that group
    template <class Last, class Convert>
    __device__ __forceinline__ void hand_off(int group, unsigned* tickets, int groups, int lane, Last last,
                                             Convert convert) {
        // this warp's earlier adds before the ticket; the ticket read before the conversion
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        unsigned t = 0;
        if (fresh >= 0 && lane == 0) t = atomicAdd(tickets + fresh, 1u);
        if (drawn >= 0) {
            const int bh = drawn / groups, row = drawn % groups * 16;
            if (__shfl_sync(0xffffffffu, ticket, 0) + 1 == (unsigned)last(row)) convert(bh, row);
        }
        drawn = fresh, ticket = t, fresh = group;
    }
    // at the end of the warp's work: every group it added to settled
    template <class Last, class Convert>
    __device__ __forceinline__ void flush(unsigned* tickets, int groups, int lane, Last last, Convert convert) {
        hand_off(-1, tickets, groups, lane, last, convert);
        hand_off(-1, tickets, groups, lane, last, convert);
    }
};

}  // namespace attn
}  // namespace engine
