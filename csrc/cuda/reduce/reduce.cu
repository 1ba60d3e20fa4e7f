// Reductions: sum / max over a block of axes (x viewed as (outer, R, inner)), argmax over the last
// axis, and the multi-tensor sum of squares + in-place scale used by clip_grad_norm_.
#include <algorithm>

#include "copy/copy.h"  // fill
#include "reduce/reduce.h"
#include "runtime/common.cuh"
#include "runtime/multi_tensor.cuh"

namespace engine {
namespace {

constexpr int kTargetBlocks = 264;  // ~2 waves of blocks on an H100/H200 (132 SMs)

template <typename T> struct Acc { using type = T; };
template <> struct Acc<int32_t> { using type = int64_t; };
template <> struct Acc<__nv_bfloat16> { using type = float; };  // bf16 sums and maxima in float32

template <int OP, typename A>
__device__ __forceinline__ A combine(A a, A b) {
    if constexpr (OP == RSUM) return a + b;
    else return (b > a || b != b) ? b : a;  // NaN wins, as numpy's max
}

template <int OP, typename A>
__device__ __forceinline__ A identity() {
    if constexpr (OP == RSUM) return A(0);
    else return Num<A>::lowest();
}

// x (outer, R) -> out (outer, splits): one block per (row, split), block-wide reduce
template <int OP, typename T, typename A, typename O>
__global__ void reduce_rows_kernel(O* __restrict__ out, const T* __restrict__ x, int64_t R, int64_t chunk,
                                   int splits) {
    __shared__ A shared[32];
    int64_t row = blockIdx.x;
    int split = blockIdx.y;
    int64_t lo = split * chunk, hi = min(R, lo + chunk);
    const T* xr = x + row * R;
    A acc = identity<OP, A>();
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) acc = combine<OP, A>(acc, (A)xr[r]);
    // block reduce
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = combine<OP, A>(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) shared[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        acc = lane < nw ? shared[lane] : identity<OP, A>();
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc = combine<OP, A>(acc, __shfl_xor_sync(0xffffffffu, acc, o));
        if (lane == 0) out[row * splits + split] = (O)acc;
    }
}

// x (outer, R) with short rows -> out (outer,): one warp per row
template <int OP, typename T, typename A, typename O>
__global__ void reduce_rows_warp_kernel(O* __restrict__ out, const T* __restrict__ x, int64_t outer, int64_t R) {
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= outer) return;
    const T* xr = x + row * R;
    A acc = identity<OP, A>();
    for (int64_t r = lane; r < R; r += 32) acc = combine<OP, A>(acc, (A)xr[r]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = combine<OP, A>(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) out[row] = (O)acc;
}

// x (outer, R, inner) -> out (splits, outer, inner): block (32, 8) covers 32 inner columns,
// threadIdx.y strides over a chunk of R
template <int OP, typename T, typename A, typename O>
__global__ void reduce_cols_kernel(O* __restrict__ out, const T* __restrict__ x, int64_t outer, int64_t R,
                                   int64_t inner, int64_t chunk) {
    __shared__ A shared[8][33];
    int64_t i = (int64_t)blockIdx.x * 32 + threadIdx.x;
    int split = blockIdx.z;
    int64_t lo = split * chunk, hi = min(R, lo + chunk);
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {  // grid.y is capped at 65535
        A acc = identity<OP, A>();
        if (i < inner) {
            const T* xo = x + o * R * inner + i;
            const int64_t by = blockDim.y;
            int64_t r = lo + threadIdx.y;
            for (; r + 3 * by < hi; r += 4 * by) {  // 4 independent loads in flight per thread
                A v0 = (A)xo[r * inner], v1 = (A)xo[(r + by) * inner];
                A v2 = (A)xo[(r + 2 * by) * inner], v3 = (A)xo[(r + 3 * by) * inner];
                acc = combine<OP, A>(acc, combine<OP, A>(combine<OP, A>(v0, v1), combine<OP, A>(v2, v3)));
            }
            for (; r < hi; r += by) acc = combine<OP, A>(acc, (A)xo[r * inner]);
        }
        shared[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && i < inner) {
            for (int k = 1; k < (int)blockDim.y; ++k) acc = combine<OP, A>(acc, shared[k][threadIdx.x]);
            out[((int64_t)split * outer + o) * inner + i] = (O)acc;
        }
        __syncthreads();
    }
}

template <int OP, typename T>
void reduce_typed(int device, void* out, const void* x, int64_t outer, int64_t R, int64_t inner) {
    using A = typename Acc<T>::type;
    cudaStream_t st = stream(device);
    if (R == 0) {  // empty reduction: sum is 0 (max of nothing is rejected in Python)
        unsigned int grid = blocks_for(outer * inner, 256);
        fill(device, std::is_same_v<T, float> ? F32 : std::is_same_v<T, double> ? F64 :
                     std::is_same_v<T, int64_t> ? I64 : std::is_same_v<T, __nv_bfloat16> ? BF16 : I32,
             out, 0.0, outer * inner);
        (void)grid;
        return;
    }
    if (inner == 1) {
        if (R <= 1024 || outer >= kTargetBlocks * 4) {
            if (R <= 256) {
                int warps = 8;
                unsigned int grid = (unsigned int)ceil_div(outer, warps);
                reduce_rows_warp_kernel<OP, T, A, T><<<grid, warps * 32, 0, st>>>((T*)out, (const T*)x, outer, R);
            } else {
                reduce_rows_kernel<OP, T, A, T><<<dim3((unsigned)outer, 1), 256, 0, st>>>((T*)out, (const T*)x, R, R, 1);
            }
            return;
        }
        int splits = (int)std::min<int64_t>(ceil_div(kTargetBlocks, outer), ceil_div(R, 4096));
        splits = std::max(splits, 1);
        if (splits == 1) {
            reduce_rows_kernel<OP, T, A, T><<<dim3((unsigned)outer, 1), 512, 0, st>>>((T*)out, (const T*)x, R, R, 1);
            return;
        }
        int64_t chunk = ceil_div(R, splits);
        std::size_t block;
        A* partial = (A*)device_alloc(sizeof(A) * outer * splits, device, &block);
        reduce_rows_kernel<OP, T, A, A><<<dim3((unsigned)outer, splits), 512, 0, st>>>(partial, (const T*)x, R, chunk, splits);
        reduce_rows_warp_kernel<OP, A, A, T><<<(unsigned)ceil_div(outer, 8), 256, 0, st>>>((T*)out, partial, outer, splits);
        device_free(partial, block, device);
        return;
    }
    int64_t base = ceil_div(inner, 32) * outer;
    // enough (32 x 8)-thread blocks to fill the GPU (~8 per SM), each over at least 64 rows
    int splits = (int)std::min<int64_t>(std::max<int64_t>(1, 4 * kTargetBlocks / std::max<int64_t>(base, 1)),
                                        ceil_div(R, 64));
    splits = std::max(std::min(splits, 65535), 1);
    int64_t chunk = ceil_div(R, splits);
    dim3 grid((unsigned)ceil_div(inner, 32), (unsigned)std::min<int64_t>(outer, 65535), (unsigned)splits);
    if (splits == 1) {
        reduce_cols_kernel<OP, T, A, T><<<grid, dim3(32, 8), 0, st>>>((T*)out, (const T*)x, outer, R, inner, chunk);
        return;
    }
    std::size_t block;
    A* partial = (A*)device_alloc(sizeof(A) * splits * outer * inner, device, &block);
    reduce_cols_kernel<OP, T, A, A><<<grid, dim3(32, 8), 0, st>>>(partial, (const T*)x, outer, R, inner, chunk);
    // partial (splits, outer*inner) -> out (outer*inner)
    int64_t cols = outer * inner;
    reduce_cols_kernel<OP, A, A, T><<<dim3((unsigned)ceil_div(cols, 32), 1, 1), dim3(32, 8), 0, st>>>(
        (T*)out, partial, 1, splits, cols, splits);
    device_free(partial, block, device);
}

// x (rows, L) -> out (rows,) int64: index of the first maximum
template <typename T>
__global__ void argmax_kernel(int64_t* __restrict__ out, const T* __restrict__ x, int64_t L) {
    __shared__ T sv[32];
    __shared__ int64_t si[32];
    const T* xr = x + (int64_t)blockIdx.x * L;
    T best = Num<T>::lowest();
    int64_t bi = L;
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) {
        T v = xr[j];
        if (v > best || (bi == L)) { best = v; bi = j; }
    }
    // reduce (value desc, index asc)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        T ov = __shfl_xor_sync(0xffffffffu, best, o);
        int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        best = lane < nw ? sv[lane] : Num<T>::lowest();
        bi = lane < nw ? si[lane] : L;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            T ov = __shfl_xor_sync(0xffffffffu, best, o);
            int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if (lane == 0) out[blockIdx.x] = bi;
    }
}

