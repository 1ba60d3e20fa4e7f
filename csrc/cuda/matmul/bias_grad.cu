// The Linear layer's bias gradient: db (O,) = column sums of the output's gradient g (N, O), summed
// in float32 and written as g's dtype or as float32 (a bf16 g under autocast: the float32 master
// bias's gradient, without a cast). With the MLP's GELU, the same pass runs the GELU backward first
// (dpre = gelu'(pre) * g, written out for the weight and input gradients' GEMMs), so that bias
// gradient costs no pass of its own.
//
// A block is 8 warps x 32 lanes: lane l owns 16 bytes of columns (8 bf16 or 4 float32) of the
// block's column strip, each warp some rows of the block's chunk of rows; a warp thus reads 512
// contiguous bytes of a row. Lanes sum their rows in registers, the 8 warps' sums meet in shared
// memory, and sum_parts_kernel adds the chunks' (chunks, O) partials: no atomics, so the result does
// not depend on scheduling.
//
// For an FP8 layer (engine.fp8) bias_grad_fp8_kernel also writes the E5M2 codes of the GEMMs' operand
// d (dpre after the GELU, g itself without): d scaled by meta's scale, with the amax and the meta's
// update of a delayed-scaling cast (fp8/fp8.cuh), row-major for dx's GEMM and, where asked, transposed
// for dW's; with both, the bf16 dpre need not be written at all. So that cast costs no pass of its
// own, and g is read once for its bias sums and its codes.
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

// The block's column sums: each lane's V sums -> part[blockIdx.y] (O,), through shared memory.
template <int V>
__device__ __forceinline__ void write_block_sums(float* part, const float* sum, float (*acc)[32 * V], int O) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
}

// part (chunks, O) float32; dpre, pre (N, O) only when GELU. Warp w takes the rows w, w + 8, ...
template <typename T, bool GELU>
__global__ void __launch_bounds__(256) bias_grad_kernel(float* __restrict__ part, T* __restrict__ dpre,
                                                        const T* __restrict__ g, const T* __restrict__ pre,
                                                        int64_t N, int O, int64_t rows_per_chunk) {
    constexpr int V = Vec16<T>::n;
    __shared__ float acc[8][32 * V];
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
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) sum[k] += to_float(gv.v[k]);
            }
        }
    }
    write_block_sums<V>(part, sum, acc, O);
}

__device__ __forceinline__ void swap(uint32_t& a, uint32_t& b) {
    const uint32_t t = a;
    a = b;
    b = t;
}

constexpr int kTileBytes = 256 * 32;  // a tile of codes: 256 columns x 32 rows

