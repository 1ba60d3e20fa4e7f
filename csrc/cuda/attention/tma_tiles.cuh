// TMA loads of the wgmma attention kernels' tiles (attention_fwd_ws.cu, attention_bwd_ws.cu): the
// tensor map of q, k, v or dout (host), and a tile's rows of one head into its swizzled panels.
#pragma once
#include <algorithm>
#include <cstdint>

#include "attention/attention.h"
#include "runtime/runtime.h"
#include "runtime/tma.cuh"
#include "runtime/tma.h"

namespace engine {
namespace attn {

// The TMA map of q, k, v or dout (rows T or S of D elements): axes (d, rows, head, batch), or (d,
// head, rows, batch) where the heads sit inside the rows (a packed qkv), so that each axis nests in
// the next; a box is (64, box_rows) of one head (at D 32, columns 32 .. 63 are out of bounds: zeros). An axis of one element may carry any stride (the
// launchers flatten the heads into the batch and pass a head stride of 0): it is given the span of
// the axes inside it. False where TMA cannot describe the layout.
inline bool make_map(CUtensorMap* map, bool* rows_inner, const void* base, AttnLayout l, int B, int H, int rows,
                     int D, int box_rows) {
    if (H == 1) l.sh = (int64_t)rows * l.st;
    if (B == 1) l.sb = std::max((int64_t)rows * l.st, (int64_t)H * l.sh);
    const bool ri = l.st <= l.sh;
    const uint64_t dims[4] = {(uint64_t)D, (uint64_t)(ri ? rows : H), (uint64_t)(ri ? H : rows), (uint64_t)B};
    const uint64_t strides[3] = {2 * (uint64_t)(ri ? l.st : l.sh), 2 * (uint64_t)(ri ? l.sh : l.st),
                                 2 * (uint64_t)l.sb};
    const uint32_t box[4] = {64, (uint32_t)(ri ? box_rows : 1), (uint32_t)(ri ? 1 : box_rows), 1};
    *rows_inner = ri;
    return tma::encode_bf16(map, base, 4, dims, strides, box);
}

// Registers a thread in a block of one producer and NWG consumer warpgroups, alone on its SM: the
// producer keeps few, the consumers take the rest. setmaxnreg.inc waits until the producer's
// setmaxnreg.dec has freed what it asks, so the consumers may ask for no more than that frees of
// what the launch gave ((NWG + 1) * 128 threads, 65536 / threads each, a multiple of 8: 168 or 128).
template <int NWG>
struct RegisterSplit {
    static_assert(NWG == 2 || NWG == 3, "two or three consumer warpgroups");
    static constexpr int producer = NWG == 2 ? 24 : 32, consumer = NWG == 2 ? 240 : 160;
    static constexpr int launch = 65536 / ((NWG + 1) * 128) / 8 * 8;
    static_assert((launch - producer) * 128 >= (consumer - launch) * NWG * 128, "the consumers would wait forever");
};

// A consumer warpgroup frees a buffer with one arrival from each of its 4 warps, each made after that
// warp's own wait on the buffer (and its reads of it): so the buffer's "full" barrier cannot complete
// its next phase while any warp has yet to see this one. (With one arrival a warpgroup, a warp held
// back, say by its output's stores, could find the barrier two phases on and wait on the aliased
// parity for ever.) An "empty" barrier counts kArrivalsPerConsumer for each consumer warpgroup.
constexpr int kArrivalsPerConsumer = 4;
__device__ __forceinline__ void release(uint32_t empty_bar) {
    __syncwarp();  // the warp's reads of the buffer, before its arrival
    if ((threadIdx.x & 31) == 0) tma::arrive(empty_bar);
}

// dQ's float32 partial sums of a 64-query tile, 64 columns of it, added into dq_acc by the L2's bulk
// reductions instead of an atomic a pair of elements: each warp stages its 16 rows in shared memory
// (rows kDqStride bytes apart, so that a half-warp's 8-byte stores meet no bank twice), then its
// lanes 0-15 each reduce one row of 256 bytes into dq_cols (the panel's first column; rows ld floats
// apart).
constexpr int kDqStride = 72 * 4;

// a warp's 16 x 64 accumulator of dQ (the wgmma m64n64 fragment's rows g, g + 8) -> its rows at `rows`
__device__ __forceinline__ void put_dq_rows(const float (&dq)[8][4], unsigned char* rows, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<float2*>(rows + g * kDqStride + (8 * j + 2 * t) * 4) = make_float2(dq[j][0], dq[j][1]);
        *reinterpret_cast<float2*>(rows + (g + 8) * kDqStride + (8 * j + 2 * t) * 4) = make_float2(dq[j][2], dq[j][3]);
    }
}

__device__ __forceinline__ void reduce_dq(float* dq_cols, int ld, const float (&dq)[8][4], int qrow, int Tq,
                                          unsigned char* rows, uint32_t rows_addr, int lane) {
    tma::wait_read<0>();  // this lane's reductions of the previous tile have read their rows
    __syncwarp();
    put_dq_rows(dq, rows, lane);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stores, before the bulk reads
    __syncwarp();
    if (lane < 16 && qrow + lane < Tq) {
        tma::reduce_add_f32(dq_cols + (int64_t)(qrow + lane) * ld, rows_addr + lane * kDqStride, 64 * 4);
        tma::commit();
    }
}

// The same 16 x 64 of dQ (columns col0 ..) added by two TMA tensor reductions instead (dq_acc's map:
// float32 (D, Tq, B H), boxes of 32 columns x 16 rows). stage_dq_tiles writes the warp's rows as two boxes of 128-byte
// rows, columns 0 .. 31 at `half0` and 32 .. 63 at `half1` (each 1024-byte aligned, in the 128-byte
// swizzle: chunk c of row r at chunk c ^ (r % 8), so that a half-warp's float2 stores meet no bank
// twice); reduce_dq_tiles, called later (once the stores have had time to land, so that the fence
// between them and the bulk reads waits for nothing), has lane 0 hand both boxes to the L2 as one bulk
// group. Rows past Tq are the tensor's out-of-bounds: left out. The staging may be rewritten once
// lane 0's tma::wait_read says the group has read it.
__device__ __forceinline__ void stage_dq_tiles(const float (&dq)[8][4], unsigned char* half0, unsigned char* half1,
                                               int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // columns 8 j + 2 t, + 1: chunk 2 (j % 4) + t / 2 of its half
        unsigned char* const half = j < 4 ? half0 : half1;
        const int at = (((2 * (j & 3) + (t >> 1)) ^ g) << 4) + (t & 1) * 8;  // rows g and g + 8 swizzle alike
        *reinterpret_cast<float2*>(half + g * 128 + at) = make_float2(dq[j][0], dq[j][1]);
        *reinterpret_cast<float2*>(half + (g + 8) * 128 + at) = make_float2(dq[j][2], dq[j][3]);
    }
}
__device__ __forceinline__ void reduce_dq_tiles(const CUtensorMap* map, int qrow, int col0, int bh,
                                                uint32_t half0_addr, uint32_t half1_addr, int lane) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stores, before the bulk reads
    __syncwarp();
    if (lane == 0) {
        tma::reduce_add_3d(map, half0_addr, col0, qrow, bh);
        tma::reduce_add_3d(map, half1_addr, col0 + 32, qrow, bh);
        tma::commit();
    }
}