// ---- multi-tensor -------------------------------------------------------------------------------

constexpr int64_t kChunk = 8192;

// sum of squares of all tensors' elements -> partial[blockIdx.x + base]
__global__ void sumsq_kernel(float* __restrict__ partial, MultiTensor<1> mt, int64_t total) {
    __shared__ float shared[32];
    float acc = 0.f;
    const int64_t lo = (int64_t)blockIdx.x * kChunk, hi = min(total, lo + kChunk);
    for_each_piece(mt, lo, hi, [&](int t, int64_t first, int64_t n) {
        const float* x = mt.ptr[0][t] + first;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i] * x[i];
    });
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = sum(partial[0:n])
__global__ void sum_partials_kernel(float* __restrict__ out, const float* __restrict__ partial, int64_t n) {
    __shared__ float shared[32];
    float acc = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) out[0] = acc;
}

// every element *= factor[0] (a device scalar: no host sync to read it)
__global__ void scale_kernel(MultiTensor<1> mt, int64_t total, const float* __restrict__ factor) {
    float f = *factor;
    const int64_t lo = (int64_t)blockIdx.x * kChunk, hi = min(total, lo + kChunk);
    for_each_piece(mt, lo, hi, [&](int t, int64_t first, int64_t n) {
        float* x = mt.ptr[0][t] + first;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] *= f;
    });
}

}  // namespace

