// dtype conversion: astype between any two dtypes (BOOL outputs normalised to 0/1), the float32 <->
// bf16 casts of autocast, 8 elements per thread, which astype tries first, and the cast of many
// float32 tensors to bf16 in one launch (a model's weights at the start of its forward).
#include <algorithm>
#include <vector>

#include "copy/copy.h"
#include "runtime/common.cuh"
#include "runtime/vec.cuh"

namespace engine {
namespace {

constexpr int kThreads = 256;

template <typename T> __device__ __forceinline__ float to_f(T v) { return (float)v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
    if constexpr (std::is_same_v<D, __half>) return __float2half((float)to_f(v));
    else if constexpr (std::is_same_v<D, __nv_bfloat16>) return __float2bfloat16((float)to_f(v));
    else if constexpr (std::is_same_v<S, __half> || std::is_same_v<S, __nv_bfloat16>) return (D)to_f(v);
    else return (D)v;
}

// out (n,) dtype D = x (n,) dtype S; BOOL outputs are normalised to 0/1
template <typename D, typename S, bool TO_BOOL>
__global__ void astype_kernel(D* __restrict__ out, const S* __restrict__ x, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if constexpr (TO_BOOL) {
            if constexpr (std::is_same_v<S, __half> || std::is_same_v<S, __nv_bfloat16>) out[i] = (D)(to_f(x[i]) != 0.0f);
            else out[i] = (D)(x[i] != (S)0);
        }
        else out[i] = convert<D, S>(x[i]);
    }
}

template <typename S>
void astype_from(int device, int dst, void* out, const void* x, int64_t n) {
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    const S* i = (const S*)x;
    switch (dst) {
        case F32: astype_kernel<float, S, false><<<grid, kThreads, 0, st>>>((float*)out, i, n); return;
        case F64: astype_kernel<double, S, false><<<grid, kThreads, 0, st>>>((double*)out, i, n); return;
        case F16: astype_kernel<__half, S, false><<<grid, kThreads, 0, st>>>((__half*)out, i, n); return;
        case BF16: astype_kernel<__nv_bfloat16, S, false><<<grid, kThreads, 0, st>>>((__nv_bfloat16*)out, i, n); return;
        case I64: astype_kernel<int64_t, S, false><<<grid, kThreads, 0, st>>>((int64_t*)out, i, n); return;
        case I32: astype_kernel<int32_t, S, false><<<grid, kThreads, 0, st>>>((int32_t*)out, i, n); return;
        case U8: astype_kernel<uint8_t, S, false><<<grid, kThreads, 0, st>>>((uint8_t*)out, i, n); return;
        case BOOL: astype_kernel<uint8_t, S, true><<<grid, kThreads, 0, st>>>((uint8_t*)out, i, n); return;
    }
    unsupported("astype", dst);
}

// float32 <-> bf16, 8 elements per thread (16 bytes of bf16, 32 of float32): the autocast casts of
// the weights (forward) and of their gradients (backward). n % 8 == 0, 16-byte aligned pointers.
__global__ void f32_to_bf16_kernel(B8* __restrict__ out, const float4* __restrict__ x, int64_t nvec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        float4 a = x[2 * i], b = x[2 * i + 1];
        B8 r;
        r.v[0] = __float2bfloat16(a.x), r.v[1] = __float2bfloat16(a.y), r.v[2] = __float2bfloat16(a.z);
        r.v[3] = __float2bfloat16(a.w), r.v[4] = __float2bfloat16(b.x), r.v[5] = __float2bfloat16(b.y);
        r.v[6] = __float2bfloat16(b.z), r.v[7] = __float2bfloat16(b.w);
        out[i] = r;
    }
}

__global__ void bf16_to_f32_kernel(float4* __restrict__ out, const B8* __restrict__ x, int64_t nvec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        B8 v = x[i];
        out[2 * i] = make_float4(__bfloat162float(v.v[0]), __bfloat162float(v.v[1]), __bfloat162float(v.v[2]),
                                 __bfloat162float(v.v[3]));
        out[2 * i + 1] = make_float4(__bfloat162float(v.v[4]), __bfloat162float(v.v[5]), __bfloat162float(v.v[6]),
                                     __bfloat162float(v.v[7]));
    }
}

