// Python bindings of optimizer/ (fused AdamW and SGD, with host or device scalars): one m.def per
// launcher of optimizer/optimizer.h, after the binding rule of csrc/README.md. Tensor lists come as
// lists of addresses with a list of element counts.
#include "optimizer/optimizer.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_optimizer(py::module_& m) {
    m.def("adamw", [](int device, const std::vector<addr>& p, const std::vector<addr>& g, const std::vector<addr>& mm,
                      const std::vector<addr>& v, const std::vector<int64_t>& n, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float bc1, float bc2) {
        adamw(device, floats(p), floats(g), floats(mm), floats(v), n, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
    });
    m.def("sgd", [](int device, const std::vector<addr>& p, const std::vector<addr>& g, const std::vector<addr>& buf,
                    const std::vector<int64_t>& n, float lr, float momentum, float dampening, bool nesterov,
                    float weight_decay, bool first_step) {
        sgd(device, floats(p), floats(g), floats(buf), n, lr, momentum, dampening, nesterov, weight_decay, first_step);
    });
    // device scalars (lr, step: float32 device memory), for captured graphs (runtime/graph.h)
    m.def("adamw_dev", [](int device, const std::vector<addr>& p, const std::vector<addr>& g,
                          const std::vector<addr>& mo, const std::vector<addr>& v, const std::vector<int64_t>& n,
                          addr lr, addr step, double beta1, double beta2, float eps, float weight_decay) {
        adamw_dev(device, floats(p), floats(g), floats(mo), floats(v), n, P<const float>(lr), P<const float>(step),
                  beta1, beta2, eps, weight_decay);
    });
    m.def("sgd_dev", [](int device, const std::vector<addr>& p, const std::vector<addr>& g,
                        const std::vector<addr>& buf, const std::vector<int64_t>& n, addr lr, float momentum,
                        float dampening, bool nesterov, float weight_decay, bool first_step) {
        sgd_dev(device, floats(p), floats(g), floats(buf), n, P<const float>(lr), momentum, dampening, nesterov,
                weight_decay, first_step);
    });
    m.def("optim_step_advance", [](int device, addr steps, uint64_t mask) {
        optim_step_advance(device, P<float>(steps), mask);
    });
}

}  // namespace engine
