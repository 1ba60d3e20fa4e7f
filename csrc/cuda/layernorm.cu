// LayerNorm over the last axis, forward and backward (llm.c style: one warp per row).
#include <algorithm>

#include "common.cuh"
#include "ops.h"

namespace engine {
namespace {

// x (N, C) -> out (N, C), mean (N,), rstd (N,); w, b (C,) or null
__global__ void layernorm_forward_kernel(float* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, int64_t N, int C, float eps) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const float* xr = x + row * C;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += xr[c];
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        float d = xr[c] - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + eps);
    float* o = out + row * C;
    for (int c = lane; c < C; c += 32) {
        float y = (xr[c] - m) * r;
        if (w) y *= w[c];
        if (b) y += b[c];
        o[c] = y;
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dout (N, C) -> dx (N, C); per-block partial dw, db (gridDim.x, C) accumulated in shared memory
__global__ void layernorm_backward_kernel(float* __restrict__ dx, float* __restrict__ dw_part,
                                          float* __restrict__ db_part, const float* __restrict__ dout,
                                          const float* __restrict__ x, const float* __restrict__ w,
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
        const float* g = dout + row * C;
        const float* xr = x + row * C;
        float m = mean[row], r = rstd[row];
        float sum_g = 0.f, sum_gx = 0.f;
        for (int c = lane; c < C; c += 32) {
            float gw = w ? g[c] * w[c] : g[c];
            float xhat = (xr[c] - m) * r;
            sum_g += gw;
            sum_gx += gw * xhat;
        }
        float mean_g = warp_sum(sum_g) / C;
        float mean_gx = warp_sum(sum_gx) / C;
        float* d = dx + row * C;
        for (int c = lane; c < C; c += 32) {
            float gc = g[c];
            float gw = w ? gc * w[c] : gc;
            float xhat = (xr[c] - m) * r;
            d[c] = (gw - mean_g - xhat * mean_gx) * r;
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

}  // namespace

void layernorm_forward(int device, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
    if (N == 0) return;
    use_device(device);
    int warps = 8;
    layernorm_forward_kernel<<<(unsigned)ceil_div(N, warps), warps * 32, 0, stream(device)>>>(out, mean, rstd, x, w,
                                                                                              b, N, (int)C, eps);
    check_launch("layer_norm");
}

void layernorm_backward(int device, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
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
        check(cudaFuncSetAttribute(layernorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "layer_norm_backward");
    }
    float* part = nullptr;
    std::size_t block = 0;
    if (need_w) part = (float*)device_alloc(2 * sizeof(float) * blocks * C, device, &block);
    layernorm_backward_kernel<<<blocks, warps * 32, smem, st>>>(dx, need_w ? part : nullptr,
                                                               need_w ? part + blocks * C : nullptr, dout, x, w, mean,
                                                               rstd, N, (int)C);
    if (need_w) {
        unsigned int g = (unsigned int)ceil_div(C, 256);
        if (dw) sum_parts_kernel<<<g, 256, 0, st>>>(dw, part, blocks, (int)C);
        if (db) sum_parts_kernel<<<g, 256, 0, st>>>(db, part + blocks * C, blocks, (int)C);
        device_free(part, block, device);
    }
    check_launch("layer_norm_backward");
}

}  // namespace engine
