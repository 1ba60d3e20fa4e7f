// The registry of engine._C's CUDA backend: bind_cuda() (called from csrc/module.cpp) registers the
// runtime's bindings and then every op family's, one bind_<family>() each (<family>/bind.cpp).
// A new family is one line here, one directory in CMakeLists.txt's ENGINE_CUDA_FAMILIES.
//
// The binding rule (csrc/README.md says more): every op is a module-level function
//   m.def("<op>", [](int device, [int op,] [int dtype,] <outputs>, <inputs>, <sizes>, <options>) {...})
// - device first: the CUDA device index. No stream argument: the launcher queues on stream(device),
//   the device's one stream, and never waits for it.
// - dtype as the DType code of runtime/types.h (engine/backends/cuda/'s _CODE); a sub-op (which
//   binary, unary or epilogue) as its enum's int, before the dtype.
// - buffers as device addresses: plain ints (`addr`), outputs before inputs, 0 for an absent operand;
//   P<T>(addr) turns one into the launcher's pointer. Lists of tensors (the multi-tensor ops) as a list
//   of addresses and a list of element counts (floats()); shapes and strides as lists (make_strided()).
//   The helpers are runtime/bind_args.h; shapes and broadcasting are worked out in Python.
// - sizes as int64 (int for attention's B, H, T, S, D), options last; a default (py::arg) only for a
//   trailing option whose default keeps older calls valid (out_dtype = -1, dres = 0, db_dtype = -1).
// - the lambda only converts arguments and calls the launcher. Errors are the launcher's: CUDA errors
//   through check() / check_launch() with the op name (CudaError), a dtype it lacks through
//   unsupported(op, dtype), bad arguments as std::runtime_error with the op name first (RuntimeError).
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace engine {

// the runtime (runtime/): exceptions, devices, streams, memory and transfers; DLPack; graphs and pools
void bind_runtime(py::module_& m);  // runtime/bind.cpp
void bind_dlpack(py::module_& m);   // runtime/dlpack.cpp
void bind_graphs(py::module_& m);   // runtime/graph.cpp
// the op families, one directory each
void bind_elementwise(py::module_& m);
void bind_copy(py::module_& m);
void bind_reduce(py::module_& m);
void bind_softmax(py::module_& m);
void bind_layernorm(py::module_& m);
void bind_attention(py::module_& m);
void bind_matmul(py::module_& m);
void bind_fp8(py::module_& m);
void bind_embedding(py::module_& m);
void bind_optimizer(py::module_& m);
void bind_random(py::module_& m);
#ifdef ENGINE_WITH_NCCL
void bind_nccl(py::module_& m);  // nccl/bind.cpp: the process group of engine.distributed, when NCCL was found
#endif

void bind_cuda(py::module_& m) {
    bind_runtime(m);  // first: CudaError and DeviceBuffer, which later signatures name
    bind_dlpack(m);
    bind_graphs(m);
    bind_elementwise(m);
    bind_copy(m);
    bind_reduce(m);
    bind_softmax(m);
    bind_layernorm(m);
    bind_attention(m);
    bind_matmul(m);
    bind_fp8(m);
    bind_embedding(m);
    bind_optimizer(m);
    bind_random(m);
#ifdef ENGINE_WITH_NCCL
    bind_nccl(m);
#endif
}

}  // namespace engine
