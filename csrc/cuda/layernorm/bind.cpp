// Python bindings of layernorm/ (layer norm (float32 and dtype-generic) and residual add + layer
// norm): one m.def per launcher of layernorm/layernorm.h, after the binding rule of csrc/README.md
// (device first, dtype code, addresses as ints, sizes, options).
#include "layernorm/layernorm.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_layernorm(py::module_& m) {
    m.def("layernorm_forward", [](int device, addr out, addr mean, addr rstd, addr x, addr w, addr b, int64_t N,
                                  int64_t C, float eps) {
        layernorm_forward(device, P<float>(out), P<float>(mean), P<float>(rstd), P<const float>(x), P<const float>(w),
                          P<const float>(b), N, C, eps);
    });
    m.def("layernorm_backward", [](int device, addr dx, addr dw, addr db, addr dout, addr x, addr w, addr mean,
                                   addr rstd, int64_t N, int64_t C) {
        layernorm_backward(device, P<float>(dx), P<float>(dw), P<float>(db), P<const float>(dout), P<const float>(x),
                           P<const float>(w), P<const float>(mean), P<const float>(rstd), N, C);
    });
    m.def("layernorm_forward_dt", [](int device, int dtype, addr out, addr mean, addr rstd, addr x, addr w, addr b,
                                     int64_t N, int64_t C, float eps) {
        layernorm_forward_dt(device, dtype, P(out), P<float>(mean), P<float>(rstd), P(x), P<const float>(w),
                             P<const float>(b), N, C, eps);
    });
    m.def(
        "layernorm_backward_dt",
        [](int device, int dtype, addr dx, addr dw, addr db, addr dout, addr x, addr w, addr mean, addr rstd, int64_t N,
           int64_t C, addr dres, addr ds) {
            layernorm_backward_dt(device, dtype, P(dx), P<float>(dw), P<float>(db), P(dout), P(x), P<const float>(w),
                                  P<const float>(mean), P<const float>(rstd), N, C, P(dres), P<float>(ds));
        },
        py::arg("device"), py::arg("dtype"), py::arg("dx"), py::arg("dw"), py::arg("db"), py::arg("dout"), py::arg("x"),
        py::arg("w"), py::arg("mean"), py::arg("rstd"), py::arg("N"), py::arg("C"), py::arg("dres") = 0,
        py::arg("ds") = 0);
    m.def("layernorm_add_forward_dt", [](int device, int dtype, addr out, addr sum, addr mean, addr rstd, addr x,
                                         addr res, addr rb, addr w, addr b, int64_t N, int64_t C, float eps) {
        layernorm_add_forward_dt(device, dtype, P(out), P(sum), P<float>(mean), P<float>(rstd), P(x), P(res),
                                 P<const float>(rb), P<const float>(w), P<const float>(b), N, C, eps);
    });
}

}  // namespace engine
