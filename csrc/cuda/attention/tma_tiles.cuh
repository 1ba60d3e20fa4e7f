// TMA loads of the wgmma attention kernels' tiles (attention_fwd_ws.cu, attention_bwd_ws.cu): the
// tensor map of q, k, v or dout (host), and a tile's rows of one head into its swizzled panels.
#pragma once
#include <cstdint>

#include "attention/attention.h"
#include "runtime/tma.cuh"
#include "runtime/tma.h"

namespace engine {
namespace attn {

// The TMA map of q, k or v (rows T or S of D elements): axes (d, rows, head, batch), or (d, head,
// rows, batch) where the heads sit inside the rows (a packed qkv), so that each axis nests in the
// next; a box is (64, box_rows) of one head. False where TMA cannot describe the layout.
inline bool make_map(CUtensorMap* map, bool* rows_inner, const void* base, AttnLayout l, int B, int H, int rows,
                     int D, int box_rows) {
    const bool ri = l.st <= l.sh;
    const uint64_t dims[4] = {(uint64_t)D, (uint64_t)(ri ? rows : H), (uint64_t)(ri ? H : rows), (uint64_t)B};
    const uint64_t strides[3] = {2 * (uint64_t)(ri ? l.st : l.sh), 2 * (uint64_t)(ri ? l.sh : l.st),
                                 2 * (uint64_t)l.sb};
    const uint32_t box[4] = {64, (uint32_t)(ri ? box_rows : 1), (uint32_t)(ri ? 1 : box_rows), 1};
    *rows_inner = ri;
    return tma::encode_bf16(map, base, 4, dims, strides, box);
}

// rows [row0, row0 + R) of head h, batch b -> the swizzled (R, D) tile at dst, panel by panel
template <int P, int R>
__device__ __forceinline__ void load_rows(uint32_t dst, const CUtensorMap* map, bool rows_inner, uint32_t bar, int row0,
                                          int h, int b) {
#pragma unroll
    for (int p = 0; p < P; ++p)
        tma::load_4d(dst + p * (R * 128), map, bar, p * 64, rows_inner ? row0 : h, rows_inner ? h : row0, b);
}

}  // namespace attn
}  // namespace engine
