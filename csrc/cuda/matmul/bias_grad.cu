// The Linear layer's bias gradient: db (O,) = column sums of the output's gradient g (N, O), summed
// in float32 and written as g's dtype or as float32 (a bf16 g under autocast: the float32 master
// bias's gradient, without a cast). With the MLP's GELU, the same pass runs the GELU backward first
// (dpre = gelu'(pre) * g, written out for the weight and input gradients' GEMMs), so that bias
// gradient costs no pass of its own.
//
// A block is 8 warps x 32 lanes: lane l owns 16 bytes of columns (8 bf16 or 4 float32) of the
// block's column strip, warp w the rows w, w + 8, ... of the block's chunk of rows; a warp thus
// reads 512 contiguous bytes of a row. Lanes sum their rows in registers, the 8 warps' sums meet in
// shared memory, and sum_parts_kernel adds the chunks' (chunks, O) partials: no atomics, so the
// result does not depend on scheduling.
//
// For an FP8 layer (engine.fp8) the GELU pass also writes dpre's E5M2 codes, the input gradient
// GEMM's operand: the bf16 dpre scaled by meta's scale, with the amax and the meta's update of a
// delayed-scaling cast (fp8/fp8.cuh), so that cast costs no pass of its own either.
#include "fp8/fp8.cuh"
#include "runtime/common.cuh"
#include "matmul/matmul.h"

namespace engine {
namespace {

using bf16 = __nv_bfloat16;

template <typename T> struct alignas(16) Vec16 {
    static constexpr int n = 16 / sizeof(T);
    T v[n];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }

// part (chunks, O) float32; dpre, pre (N, O) only when GELU; dpre8 (N, O) E5M2, inv_scale (1,) and
// meta only when FP8 (bf16 GELU only)
template <typename T, bool GELU, bool FP8>
__global__ void __launch_bounds__(256) bias_grad_kernel(float* __restrict__ part, T* __restrict__ dpre,
                                                        const T* __restrict__ g, const T* __restrict__ pre,
                                                        int64_t N, int O, int64_t rows_per_chunk,
                                                        uint8_t* __restrict__ dpre8, float* __restrict__ inv_scale,
                                                        float* __restrict__ meta) {
    constexpr int V = Vec16<T>::n;
    __shared__ float acc[8][32 * V];
    __shared__ float amax_shared[8];
    const float scale = FP8 ? meta[0] : 1.f;
    float amax = 0.f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = (blockIdx.x * 32 + lane) * V;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0.f;
    if (col < O) {
#pragma unroll 4
        for (int64_t r = r0 + warp; r < r1; r += 8) {
            const int64_t at = r * O + col;
            Vec16<T> gv = *reinterpret_cast<const Vec16<T>*>(g + at);
            if constexpr (GELU) {
                Vec16<T> xv = *reinterpret_cast<const Vec16<T>*>(pre + at);
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    float d = to_float(gv.v[k]) * gelu_grad(to_float(xv.v[k]));
                    gv.v[k] = static_cast<T>(d);
                    sum[k] += d;
                }
                *reinterpret_cast<Vec16<T>*>(dpre + at) = gv;
                if constexpr (FP8) {  // the E5M2 codes of the bf16 values just stored
                    uint16_t q[V / 2];
#pragma unroll
                    for (int k = 0; k < V; k += 2) {
                        float d0 = to_float(gv.v[k]), d1 = to_float(gv.v[k + 1]);
                        amax = fmaxf(amax, fmaxf(fabsf(d0), fabsf(d1)));
                        q[k / 2] = fp8::to_fp8x2<FP8_E5M2>(d0 * scale, d1 * scale);
                    }
                    *reinterpret_cast<uint2*>(dpre8 + at) = make_uint2(q[0] | (uint32_t)q[1] << 16,
                                                                       q[2] | (uint32_t)q[3] << 16);
                }
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) sum[k] += to_float(gv.v[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) acc[warp][lane * V + k] = sum[k];
    __syncthreads();
    for (int c = threadIdx.x; c < 32 * V; c += 256) {
        const int oc = blockIdx.x * 32 * V + c;
        if (oc >= O) continue;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 8; ++w) s += acc[w][c];
        part[(int64_t)blockIdx.y * O + oc] = s;
    }
    if constexpr (FP8) {
        amax = fp8::block_amax(amax, amax_shared);
        if (threadIdx.x == 0)
            fp8::finish_block(meta, inv_scale, amax, scale, fp8::Limits<FP8_E5M2>::max, false);
    }
}

// db (O,) of DB (T, or float32)
template <typename T, typename DB>
void bias_grad_typed(int device, DB* db, T* dpre, const T* g, const T* pre, int64_t N, int64_t O,
                     uint8_t* dpre8 = nullptr, float* inv_scale = nullptr, float* meta = nullptr) {
    constexpr int V = Vec16<T>::n;
    cudaStream_t st = stream(device);
    const unsigned int strips = (unsigned int)ceil_div(O, 32 * V);
    // about 4 blocks per SM in all, each chunk at least 8 rows (one per warp)
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(ceil_div(N, 8), 4 * sm_count(device) / strips));
    const int64_t rows = ceil_div(N, chunks);
    std::size_t block = 0;
    float* part = (float*)device_alloc(sizeof(float) * chunks * O, device, &block);
    dim3 grid(strips, (unsigned int)chunks);
    if (dpre8) {
        if constexpr (sizeof(T) == 2)
            bias_grad_kernel<T, true, true><<<grid, 256, 0, st>>>(part, dpre, g, pre, N, (int)O, rows, dpre8,
                                                                  inv_scale, meta);
    } else if (pre) {
        bias_grad_kernel<T, true, false><<<grid, 256, 0, st>>>(part, dpre, g, pre, N, (int)O, rows, nullptr, nullptr,
                                                               nullptr);
    } else {
        bias_grad_kernel<T, false, false><<<grid, 256, 0, st>>>(part, nullptr, g, nullptr, N, (int)O, rows, nullptr,
                                                                nullptr, nullptr);
    }
    sum_parts_kernel<DB><<<(unsigned int)ceil_div(O, 32), dim3(32, 32), 0, st>>>(db, part, (int)chunks, (int)O);
    device_free(part, block, device);
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) % 16) == 0; }

}  // namespace

