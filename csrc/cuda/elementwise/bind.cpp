// Python bindings of elementwise/ (binary / unary / activation backward / where): one m.def per
// launcher of elementwise/elementwise.h, after the binding rule of csrc/README.md (device first,
// dtype code, addresses as ints, sizes, options).
#include "elementwise/elementwise.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_elementwise(py::module_& m) {
    m.def("binary", [](int device, int op, int dtype, addr out, addr a, addr b, double scalar, int mode,
                       const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& strides, int64_t n) {
        binary(device, op, dtype, P(out), P(a), P(b), scalar, mode, make_strided(shape, strides), n);
    });
    m.def("unary", [](int device, int op, int dtype, addr out, addr x, int64_t n) {
        unary(device, op, dtype, P(out), P(x), n);
    });
    m.def("act_backward", [](int device, int op, int dtype, addr dx, addr x, addr g, int64_t n) {
        act_backward(device, op, dtype, P(dx), P(x), P(g), n);
    });
    m.def("where", [](int device, int dtype, addr out, addr cond, addr a, addr b, double sa, double sb, bool as,
                      bool bs, const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& strides,
                      int64_t n) {
        where(device, dtype, P(out), P(cond), P(a), P(b), sa, sb, as, bs, make_strided(shape, strides), n);
    });
}

}  // namespace engine
