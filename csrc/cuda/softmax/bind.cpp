// Python bindings of softmax/ (softmax, cross-entropy and the fused classifier): one m.def per
// launcher of softmax/softmax.h, after the binding rule of csrc/README.md (device first, dtype
// code, addresses as ints, sizes, options).
#include "softmax/softmax.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_softmax(py::module_& m) {
    m.def("softmax_forward", [](int device, addr out, addr x, int64_t N, int64_t L, bool log) {
        softmax_forward(device, P<float>(out), P<const float>(x), N, L, log);
    });
    m.def("softmax_backward", [](int device, addr dx, addr y, addr g, int64_t N, int64_t L, bool log) {
        softmax_backward(device, P<float>(dx), P<const float>(y), P<const float>(g), N, L, log);
    });
    m.def("cross_entropy_forward", [](int device, addr losses, addr lse, addr logits, addr targets, int64_t N,
                                      int64_t V, int64_t ignore_index) {
        cross_entropy_forward(device, P<float>(losses), P<float>(lse), P<const float>(logits),
                              P<const int64_t>(targets), N, V, ignore_index);
    });
    m.def("cross_entropy_backward", [](int device, addr dlogits, addr logits, addr targets, addr lse, addr g,
                                       int64_t N, int64_t V, int64_t ignore_index) {
        cross_entropy_backward(device, P<float>(dlogits), P<const float>(logits), P<const int64_t>(targets),
                               P<const float>(lse), P<const float>(g), N, V, ignore_index);
    });
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
    m.def(
        "cross_entropy_with_grad_dt",
        [](int device, int dtype, addr losses, addr logits, addr targets, int64_t N, int64_t V, int64_t ignore_index,
           addr dlogits8, addr grad_scale) {
            cross_entropy_with_grad_dt(device, dtype, P<float>(losses), P(logits), P<const int64_t>(targets), N, V,
                                       ignore_index, P(dlogits8), P<const float>(grad_scale));
        },
        py::arg("device"), py::arg("dtype"), py::arg("losses"), py::arg("logits"), py::arg("targets"), py::arg("N"),
        py::arg("V"), py::arg("ignore_index"), py::arg("dlogits8") = 0,  // 0: no FP8 copy
        py::arg("grad_scale") = 0);                                       // 0: times 1
    m.attr("dlogits_fp8_scale") = kDlogitsFp8Scale;
    m.def("scale_dt", [](int device, int dtype, addr out, addr x, addr factor, int64_t n) {
        scale_dt(device, dtype, P(out), P(x), P<const float>(factor), n);
    });
}

}  // namespace engine
