// engine._C: the extension module. Always built (C++ only): build_info and the CPU kernels of the
// coordinator's close (bind_cpu(), cpu/bind.cpp); the CUDA backend's bindings are added by bind_cuda()
// (cuda/registry.cpp) when CMake found nvcc and cuBLASLt (ENGINE_WITH_CUDA). csrc/README.md is the map
// of csrc/.
#include <pybind11/pybind11.h>

#include "build_info.h"

namespace py = pybind11;

namespace engine { void bind_cpu(py::module_& m); }  // cpu/bind.cpp: median_dots, weighted_sum_into

#ifdef ENGINE_WITH_CUDA
namespace engine { void bind_cuda(py::module_& m); }
static constexpr bool kCudaBuilt = true;
#else
static constexpr bool kCudaBuilt = false;
#endif
#ifdef ENGINE_WITH_NCCL
static constexpr bool kNcclBuilt = true;
#else
static constexpr bool kNcclBuilt = false;
#endif

PYBIND11_MODULE(_C, m) {
    m.doc() = "engine's native extension: build information, the CPU kernels of coop.robust and (when built) the CUDA backend";

    m.def("build_info", []() {
        py::dict d;
        d["version"] = ENGINE_VERSION;
        d["compiler"] = ENGINE_CXX_COMPILER;
        d["build_type"] = ENGINE_BUILD_TYPE;
        d["cuda_built"] = kCudaBuilt;
        d["cuda_reason"] = kCudaBuilt ? "" : ENGINE_CUDA_REASON;
        d["cuda_compiler"] = kCudaBuilt ? ENGINE_CUDA_COMPILER : "";
        d["cuda_version"] = ENGINE_CUDA_VERSION;
        d["cuda_archs"] = kCudaBuilt ? ENGINE_CUDA_ARCHS : "";
        d["cublaslt_path"] = ENGINE_CUBLASLT_PATH;
        d["nccl_built"] = kNcclBuilt;
        d["nccl_reason"] = kNcclBuilt ? "" : (kCudaBuilt ? ENGINE_NCCL_REASON : "the CUDA backend is not built");
        d["nccl_path"] = ENGINE_NCCL_PATH;
        return d;
    }, "What was built: version, compiler, whether the CUDA backend and NCCL are in (and why not), library paths.");

    engine::bind_cpu(m);
#ifdef ENGINE_WITH_CUDA
    engine::bind_cuda(m);
#else
    m.def("cuda_available", []() { return false; }, "False: this build has no CUDA backend.");
    m.def("device_count", []() { return 0; });
    m.def("cuda_status", []() { return std::string("engine was built without CUDA: ") + ENGINE_CUDA_REASON; });
#endif
}
