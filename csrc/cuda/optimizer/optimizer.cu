// Fused optimizer updates: one launch updates every parameter (up to 64 tensors per launch).
#include "runtime/multi_tensor.cuh"
#include "runtime/common.cuh"
#include "runtime/graph.h"
#include "optimizer/optimizer.h"

namespace engine {
namespace {

constexpr int64_t kChunk = 16384;

// One element of AdamW: decoupled weight decay, bias-corrected moments (the CPU reference's arithmetic)
struct AdamWStep {
    float beta1, beta2, eps, step_size, decay, inv_bc2;
    __device__ __forceinline__ void operator()(float& p, float g, float& m, float& v) const {
        const float pi = p * decay;
        m = beta1 * m + (1.0f - beta1) * g;
        v = beta2 * v + (1.0f - beta2) * g * g;
        p = pi - step_size * (m / (sqrtf(v * inv_bc2) + eps));
    }
};

// p, g, m, v: lists of float32 tensors. A block takes kChunk elements of the concatenated space, a
// tensor at a time (for_each_piece); a piece whose four rows are 16-byte aligned moves float4s.
__device__ __forceinline__ void adamw_body(const MultiTensor<4>& mt, int64_t total, float lr, float beta1, float beta2,
                                           float eps, float weight_decay, float bc1, float bc2) {
    const int64_t lo = (int64_t)blockIdx.x * kChunk, hi = min(total, lo + kChunk);
    const AdamWStep step{beta1, beta2, eps, lr / bc1, 1.0f - lr * weight_decay, 1.0f / bc2};
    for_each_piece(mt, lo, hi, [&](int t, int64_t first, int64_t n) {
        float* __restrict__ p = mt.ptr[0][t] + first;
        const float* __restrict__ g = mt.ptr[1][t] + first;
        float* __restrict__ m = mt.ptr[2][t] + first;
        float* __restrict__ v = mt.ptr[3][t] + first;
        int64_t done = 0;
        if (((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) | reinterpret_cast<uintptr_t>(m) |
              reinterpret_cast<uintptr_t>(v)) & 15) == 0) {
            done = n / 4 * 4;
            for (int64_t k = threadIdx.x; k < n / 4; k += blockDim.x) {
                float4 pk = reinterpret_cast<float4*>(p)[k], mk = reinterpret_cast<float4*>(m)[k];
                float4 vk = reinterpret_cast<float4*>(v)[k];
                const float4 gk = reinterpret_cast<const float4*>(g)[k];
                step(pk.x, gk.x, mk.x, vk.x);
                step(pk.y, gk.y, mk.y, vk.y);
                step(pk.z, gk.z, mk.z, vk.z);
                step(pk.w, gk.w, mk.w, vk.w);
                reinterpret_cast<float4*>(p)[k] = pk;
                reinterpret_cast<float4*>(m)[k] = mk;
                reinterpret_cast<float4*>(v)[k] = vk;
            }
        }
        for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) step(p[i], g[i], m[i], v[i]);
    });
}

__global__ void adamw_kernel(MultiTensor<4> mt, int64_t total, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bc1, float bc2) {
    adamw_body(mt, total, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
}

// lr and step read from device memory (one captured graph serves the whole schedule); the bias
// corrections in double, then rounded, exactly as the host path computes and passes them
__global__ void adamw_dev_kernel(MultiTensor<4> mt, int64_t total, const float* __restrict__ lr_ptr,
                                 const float* __restrict__ step_ptr, float beta1, float beta2, double beta1d,
                                 double beta2d, float eps, float weight_decay) {
    double step = (double)*step_ptr;
    float bc1 = (float)(1.0 - pow(beta1d, step));
    float bc2 = (float)(1.0 - pow(beta2d, step));
    adamw_body(mt, total, *lr_ptr, beta1, beta2, eps, weight_decay, bc1, bc2);
}

// PyTorch SGD: g += wd p; buf = first ? g : momentum buf + (1 - dampening) g; g = nesterov ? g + momentum buf : buf
__device__ __forceinline__ void sgd_body(const MultiTensor<3>& mt, int64_t total, float lr, float momentum,
                                         float dampening, bool nesterov, float weight_decay, bool first_step) {
    const int64_t lo = (int64_t)blockIdx.x * kChunk, hi = min(total, lo + kChunk);
    for_each_piece(mt, lo, hi, [&](int t, int64_t first, int64_t n) {
        float* p = mt.ptr[0][t] + first;
        const float* gr = mt.ptr[1][t] + first;
        float* buf = mt.ptr[2][t] + first;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float g = gr[i], pi = p[i];
            if (weight_decay != 0.f) g += weight_decay * pi;
            if (momentum != 0.f) {
                float b = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
                buf[i] = b;
                g = nesterov ? g + momentum * b : b;
            }
            p[i] = pi - lr * g;
        }
    });
}

