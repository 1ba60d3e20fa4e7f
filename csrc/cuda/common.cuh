// Device-side helpers of engine's CUDA kernels: warp/block reductions, numeric limits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "types.h"

namespace engine {

// --- reductions inside a warp / block ---------------------------------------------------------

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T v, T* shared /* >= 32 */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T r = lane < nwarps ? shared[lane] : T(0);
    return warp_sum(r);
}

template <typename T>
__device__ T block_max(T v, T* shared, T lowest) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T r = lane < nwarps ? shared[lane] : lowest;
    return warp_max(r);
}

// --- numeric helpers ------------------------------------------------------------------------------

template <typename T> struct Num;
template <> struct Num<float> {
    __device__ static float lowest() { return -INFINITY; }
};
template <> struct Num<double> {
    __device__ static double lowest() { return -INFINITY; }
};
template <> struct Num<int64_t> {
    __device__ static int64_t lowest() { return INT64_MIN; }
};
template <> struct Num<int32_t> {
    __device__ static int32_t lowest() { return INT32_MIN; }
};
template <> struct Num<uint8_t> {
    __device__ static uint8_t lowest() { return 0; }
};

}  // namespace engine