bool linear_bias_grad(int device, int dtype, void* db, void* dpre, const void* g, const void* pre, int64_t N,
                      int64_t O, int db_dtype, void* dpre8, float* inv_scale, float* meta) {
    const int V = dtype == BF16 ? 8 : 4;
    if ((dtype != F32 && dtype != BF16) || N == 0 || O == 0 || O % V != 0 || O > INT32_MAX) return false;
    if (db_dtype < 0) db_dtype = dtype;
    if (db_dtype != dtype && db_dtype != F32)
        throw std::invalid_argument(std::string("engine op 'bias_grad': db must be ") + dtype_name(dtype) +
                                    " (g's dtype) or float32, got " + dtype_name(db_dtype));
    if (!aligned16(g) || (pre && (!aligned16(pre) || !aligned16(dpre)))) return false;
    if (dpre8 && (dtype != BF16 || !pre || (reinterpret_cast<std::uintptr_t>(dpre8) % 8) != 0)) return false;
    use_device(device);
    if (dtype == F32)
        bias_grad_typed<float, float>(device, (float*)db, (float*)dpre, (const float*)g, (const float*)pre, N, O);
    else if (db_dtype == F32)
        bias_grad_typed<bf16, float>(device, (float*)db, (bf16*)dpre, (const bf16*)g, (const bf16*)pre, N, O,
                                     (uint8_t*)dpre8, inv_scale, meta);
    else bias_grad_typed<bf16, bf16>(device, (bf16*)db, (bf16*)dpre, (const bf16*)g, (const bf16*)pre, N, O,
                                     (uint8_t*)dpre8, inv_scale, meta);
    check_launch(pre ? "gelu_backward_bias_grad" : "bias_grad");
    return true;
}

}  // namespace engine
