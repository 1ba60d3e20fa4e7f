// LayerNorm over the last axis, forward and backward (llm.c style: one warp per row).
#include <algorithm>

#include "common.cuh"
#include "fused.h"
#include "ops.h"

namespace engine {
namespace {

__device__ __forceinline__ float ldf(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stf(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// x (N, C) -> out (N, C), mean (N,), rstd (N,); w, b (C,) or null. T: float or bf16 (statistics,
// weights and arithmetic in float32)
template <typename T>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, int64_t N, int C, float eps) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* xr = x + row * C;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += ldf(xr, c);
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        float d = ldf(xr, c) - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + eps);
    T* o = out + row * C;
    for (int c = lane; c < C; c += 32) {
        float y = (ldf(xr, c) - m) * r;
        if (w) y *= w[c];
        if (b) y += b[c];
        stf(o, c, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dout (N, C) -> dx (N, C); per-block partial dw, db (gridDim.x, C) accumulated in shared memory
template <typename T>
__global__ void layernorm_backward_kernel(T* __restrict__ dx, float* __restrict__ dw_part,
                                          float* __restrict__ db_part, const T* __restrict__ dout,
                                          const T* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ mean, const float* __restrict__ rstd, int64_t N,
                                          int C) {
    extern __shared__ float smem[];  // dw (C), db (C)
    float* sdw = smem;
    float* sdb = smem + C;
    bool need_w = dw_part != nullptr;
    if (need_w)
        for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) smem[c] = 0.f;
    __syncthreads();
    int lane = threadIdx.x & 31;
    int warps = blockDim.x >> 5;
    for (int64_t row = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += (int64_t)gridDim.x * warps) {
        const T* g = dout + row * C;
        const T* xr = x + row * C;
        float m = mean[row], r = rstd[row];
        float sum_g = 0.f, sum_gx = 0.f;
        for (int c = lane; c < C; c += 32) {
            float gc = ldf(g, c);
            float gw = w ? gc * w[c] : gc;
            float xhat = (ldf(xr, c) - m) * r;
            sum_g += gw;
            sum_gx += gw * xhat;
        }
        float mean_g = warp_sum(sum_g) / C;
        float mean_gx = warp_sum(sum_gx) / C;
        T* d = dx + row * C;
        for (int c = lane; c < C; c += 32) {
            float gc = ldf(g, c);
            float gw = w ? gc * w[c] : gc;
            float xhat = (ldf(xr, c) - m) * r;
            stf(d, c, (gw - mean_g - xhat * mean_gx) * r);
            if (need_w) {
                atomicAdd(&sdw[c], gc * xhat);
                atomicAdd(&sdb[c], gc);
            }
        }
    }
    __syncthreads();
    if (need_w)
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            dw_part[(int64_t)blockIdx.x * C + c] = sdw[c];
            db_part[(int64_t)blockIdx.x * C + c] = sdb[c];
        }
}

// part (P, C) -> out (C,): column sums
__global__ void sum_parts_kernel(float* __restrict__ out, const float* __restrict__ part, int P, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int p = 0; p < P; ++p) s += part[(int64_t)p * C + c];
    out[c] = s;
}

template <typename T>
void layernorm_forward_typed(int device, T* out, float* mean, float* rstd, const T* x, const float* w,
                             const float* b, int64_t N, int64_t C, float eps) {
    if (N == 0) return;
    use_device(device);
    int warps = 8;
    layernorm_forward_kernel<T><<<(unsigned)ceil_div(N, warps), warps * 32, 0, stream(device)>>>(out, mean, rstd, x, w,
                                                                                                 b, N, (int)C, eps);
    check_launch("layer_norm");
}

template <typename T>
void layernorm_backward_typed(int device, T* dx, float* dw, float* db, const T* dout, const T* x, const float* w,
                              const float* mean, const float* rstd, int64_t N, int64_t C) {
    use_device(device);
    cudaStream_t st = stream(device);
    bool need_w = dw != nullptr || db != nullptr;
    if (N == 0) {
        if (dw) fill(device, F32, dw, 0.0, C);
        if (db) fill(device, F32, db, 0.0, C);
        return;
    }
    int warps = 8;
    int blocks = (int)std::min<int64_t>(ceil_div(N, warps), 264);
    std::size_t smem = need_w ? 2 * C * sizeof(float) : 0;
    if (smem > 48 * 1024) {
        check(cudaFuncSetAttribute(layernorm_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "layer_norm_backward");
    }
    float* part = nullptr;
    std::size_t block = 0;
    if (need_w) part = (float*)device_alloc(2 * sizeof(float) * blocks * C, device, &block);
    layernorm_backward_kernel<T><<<blocks, warps * 32, smem, st>>>(dx, need_w ? part : nullptr,
                                                                  need_w ? part + blocks * C : nullptr, dout, x, w,
                                                                  mean, rstd, N, (int)C);
    if (need_w) {
        unsigned int g = (unsigned int)ceil_div(C, 256);
        if (dw) sum_parts_kernel<<<g, 256, 0, st>>>(dw, part, blocks, (int)C);
        if (db) sum_parts_kernel<<<g, 256, 0, st>>>(db, part + blocks * C, blocks, (int)C);
        device_free(part, block, device);
    }
    check_launch("layer_norm_backward");
}

}  // namespace

void layernorm_forward(int device, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
    layernorm_forward_typed<float>(device, out, mean, rstd, x, w, b, N, C, eps);
}

void layernorm_backward(int device, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
    layernorm_backward_typed<float>(device, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

void layernorm_forward_dt(int device, int dtype, void* out, float* mean, float* rstd, const void* x, const float* w,
                          const float* b, int64_t N, int64_t C, float eps) {
    if (dtype == F32) layernorm_forward_typed<float>(device, (float*)out, mean, rstd, (const float*)x, w, b, N, C, eps);
    else if (dtype == BF16)
        layernorm_forward_typed<__nv_bfloat16>(device, (__nv_bfloat16*)out, mean, rstd, (const __nv_bfloat16*)x, w, b,
                                               N, C, eps);
    else unsupported("layer_norm", dtype);
}

void layernorm_backward_dt(int device, int dtype, void* dx, float* dw, float* db, const void* dout, const void* x,
                           const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
    if (dtype == F32)
        layernorm_backward_typed<float>(device, (float*)dx, dw, db, (const float*)dout, (const float*)x, w, mean, rstd,
                                        N, C);
    else if (dtype == BF16)
        layernorm_backward_typed<__nv_bfloat16>(device, (__nv_bfloat16*)dx, dw, db, (const __nv_bfloat16*)dout,
                                                (const __nv_bfloat16*)x, w, mean, rstd, N, C);
    else unsupported("layer_norm_backward", dtype);
}

}  // namespace engine
