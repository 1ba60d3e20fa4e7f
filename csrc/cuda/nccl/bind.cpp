// Python bindings of the NCCL process group (nccl.h): NcclError, nccl_unique_id, nccl_version and
// the NcclComm class that engine/distributed/nccl_backend.py drives. Calls that may wait (init,
// every collective's enqueue, destroy, the watchdog's check) release the GIL, so the watchdog
// thread and the other Python threads run meanwhile.
#include <pybind11/pybind11.h>

#include <memory>

#include "nccl/nccl.h"

namespace py = pybind11;

namespace engine {

void bind_nccl(py::module_& m) {
    py::register_exception<NcclError>(m, "NcclError", PyExc_RuntimeError);
    m.def("nccl_unique_id", []() { return py::bytes(nccl_unique_id()); },
          "A new ncclUniqueId (128 bytes): rank 0 makes it and hands it to the other ranks.");
    m.def("nccl_version", &nccl_version, "NCCL_VERSION_CODE of the loaded NCCL library.");
    using release = py::call_guard<py::gil_scoped_release>;
    py::class_<NcclComm, std::shared_ptr<NcclComm>>(m, "NcclComm",
                                                    "One rank's NCCL communicator (csrc/cuda/nccl/nccl.h).")
        .def(py::init([](int device, py::bytes unique_id, int world_size, int rank, double timeout_s) {
                 std::string id = unique_id;
                 py::gil_scoped_release unlocked;
                 return std::make_shared<NcclComm>(device, id, world_size, rank, timeout_s);
             }),
             py::arg("device"), py::arg("unique_id"), py::arg("world_size"), py::arg("rank"), py::arg("timeout_s"))
        // (addr, count, dtype code, op code 0 sum / 1 avg / 2 max / 3 min, side stream)
        .def("all_reduce", &NcclComm::all_reduce, release(), py::arg("ptr"), py::arg("count"), py::arg("dtype"),
             py::arg("op"), py::arg("side"))
        // (addr, count, dtype code, root rank, side stream)
        .def("broadcast", &NcclComm::broadcast, release(), py::arg("ptr"), py::arg("count"), py::arg("dtype"),
             py::arg("root"), py::arg("side"))
        .def("join", &NcclComm::join, "engine's stream waits for the side stream's collectives (no host wait).")
        .def("check", &NcclComm::check, release(), "'' while healthy, else why the communicator was aborted.")
        .def("abort", &NcclComm::abort, release(), py::arg("why"))
        .def("destroy", &NcclComm::destroy, release())
        .def("failure", &NcclComm::failure)
        .def_property_readonly("device", &NcclComm::device)
        .def_property_readonly("rank", &NcclComm::rank)
        .def_property_readonly("world_size", &NcclComm::world_size);
}

}  // namespace engine
