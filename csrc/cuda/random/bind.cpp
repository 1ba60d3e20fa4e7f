// Python bindings of random/ (dropout masks, rand, randn): one m.def per launcher of
// random/random.h, after the binding rule of csrc/README.md (device first, dtype code, addresses as
// ints, sizes, options).
#include "random/random.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_random(py::module_& m) {
    m.def("dropout_mask", [](int device, int dtype, addr out, int64_t n, float p, uint64_t seed, uint64_t offset) {
        dropout_mask(device, dtype, P(out), n, p, seed, offset);
    });
    m.def("random_uniform", [](int device, addr out, int64_t n, uint64_t seed, uint64_t offset) {
        random_uniform(device, P<float>(out), n, seed, offset);
    });
    m.def("random_normal", [](int device, addr out, int64_t n, uint64_t seed, uint64_t offset) {
        random_normal(device, P<float>(out), n, seed, offset);
    });
}

}  // namespace engine
