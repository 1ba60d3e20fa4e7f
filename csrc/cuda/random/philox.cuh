// Counter-based random bits shared by random.cu (dropout masks, rand, randn) and attention.cu
// (attention dropout): Philox4x32-10 (Salmon et al. 2011) and the graph-aware draw key.
// engine/backends/philox.py is the numpy twin of this file; both must stay bit-identical.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace engine {

// 4 x 32 random bits of counter c under key k (Random123's philox4x32_10; its known-answer vectors
// are checked in tests/engine/test_attention_dropout.py against the numpy twin)
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        uint32_t hi0 = __umulhi(M0, c.x), lo0 = M0 * c.x;
        uint32_t hi1 = __umulhi(M1, c.z), lo1 = M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += W0;
        k.y += W1;
    }
    return c;
}

__device__ __forceinline__ uint2 philox_key(uint64_t key) { return make_uint2((uint32_t)key, (uint32_t)(key >> 32)); }

// The Philox key of a draw: the seed, moved along by the graph epoch when replaying a capture
// (graph.h: inside a captured graph the seed is a baked kernel parameter, the epoch advances on
// every replay). Outside a capture `epoch` is null and the key is the seed alone.
__device__ __forceinline__ uint64_t draw_key(uint64_t seed, const uint64_t* epoch) {
    return epoch == nullptr ? seed : seed + *epoch * 0x9E3779B97F4A7C15ull;
}

}  // namespace engine
