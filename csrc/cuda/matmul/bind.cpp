// Python bindings of matmul/ (the cuBLASLt GEMMs, their epilogues, TF32, and the Linear bias
// gradient): one m.def per launcher of matmul/matmul.h, after the binding rule of csrc/README.md
// (device first, dtype code, addresses as ints, sizes, options).
#include "matmul/matmul.h"
#include "runtime/bind_args.h"

namespace engine {

void bind_matmul(py::module_& m) {
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
    m.def(
        "matmul_fp8",
        [](int device, int epilogue, addr c, addr a, addr b, int a_format, int b_format, addr a_inv_scale,
           addr b_inv_scale, int64_t M, int64_t N, int64_t K, addr bias, addr aux, bool fast_accum, int out_dtype) {
            return matmul_fp8(device, epilogue, P(c), P(a), P(b), a_format, b_format, P<float>(a_inv_scale),
                              P<float>(b_inv_scale), M, N, K, P(bias), P(aux), fast_accum, out_dtype);
        },
        py::arg("device"), py::arg("epilogue"), py::arg("c"), py::arg("a"), py::arg("b"), py::arg("a_format"),
        py::arg("b_format"), py::arg("a_inv_scale"), py::arg("b_inv_scale"), py::arg("M"), py::arg("N"), py::arg("K"),
        py::arg("bias"), py::arg("aux"), py::arg("fast_accum"), py::arg("out_dtype") = -1);  // -1: bfloat16
    m.def("set_allow_tf32", &set_allow_tf32);
    m.def("allow_tf32", &allow_tf32);
    m.def(
        "linear_bias_grad",
        [](int device, int dtype, addr db, addr dpre, addr g, addr pre, int64_t N, int64_t O, int db_dtype,
           addr dpre8, addr inv_scale, addr meta, addr dpre8_t) {
            return linear_bias_grad(device, dtype, P(db), P(dpre), P(g), P(pre), N, O, db_dtype, P(dpre8),
                                    P<float>(inv_scale), P<float>(meta), P(dpre8_t));
        },
        py::arg("device"), py::arg("dtype"), py::arg("db"), py::arg("dpre"), py::arg("g"), py::arg("pre"),
        py::arg("N"), py::arg("O"), py::arg("db_dtype") = -1,  // db_dtype -1: g's dtype
        py::arg("dpre8") = 0, py::arg("inv_scale") = 0, py::arg("meta") = 0,  // 0: no E5M2 copy
        py::arg("dpre8_t") = 0);  // 0: no transposed copy
}

}  // namespace engine
