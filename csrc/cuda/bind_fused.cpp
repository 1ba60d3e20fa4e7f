// Python bindings of the fused kernels (fused.h): attention, and the fused / mixed-precision kernels.
// Shapes and layouts are worked out in engine/backends/cuda.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "attention_wgmma.h"
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
    m.def("attention_wgmma_built", &attention_wgmma_built);
    m.def("attention_wgmma_forward", &attention_wgmma_forward, py::arg("enabled"),
          "whether the Hopper attention forward may run; returns the previous setting");
    m.def("attention_wgmma_backward", &attention_wgmma_backward, py::arg("enabled"),
          "whether the Hopper attention backward may run; returns the previous setting");
    m.def("attention_forward", [](int device, int dtype, addr o, addr lse, addr q, addr k, addr v,
                                  const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
                                  const std::vector<int64_t>& lv, const std::vector<int64_t>& lo, int B, int H, int T,
                                  int S, int D, bool causal, float scale, bool precise, float dropout_p,
                                  uint64_t seed, addr rng_key) {
        attention_forward(device, dtype, P(o), P<float>(lse), P(q), P(k), P(v), L(lq), L(lk), L(lv), L(lo), B, H, T, S,
                          D, causal, scale, precise, dropout_p, seed, P<uint64_t>(rng_key));
    });
    m.def("attention_backward", [](int device, int dtype, addr dq, addr dk, addr dv, addr dout, addr q, addr k,
                                   addr v, addr o, addr lse, const std::vector<int64_t>& lq,
                                   const std::vector<int64_t>& lk, const std::vector<int64_t>& lv,
                                   const std::vector<int64_t>& lo, int B, int H, int T, int S, int D, bool causal,
                                   float scale, bool precise, float dropout_p, addr rng_key) {
        attention_backward(device, dtype, P(dq), P(dk), P(dv), P(dout), P(q), P(k), P(v), P(o), P<const float>(lse),
                           L(lq), L(lk), L(lv), L(lo), B, H, T, S, D, causal, scale, precise, dropout_p,
                           P<const uint64_t>(rng_key));
    });
    m.def("attention_dropout_mask", [](int device, addr out, int64_t BH, int T, int S, float p, uint64_t seed,
                                       addr rng_key) {
        attention_dropout_mask(device, P<float>(out), BH, T, S, p, seed, P<const uint64_t>(rng_key));
    });
    m.def("attention_rng_key", [](int device, addr rng_key, uint64_t seed) {
        attention_rng_key(device, P<uint64_t>(rng_key), seed);
    });
    m.def("layernorm_forward_dt", [](int device, int dtype, addr out, addr mean, addr rstd, addr x, addr w, addr b,
                                     int64_t N, int64_t C, float eps) {
        layernorm_forward_dt(device, dtype, P(out), P<float>(mean), P<float>(rstd), P(x), P<const float>(w),
                             P<const float>(b), N, C, eps);
    });
    m.def(
        "layernorm_backward_dt",
        [](int device, int dtype, addr dx, addr dw, addr db, addr dout, addr x, addr w, addr mean, addr rstd, int64_t N,
           int64_t C, addr dres) {
            layernorm_backward_dt(device, dtype, P(dx), P<float>(dw), P<float>(db), P(dout), P(x), P<const float>(w),
                                  P<const float>(mean), P<const float>(rstd), N, C, P(dres));
        },
        py::arg("device"), py::arg("dtype"), py::arg("dx"), py::arg("dw"), py::arg("db"), py::arg("dout"), py::arg("x"),
        py::arg("w"), py::arg("mean"), py::arg("rstd"), py::arg("N"), py::arg("C"), py::arg("dres") = 0);
    m.def("layernorm_add_forward_dt", [](int device, int dtype, addr out, addr sum, addr mean, addr rstd, addr x,
                                         addr res, addr w, addr b, int64_t N, int64_t C, float eps) {
        layernorm_add_forward_dt(device, dtype, P(out), P(sum), P<float>(mean), P<float>(rstd), P(x), P(res),
                                 P<const float>(w), P<const float>(b), N, C, eps);
    });
    m.def(
        "linear_bias_grad",
        [](int device, int dtype, addr db, addr dpre, addr g, addr pre, int64_t N, int64_t O, int db_dtype) {
            return linear_bias_grad(device, dtype, P(db), P(dpre), P(g), P(pre), N, O, db_dtype);
        },
        py::arg("device"), py::arg("dtype"), py::arg("db"), py::arg("dpre"), py::arg("g"), py::arg("pre"),
        py::arg("N"), py::arg("O"), py::arg("db_dtype") = -1);  // db_dtype -1: g's dtype
    m.def("cross_entropy_forward_dt", [](int device, int dtype, addr losses, addr lse, addr logits, addr targets,
                                         int64_t N, int64_t V, int64_t ignore_index) {
        cross_entropy_forward_dt(device, dtype, P<float>(losses), P<float>(lse), P(logits), P<const int64_t>(targets),
                                 N, V, ignore_index);
    });
    m.def("cross_entropy_backward_dt", [](int device, int dtype, addr dlogits, addr logits, addr targets, addr lse,
                                          addr g, int64_t N, int64_t V, int64_t ignore_index) {
        cross_entropy_backward_dt(device, dtype, P(dlogits), P(logits), P<const int64_t>(targets), P<const float>(lse),
                                  P<const float>(g), N, V, ignore_index);
    });
    m.def("cross_entropy_with_grad_dt", [](int device, int dtype, addr losses, addr logits, addr targets, int64_t N,
                                           int64_t V, int64_t ignore_index) {
        cross_entropy_with_grad_dt(device, dtype, P<float>(losses), P(logits), P<const int64_t>(targets), N, V,
                                   ignore_index);
    });
    m.def("scale_dt", [](int device, int dtype, addr out, addr x, addr factor, int64_t n) {
        scale_dt(device, dtype, P(out), P(x), P<const float>(factor), n);
    });
}

}  // namespace engine
