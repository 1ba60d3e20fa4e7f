// Device-side FP8 helpers shared by the kernels that write FP8 (fp8/cast.cu, and the GELU backward in
// matmul/bias_grad.cu, which writes the gradient's E5M2 copy as it goes): the formats' limits, the
// conversions (round to nearest even, saturating), the block's amax and the last block's update of
// the meta (fp8.h says what the meta holds).
#pragma once
#include <cuda_fp8.h>

#include "fp8/fp8.h"
#include "runtime/common.cuh"

namespace engine {
namespace fp8 {

constexpr int kThreads = 256;  // the FP8-writing kernels' block size

template <int FMT> struct Limits;
template <> struct Limits<FP8_E4M3> {
    static constexpr float max = 448.f;
    static constexpr __nv_fp8_interpretation_t kind = __NV_E4M3;
};
template <> struct Limits<FP8_E5M2> {
    static constexpr float max = 57344.f;
    static constexpr __nv_fp8_interpretation_t kind = __NV_E5M2;
};

template <int FMT> __device__ __forceinline__ uint8_t to_fp8(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, Limits<FMT>::kind);
}
template <int FMT> __device__ __forceinline__ uint16_t to_fp8x2(float a, float b) {
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, Limits<FMT>::kind);
}

// the block's max |x| (every thread passes its own; kThreads threads in any shape); thread 0 gets it
__device__ __forceinline__ float block_amax(float v, float* shared /* kThreads / 32 */) {
    const int tid = threadIdx.x + threadIdx.y * blockDim.x, lane = tid & 31, warp = tid >> 5;
    v = warp_max(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = lane < kThreads / 32 ? shared[lane] : 0.f;
    return warp_max(r);
}

// After the block's elements, from its thread 0: add its amax to meta[1] (unless a first pass put the
// whole tensor's there: `current`), and in the last block of the grid to finish (a counter after a
// fence, the CUDA programming guide's threadFenceReduction pattern) write inv_scale = 1 / scale, push
// the tensor's amax into the history and set the next scale, fp8_max / max(history).
__device__ inline void finish_block(float* meta, float* inv_scale, float amax, float scale, float fmax, bool current) {
    unsigned int* words = reinterpret_cast<unsigned int*>(meta);
    if (!current) atomicMax(reinterpret_cast<int*>(meta + 1), __float_as_int(amax));  // amax >= 0: bits order
    __threadfence();
    const unsigned int blocks = gridDim.x * gridDim.y;
    if (atomicAdd(words + 2, 1u) != blocks - 1) return;
    float total = __int_as_float(atomicExch(reinterpret_cast<int*>(meta + 1), 0));
    *inv_scale = 1.f / scale;
    float* history = meta + 4;
    if (isfinite(total)) {
        for (int i = 15; i > 0; --i) history[i] = history[i - 1];
        history[0] = total;
    }
    float m = 0.f;
    for (int i = 0; i < 16; ++i) m = fmaxf(m, history[i]);
    if (m > 0.f) meta[0] = fmax / m;
    atomicExch(words + 2, 0u);
}

}  // namespace fp8
}  // namespace engine
