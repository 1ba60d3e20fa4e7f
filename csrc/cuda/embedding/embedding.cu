// Embedding lookup and its backward (scatter-add of rows; a token seen twice gets both gradients).
#include <algorithm>
#include <stdexcept>

#include "copy/copy.h"  // fill
#include "embedding/embedding.h"
#include "runtime/common.cuh"

namespace engine {
namespace {

// weight (V, C), idx (N,) -> out (N, C); an out-of-range index gives a NaN row (no host sync to raise)
template <typename T>
__global__ void embedding_forward_kernel(T* __restrict__ out, const T* __restrict__ weight,
                                         const int64_t* __restrict__ idx, int64_t N, int64_t V, int64_t C) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = idx[n];
        T* o = out + n * C;
        if (t < 0 || t >= V) {
            for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (T)NAN;
            continue;
        }
        const T* w = weight + t * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = w[c];
    }
}

// A language model's input: out (N, C) = weight[idx[n]] + pos[start + n % T] for idx (B, T) flattened
// (N = B * T), float32 tables, out float32 or bf16 (autocast's: the sum rounded once). One kernel where
// two lookups, two casts and a broadcasting add ran. An out-of-range token gives a NaN row.
template <typename Tout>
__global__ void embedding_positions_kernel(Tout* __restrict__ out, const float* __restrict__ weight,
                                           const float* __restrict__ pos, const int64_t* __restrict__ idx,
                                           int64_t N, int64_t V, int64_t C, int T, int start) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = idx[n];
        Tout* o = out + n * C;
        const float* p = pos + (int64_t)(start + (int)(n % T)) * C;
        if (t < 0 || t >= V) {
            for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (Tout)NAN;
            continue;
        }
        const float* w = weight + t * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (Tout)(w[c] + p[c]);
    }
}

// small vocabularies: a block owns 32 columns and a slice of the tokens, accumulates (V, 32) in
// shared memory, then adds it to dweight once. g (N, C), idx (N,) -> dweight (V, C) +=
__global__ void embedding_backward_shared_kernel(float* __restrict__ dweight, const float* __restrict__ g,
                                                 const int64_t* __restrict__ idx, int64_t N, int64_t V, int64_t C,
                                                 int64_t tokens_per_block) {
    extern __shared__ float acc[];  // (V, 32)
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int64_t c = (int64_t)blockIdx.x * 32 + lane;
    for (int64_t i = threadIdx.x; i < V * 32; i += blockDim.x) acc[i] = 0.f;
    __syncthreads();
    int64_t lo = (int64_t)blockIdx.y * tokens_per_block, hi = min(N, lo + tokens_per_block);
    if (c < C)
        for (int64_t n = lo + warp; n < hi; n += warps) {
            int64_t t = idx[n];
            if (t >= 0 && t < V) atomicAdd(&acc[t * 32 + lane], g[n * C + c]);
        }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V * 32; i += blockDim.x) {
        int64_t t = i / 32, cc = (int64_t)blockIdx.x * 32 + (i % 32);
        float v = acc[i];
        if (cc < C && v != 0.f) atomicAdd(&dweight[t * C + cc], v);
    }
}

// large vocabularies: contention is low, add straight into dweight
__global__ void embedding_backward_atomic_kernel(float* __restrict__ dweight, const float* __restrict__ g,
                                                 const int64_t* __restrict__ idx, int64_t N, int64_t V, int64_t C) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = idx[n];
        if (t < 0 || t >= V) continue;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dweight[t * C + c], g[n * C + c]);
    }
}

}  // namespace

void embedding_forward(int device, int dtype, void* out, const void* weight, const int64_t* idx, int64_t N, int64_t V,
                       int64_t C) {
    if (N == 0 || C == 0) return;
    use_device(device);
    unsigned int grid = (unsigned int)std::min<int64_t>(N, 65535 * 4);
    int threads = C >= 256 ? 256 : 64;
    cudaStream_t st = stream(device);
    if (dtype == F32)
        embedding_forward_kernel<float><<<grid, threads, 0, st>>>((float*)out, (const float*)weight, idx, N, V, C);
    else if (dtype == F64)
        embedding_forward_kernel<double><<<grid, threads, 0, st>>>((double*)out, (const double*)weight, idx, N, V, C);
    else
        unsupported("embedding", dtype);
    check_launch("embedding");
}

void embedding_positions_forward(int device, int out_dtype, void* out, const float* weight, const float* pos,
                                 const int64_t* idx, int64_t N, int64_t V, int64_t C, int T, int start) {
    if (N == 0 || C == 0) return;
    if (T <= 0 || N % T != 0) throw std::invalid_argument("embedding_positions: N must be a multiple of T");
    use_device(device);
    unsigned int grid = (unsigned int)std::min<int64_t>(N, 65535 * 4);
    int threads = C >= 256 ? 256 : 64;
    cudaStream_t st = stream(device);
    if (out_dtype == F32)
        embedding_positions_kernel<float><<<grid, threads, 0, st>>>((float*)out, weight, pos, idx, N, V, C, T, start);
    else if (out_dtype == BF16)
        embedding_positions_kernel<__nv_bfloat16><<<grid, threads, 0, st>>>((__nv_bfloat16*)out, weight, pos, idx, N,
                                                                            V, C, T, start);
    else
        unsupported("embedding_positions", out_dtype);
    check_launch("embedding_positions");
}

void embedding_backward(int device, float* dweight, const float* g, const int64_t* idx, int64_t N, int64_t V,
                        int64_t C) {
    use_device(device);
    fill(device, F32, dweight, 0.0, V * C);
    if (N == 0 || C == 0) return;
    cudaStream_t st = stream(device);
    if (V <= 256) {
        int64_t col_blocks = ceil_div(C, 32);
        int64_t splits = std::max<int64_t>(1, std::min<int64_t>(264 / col_blocks + 1, ceil_div(N, 64)));
        int64_t per = ceil_div(N, splits);
        splits = ceil_div(N, per);
        std::size_t smem = V * 32 * sizeof(float);
        embedding_backward_shared_kernel<<<dim3((unsigned)col_blocks, (unsigned)splits), 256, smem, st>>>(
            dweight, g, idx, N, V, C, per);
    } else {
        unsigned int grid = (unsigned int)std::min<int64_t>(N, 65535 * 4);
        embedding_backward_atomic_kernel<<<grid, C >= 256 ? 256 : 64, 0, st>>>(dweight, g, idx, N, V, C);
    }
    check_launch("embedding_backward");
}

}  // namespace engine
