// fill and arange: out (n,) = value | start + step * i, for every dtype (fill: 4 floats per thread
// where aligned).
#include <algorithm>

#include "copy/copy.h"
#include "runtime/common.cuh"
#include "runtime/vec.cuh"

namespace engine {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void fill_kernel(T* __restrict__ out, T v, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = v;
}

template <typename T>
__global__ void arange_kernel(T* __restrict__ out, double start, double step, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = (T)(start + step * (double)i);
}

// `height` rows `pitch` bytes apart, each `width` elements of `elsize` bytes (1, 2 or 4) set to the
// low bytes of `value`: element i of them for i = first, first + stride, ...
__device__ __forceinline__ void memset_rows(char* __restrict__ dst, size_t pitch, unsigned value, unsigned elsize,
                                            size_t width, size_t height, size_t first, size_t stride) {
    const size_t n = width * height;
    for (size_t i = first; i < n; i += stride) {
        char* p = dst + (i / width) * pitch + (i % width) * elsize;
        if (elsize == 4)
            *reinterpret_cast<unsigned*>(p) = value;
        else if (elsize == 2)
            *reinterpret_cast<unsigned short*>(p) = (unsigned short)value;
        else
            *p = (char)value;
    }
}

// a graph's memset node as a kernel
__global__ void memset_rows_kernel(char* __restrict__ dst, size_t pitch, unsigned value, unsigned elsize, size_t width,
                                   size_t height) {
    memset_rows(dst, pitch, value, elsize, width, height, (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                (size_t)gridDim.x * blockDim.x);
}

struct MemsetRegion {
    char* dst;
    size_t pitch, width, height;
    unsigned value, elsize;
};

// many memset nodes as one kernel: region blockIdx.y by the blocks of row y of the grid
__global__ void memset_regions_kernel(const MemsetRegion* __restrict__ regions) {
    const MemsetRegion r = regions[blockIdx.y];
    memset_rows(r.dst, r.pitch, r.value, r.elsize, r.width, r.height, (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                (size_t)gridDim.x * blockDim.x);
}

}  // namespace

MemsetKernel::MemsetKernel(const cudaMemsetParams& m)
    : dst((char*)m.dst), pitch(m.height > 1 ? m.pitch : 0), value(m.value), elsize(m.elementSize), width(m.width),
      height(m.height), args{&dst, &pitch, &value, &elsize, &width, &height} {
    params.func = (void*)memset_rows_kernel;
    params.blockDim = dim3(kThreads);
    params.gridDim = dim3(std::max(1u, blocks_for((int64_t)(width * height), kThreads)));
    params.sharedMemBytes = 0;
    params.kernelParams = args;
    params.extra = nullptr;
}

MemsetsKernel::MemsetsKernel(const std::vector<cudaMemsetParams>& m) {
    std::vector<MemsetRegion> regions;
    size_t most = 1;
    for (const cudaMemsetParams& p : m) {
        regions.push_back({(char*)p.dst, p.height > 1 ? p.pitch : 0, p.width, p.height, p.value, p.elementSize});
        most = std::max(most, p.width * p.height);
    }
    const size_t bytes = regions.size() * sizeof(MemsetRegion);
    check(cudaMalloc(&table, bytes), "graph memsets table");
    check(cudaMemcpy(table, regions.data(), bytes, cudaMemcpyHostToDevice), "graph memsets table");
    args[0] = &table;
    params.func = (void*)memset_regions_kernel;
    params.blockDim = dim3(kThreads);
    params.gridDim = dim3(std::min(1024u, std::max(1u, blocks_for((int64_t)most, kThreads))), (unsigned)regions.size());
    params.sharedMemBytes = 0;
    params.kernelParams = args;
    params.extra = nullptr;
}

MemsetsKernel::~MemsetsKernel() { cudaFree(table); }

void fill(int device, int dtype, void* out, double v, int64_t n) {
    if (n == 0) return;
    use_device(device);
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    switch (dtype) {
        case F32:
            if (aligned(out, 16) && n % 4 == 0) {
                float f = (float)v;
                fill_kernel<F4><<<blocks_for(n / 4, kThreads), kThreads, 0, st>>>((F4*)out, F4{{f, f, f, f}}, n / 4);
            } else {
                fill_kernel<float><<<grid, kThreads, 0, st>>>((float*)out, (float)v, n);
            }
            break;
        case F64: fill_kernel<double><<<grid, kThreads, 0, st>>>((double*)out, v, n); break;
        case F16: fill_kernel<__half><<<grid, kThreads, 0, st>>>((__half*)out, __float2half((float)v), n); break;
        case BF16: fill_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>((__nv_bfloat16*)out, __float2bfloat16((float)v), n); break;
        case I64: fill_kernel<int64_t><<<grid, kThreads, 0, st>>>((int64_t*)out, (int64_t)v, n); break;
        case I32: fill_kernel<int32_t><<<grid, kThreads, 0, st>>>((int32_t*)out, (int32_t)v, n); break;
        case U8: fill_kernel<uint8_t><<<grid, kThreads, 0, st>>>((uint8_t*)out, (uint8_t)v, n); break;
        case BOOL: fill_kernel<uint8_t><<<grid, kThreads, 0, st>>>((uint8_t*)out, (uint8_t)(v != 0), n); break;
        default: unsupported("full", dtype);
    }
    check_launch("full");
}

void arange(int device, int dtype, void* out, double start, double step, int64_t n) {
    if (n == 0) return;
    use_device(device);
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    switch (dtype) {
        case F32: arange_kernel<float><<<grid, kThreads, 0, st>>>((float*)out, start, step, n); break;
        case F64: arange_kernel<double><<<grid, kThreads, 0, st>>>((double*)out, start, step, n); break;
        case I64: arange_kernel<int64_t><<<grid, kThreads, 0, st>>>((int64_t*)out, start, step, n); break;
        case I32: arange_kernel<int32_t><<<grid, kThreads, 0, st>>>((int32_t*)out, start, step, n); break;
        default: unsupported("arange", dtype);
    }
    check_launch("arange");
}

}  // namespace engine