// The FP8 layer's pass (bf16): part (chunks, O) float32; with GELU pre (N, O) and dpre (N, O), written
// unless null; d's E5M2 codes d8 (N, O), and with d8_t their transpose (O, N) (N a multiple of 16);
// inv_scale (1,) and meta as a delayed-scaling cast's. d is dpre with GELU, g without.
//
// Each warp takes groups of 32 rows of the block's chunk (warp w the groups w, w + 8, ...; a chunk is
// whole groups of 256 rows), 4 rows at a time (8 loads in flight a lane with GELU), so that for each of
// its 8 columns a lane holds one 32-bit word of that column's transposed row: 4 rows' codes. A group's
// words meet in the warp's own tile (256 columns x 32 rows; no block barrier, so the warps drift apart
// and one's loads hide another's arithmetic) and go out as whole 32-byte sectors, two lanes a column. In the tile, column c = 8 l + k
// (lane l) sits at row c ^ (l % 4) with its word j at j ^ (l / 4): both the lanes' word stores and the
// 16-byte reads of the write-out hit 32 banks.
template <bool GELU>
__global__ void __launch_bounds__(256) bias_grad_fp8_kernel(float* __restrict__ part, bf16* __restrict__ dpre,
                                                            const bf16* __restrict__ g, const bf16* __restrict__ pre,
                                                            int64_t N, int O, int64_t rows_per_chunk,
                                                            uint8_t* __restrict__ d8, uint8_t* __restrict__ d8_t,
                                                            float* __restrict__ inv_scale, float* __restrict__ meta) {
    constexpr int V = 8;
    __shared__ float acc[8][32 * V];
    __shared__ float amax_shared[8];
    extern __shared__ uint4 tiles[];  // a tile a warp, with d8_t
    const float scale = meta[0];
    float amax = 0.f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = (blockIdx.x * 32 + lane) * V;
    uint32_t* tile = reinterpret_cast<uint32_t*>(tiles) + warp * (kTileBytes / 4);
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0.f;
    for (int64_t g0 = r0 + 32 * warp; g0 < r1; g0 += 256) {
#pragma unroll 1
        for (int j = 0; j < 8; ++j) {  // rows g0 + 4 j + i, columns col .. col + 7: the loads first
            Vec16<bf16> gv[4], xv[4];
            bool in[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t r = g0 + 4 * j + i;
                in[i] = col < O && r < r1;
                if (in[i]) {
                    gv[i] = *reinterpret_cast<const Vec16<bf16>*>(g + r * O + col);
                    if constexpr (GELU) xv[i] = *reinterpret_cast<const Vec16<bf16>*>(pre + r * O + col);
                }
            }
            uint32_t q[4][2];  // the rows' codes
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                q[i][0] = q[i][1] = 0u;
                if (!in[i]) continue;
                const int64_t at = (g0 + 4 * j + i) * O + col;
                if constexpr (GELU) {
#pragma unroll
                    for (int k = 0; k < V; ++k) {  // summed in float32, stored (and cast) rounded to bf16
                        const float d = to_float(gv[i].v[k]) * gelu_grad(to_float(xv[i].v[k]));
                        gv[i].v[k] = static_cast<bf16>(d);
                        sum[k] += d;
                    }
                    if (dpre) *reinterpret_cast<Vec16<bf16>*>(dpre + at) = gv[i];
                } else {
#pragma unroll
                    for (int k = 0; k < V; ++k) sum[k] += to_float(gv[i].v[k]);
                }
                uint16_t c[4];
#pragma unroll
                for (int k = 0; k < V; k += 2) {
                    const float v0 = to_float(gv[i].v[k]), v1 = to_float(gv[i].v[k + 1]);
                    amax = fmaxf(amax, fmaxf(fabsf(v0), fabsf(v1)));
                    c[k / 2] = fp8::to_fp8x2<FP8_E5M2>(v0 * scale, v1 * scale);
                }
                q[i][0] = c[0] | (uint32_t)c[1] << 16;
                q[i][1] = c[2] | (uint32_t)c[3] << 16;
                *reinterpret_cast<uint2*>(d8 + at) = make_uint2(q[i][0], q[i][1]);
            }
            if (d8_t) {  // uniform: the whole grid transposes or none of it
#pragma unroll
                for (int k = 0; k < 8; ++k) {  // column 8 lane + k, rows 4 j .. 4 j + 3 of the group
                    const uint32_t sel = (k & 3) | ((4 + (k & 3)) << 4);
                    const uint32_t lo = __byte_perm(q[0][k >> 2], q[1][k >> 2], sel);
                    const uint32_t hi = __byte_perm(q[2][k >> 2], q[3][k >> 2], sel);
                    tile[((lane * 8 + k) ^ (lane & 3)) * 8 + (j ^ (lane >> 2))] = __byte_perm(lo, hi, 0x5410);
                }
            }
        }
        if (d8_t) {
            __syncwarp();
#pragma unroll 4
            for (int m = 0; m < 16; ++m) {  // tile row p, its physical half ph: 16 rows' codes
                const int p = 16 * m + (lane >> 1), ph = lane & 1, l = p >> 3, s = l >> 2;
                uint4 v = *reinterpret_cast<const uint4*>(tile + p * 8 + 4 * ph);
                if (s & 1) {  // v holds the half's words in the order i ^ (s % 4)
                    swap(v.x, v.y);
                    swap(v.z, v.w);
                }
                if (s & 2) {
                    swap(v.x, v.z);
                    swap(v.y, v.w);
                }
                const int oc = blockIdx.x * 256 + (p ^ (l & 3));
                const int64_t row = g0 + 16 * (ph ^ (s >> 2));
                if (oc < O && row < r1) *reinterpret_cast<uint4*>(d8_t + (int64_t)oc * N + row) = v;
            }
            __syncwarp();
        }
    }
    write_block_sums<V>(part, sum, acc, O);
    amax = fp8::block_amax(amax, amax_shared);
    if (threadIdx.x == 0) fp8::finish_block(meta, inv_scale, amax, scale, fp8::Limits<FP8_E5M2>::max, false);
}

