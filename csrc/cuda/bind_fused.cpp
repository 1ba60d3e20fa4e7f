// Python bindings of the fused kernels (fused.h): attention, and the fused / mixed-precision kernels.
// Shapes and layouts are worked out in engine/backends/cuda.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "fused.h"

namespace py = pybind11;
using addr = std::uintptr_t;

namespace engine {
namespace {

template <typename T = void>
T* P(addr a) { return reinterpret_cast<T*>(a); }

AttnLayout L(const std::vector<int64_t>& s) {
    if (s.size() != 3) throw std::runtime_error("attention: a layout is (batch, head, time) strides");
    return AttnLayout{s[0], s[1], s[2]};
}

}  // namespace

void bind_fused(py::module_& m) {
    m.def("attention_forward", [](int device, int dtype, addr o, addr lse, addr q, addr k, addr v,
                                  const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
                                  const std::vector<int64_t>& lv, const std::vector<int64_t>& lo, int B, int H, int T,
                                  int S, int D, bool causal, float scale, bool precise) {
        attention_forward(device, dtype, P(o), P<float>(lse), P(q), P(k), P(v), L(lq), L(lk), L(lv), L(lo), B, H, T, S,
                          D, causal, scale, precise);
    });
    m.def("attention_backward", [](int device, int dtype, addr dq, addr dk, addr dv, addr dout, addr q, addr k,
                                   addr v, addr o, addr lse, const std::vector<int64_t>& lq,
                                   const std::vector<int64_t>& lk, const std::vector<int64_t>& lv,
                                   const std::vector<int64_t>& lo, int B, int H, int T, int S, int D, bool causal,
                                   float scale, bool precise) {
        attention_backward(device, dtype, P(dq), P(dk), P(dv), P(dout), P(q), P(k), P(v), P(o), P<const float>(lse),
                           L(lq), L(lk), L(lv), L(lo), B, H, T, S, D, causal, scale, precise);
    });
}

}  // namespace engine
