// copy/: moving and converting memory. copy.cu: the strided copy (permute, transpose, broadcast_to,
// slicing, concat, split); cast.cu: dtype conversion (astype) and its float32 <-> bf16 vector form;
// fill.cu: fill and arange. bind.cpp: the Python bindings. Launchers take device pointers, sizes and the
// device index; work is queued on the device's one stream and never waited for.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "runtime/types.h"

namespace engine {

// copy.cu: out[idx] = x[idx] over `s` (stride[0] = dst strides, stride[1] = src strides), elsize bytes
void strided_copy(int device, int elsize, void* dst, const void* src, const Strided& s, int64_t n);

// cast.cu: out (n,) of dst_dtype = x (n,) of src_dtype
void astype(int device, int src_dtype, int dst_dtype, void* out, const void* x, int64_t n);
// float32 <-> bf16 cast, 8 per thread; false (nothing launched) unless n % 8 == 0 and 16-byte aligned
bool cast_bf16_vec(int device, int src, int dst, void* out, const void* x, int64_t n);
// dst[t] (n[t],) bf16 = src[t] (n[t],) float32 for every t, in one launch per 64 tensors
void astype_f32_bf16_many(int device, const std::vector<const float*>& src, const std::vector<void*>& dst,
                          const std::vector<int64_t>& n);

// fill.cu
void fill(int device, int dtype, void* out, double value, int64_t n);
// A memset node of a captured graph as the parameters of a kernel node that does the same
// (runtime/graph.cpp): `params` points into this object, which must outlive cudaGraphAddKernelNode.
struct MemsetKernel {
    explicit MemsetKernel(const cudaMemsetParams& m);
    char* dst;
    size_t pitch;
    unsigned value, elsize;
    size_t width, height;
    void* args[6];
    cudaKernelNodeParams params;
};
// Memset nodes of a captured graph (those of its GEMMs' own workspaces, runtime/graph.cpp) done by one
// kernel node, a block row per memset: `params` points into this object, and its device table must
// outlive the graph's executable.
struct MemsetsKernel {
    static constexpr std::size_t kMaxRegions = 65535;  // gridDim.y
    explicit MemsetsKernel(const std::vector<cudaMemsetParams>& m);
    ~MemsetsKernel();
    MemsetsKernel(const MemsetsKernel&) = delete;
    MemsetsKernel& operator=(const MemsetsKernel&) = delete;
    void* table = nullptr;  // MemsetRegion[count] on the device (fill.cu)
    void* args[1];
    cudaKernelNodeParams params;
};
void arange(int device, int dtype, void* out, double start, double step, int64_t n);

}  // namespace engine
