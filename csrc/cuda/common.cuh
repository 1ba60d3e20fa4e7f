// Shared pieces of engine's CUDA kernels: dtypes, launch helpers, warp/block reductions and the
// strided-shape descriptor used by every kernel that broadcasts or permutes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime.h"

namespace engine {

// dtype codes shared with engine/backends/cuda.py (_CODE)
enum DType : int { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I64 = 4, I32 = 5, U8 = 6, BOOL = 7 };

inline const char* dtype_name(int d) {
    switch (d) {
        case F32: return "float32"; case F64: return "float64"; case F16: return "float16";
        case BF16: return "bfloat16"; case I64: return "int64"; case I32: return "int32";
        case U8: return "uint8"; case BOOL: return "bool";
    }
    return "?";
}

[[noreturn]] inline void unsupported(const char* op, int dtype) {
    throw std::runtime_error(std::string("cuda backend: op '") + op + "' does not support dtype " + dtype_name(dtype));
}

constexpr int kMaxDims = 8;

// An n-d iteration space (shape) and up to three operands' element strides over it; 0 strides
// broadcast. Dims are coalesced on the host side (Python) so ndim is usually 1-3.
struct Strided {
    int ndim;
    int64_t shape[kMaxDims];
    int64_t stride[3][kMaxDims];
};

inline unsigned int blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 16) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return static_cast<unsigned int>(b);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