__device__ __forceinline__ float4 ld_shared_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void st_shared_f4(uint32_t addr, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

// A block's next work item after `index`: in a grid of a block an item (next_item null) one past the
// end, which closes its walk; in a persistent one the next unclaimed one from the counter next_item. A walk makes exactly
// `work` fetches (one per item past the first grid, and one past the end per block); the fetch that
// hands out the last value puts the counter back to 0 for the next launch.
__device__ __forceinline__ int next_index(int index, int work, unsigned* next_item) {
    if (next_item == nullptr) return index + (int)gridDim.x;
    const unsigned taken = atomicAdd(next_item, 1u);
    if (taken == (unsigned)work - 1) atomicExch(next_item, 0u);
    return (int)(taken + gridDim.x);
}

// The device address of a kernel file's walk counter (a __device__ unsigned: engine runs all of a
// device's work on one stream, so one counter a device serves every launch), looked up once a device
inline unsigned* walk_counter(const unsigned& symbol, unsigned* (&cache)[64]) {
    int device = 0;
    check(cudaGetDevice(&device), "attention");
    if (cache[device] == nullptr)
        check(cudaGetSymbolAddress(reinterpret_cast<void**>(&cache[device]), symbol), "attention");
    return cache[device];
}

// rows [row0, row0 + R) of head h, batch b -> the swizzled (R, D) tile at dst, panel by panel
template <int P, int R>
__device__ __forceinline__ void load_rows(uint32_t dst, const CUtensorMap* map, bool rows_inner, uint32_t bar, int row0,
                                          int h, int b) {
#pragma unroll
    for (int p = 0; p < P; ++p)
        tma::load_4d(dst + p * (R * 128), map, bar, p * 64, rows_inner ? row0 : h, rows_inner ? h : row0, b);
}

// the swizzled (R, D) tile at src -> rows [row0, row0 + R) of head h, batch b (rows past the map's end
// left out), panel by panel, as one bulk group of the calling thread's
template <int P, int R>
__device__ __forceinline__ void store_rows(const CUtensorMap* map, bool rows_inner, uint32_t src, int row0, int h,
                                           int b) {
#pragma unroll
    for (int p = 0; p < P; ++p)
        tma::store_4d(map, src + p * (R * 128), p * 64, rows_inner ? row0 : h, rows_inner ? h : row0, b);
    tma::commit();
}

}  // namespace attn
}  // namespace engine
