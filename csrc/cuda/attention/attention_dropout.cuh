// Dropout of the fused attention: which probabilities are kept (the Philox rule, keep8) and the
// host-side rule of a drop probability (threshold, scale). Shared by the WMMA kernels
// (attention_wmma.cuh) and the mask / key kernels (attention_dropout.cu), so they agree by
// construction; engine/backends/philox.py is the numpy twin.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "random/philox.cuh"

namespace engine {
namespace {

constexpr uint32_t kAttnStream = 0xA77Eu;  // counter word 3: apart from random.cu's streams

// keep iff a 16-bit Philox lane >= threshold; a kept probability is multiplied by scale
struct DropoutRule {
    uint32_t threshold;  // round(p * 65536), at most 65535
    float scale;         // 1 / (1 - p)
};

// Bit j: keep key 8 * k8 + j of query qi in head bh (bh = b * H + h). One Philox call, counter
// (k8, qi, bh, stream), gives 8 16-bit lanes: lane 2w is the low half of word w, 2w + 1 the high
// half. The one rule of the forward, the backward and the mask kernel (numpy twin:
// engine/backends/philox.py, attention_keep), so all of them agree by construction.
__device__ __forceinline__ uint32_t keep8(uint2 key, uint32_t bh, uint32_t qi, uint32_t k8, uint32_t threshold) {
    uint4 r = philox4x32_10(make_uint4(k8, qi, bh, kAttnStream), key);
    uint32_t w[4] = {r.x, r.y, r.z, r.w};
    uint32_t bits = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        bits |= (uint32_t)((w[i] & 0xFFFFu) >= threshold) << (2 * i);
        bits |= (uint32_t)((w[i] >> 16) >= threshold) << (2 * i + 1);
    }
    return bits;
}

// the rule of drop probability p: threshold round(p * 65536) (at most 65535), scale 1 / (1 - p)
DropoutRule dropout_rule(const char* op, float p) {
    if (!(p >= 0.f && p < 1.f))
        throw std::runtime_error(std::string(op) + ": dropout_p must be in [0, 1), got " + std::to_string(p));
    double t = std::floor((double)p * 65536.0 + 0.5);
    return DropoutRule{(uint32_t)std::min(t, 65535.0), 1.0f / (1.0f - p)};
}

}  // namespace
}  // namespace engine