// Up to kCastMax tensors a launch, passed by value (< 4 KB of kernel parameters): tensor t is
// groups [first[t], first[t + 1]) of 8 elements of the concatenated index space, n[t] elements.
constexpr int kCastMax = 64;
struct CastList {
    int count;
    int64_t first[kCastMax + 1];
    int64_t n[kCastMax];
    const float* src[kCastMax];
    __nv_bfloat16* dst[kCastMax];
};

// dst[t] (n[t],) bf16 = src[t] (n[t],) float32 for every t of the list; a thread takes a group of 8
// elements: one 16-byte store where the group is whole and both rows 16-byte aligned, else one by one.
__global__ void f32_to_bf16_many_kernel(CastList list, int64_t groups) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int t = 0;  // the tensor of the previous group: groups only grow along a thread's walk
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < groups; e += stride) {
        while (e >= list.first[t + 1]) ++t;
        const int64_t i = (e - list.first[t]) * 8, n = list.n[t];
        const float* x = list.src[t] + i;
        __nv_bfloat16* y = list.dst[t] + i;
        if (i + 8 <= n && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
            const float4 a = reinterpret_cast<const float4*>(x)[0], b = reinterpret_cast<const float4*>(x)[1];
            B8 r;
            r.v[0] = __float2bfloat16(a.x), r.v[1] = __float2bfloat16(a.y), r.v[2] = __float2bfloat16(a.z);
            r.v[3] = __float2bfloat16(a.w), r.v[4] = __float2bfloat16(b.x), r.v[5] = __float2bfloat16(b.y);
            r.v[6] = __float2bfloat16(b.z), r.v[7] = __float2bfloat16(b.w);
            *reinterpret_cast<B8*>(y) = r;
        } else {
            for (int64_t k = i; k < i + 8 && k < n; ++k) list.dst[t][k] = __float2bfloat16(list.src[t][k]);
        }
    }
}

}  // namespace

void astype_f32_bf16_many(int device, const std::vector<const float*>& src, const std::vector<void*>& dst,
                          const std::vector<int64_t>& n) {
    if (src.size() != dst.size() || src.size() != n.size()) unsupported("astype_many", F32);
    use_device(device);
    for (size_t start = 0; start < n.size(); start += kCastMax) {
        CastList list;
        list.count = (int)std::min<size_t>(kCastMax, n.size() - start);
        int64_t groups = 0;
        for (int t = 0; t < list.count; ++t) {
            list.first[t] = groups;
            list.n[t] = n[start + t];
            list.src[t] = src[start + t];
            list.dst[t] = (__nv_bfloat16*)dst[start + t];
            groups += (n[start + t] + 7) / 8;
        }
        list.first[list.count] = groups;
        if (groups == 0) continue;
        const unsigned grid = blocks_for(groups, kThreads, (int64_t)sm_count(device) * 8);  // one full wave
        f32_to_bf16_many_kernel<<<grid, kThreads, 0, stream(device)>>>(list, groups);
    }
    check_launch("astype_many");
}

void astype(int device, int src, int dst, void* out, const void* x, int64_t n) {
    if (n == 0) return;
    use_device(device);
    if (cast_bf16_vec(device, src, dst, out, x, n)) {
        check_launch("astype");
        return;
    }
    switch (src) {
        case F32: astype_from<float>(device, dst, out, x, n); break;
        case F64: astype_from<double>(device, dst, out, x, n); break;
        case F16: astype_from<__half>(device, dst, out, x, n); break;
        case BF16: astype_from<__nv_bfloat16>(device, dst, out, x, n); break;
        case I64: astype_from<int64_t>(device, dst, out, x, n); break;
        case I32: astype_from<int32_t>(device, dst, out, x, n); break;
        case U8: case BOOL: astype_from<uint8_t>(device, dst, out, x, n); break;
        default: unsupported("astype", src);
    }
    check_launch("astype");
}

bool cast_bf16_vec(int device, int src, int dst, void* out, const void* x, int64_t n) {
    if (n % 8 != 0 || !aligned16(out) || !aligned16(x)) return false;
    int64_t nvec = n / 8;
    unsigned int grid = blocks_for(nvec, kThreads);
    if (src == F32 && dst == BF16)
        f32_to_bf16_kernel<<<grid, kThreads, 0, stream(device)>>>((B8*)out, (const float4*)x, nvec);
    else if (src == BF16 && dst == F32)
        bf16_to_f32_kernel<<<grid, kThreads, 0, stream(device)>>>((float4*)out, (const B8*)x, nvec);
    else return false;
    return true;
}

}  // namespace engine
