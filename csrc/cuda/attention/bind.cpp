// Python bindings of attention/ (fused attention, its dropout mask and key, the Hopper kernels'
// switches): one m.def per launcher of attention/attention.h and attention/attention_wgmma.h, after
// the binding rule of csrc/README.md. Layouts come as (batch, head, time) stride lists.
#include <stdexcept>
#include <vector>

#include "attention/attention.h"
#include "attention/attention_wgmma.h"
#include "runtime/bind_args.h"

namespace engine {
namespace {

AttnLayout L(const std::vector<int64_t>& s) {
    if (s.size() != 3) throw std::runtime_error("attention: a layout is (batch, head, time) strides");
    return AttnLayout{s[0], s[1], s[2]};
}

}  // namespace

void bind_attention(py::module_& m) {
    m.def("attention_wgmma_built", &attention_wgmma_built);
    m.def("attention_wgmma_forward", &attention_wgmma_forward, py::arg("enabled"),
          "whether the Hopper attention forward may run; returns the previous setting");
    m.def("attention_wgmma_backward", &attention_wgmma_backward, py::arg("enabled"),
          "whether the Hopper attention backward may run; returns the previous setting");
    m.def("attention_wgmma_forward_kernel", &attention_wgmma_forward_kernel, py::arg("kernel"),
          "which Hopper forward kernel runs at head dims 64 and 128 (-1: by shape; 0: two warpgroups on cp.async; 1-4: "
          "the warp-specialised ones, 2 or 3 consumer warpgroups x 128 or 64 keys a tile); returns the previous one");
    m.def("attention_wgmma_backward_kernel", &attention_wgmma_backward_kernel, py::arg("kernel"),
          "which Hopper backward kernel runs at head dims 64 and 128 (-1: by shape; 0: one warpgroup a block on "
          "cp.async; 1, 2: the warp-specialised ones with 3 or 2 consumer warpgroups of 64 keys); returns the previous one");
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
                                   float scale, bool precise, float dropout_p, addr rng_key, addr dbias) {
        attention_backward(device, dtype, P(dq), P(dk), P(dv), P(dout), P(q), P(k), P(v), P(o), P<const float>(lse),
                           L(lq), L(lk), L(lv), L(lo), B, H, T, S, D, causal, scale, precise, dropout_p,
                           P<const uint64_t>(rng_key), P<float>(dbias));
    }, py::arg("device"), py::arg("dtype"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("dout"), py::arg("q"),
       py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("lq"), py::arg("lk"), py::arg("lv"),
       py::arg("lo"), py::arg("B"), py::arg("H"), py::arg("T"), py::arg("S"), py::arg("D"), py::arg("causal"),
       py::arg("scale"), py::arg("precise"), py::arg("dropout_p"), py::arg("rng_key"), py::arg("dbias") = 0);
    m.def("attention_dropout_mask", [](int device, addr out, int64_t BH, int T, int S, float p, uint64_t seed,
                                       addr rng_key) {
        attention_dropout_mask(device, P<float>(out), BH, T, S, p, seed, P<const uint64_t>(rng_key));
    });
    m.def("attention_rng_key", [](int device, addr rng_key, uint64_t seed) {
        attention_rng_key(device, P<uint64_t>(rng_key), seed);
    });
}

}  // namespace engine