__global__ void sgd_kernel(MultiTensor<3> mt, int64_t total, float lr, float momentum, float dampening, bool nesterov,
                           float weight_decay, bool first_step) {
    sgd_body(mt, total, lr, momentum, dampening, nesterov, weight_decay, first_step);
}

__global__ void sgd_dev_kernel(MultiTensor<3> mt, int64_t total, const float* __restrict__ lr_ptr, float momentum,
                               float dampening, bool nesterov, float weight_decay, bool first_step) {
    sgd_body(mt, total, *lr_ptr, momentum, dampening, nesterov, weight_decay, first_step);
}

// steps (G,): steps[i] += 1 where bit i of mask is set
__global__ void step_advance_kernel(float* steps, uint64_t mask) {
    for (int i = 0; i < 64; ++i)
        if ((mask >> i) & 1ull) steps[i] += 1.0f;
}

}  // namespace

void adamw(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& m,
           const std::vector<float*>& v, const std::vector<int64_t>& n, float lr, float beta1, float beta2, float eps,
           float weight_decay, float bc1, float bc2) {
    use_device(device);
    cudaStream_t st = stream(device);
    for_each_chunk<4>({&p, &g, &m, &v}, n, [&](const MultiTensor<4>& mt, int64_t total) {
        adamw_kernel<<<(unsigned)ceil_div(total, kChunk), 512, 0, st>>>(mt, total, lr, beta1, beta2, eps,
                                                                        weight_decay, bc1, bc2);
    });
    check_launch("adamw_");
}

void sgd(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& buf,
         const std::vector<int64_t>& n, float lr, float momentum, float dampening, bool nesterov, float weight_decay,
         bool first_step) {
    use_device(device);
    cudaStream_t st = stream(device);
    for_each_chunk<3>({&p, &g, &buf}, n, [&](const MultiTensor<3>& mt, int64_t total) {
        sgd_kernel<<<(unsigned)ceil_div(total, kChunk), 512, 0, st>>>(mt, total, lr, momentum, dampening, nesterov,
                                                                      weight_decay, first_step);
    });
    check_launch("sgd_");
}

void adamw_dev(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& m,
               const std::vector<float*>& v, const std::vector<int64_t>& n, const float* lr, const float* step,
               double beta1, double beta2, float eps, float weight_decay) {
    use_device(device);
    cudaStream_t st = stream(device);
    // moments in float; 1 - beta^step in double from the Python float of beta, as the host path
    for_each_chunk<4>({&p, &g, &m, &v}, n, [&](const MultiTensor<4>& mt, int64_t total) {
        adamw_dev_kernel<<<(unsigned)ceil_div(total, kChunk), 512, 0, st>>>(mt, total, lr, step, (float)beta1,
                                                                            (float)beta2, beta1, beta2, eps,
                                                                            weight_decay);
    });
    check_launch("adamw_");
}

void sgd_dev(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& buf,
             const std::vector<int64_t>& n, const float* lr, float momentum, float dampening, bool nesterov,
             float weight_decay, bool first_step) {
    use_device(device);
    cudaStream_t st = stream(device);
    for_each_chunk<3>({&p, &g, &buf}, n, [&](const MultiTensor<3>& mt, int64_t total) {
        sgd_dev_kernel<<<(unsigned)ceil_div(total, kChunk), 512, 0, st>>>(mt, total, lr, momentum, dampening,
                                                                          nesterov, weight_decay, first_step);
    });
    check_launch("sgd_");
}

void optim_step_advance(int device, float* steps, uint64_t mask) {
    if (mask == 0) return;
    use_device(device);
    step_advance_kernel<<<1, 1, 0, stream(device)>>>(steps, mask);
    check_launch("optimizer step count");
}

}  // namespace engine
