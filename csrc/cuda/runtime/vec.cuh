// Vector types of the elementwise-style kernels (elementwise/, copy/cast.cu, copy/fill.cu): N elements
// of T loaded and stored as one aligned access, and the alignment tests that decide when they may be.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace engine {
namespace {

// 4 floats (16 bytes) per thread: the float32 kernels load and store whole vectors when the
// pointers are aligned, and amortise index arithmetic over 4 elements when they are strided
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
    T v[N];
};
using F4 = Vec<float, 4>;

// 8 bf16 (16 bytes) per thread: the bfloat16 kernels' vector
struct alignas(16) B8 {
    __nv_bfloat16 v[8];
};

inline bool aligned(const void* p, int bytes) { return (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0; }
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) % 16) == 0; }

}  // namespace
}  // namespace engine
