// Python bindings of the kernels (filled in with the kernel families).
#include <pybind11/pybind11.h>
namespace py = pybind11;
namespace engine {
void bind_ops(py::module_& m) { (void)m; }
}  // namespace engine
