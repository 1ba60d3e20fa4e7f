// Host-safe definitions shared by the kernels (.cu) and the bindings (.cpp): dtype codes and the
// strided-shape descriptor used by every kernel that broadcasts or permutes.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime/runtime.h"

namespace engine {

// dtype codes shared with engine/backends/cuda/ (_CODE)
enum DType : int { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I64 = 4, I32 = 5, U8 = 6, BOOL = 7 };

inline const char* dtype_name(int d) {
    switch (d) {
        case F32: return "float32"; case F64: return "float64"; case F16: return "float16";
        case BF16: return "bfloat16"; case I64: return "int64"; case I32: return "int32";
        case U8: return "uint8"; case BOOL: return "bool";
    }
    return "?";
}

[[noreturn]] inline void unsupported(const char* op, int dtype) {
    throw std::runtime_error(std::string("cuda backend: op '") + op + "' does not support dtype " + dtype_name(dtype));
}

constexpr int kMaxDims = 8;

// An n-d iteration space (shape) and up to three operands' element strides over it; 0 strides
// broadcast. Dims are coalesced on the host side (Python) so ndim is usually 1-3.
struct Strided {
    int ndim;
    int64_t shape[kMaxDims];
    int64_t stride[3][kMaxDims];
};

inline unsigned int blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 16) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return static_cast<unsigned int>(b);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace engine
