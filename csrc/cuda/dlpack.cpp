#include <pybind11/pybind11.h>
namespace py = pybind11;
namespace engine {
void bind_dlpack(py::module_& m) { (void)m; }
}  // namespace engine
