// Python bindings of copy/ (strided copy, dtype conversion, fill, arange): one m.def per launcher
// of copy/copy.h, after the binding rule of csrc/README.md (device first, dtype code, addresses as
// ints, sizes, options).
#include "copy/copy.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_copy(py::module_& m) {
    m.def("strided_copy", [](int device, int elsize, addr dst, addr src, const std::vector<int64_t>& shape,
                             const std::vector<std::vector<int64_t>>& strides, int64_t n) {
        strided_copy(device, elsize, P(dst), P(src), make_strided(shape, strides), n);
    });
    m.def("astype", [](int device, int src, int dst, addr out, addr x, int64_t n) {
        astype(device, src, dst, P(out), P(x), n);
    });
    m.def("astype_f32_bf16_many", [](int device, const std::vector<addr>& src, const std::vector<addr>& dst,
                                     const std::vector<int64_t>& n) {
        std::vector<const float*> s;
        std::vector<void*> d;
        for (addr a : src) s.push_back((const float*)P(a));
        for (addr a : dst) d.push_back(P(a));
        astype_f32_bf16_many(device, s, d, n);
    });
    m.def("fill", [](int device, int dtype, addr out, double value, int64_t n) { fill(device, dtype, P(out), value, n); });
    m.def("arange", [](int device, int dtype, addr out, double start, double step, int64_t n) {
        arange(device, dtype, P(out), start, step, n);
    });
}

}  // namespace engine
