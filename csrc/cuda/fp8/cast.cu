// Casts to FP8 with delayed scaling (fp8.h says what the meta holds). Three kernels:
// - amax_kernel: the first pass of a `current` cast, max |x| into meta[1];
// - cast_kernel: 1-D, 8 elements a thread a step (16 or 32 bytes in, 8 out), grid-stride;
// - cast_transpose_tiled_kernel: a 128 x 64 tile a block, 8 elements a load, written as it is and,
//   through shared memory, transposed with 16-byte stores (a tensor's two K-major copies in one pass);
//   cast_transpose_kernel, 32 x 32 tiles an element at a time, where the sizes do not fit those tiles.
// Each block reduces its |x| maximum and adds it to meta[1] with one atomicMax; the block that
// finishes last turns that into the next scale (fp8.cuh's finish_block), so the whole update is
// inside the cast's one launch.
#include "fp8/fp8.cuh"

namespace engine {
namespace {

using bf16 = __nv_bfloat16;
using fp8::block_amax;
using fp8::finish_block;
using fp8::kThreads;
template <int FMT> using Fp8Limits = fp8::Limits<FMT>;
using fp8::to_fp8;
using fp8::to_fp8x2;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }

// the scale this cast multiplies by: meta[0], or with `current` fp8_max / the amax the first pass found
__device__ __forceinline__ float cast_scale(const float* meta, bool current, float fmax) {
    if (current) {
        float amax = *(volatile const float*)(meta + 1);
        if (amax > 0.f && isfinite(amax)) return fmax / amax;
    }
    return meta[0];
}

template <typename T, int V> struct alignas(sizeof(T) * V) Pack {
    T v[V];
};

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) amax_kernel(float* __restrict__ meta, const T* __restrict__ in, int64_t n) {
    __shared__ float shared[kThreads / 32];
    const int64_t nv = n / V, stride = (int64_t)gridDim.x * kThreads;
    const int64_t tid = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    float a = 0.f;
    for (int64_t i = tid; i < nv; i += stride) {
        Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(in)[i];
#pragma unroll
        for (int k = 0; k < V; ++k) a = fmaxf(a, fabsf(to_float(p.v[k])));
    }
    for (int64_t i = nv * V + tid; i < n; i += stride) a = fmaxf(a, fabsf(to_float(in[i])));
    a = block_amax(a, shared);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(meta + 1), __float_as_int(a));
}

template <typename T, int V, int FMT>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(uint8_t* __restrict__ out, float* __restrict__ inv_scale, float* __restrict__ meta,
                const T* __restrict__ in, int64_t n, bool current) {
    __shared__ float shared[kThreads / 32];
    constexpr float fmax = Fp8Limits<FMT>::max;
    const float scale = cast_scale(meta, current, fmax);
    const int64_t nv = n / V, stride = (int64_t)gridDim.x * kThreads;
    const int64_t tid = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    float a = 0.f;
    for (int64_t i = tid; i < nv; i += stride) {
        if constexpr (V == 1) {
            float x = to_float(in[i]);
            a = fmaxf(a, fabsf(x));
            out[i] = to_fp8<FMT>(x * scale);
        } else {
            Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(in)[i];
            Pack<uint16_t, V / 2> q;
#pragma unroll
            for (int k = 0; k < V; k += 2) {
                float x0 = to_float(p.v[k]), x1 = to_float(p.v[k + 1]);
                a = fmaxf(a, fmaxf(fabsf(x0), fabsf(x1)));
                q.v[k / 2] = to_fp8x2<FMT>(x0 * scale, x1 * scale);
            }
            reinterpret_cast<Pack<uint16_t, V / 2>*>(out)[i] = q;
        }
    }
    for (int64_t i = nv * V + tid; i < n; i += stride) {
        float x = to_float(in[i]);
        a = fmaxf(a, fabsf(x));
        out[i] = to_fp8<FMT>(x * scale);
    }
    a = block_amax(a, shared);
    if (threadIdx.x == 0) finish_block(meta, inv_scale, a, scale, fmax, current);
}

