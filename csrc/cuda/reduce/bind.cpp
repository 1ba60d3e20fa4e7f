// Python bindings of reduce/ (reductions, argmax, the multi-tensor sum of squares and scale): one
// m.def per launcher of reduce/reduce.h, after the binding rule of csrc/README.md (device first,
// dtype code, addresses as ints, sizes, options).
#include "reduce/reduce.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_reduce(py::module_& m) {
    m.def("reduce", [](int device, int op, int dtype, addr out, addr x, int64_t outer, int64_t R, int64_t inner) {
        reduce(device, op, dtype, P(out), P(x), outer, R, inner);
    });
    m.def("argmax_lastdim", [](int device, int dtype, addr out, addr x, int64_t rows, int64_t L) {
        argmax_lastdim(device, dtype, P<int64_t>(out), P(x), rows, L);
    });
    m.def("sum_of_squares", [](int device, addr out, const std::vector<addr>& xs, const std::vector<int64_t>& ns) {
        sum_of_squares(device, P<float>(out), floats(xs), ns);
    });
    m.def("scale_multi", [](int device, const std::vector<addr>& xs, const std::vector<int64_t>& ns, addr factor) {
        scale_multi(device, floats(xs), ns, P<const float>(factor));
    });
}

}  // namespace engine
