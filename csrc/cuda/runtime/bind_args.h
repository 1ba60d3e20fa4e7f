// The binding rule's helpers (csrc/README.md, "The binding rule"): how a Python call's arguments
// become a launcher's. Every bind.cpp uses these, so every op is exposed the same way.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/types.h"

namespace py = pybind11;

namespace engine {

// A device address as Python passes it (DeviceBuffer.ptr plus an offset, computed in
// engine/backends/cuda/): a plain int, 0 for an absent (null) operand.
using addr = std::uintptr_t;

// an address as the launcher's pointer type
template <typename T = void>
inline T* P(addr a) { return reinterpret_cast<T*>(a); }

// (shape, [strides of operand 0, 1, 2]) as Python passes them, dims already coalesced -> Strided
inline Strided make_strided(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& strides) {
    if (shape.size() > (std::size_t)kMaxDims)
        throw std::runtime_error("cuda backend: at most " + std::to_string(kMaxDims) + " dims after coalescing, got " +
                                 std::to_string(shape.size()));
    Strided s{};
    s.ndim = (int)shape.size();
    for (std::size_t d = 0; d < shape.size(); ++d) {
        s.shape[d] = shape[d];
        for (std::size_t k = 0; k < strides.size() && k < 3; ++k) s.stride[k][d] = strides[k][d];
    }
    if (s.ndim == 0) {  // a scalar: one element
        s.ndim = 1;
        s.shape[0] = 1;
    }
    return s;
}

// a list of float32 tensors' addresses (the multi-tensor launchers) -> their pointers
inline std::vector<float*> floats(const std::vector<addr>& v) {
    std::vector<float*> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = P<float>(v[i]);
    return out;
}

}  // namespace engine
