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
// shared memory, then adds it to dweight once. g (N, C) float32 or bf16, idx (N,) -> dweight (V, C) +=
template <typename T>
__global__ void embedding_backward_shared_kernel(float* __restrict__ dweight, const T* __restrict__ g,
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
            if (t >= 0 && t < V) atomicAdd(&acc[t * 32 + lane], (float)g[n * C + c]);
        }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V * 32; i += blockDim.x) {
        int64_t t = i / 32, cc = (int64_t)blockIdx.x * 32 + (i % 32);
        float v = acc[i];
        if (cc < C && v != 0.f) atomicAdd(&dweight[t * C + cc], v);
    }
}

// large vocabularies: contention is low, add straight into dweight
template <typename T>
__global__ void embedding_backward_atomic_kernel(float* __restrict__ dweight, const T* __restrict__ g,
                                                 const int64_t* __restrict__ idx, int64_t N, int64_t V, int64_t C) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = idx[n];
        if (t < 0 || t >= V) continue;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dweight[t * C + c], (float)g[n * C + c]);
    }
}

// position rows of a language model's input: g (B, T, C) -> dpos rows start..start+T-1 = sum over b
// of g[b] (float32 sums, no atomics, so deterministic)
template <typename T>
__global__ void positions_backward_kernel(float* __restrict__ dpos, const T* __restrict__ g, int64_t B,
                                          int64_t TC) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int64_t b = 0; b < B; ++b) s += (float)g[b * TC + i];
        dpos[i] = s;
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

template <typename T>
static void embedding_backward_launch(cudaStream_t st, float* dweight, const T* g, const int64_t* idx, int64_t N,
                                      int64_t V, int64_t C) {
    if (V <= 256) {
        int64_t col_blocks = ceil_div(C, 32);
        int64_t splits = std::max<int64_t>(1, std::min<int64_t>(264 / col_blocks + 1, ceil_div(N, 64)));
        int64_t per = ceil_div(N, splits);
        splits = ceil_div(N, per);
        std::size_t smem = V * 32 * sizeof(float);
        embedding_backward_shared_kernel<T><<<dim3((unsigned)col_blocks, (unsigned)splits), 256, smem, st>>>(
            dweight, g, idx, N, V, C, per);
    } else {
        unsigned int grid = (unsigned int)std::min<int64_t>(N, 65535 * 4);
        embedding_backward_atomic_kernel<T><<<grid, C >= 256 ? 256 : 64, 0, st>>>(dweight, g, idx, N, V, C);
    }
}

void embedding_backward(int device, int g_dtype, float* dweight, const void* g, const int64_t* idx, int64_t N,
                        int64_t V, int64_t C, bool accumulate) {
    use_device(device);
    if (!accumulate) fill(device, F32, dweight, 0.0, V * C);
    if (N == 0 || C == 0) return;
    cudaStream_t st = stream(device);
    if (g_dtype == F32)
        embedding_backward_launch(st, dweight, (const float*)g, idx, N, V, C);
    else if (g_dtype == BF16)
        embedding_backward_launch(st, dweight, (const __nv_bfloat16*)g, idx, N, V, C);
    else
        unsupported("embedding_backward", g_dtype);
    check_launch("embedding_backward");
}

void embedding_positions_backward(int device, int g_dtype, float* dweight, float* dpos, const void* g,
                                  const int64_t* idx, int64_t N, int64_t V, int64_t P, int64_t C, int T, int start,
                                  bool accumulate) {
    if (T <= 0 || N % T != 0) throw std::invalid_argument("embedding_positions_backward: N must be a multiple of T");
    embedding_backward(device, g_dtype, dweight, g, idx, N, V, C, accumulate);
    fill(device, F32, dpos, 0.0, P * C);
    if (N == 0 || C == 0) return;
    cudaStream_t st = stream(device);
    int64_t TC = (int64_t)T * C, B = N / T;
    unsigned int grid = (unsigned int)std::min<int64_t>(ceil_div(TC, 256), 65535);
    float* rows = dpos + (int64_t)start * C;
    if (g_dtype == F32)
        positions_backward_kernel<<<grid, 256, 0, st>>>(rows, (const float*)g, B, TC);
    else
        positions_backward_kernel<<<grid, 256, 0, st>>>(rows, (const __nv_bfloat16*)g, B, TC);
    check_launch("embedding_positions_backward");
}

}  // namespace engine
