// Tensor maps for the TMA loads of runtime/tma.cuh: the driver's cuTensorMapEncodeTiled, reached
// through the runtime (cudaGetDriverEntryPointByVersion), so that engine._C still links no libcuda.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace engine {
namespace tma {

// A bf16 tensor at `base` (16-byte aligned) of `rank` (1 to 5) axes, axis 0 innermost and unit-stride: dims[i] elements along
// axis i, strides[i - 1] bytes between neighbours along axis i (i >= 1; multiples of 16, each at
// least the span of the axes inside it), box[i] elements copied along axis i by one load (box[0] * 2
// <= 128 bytes). Shared-memory layout of a box: the 128-byte swizzle; out-of-bounds elements load as
// zeros. False where the driver has no TMA or declines the layout (the caller takes another path).
bool encode_bf16(CUtensorMap* map, const void* base, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box);
// The same for a float32 tensor (strides multiples of 16 bytes, box[0] * 4 <= 128 bytes): the maps of
// the TMA reductions into float32 accumulators (runtime/tma.cuh's reduce_add_3d).
bool encode_f32(CUtensorMap* map, const void* base, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box);

}  // namespace tma
}  // namespace engine
