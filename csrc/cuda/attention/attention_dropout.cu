// The attention dropout mask as a tensor (the unfused path and the tests) and the draw key a fused
// forward would write: the same rule (attention_dropout.cuh) as the fused kernels.
#include "attention/attention.h"
#include "attention/attention_dropout.cuh"
#include "runtime/common.cuh"
#include "runtime/graph.h"

namespace engine {
namespace {

// out (BH, T, S) float32 = Z: 0 where dropped, rule.scale where kept. One thread per (bh, query, 8
// keys). The key is *key_buf (what a forward wrote) or, when key_buf is null, the seed itself.
__global__ void attention_dropout_mask_kernel(float* __restrict__ out, int64_t BH, int Tq, int S, DropoutRule rule,
                                              uint64_t seed, const uint64_t* __restrict__ key_buf) {
    uint2 key = philox_key(key_buf != nullptr ? *key_buf : seed);
    int S8 = (S + 7) / 8;
    int64_t n = BH * Tq * S8;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int k8 = (int)(i % S8);
        int64_t row = i / S8;  // bh * Tq + qi
        uint32_t keep = keep8(key, (uint32_t)(row / Tq), (uint32_t)(row % Tq), (uint32_t)k8, rule.threshold);
        float* o = out + row * S + k8 * 8;
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (k8 * 8 + j < S) o[j] = (keep >> j) & 1u ? rule.scale : 0.f;
    }
}

// *key_out = the draw key of `seed` (mixed with the graph epoch while capturing): what a fused
// forward writes, for the unfused path (engine/backends/cuda/) that materialises the mask
__global__ void attention_rng_key_kernel(uint64_t* key_out, uint64_t seed, const uint64_t* epoch) {
    *key_out = draw_key(seed, epoch);
}

}  // namespace

void attention_dropout_mask(int device, float* out, int64_t BH, int T_, int S, float p, uint64_t seed,
                            const uint64_t* rng_key) {
    DropoutRule rule = dropout_rule("attention_dropout_mask", p);
    if (BH * T_ * S == 0) return;
    use_device(device);
    int64_t groups = BH * T_ * ((S + 7) / 8);
    attention_dropout_mask_kernel<<<blocks_for(groups, 256), 256, 0, stream(device)>>>(out, BH, T_, S, rule, seed,
                                                                                        rng_key);
    check_launch("attention_dropout_mask");
}

void attention_rng_key(int device, uint64_t* rng_key, uint64_t seed) {
    use_device(device);
    attention_rng_key_kernel<<<1, 1, 0, stream(device)>>>(rng_key, seed, capture_rng_epoch(device));
    check_launch("attention_rng_key");
}

}  // namespace engine
