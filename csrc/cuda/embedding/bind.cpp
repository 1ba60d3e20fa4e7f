// Python bindings of embedding/ (embedding lookup and its backward): one m.def per launcher of
// embedding/embedding.h, after the binding rule of csrc/README.md (device first, dtype code,
// addresses as ints, sizes, options).
#include "embedding/embedding.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_embedding(py::module_& m) {
    m.def("embedding_forward", [](int device, int dtype, addr out, addr weight, addr idx, int64_t N, int64_t V,
                                  int64_t C) {
        embedding_forward(device, dtype, P(out), P(weight), P<const int64_t>(idx), N, V, C);
    });
    m.def("embedding_positions_forward", [](int device, int out_dtype, addr out, addr weight, addr pos, addr idx,
                                            int64_t N, int64_t V, int64_t C, int T, int start) {
        embedding_positions_forward(device, out_dtype, P(out), P<const float>(weight), P<const float>(pos),
                                    P<const int64_t>(idx), N, V, C, T, start);
    });
    m.def("embedding_backward", [](int device, int g_dtype, addr dweight, addr g, addr idx, int64_t N, int64_t V,
                                   int64_t C, bool accumulate) {
        embedding_backward(device, g_dtype, P<float>(dweight), P(g), P<const int64_t>(idx), N, V, C, accumulate);
    });
    m.def("embedding_positions_backward", [](int device, int g_dtype, addr dweight, addr dpos, addr g, addr idx,
                                             int64_t N, int64_t V, int64_t num_pos, int64_t C, int T, int start,
                                             bool accumulate) {
        embedding_positions_backward(device, g_dtype, P<float>(dweight), P<float>(dpos), P(g), P<const int64_t>(idx),
                                     N, V, num_pos, C, T, start, accumulate);
    });
}

}  // namespace engine
