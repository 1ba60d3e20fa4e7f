// Python bindings of fp8/ (the FP8 casts with delayed scaling), after the binding rule of
// csrc/README.md (device first, dtype code, addresses as ints, sizes, options).
#include "fp8/fp8.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_fp8(py::module_& m) {
    // out_t 0: no transposed copy
    m.def(
        "fp8_cast",
        [](int device, int dtype, int format, addr out, addr out_t, addr inv_scale, addr meta, addr in, int64_t rows,
           int64_t cols, bool current) {
            fp8_cast(device, dtype, format, P(out), P(out_t), P<float>(inv_scale), P<float>(meta), P(in), rows, cols,
                     current);
        },
        py::arg("device"), py::arg("dtype"), py::arg("format"), py::arg("out"), py::arg("out_t"), py::arg("inv_scale"),
        py::arg("meta"), py::arg("input"), py::arg("rows"), py::arg("cols"), py::arg("current"));
    m.attr("fp8_meta_words") = kFp8MetaWords;
}

}  // namespace engine
