// Python bindings of cpu/ (the coordinator's close, robust.h), built into every engine._C, the CPU-only
// build too; called from module.cpp. Unlike the CUDA ops (device addresses, csrc/README.md) these take
// numpy arrays: the rows of one chunk are views of the contributions in RAM or the rows of a stack read
// from the spool, so nothing is copied. Each function checks its arguments (ValueError, the op name
// first), takes the pointers, then releases the GIL for the whole computation: coop.threads' pool runs
// one chunk per core.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <type_traits>
#include <vector>

#include "cpu/robust.h"

namespace py = pybind11;

namespace engine {
namespace {

[[noreturn]] void bad(const std::string& op, const std::string& what) { throw py::value_error(op + ": " + what); }

std::string dtype_of(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// a 1-D C-contiguous array of T with `size` elements (-1: any), else ValueError naming `what`
template <typename T>
py::array vector_of(const std::string& op, const std::string& what, const py::handle& obj, int64_t size) {
    const char* type = std::is_same_v<T, float> ? "float32" : "float64";
    if (!py::isinstance<py::array>(obj)) bad(op, what + " must be a numpy " + type + " array, got " + std::string(py::str(py::type::of(obj))));
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!py::isinstance<py::array_t<T>>(a)) bad(op, what + " must be " + type + ", got " + dtype_of(a) + " (convert it with .astype(np." + type + "))");
    if (a.ndim() != 1) bad(op, what + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
    if (!(a.flags() & py::array::c_style)) bad(op, what + " must be C-contiguous (a strided view: pass np.ascontiguousarray of it)");
    if (size >= 0 && a.size() != size)
        bad(op, what + " has " + std::to_string(a.size()) + " elements, expected " + std::to_string(size));
    return a;
}

// the N rows of one chunk: their pointers, with the arrays that own them kept alive
struct Rows {
    std::vector<py::array> arrays;
    std::vector<const float*> pointers;
    int64_t length = 0;
};

Rows rows_of(const std::string& op, const py::sequence& rows) {
    Rows out;
    const int64_t N = static_cast<int64_t>(py::len(rows));
    if (N == 0) bad(op, "needs at least one row, got an empty sequence");
    for (int64_t i = 0; i < N; ++i) {
        py::object item = rows[i];
        out.arrays.push_back(vector_of<float>(op, "row " + std::to_string(i), item, i ? out.length : -1));
        if (i == 0) out.length = out.arrays[0].size();
        out.pointers.push_back(static_cast<const float*>(out.arrays.back().data()));
    }
    return out;
}

float* writable(const std::string& op, py::array& out) {
    if (!out.writeable()) bad(op, "out is read-only");
    return static_cast<float*>(out.mutable_data());
}

}  // namespace

void bind_cpu(py::module_& m) {
    m.def("median_dots", [](const py::sequence& rows, const py::handle& scales, const py::handle& coefficients,
                            const py::handle& out) {
        const std::string op = "median_dots";
        Rows r = rows_of(op, rows);
        const int64_t N = static_cast<int64_t>(r.pointers.size());
        py::array s = vector_of<float>(op, "scales", scales, N);
        const double* c = nullptr;
        float* o = nullptr;
        py::array c_array, o_array;
        if (coefficients.is_none() != out.is_none()) bad(op, "coefficients and out come together (the weighted sum) or not at all");
        if (!coefficients.is_none()) {
            c_array = vector_of<double>(op, "coefficients", coefficients, N);
            o_array = vector_of<float>(op, "out", out, r.length);
            c = static_cast<const double*>(c_array.data());
            o = writable(op, o_array);
        }
        py::array_t<double> dots(N + 1);
        double* d = dots.mutable_data();
        const float* sp = static_cast<const float*>(s.data());
        {
            py::gil_scoped_release release;
            median_dots(r.pointers.data(), N, r.length, sp, d, c, o);
        }
        return dots;
    }, py::arg("rows"), py::arg("scales"), py::arg("coefficients") = py::none(), py::arg("out") = py::none(),
    "rows: N 1-D C-contiguous float32 arrays of n each; scales (N,) float32 -> (N + 1,) float64: with\n"
    "x_i = rows[i] * scales[i] (float32) and m their coordinate-wise median (float32), x_i . m for each i,\n"
    "then m . m (float64 sums). With coefficients (N,) float64 and out (n,) float32, also\n"
    "weighted_sum_into(rows, coefficients, out) in the same pass. Releases the GIL.");

    m.def("weighted_sum_into", [](const py::sequence& rows, const py::handle& coefficients, const py::handle& out) {
        const std::string op = "weighted_sum_into";
        Rows r = rows_of(op, rows);
        const int64_t N = static_cast<int64_t>(r.pointers.size());
        py::array c_array = vector_of<double>(op, "coefficients", coefficients, N);
        py::array o_array = vector_of<float>(op, "out", out, r.length);
        const double* c = static_cast<const double*>(c_array.data());
        float* o = writable(op, o_array);
        py::gil_scoped_release release;
        weighted_sum(r.pointers.data(), N, r.length, c, o);
    }, py::arg("rows"), py::arg("coefficients"), py::arg("out"),
    "rows: N 1-D C-contiguous float32 arrays of n each; coefficients (N,) float64; out (n,) float32:\n"
    "out[j] = float32(sum_i double(rows[i][j]) * coefficients[i]), summed in float64 in the order\n"
    "i = 0 .. N-1 and rounded once (numpy's acc += row * c, then out[...] = acc). Releases the GIL.");
}

}  // namespace engine
