// Python bindings of the kernels: thin wrappers that turn integer addresses into pointers.
// Shapes, strides and broadcasting are worked out in engine/backends/cuda.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "ops.h"

namespace py = pybind11;
using addr = std::uintptr_t;

namespace engine {
namespace {

template <typename T = void>
T* P(addr a) { return reinterpret_cast<T*>(a); }

Strided make_strided(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& strides) {
    if (shape.size() > (std::size_t)kMaxDims)
        throw std::runtime_error("cuda backend: at most " + std::to_string(kMaxDims) + " dims after coalescing, got " +
                                 std::to_string(shape.size()));
    Strided s{};
    s.ndim = (int)shape.size();
    for (std::size_t d = 0; d < shape.size(); ++d) {
        s.shape[d] = shape[d];
        for (std::size_t k = 0; k < strides.size() && k < 3; ++k) s.stride[k][d] = strides[k][d];
    }
    if (s.ndim == 0) {  // a scalar: one element
        s.ndim = 1;
        s.shape[0] = 1;
    }
    return s;
}

std::vector<float*> floats(const std::vector<addr>& v) {
    std::vector<float*> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = P<float>(v[i]);
    return out;
}

}  // namespace

void bind_ops(py::module_& m) {
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
    m.def("astype", [](int device, int src, int dst, addr out, addr x, int64_t n) {
        astype(device, src, dst, P(out), P(x), n);
    });
    m.def("fill", [](int device, int dtype, addr out, double value, int64_t n) { fill(device, dtype, P(out), value, n); });
    m.def("arange", [](int device, int dtype, addr out, double start, double step, int64_t n) {
        arange(device, dtype, P(out), start, step, n);
    });
    m.def("strided_copy", [](int device, int elsize, addr dst, addr src, const std::vector<int64_t>& shape,
                             const std::vector<std::vector<int64_t>>& strides, int64_t n) {
        strided_copy(device, elsize, P(dst), P(src), make_strided(shape, strides), n);
    });
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
    m.def("embedding_forward", [](int device, int dtype, addr out, addr weight, addr idx, int64_t N, int64_t V,
                                  int64_t C) {
        embedding_forward(device, dtype, P(out), P(weight), P<const int64_t>(idx), N, V, C);
    });
    m.def("embedding_backward", [](int device, addr dweight, addr g, addr idx, int64_t N, int64_t V, int64_t C) {
        embedding_backward(device, P<float>(dweight), P<const float>(g), P<const int64_t>(idx), N, V, C);
    });
    m.def("dropout_mask", [](int device, int dtype, addr out, int64_t n, float p, uint64_t seed, uint64_t offset) {
        dropout_mask(device, dtype, P(out), n, p, seed, offset);
    });
    m.def("random_uniform", [](int device, addr out, int64_t n, uint64_t seed, uint64_t offset) {
        random_uniform(device, P<float>(out), n, seed, offset);
    });
    m.def("random_normal", [](int device, addr out, int64_t n, uint64_t seed, uint64_t offset) {
        random_normal(device, P<float>(out), n, seed, offset);
    });
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
    // out_dtype -1: the operands' dtype
    m.def(
        "matmul",
        [](int device, int dtype, addr c, addr a, addr b, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta,
           bool tb, int64_t sa, int64_t sb, int64_t sc, int out_dtype) {
            matmul(device, dtype, P(c), P(a), P(b), batch, M, N, K, ta, tb, sa, sb, sc, out_dtype);
        },
        py::arg("device"), py::arg("dtype"), py::arg("c"), py::arg("a"), py::arg("b"), py::arg("batch"), py::arg("M"),
        py::arg("N"), py::arg("K"), py::arg("trans_a"), py::arg("trans_b"), py::arg("stride_a"), py::arg("stride_b"),
        py::arg("stride_c"), py::arg("out_dtype") = -1);
    m.def(
        "matmul_epilogue",
        [](int device, int dtype, int epilogue, addr c, addr a, addr b, int64_t M, int64_t N, int64_t K, bool ta,
           bool tb, addr bias, addr aux, int out_dtype) {
            return matmul_epilogue(device, dtype, epilogue, P(c), P(a), P(b), M, N, K, ta, tb, P(bias), P(aux),
                                   out_dtype);
        },
        py::arg("device"), py::arg("dtype"), py::arg("epilogue"), py::arg("c"), py::arg("a"), py::arg("b"),
        py::arg("M"), py::arg("N"), py::arg("K"), py::arg("trans_a"), py::arg("trans_b"), py::arg("bias"),
        py::arg("aux"), py::arg("out_dtype") = -1);
    m.def("set_allow_tf32", &set_allow_tf32);
    m.def("allow_tf32", &allow_tf32);
}

}  // namespace engine