void reduce(int device, int op, int dtype, void* out, const void* x, int64_t outer, int64_t R, int64_t inner) {
    if (outer * inner == 0) return;
    use_device(device);
#define ENGINE_REDUCE_DTYPES(OPC)                                                     \
    switch (dtype) {                                                                  \
        case F32: reduce_typed<OPC, float>(device, out, x, outer, R, inner); break;   \
        case F64: reduce_typed<OPC, double>(device, out, x, outer, R, inner); break;  \
        case I64: reduce_typed<OPC, int64_t>(device, out, x, outer, R, inner); break; \
        case I32: reduce_typed<OPC, int32_t>(device, out, x, outer, R, inner); break; \
        case BF16: reduce_typed<OPC, __nv_bfloat16>(device, out, x, outer, R, inner); break; \
        default: unsupported(OPC == RSUM ? "sum" : "max", dtype);                     \
    }
    if (op == RSUM) {
        ENGINE_REDUCE_DTYPES(RSUM)
    } else {
        ENGINE_REDUCE_DTYPES(RMAX)
    }
#undef ENGINE_REDUCE_DTYPES
    check_launch(op == RSUM ? "sum" : "max");
}

void argmax_lastdim(int device, int dtype, int64_t* out, const void* x, int64_t rows, int64_t L) {
    if (rows == 0) return;
    use_device(device);
    cudaStream_t st = stream(device);
    int threads = L >= 1024 ? 512 : 128;
    switch (dtype) {
        case F32: argmax_kernel<float><<<(unsigned)rows, threads, 0, st>>>(out, (const float*)x, L); break;
        case F64: argmax_kernel<double><<<(unsigned)rows, threads, 0, st>>>(out, (const double*)x, L); break;
        case I64: argmax_kernel<int64_t><<<(unsigned)rows, threads, 0, st>>>(out, (const int64_t*)x, L); break;
        case I32: argmax_kernel<int32_t><<<(unsigned)rows, threads, 0, st>>>(out, (const int32_t*)x, L); break;
        default: unsupported("argmax", dtype);
    }
    check_launch("argmax");
}

void sum_of_squares(int device, float* out, const std::vector<float*>& xs, const std::vector<int64_t>& ns) {
    use_device(device);
    cudaStream_t st = stream(device);
    int64_t nblocks = 0;
    for (size_t s = 0; s < ns.size(); s += kMultiTensorMax) {
        int64_t total = 0;
        for (size_t t = s; t < std::min(ns.size(), s + kMultiTensorMax); ++t) total += ns[t];
        nblocks += ceil_div(total, kChunk);
    }
    if (nblocks == 0) {
        fill(device, F32, out, 0.0, 1);
        return;
    }
    std::size_t block;
    float* partial = (float*)device_alloc(sizeof(float) * nblocks, device, &block);
    int64_t base = 0;
    for_each_chunk<1>({&xs}, ns, [&](const MultiTensor<1>& mt, int64_t total) {
        int64_t nb = ceil_div(total, kChunk);
        sumsq_kernel<<<(unsigned)nb, 256, 0, st>>>(partial + base, mt, total);
        base += nb;
    });
    sum_partials_kernel<<<1, 1024, 0, st>>>(out, partial, nblocks);
    device_free(partial, block, device);
    check_launch("sum_of_squares");
}

void scale_multi(int device, const std::vector<float*>& xs, const std::vector<int64_t>& ns, const float* factor) {
    use_device(device);
    cudaStream_t st = stream(device);
    for_each_chunk<1>({&xs}, ns, [&](const MultiTensor<1>& mt, int64_t total) {
        scale_kernel<<<(unsigned)ceil_div(total, kChunk), 256, 0, st>>>(mt, total, factor);
    });
    check_launch("scale_");
}

}  // namespace engine
