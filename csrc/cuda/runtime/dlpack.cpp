// DLPack export and import of device memory: torch.from_dlpack(engine_tensor) and
// engine.from_dlpack(torch_tensor) share memory without a copy. Streams are ordered with an
// event, so neither side waits on the host.
#include "runtime/dlpack.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "runtime/buffer.h"
#include "runtime/types.h"

namespace py = pybind11;

namespace engine {
namespace {

struct ExportCtx {
    std::shared_ptr<DeviceBuffer> owner;  // keeps the memory alive while the consumer holds it
    std::vector<int64_t> shape, strides;
};

DLDataType dl_dtype(int code) {
    switch (code) {
        case F32: return {kDLFloat, 32, 1};
        case F64: return {kDLFloat, 64, 1};
        case F16: return {kDLFloat, 16, 1};
        case BF16: return {kDLBfloat, 16, 1};
        case I64: return {kDLInt, 64, 1};
        case I32: return {kDLInt, 32, 1};
        case U8: return {kDLUInt, 8, 1};
        case BOOL: return {kDLBool, 8, 1};
    }
    unsupported("to_dlpack", code);
}

int engine_dtype(DLDataType t) {
    if (t.lanes != 1) throw std::runtime_error("from_dlpack: vector dtypes (lanes > 1) are not supported");
    if (t.code == kDLFloat && t.bits == 32) return F32;
    if (t.code == kDLFloat && t.bits == 64) return F64;
    if (t.code == kDLFloat && t.bits == 16) return F16;
    if (t.code == kDLBfloat && t.bits == 16) return BF16;
    if (t.code == kDLInt && t.bits == 64) return I64;
    if (t.code == kDLInt && t.bits == 32) return I32;
    if (t.code == kDLUInt && t.bits == 8) return U8;
    if (t.code == kDLBool && t.bits == 8) return BOOL;
    throw std::runtime_error("from_dlpack: unsupported DLPack dtype code " + std::to_string(t.code) + " bits " +
                             std::to_string(t.bits) + " (engine has float32/64/16, bfloat16, int64/32, uint8, bool)");
}

// make the consumer's stream wait for the work queued on ours
void order_streams(int device, py::object consumer_stream) {
    if (consumer_stream.is_none()) return;  // no preference: see the caller
    int64_t s = consumer_stream.cast<int64_t>();
    if (s == -1) return;  // consumer asked for no synchronisation
    cudaStream_t target = s == 1 ? cudaStreamLegacy : s == 2 ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(s);
    use_device(device);
    cudaEvent_t ev;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "to_dlpack");
    check(cudaEventRecord(ev, stream(device)), "to_dlpack");
    check(cudaStreamWaitEvent(target, ev, 0), "to_dlpack");
    check(cudaEventDestroy(ev), "to_dlpack");
}

template <typename M>
void fill_tensor(M* mt, ExportCtx* ctx, std::uintptr_t ptr, int dtype, int device) {
    mt->manager_ctx = ctx;
    DLTensor& t = mt->dl_tensor;
    t.data = reinterpret_cast<void*>(ptr);
    t.device = {kDLCUDA, device};
    t.ndim = (int32_t)ctx->shape.size();
    t.dtype = dl_dtype(dtype);
    t.shape = ctx->shape.data();
    t.strides = ctx->strides.data();
    t.byte_offset = 0;
}

py::capsule export_tensor(std::shared_ptr<DeviceBuffer> owner, std::uintptr_t ptr, std::vector<int64_t> shape,
                          int dtype, py::object consumer_stream, bool versioned) {
    int device = owner->device;
    if (consumer_stream.is_none()) consumer_stream = py::int_(1);  // DLPack: None means the legacy default stream
    order_streams(device, consumer_stream);
    auto* ctx = new ExportCtx{std::move(owner), std::move(shape), {}};
    ctx->strides.resize(ctx->shape.size());
    int64_t st = 1;
    for (int i = (int)ctx->shape.size() - 1; i >= 0; --i) {
        ctx->strides[i] = st;
        st *= ctx->shape[i];
    }
    if (versioned) {
        auto* mt = new DLManagedTensorVersioned();
        mt->version = {1, 0};
        mt->flags = 0;
        mt->deleter = [](DLManagedTensorVersioned* self) {
            delete static_cast<ExportCtx*>(self->manager_ctx);
            delete self;
        };
        fill_tensor(mt, ctx, ptr, dtype, device);
        return py::capsule(mt, "dltensor_versioned", [](PyObject* cap) {
            if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
                auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
                if (t && t->deleter) t->deleter(t);
            } else {
                PyErr_Clear();
            }
        });
    }
    auto* mt = new DLManagedTensor();
    mt->deleter = [](DLManagedTensor* self) {
        delete static_cast<ExportCtx*>(self->manager_ctx);
        delete self;
    };
    fill_tensor(mt, ctx, ptr, dtype, device);
    return py::capsule(mt, "dltensor", [](PyObject* cap) {
        if (PyCapsule_IsValid(cap, "dltensor")) {
            auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
            if (t && t->deleter) t->deleter(t);
        } else {
            PyErr_Clear();
        }
    });
}

// -> (buffer, shape, strides (elements), dtype code, device index); the buffer calls the
// producer's deleter when engine drops it
py::tuple import_tensor(py::capsule cap) {
    const char* name = cap.name();
    DLTensor* t = nullptr;
    std::function<void()> release;
    if (std::string(name) == "dltensor_versioned") {
        auto* mt = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), name));
        if (mt->version.major > 1)
            throw std::runtime_error("from_dlpack: DLPack major version " + std::to_string(mt->version.major) +
                                     " is newer than engine understands (1)");
        t = &mt->dl_tensor;
        release = [mt]() { if (mt->deleter) mt->deleter(mt); };
        PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned");
    } else if (std::string(name) == "dltensor") {
        auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), name));
        t = &mt->dl_tensor;
        release = [mt]() { if (mt->deleter) mt->deleter(mt); };
        PyCapsule_SetName(cap.ptr(), "used_dltensor");
    } else {
        throw std::runtime_error(std::string("from_dlpack: expected a DLPack capsule, got one named '") + name + "'");
    }
    if (t->device.device_type != kDLCUDA) {
        release();
        throw std::runtime_error("from_dlpack: the tensor is not in CUDA device memory (DLPack device type " +
                                 std::to_string(t->device.device_type) + ")");
    }
    std::vector<int64_t> shape(t->shape, t->shape + t->ndim), strides(t->ndim);
    int64_t st = 1, numel = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
        strides[i] = t->strides ? t->strides[i] : st;
        st *= shape[i];
    }
    for (int64_t n : shape) numel *= n;
    int dtype = engine_dtype(t->dtype);
    char* data = static_cast<char*>(t->data) + t->byte_offset;
    auto buf = std::make_shared<DeviceBuffer>(data, (std::size_t)(numel * (t->dtype.bits / 8)), t->device.device_id,
                                              release);
    return py::make_tuple(buf, shape, strides, dtype, t->device.device_id);
}

}  // namespace

void bind_dlpack(py::module_& m) {
    m.def("to_dlpack", &export_tensor, py::arg("buffer"), py::arg("ptr"), py::arg("shape"), py::arg("dtype"),
          py::arg("stream") = py::none(), py::arg("versioned") = false,
          "A DLPack capsule viewing `buffer` (contiguous `shape` at `ptr`); the consumer's stream waits on ours.");
    m.def("from_dlpack_capsule", &import_tensor,
          "(buffer, shape, strides, dtype, device) of a CUDA DLPack capsule; the capsule is consumed.");
}

}  // namespace engine