// db (O,) of DB (T, or float32); d8 (bf16 only): the FP8 kernel
template <typename T, typename DB>
void bias_grad_typed(int device, DB* db, T* dpre, const T* g, const T* pre, int64_t N, int64_t O,
                     uint8_t* d8 = nullptr, uint8_t* d8_t = nullptr, float* inv_scale = nullptr,
                     float* meta = nullptr) {
    constexpr int V = Vec16<T>::n;
    cudaStream_t st = stream(device);
    const unsigned int strips = (unsigned int)ceil_div(O, 32 * V);
    // about 4 blocks per SM in all; a chunk is whole groups of rows: a row a warp (8), or in the FP8
    // kernel 32 rows a warp (256)
    const int64_t unit = d8 ? 256 : 8;
    const int64_t want = std::max<int64_t>(1, std::min<int64_t>(ceil_div(N, unit), 4 * sm_count(device) / strips));
    const int64_t rows = ceil_div(ceil_div(N, want), unit) * unit, chunks = ceil_div(N, rows);
    std::size_t block = 0;
    float* part = (float*)device_alloc(sizeof(float) * chunks * O, device, &block);
    dim3 grid(strips, (unsigned int)chunks);
    if (d8) {
        if constexpr (sizeof(T) == 2) {
            auto kernel = pre ? bias_grad_fp8_kernel<true> : bias_grad_fp8_kernel<false>;
            const int smem = d8_t ? 8 * kTileBytes : 0;
            if (smem)
                check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "bias_grad");
            kernel<<<grid, 256, smem, st>>>(part, dpre, g, pre, N, (int)O, rows, d8, d8_t, inv_scale, meta);
        }
    } else if (pre) {
        bias_grad_kernel<T, true><<<grid, 256, 0, st>>>(part, dpre, g, pre, N, (int)O, rows);
    } else {
        bias_grad_kernel<T, false><<<grid, 256, 0, st>>>(part, nullptr, g, nullptr, N, (int)O, rows);
    }
    sum_parts_kernel<DB><<<(unsigned int)ceil_div(O, 32), dim3(32, 32), 0, st>>>(db, part, (int)chunks, (int)O);
    device_free(part, block, device);
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) % 16) == 0; }

}  // namespace

bool linear_bias_grad(int device, int dtype, void* db, void* dpre, const void* g, const void* pre, int64_t N,
                      int64_t O, int db_dtype, void* d8, float* inv_scale, float* meta, void* d8_t) {
    const int V = dtype == BF16 ? 8 : 4;
    if ((dtype != F32 && dtype != BF16) || N == 0 || O == 0 || O % V != 0 || O > INT32_MAX) return false;
    if (db_dtype < 0) db_dtype = dtype;
    if (db_dtype != dtype && db_dtype != F32)
        throw std::invalid_argument(std::string("engine op 'bias_grad': db must be ") + dtype_name(dtype) +
                                    " (g's dtype) or float32, got " + dtype_name(db_dtype));
    if (!aligned16(g) || (pre && !aligned16(pre)) || (dpre && !aligned16(dpre))) return false;
    if (pre && !dpre && !d8_t) return false;  // the GELU's dpre goes somewhere
    if (d8 && (dtype != BF16 || (reinterpret_cast<std::uintptr_t>(d8) % 8) != 0)) return false;
    if (d8_t && (!d8 || N % 16 != 0 || !aligned16(d8_t))) return false;
    use_device(device);
    if (dtype == F32)
        bias_grad_typed<float, float>(device, (float*)db, (float*)dpre, (const float*)g, (const float*)pre, N, O);
    else if (db_dtype == F32)
        bias_grad_typed<bf16, float>(device, (float*)db, (bf16*)dpre, (const bf16*)g, (const bf16*)pre, N, O,
                                     (uint8_t*)d8, (uint8_t*)d8_t, inv_scale, meta);
    else bias_grad_typed<bf16, bf16>(device, (bf16*)db, (bf16*)dpre, (const bf16*)g, (const bf16*)pre, N, O,
                                     (uint8_t*)d8, (uint8_t*)d8_t, inv_scale, meta);
    check_launch(pre ? "gelu_backward_bias_grad" : "bias_grad");
    return true;
}

}  // namespace engine
