// Device-side helpers of engine's CUDA kernels: warp/block reductions, numeric limits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime/types.h"

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

// part (P, C) float32 -> out (C,) of T: column sums of per-block partials (layer-norm weight and bias
// gradients, Linear bias gradients). Block (32, 32): columns 32 blockIdx.x + 0..31, each summed by 32 threads
// (rows y, y + 32, ...) and then across them in shared memory
template <typename T>
__device__ __forceinline__ void sum_parts(T* __restrict__ out, const float* __restrict__ part, int P, int C) {
    __shared__ float acc[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < C)
#pragma unroll 4
        for (int p = threadIdx.y; p < P; p += 32) s += part[(int64_t)p * C + c];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.f;
#pragma unroll 8
        for (int y = 0; y < 32; ++y) total += acc[y][threadIdx.x];
        out[c] = static_cast<T>(total);
    }
}
template <typename T>  // the same as a kernel: a grid of ceil(C / 32) blocks
__global__ void sum_parts_kernel(T* __restrict__ out, const float* __restrict__ part, int P, int C) {
    sum_parts(out, part, P, C);
}

// --- numeric helpers ------------------------------------------------------------------------------

// 16 bytes of T as floats and back: kVec<T> = 8 bf16 or 4 float32 (the row kernels' uint4 accesses)
template <typename T> constexpr int kVec = 16 / (int)sizeof(T);
__device__ __forceinline__ void unpack(float (&f)[4], uint4 u) {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack(float (&f)[8], uint4 u) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ uint4 pack(const float (&f)[4]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
__device__ __forceinline__ uint4 pack(const float (&f)[8]) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}

// d gelu_tanh(x) / dx in float32 (the GELU backward of the bf16 and fused kernels):
// 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2) with t = tanh(u), u = c (x + a x^3). Through
// e = exp(2 u) and s = 1 / (1 + e): 1 + t = 2 e s and 1 - t^2 = 4 e s^2, so it is
// e s (1 + 2 x s c (1 + 3 a x^2)): one exponential and one reciprocal, with no cancellation where t
// is near -1 (tanhf costs about 20 instructions and a branch a value). 2 u is capped at 80, where e
// is still finite and e s is 1 to float32.
__device__ __forceinline__ float gelu_grad(float x) {
    const float c = 0.7978845608028654f, a = 0.044715f;
    const float x2 = x * x;
    const float e = __expf(fminf(2.f * c * x * (1.f + a * x2), 80.f));
    const float s = __fdividef(1.f, 1.f + e);
    return e * s * (1.f + 2.f * x * s * c * (1.f + 3.f * a * x2));
}

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
