// The generic strided copy: dst[strided] = src[strided] over an n-d shape. It implements permute,
// transpose, broadcast_to (0 strides), basic slicing and its backward, concat and split.
#include "runtime/common.cuh"
#include "copy/copy.h"

namespace engine {
namespace {

template <typename T, typename I>
__global__ void strided_copy_kernel(T* __restrict__ dst, const T* __restrict__ src, Strided s, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        I idx = (I)i, od = 0, os = 0;
        for (int d = s.ndim - 1; d >= 0; --d) {
            I len = (I)s.shape[d];
            I c = idx % len;
            idx /= len;
            od += c * (I)s.stride[0][d];
            os += c * (I)s.stride[1][d];
        }
        dst[od] = src[os];
    }
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

// 4 consecutive elements of the last dim per thread (index arithmetic once per 4); vector
// loads/stores where that side is unit-stride and aligned
template <typename T>
__global__ void strided_copy_vec_kernel(T* __restrict__ dst, const T* __restrict__ src, Strided s, int64_t ngroups,
                                        bool vd, bool vs) {
    using V = Vec<T, 4>;
    int last = s.ndim - 1;
    int ld = (int)s.stride[0][last], ls = (int)s.stride[1][last];
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < ngroups; g += stride) {
        int idx = (int)(g * 4), od = 0, os = 0;
        for (int d = last; d >= 0; --d) {
            int len = (int)s.shape[d];
            int c = idx % len;
            idx /= len;
            od += c * (int)s.stride[0][d];
            os += c * (int)s.stride[1][d];
        }
        V v;
        if (vs) v = *reinterpret_cast<const V*>(src + os);
        else
#pragma unroll
            for (int k = 0; k < 4; ++k) v.v[k] = src[os + k * ls];
        if (vd) *reinterpret_cast<V*>(dst + od) = v;
        else
#pragma unroll
            for (int k = 0; k < 4; ++k) dst[od + k * ld] = v.v[k];
    }
}

bool vec_side(const Strided& s, int k, const void* p, int elsize) {
    if (reinterpret_cast<std::uintptr_t>(p) % (4 * elsize) != 0) return false;
    int last = s.ndim - 1;
    if (s.stride[k][last] != 1) return false;
    for (int d = 0; d < last; ++d)
        if (s.stride[k][d] % 4 != 0) return false;
    return true;
}

// 2-d tile transpose for the common last-two-dims swap: dst (B, C, R) = src (B, R, C)^T per batch,
// through shared memory so both reads and writes are coalesced
template <typename T>
__global__ void transpose_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t R, int64_t C) {
    __shared__ T tile[32][33];
    int64_t b = blockIdx.z;
    const T* s = src + b * R * C;
    T* d = dst + b * R * C;
    int64_t c0 = (int64_t)blockIdx.x * 32, r0 = (int64_t)blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        int64_t r = r0 + j, c = c0 + threadIdx.x;
        if (r < R && c < C) tile[j][threadIdx.x] = s[r * C + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        int64_t c = c0 + j, r = r0 + threadIdx.x;
        if (r < R && c < C) d[c * R + r] = tile[threadIdx.x][j];
    }
}

bool fits32(const Strided& s, int64_t n) {
    if (n >= (int64_t(1) << 31)) return false;
    for (int k = 0; k < 2; ++k) {
        int64_t m = 0;
        for (int d = 0; d < s.ndim; ++d) m += (s.shape[d] - 1) * (s.stride[k][d] < 0 ? -s.stride[k][d] : s.stride[k][d]);
        if (m >= (int64_t(1) << 31)) return false;
    }
    return true;
}

template <typename T>
void copy_typed(int device, void* dst, const void* src, const Strided& s, int64_t n) {
    cudaStream_t st = stream(device);
    // (B, R, C) -> (B, C, R) with contiguous dst: tiled transpose
    int nd = s.ndim;
    if ((nd == 2 || nd == 3) && s.stride[1][nd - 2] == 1 && s.stride[0][nd - 1] == 1) {
        int64_t C = s.shape[nd - 2], R = s.shape[nd - 1];  // iteration order is dst order: (.., C, R)
        bool src_ok = s.stride[1][nd - 1] == C;
        bool dst_ok = s.stride[0][nd - 2] == R;
        int64_t B = nd == 3 ? s.shape[0] : 1;
        bool batch_ok = nd == 2 || (s.stride[0][0] == R * C && s.stride[1][0] == R * C);
        if (src_ok && dst_ok && batch_ok && B <= 65535 && ceil_div(R, 32) <= 65535) {
            dim3 grid((unsigned)ceil_div(C, 32), (unsigned)ceil_div(R, 32), (unsigned)B);
            transpose_kernel<T><<<grid, dim3(32, 8), 0, st>>>((T*)dst, (const T*)src, R, C);
            return;
        }
    }
    if (s.shape[nd - 1] % 4 == 0 && fits32(s, n) && sizeof(T) <= 8) {
        bool vd = vec_side(s, 0, dst, sizeof(T)), vs = vec_side(s, 1, src, sizeof(T));
        if (vd || vs) {
            strided_copy_vec_kernel<T><<<blocks_for(n / 4, 256), 256, 0, st>>>((T*)dst, (const T*)src, s, n / 4, vd, vs);
            return;
        }
    }
    unsigned int grid = blocks_for(n, 256);
    if (fits32(s, n))
        strided_copy_kernel<T, int32_t><<<grid, 256, 0, st>>>((T*)dst, (const T*)src, s, n);
    else
        strided_copy_kernel<T, int64_t><<<grid, 256, 0, st>>>((T*)dst, (const T*)src, s, n);
}

}  // namespace

void strided_copy(int device, int elsize, void* dst, const void* src, const Strided& s, int64_t n) {
    if (n == 0) return;
    use_device(device);
    switch (elsize) {
        case 1: copy_typed<uint8_t>(device, dst, src, s, n); break;
        case 2: copy_typed<uint16_t>(device, dst, src, s, n); break;
        case 4: copy_typed<uint32_t>(device, dst, src, s, n); break;
        case 8: copy_typed<uint64_t>(device, dst, src, s, n); break;
        default: throw std::runtime_error("strided_copy: element size " + std::to_string(elsize));
    }
    check_launch("strided_copy");
}

}  // namespace engine