// in (rows, cols) -> out (rows, cols) and out_t (cols, rows); block (32, 8), tile 32 x 32
template <typename T, int FMT>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ inv_scale,
                          float* __restrict__ meta, const T* __restrict__ in, int64_t rows, int64_t cols, bool current) {
    __shared__ float shared[kThreads / 32];
    __shared__ uint8_t tile[32][33];
    constexpr float fmax = Fp8Limits<FMT>::max;
    const float scale = cast_scale(meta, current, fmax);
    const int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    const int tx = threadIdx.x;
    float a = 0.f;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int64_t r = r0 + i, c = c0 + tx;
        if (r < rows && c < cols) {
            float x = to_float(in[r * cols + c]);
            a = fmaxf(a, fabsf(x));
            uint8_t q = to_fp8<FMT>(x * scale);
            out[r * cols + c] = q;
            tile[i][tx] = q;
        }
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int64_t c = c0 + i, r = r0 + tx;
        if (r < rows && c < cols) out_t[c * rows + r] = tile[tx][i];
    }
    a = block_amax(a, shared);
    if (threadIdx.x == 0 && threadIdx.y == 0) finish_block(meta, inv_scale, a, scale, fmax, current);
}

// in (rows, cols) -> out (rows, cols) and out_t (cols, rows), rows a multiple of 128 and cols of 64;
// 256 threads, a 128 x 64 tile. Loads: the tile's 128 rows x 8 loads of 8 elements, four a thread, all
// issued before the first is used (64 bytes of bf16 in flight a thread); the codes go to out (8 bytes)
// and to the shared tile (rows 68 bytes apart, so rows 16 apart sit 16 banks apart). Stores of out_t:
// 64 rows (the tile's columns) x 8 chunks of 16 codes, two a thread.
template <typename T, int FMT>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_tiled_kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ inv_scale,
                                float* __restrict__ meta, const T* __restrict__ in, int64_t rows, int64_t cols,
                                bool current) {
    constexpr int V = 8, TR = 128, STRIDE = 68, LOADS = TR * 8 / kThreads;
    __shared__ float shared[kThreads / 32];
    __shared__ __align__(16) uint8_t tile[TR * STRIDE];
    constexpr float fmax = Fp8Limits<FMT>::max;
    const float scale = cast_scale(meta, current, fmax);
    const int64_t r0 = (int64_t)blockIdx.y * TR, c0 = (int64_t)blockIdx.x * 64;
    Pack<T, V> p[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        const int v = threadIdx.x + k * kThreads, row = v >> 3, col = (v & 7) * V;
        p[k] = *reinterpret_cast<const Pack<T, V>*>(in + (r0 + row) * cols + c0 + col);
    }
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        const int v = threadIdx.x + k * kThreads, row = v >> 3, col = (v & 7) * V;
        uint32_t q[2];
#pragma unroll
        for (int i = 0; i < V; i += 4) {
            float x0 = to_float(p[k].v[i]), x1 = to_float(p[k].v[i + 1]), x2 = to_float(p[k].v[i + 2]),
                  x3 = to_float(p[k].v[i + 3]);
            a = fmaxf(a, fmaxf(fmaxf(fabsf(x0), fabsf(x1)), fmaxf(fabsf(x2), fabsf(x3))));
            q[i / 4] = to_fp8x2<FMT>(x0 * scale, x1 * scale) | (uint32_t)to_fp8x2<FMT>(x2 * scale, x3 * scale) << 16;
        }
        *reinterpret_cast<uint2*>(out + (r0 + row) * cols + c0 + col) = make_uint2(q[0], q[1]);
        uint32_t* t32 = reinterpret_cast<uint32_t*>(tile + row * STRIDE + col);
        t32[0] = q[0];
        t32[1] = q[1];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        // s's bits: 0-3 the column's low bits, 4 the chunk's low bit, 5-6 the column's high bits, 7-8 the
        // chunk's high bits. A warp reads 16 neighbouring columns of two chunks 16 rows apart (banks 16
        // apart: no conflict) and writes 32 contiguous bytes (a whole sector) of each of 16 out_t rows.
        const int s = threadIdx.x + k * kThreads;
        const int tc = (s & 15) | (((s >> 5) & 3) << 4), chunk = (((s >> 4) & 1) | ((s >> 7) << 1)) * 16;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint8_t* c = tile + (chunk + 4 * j) * STRIDE + tc;
            w[j] = (uint32_t)c[0] | (uint32_t)c[STRIDE] << 8 | (uint32_t)c[2 * STRIDE] << 16 |
                   (uint32_t)c[3 * STRIDE] << 24;
        }
        *reinterpret_cast<uint4*>(out_t + (c0 + tc) * rows + r0 + chunk) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    a = block_amax(a, shared);
    if (threadIdx.x == 0) finish_block(meta, inv_scale, a, scale, fmax, current);
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

