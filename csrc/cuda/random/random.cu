// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011): element i of a draw uses
// counter (i / 4, offset) and key `seed`, so results depend only on (seed, offset, i).
// Inside a captured CUDA graph the seed is a kernel parameter baked at capture time, so the key
// also mixes in the device's random epoch (graph.h), which every replay advances: each replay
// draws new numbers. Outside a capture `epoch` is null and the key is the seed alone.
#include "runtime/common.cuh"
#include "runtime/graph.h"
#include "random/random.h"
#include "random/philox.cuh"

namespace engine {
namespace {

__device__ __forceinline__ float u01(uint32_t x) { return (x >> 8) * (1.0f / 16777216.0f); }  // [0, 1)

__device__ __forceinline__ uint4 draw(uint64_t group, uint64_t seed, uint64_t offset) {
    uint64_t ctr = group + offset / 4;
    return philox4x32_10(make_uint4((uint32_t)ctr, (uint32_t)(ctr >> 32), 0x5eedu, 0u),
                         philox_key(seed));
}

// out (n,) = 0 with probability p, else 1/(1-p)
template <typename T>
__global__ void dropout_mask_kernel(T* __restrict__ out, int64_t n, float p, T scale, uint64_t seed, uint64_t offset,
                                    const uint64_t* __restrict__ epoch) {
    seed = draw_key(seed, epoch);
    int64_t groups = (n + 3) / 4;
    for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < groups; gi += (int64_t)gridDim.x * blockDim.x) {
        uint4 r = draw(gi, seed, offset);
        uint32_t v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int64_t i = gi * 4 + k;
            if (i < n) out[i] = u01(v[k]) >= p ? scale : (T)0;
        }
    }
}

__global__ void uniform_kernel(float* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                               const uint64_t* __restrict__ epoch) {
    seed = draw_key(seed, epoch);
    int64_t groups = (n + 3) / 4;
    for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < groups; gi += (int64_t)gridDim.x * blockDim.x) {
        uint4 r = draw(gi, seed, offset);
        uint32_t v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (gi * 4 + k < n) out[gi * 4 + k] = u01(v[k]);
    }
}

// Box-Muller on pairs
__global__ void normal_kernel(float* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                              const uint64_t* __restrict__ epoch) {
    seed = draw_key(seed, epoch);
    int64_t groups = (n + 3) / 4;
    for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < groups; gi += (int64_t)gridDim.x * blockDim.x) {
        uint4 r = draw(gi, seed, offset);
        float u1 = 1.0f - u01(r.x), u2 = u01(r.y), u3 = 1.0f - u01(r.z), u4 = u01(r.w);
        float r1 = sqrtf(-2.0f * logf(u1)), r2 = sqrtf(-2.0f * logf(u3));
        float v[4] = {r1 * cospif(2.0f * u2), r1 * sinpif(2.0f * u2), r2 * cospif(2.0f * u4), r2 * sinpif(2.0f * u4)};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (gi * 4 + k < n) out[gi * 4 + k] = v[k];
    }
}

__global__ void epoch_advance_kernel(uint64_t* epoch) { *epoch += 1; }

}  // namespace

void rng_epoch_advance(int device, uint64_t* epoch) {
    use_device(device);
    epoch_advance_kernel<<<1, 1, 0, stream(device)>>>(epoch);
    check_launch("graph rng epoch");
}

void dropout_mask(int device, int dtype, void* out, int64_t n, float p, uint64_t seed, uint64_t offset) {
    if (n == 0) return;
    use_device(device);
    unsigned int grid = blocks_for((n + 3) / 4, 256);
    cudaStream_t st = stream(device);
    const uint64_t* epoch = capture_rng_epoch(device);
    if (dtype == F32)
        dropout_mask_kernel<float><<<grid, 256, 0, st>>>((float*)out, n, p, 1.0f / (1.0f - p), seed, offset, epoch);
    else if (dtype == F64)
        dropout_mask_kernel<double><<<grid, 256, 0, st>>>((double*)out, n, p, 1.0 / (1.0 - (double)p), seed, offset,
                                                          epoch);
    else
        unsupported("dropout_mask", dtype);
    check_launch("dropout_mask");
}

void random_uniform(int device, float* out, int64_t n, uint64_t seed, uint64_t offset) {
    if (n == 0) return;
    use_device(device);
    uniform_kernel<<<blocks_for((n + 3) / 4, 256), 256, 0, stream(device)>>>(out, n, seed, offset,
                                                                              capture_rng_epoch(device));
    check_launch("rand");
}

void random_normal(int device, float* out, int64_t n, uint64_t seed, uint64_t offset) {
    if (n == 0) return;
    use_device(device);
    normal_kernel<<<blocks_for((n + 3) / 4, 256), 256, 0, stream(device)>>>(out, n, seed, offset,
                                                                             capture_rng_epoch(device));
    check_launch("randn");
}

}  // namespace engine