template <typename T, int FMT>
void cast_typed(int device, uint8_t* out, uint8_t* out_t, float* inv_scale, float* meta, const T* in, int64_t rows,
                int64_t cols, bool current) {
    constexpr int V = 8;
    cudaStream_t st = stream(device);
    const int64_t n = rows * cols;
    const bool vec = aligned(in, sizeof(T) * V) && aligned(out, V);
    const unsigned int grid = (unsigned int)std::max<int64_t>(
        1, std::min<int64_t>(ceil_div(vec ? n / V : n, kThreads), (int64_t)sm_count(device) * 8));
    if (current) {
        if (vec) amax_kernel<T, V><<<grid, kThreads, 0, st>>>(meta, in, n);
        else amax_kernel<T, 1><<<grid, kThreads, 0, st>>>(meta, in, n);
        check_launch("fp8_cast");
    }
    if (out_t != nullptr && rows % 128 == 0 && cols % 64 == 0 && aligned(in, sizeof(T) * V) && aligned(out, 8) &&
        aligned(out_t, 16)) {
        dim3 tiles((unsigned int)(cols / 64), (unsigned int)(rows / 128));
        cast_transpose_tiled_kernel<T, FMT><<<tiles, kThreads, 0, st>>>(out, out_t, inv_scale, meta, in, rows, cols,
                                                                        current);
    } else if (out_t != nullptr) {
        dim3 tiles((unsigned int)ceil_div(cols, 32), (unsigned int)ceil_div(rows, 32));
        cast_transpose_kernel<T, FMT><<<tiles, dim3(32, 8), 0, st>>>(out, out_t, inv_scale, meta, in, rows, cols,
                                                                      current);
    } else if (vec) {
        cast_kernel<T, V, FMT><<<grid, kThreads, 0, st>>>(out, inv_scale, meta, in, n, current);
    } else {
        cast_kernel<T, 1, FMT><<<grid, kThreads, 0, st>>>(out, inv_scale, meta, in, n, current);
    }
    check_launch("fp8_cast");
}

template <typename T>
void cast_format(int device, int format, uint8_t* out, uint8_t* out_t, float* inv_scale, float* meta, const T* in,
                 int64_t rows, int64_t cols, bool current) {
    if (format == FP8_E4M3) cast_typed<T, FP8_E4M3>(device, out, out_t, inv_scale, meta, in, rows, cols, current);
    else if (format == FP8_E5M2) cast_typed<T, FP8_E5M2>(device, out, out_t, inv_scale, meta, in, rows, cols, current);
    else throw std::runtime_error("engine op 'fp8_cast': format must be 0 (E4M3) or 1 (E5M2)");
}

}  // namespace

void fp8_cast(int device, int dtype, int format, void* out, void* out_t, float* inv_scale, float* meta, const void* in,
              int64_t rows, int64_t cols, bool current) {
    if (rows * cols == 0) return;
    use_device(device);
    auto* o = static_cast<uint8_t*>(out);
    auto* ot = static_cast<uint8_t*>(out_t);
    if (dtype == BF16) cast_format(device, format, o, ot, inv_scale, meta, static_cast<const bf16*>(in), rows, cols, current);
    else if (dtype == F32) cast_format(device, format, o, ot, inv_scale, meta, static_cast<const float*>(in), rows, cols, current);
    else unsupported("fp8_cast", dtype);
}

}  // namespace engine
