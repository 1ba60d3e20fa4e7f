// Python bindings of the CUDA runtime layer: the CudaError exception, devices, streams, memory,
// transfers. DLPack's are in dlpack.cpp, graphs' in graph.cpp; the op families' in their bind.cpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/buffer.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace engine {

namespace {

// Pinned staging for host -> device copies: a copy from pageable memory may wait for the stream
// (the driver stages it), which would serialise the host with the GPU once per uploaded batch.
// Small uploads go through reusable pinned blocks instead; a block is reused once its copy is done.
struct Staging {
    void* host;
    std::size_t bytes;
    cudaEvent_t done;
    int device;
};
std::vector<Staging> g_staging;
std::size_t g_staging_total = 0;
constexpr std::size_t kStageMax = 16u << 20, kStageTotal = 256u << 20;

bool staged_upload(void* dst, const void* src, std::size_t nbytes, int device) {
    if (nbytes > kStageMax) return false;
    Staging* s = nullptr;
    for (auto& c : g_staging) {
        if (c.device == device && c.bytes >= nbytes && c.bytes <= 4 * nbytes + 65536 &&
            cudaEventQuery(c.done) == cudaSuccess) {
            s = &c;
            break;
        }
    }
    if (s == nullptr) {
        std::size_t bytes = 4096;
        while (bytes < nbytes) bytes <<= 1;
        if (g_staging_total + bytes > kStageTotal) return false;
        Staging c{nullptr, bytes, nullptr, device};
        if (cudaHostAlloc(&c.host, bytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        check(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming), "copy_from_host");
        g_staging.push_back(c);
        g_staging_total += bytes;
        s = &g_staging.back();
    }
    std::memcpy(s->host, src, nbytes);
    check(cudaMemcpyAsync(dst, s->host, nbytes, cudaMemcpyHostToDevice, stream(device)), "copy_from_host");
    check(cudaEventRecord(s->done, stream(device)), "copy_from_host");
    return true;
}

}  // namespace

struct StreamEvent {
    int device;
    cudaEvent_t event = nullptr;
    explicit StreamEvent(int device_) : device(device_) {
        use_device(device);
        check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event create");
    }
    ~StreamEvent() {
        if (event != nullptr) cudaEventDestroy(event);
    }
    StreamEvent(const StreamEvent&) = delete;
    StreamEvent& operator=(const StreamEvent&) = delete;
};

// Host transfers and waits cannot be part of a captured graph: a replay would reuse the host data of
// the capture, and a wait would wait for work that is only being recorded. Say so, by name.
static void refuse_in_capture(int device, const char* what) {
    if (capturing(device))
        throw CudaError(std::string("engine: ") + what + " inside a CUDA graph capture on cuda:" +
                        std::to_string(device) +
                        ": a captured step cannot read or write host memory or wait for the GPU (.item(), "
                        ".numpy(), print(tensor), engine.tensor(host_data, device='cuda')); pass host data as an "
                        "input of the step and read results after it");
}

void bind_runtime(py::module_& m) {
    py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);

    m.def("cuda_available", []() { return device_count() > 0; },
          "True when this build has the CUDA backend and a driver with at least one GPU answers.");
    m.def("device_count", &device_count);
    m.def("cuda_status", &cuda_status, "'' when a GPU is usable, else why not.");
    m.def("synchronize", [](int device) {
        refuse_in_capture(device, "synchronize()");
        py::gil_scoped_release nogil;
        use_device(device);
        check(cudaStreamSynchronize(stream(device)), "synchronize");
    });
    // A point in the device's stream (torch.cuda.Event's counterpart, without timing): what was
    // queued before record() has finished once query() is True; synchronize() waits for it
    // without the GIL. Lets the host stay a bounded number of steps ahead of the device.
    py::class_<StreamEvent, std::shared_ptr<StreamEvent>>(m, "StreamEvent")
        .def(py::init<int>(), py::arg("device"))
        .def("record", [](StreamEvent& e) {
            refuse_in_capture(e.device, "recording an event");
            use_device(e.device);
            check(cudaEventRecord(e.event, stream(e.device)), "event record");
        })
        .def("query", [](StreamEvent& e) {
            cudaError_t status = cudaEventQuery(e.event);
            if (status == cudaErrorNotReady) {
                cudaGetLastError();
                return false;
            }
            check(status, "event query");
            return true;
        })
        .def("synchronize", [](StreamEvent& e) {
            py::gil_scoped_release nogil;
            check(cudaEventSynchronize(e.event), "event synchronize");
        })
        .def_readonly("device", &StreamEvent::device);
    m.def("stream_handle", [](int device) { return reinterpret_cast<std::uintptr_t>(stream(device)); },
          "The cudaStream_t (as an int) all of engine's work on `device` is queued on.");
    m.def("device_properties", [](int device) {
        cudaDeviceProp prop;
        check(cudaGetDeviceProperties(&prop, device), "device_properties");
        py::dict d;
        d["name"] = std::string(prop.name);
        d["major"] = prop.major;
        d["minor"] = prop.minor;
        d["total_memory"] = prop.totalGlobalMem;
        d["multi_processor_count"] = prop.multiProcessorCount;
        d["l2_cache_size"] = prop.l2CacheSize;
        return d;
    });
    m.def("driver_version", []() {
        int v = 0;
        cudaDriverGetVersion(&v);
        cudaGetLastError();
        return v;
    });
    m.def("runtime_version", []() {
        int v = 0;
        cudaRuntimeGetVersion(&v);
        return v;
    });
    m.def("mem_stats", [](int device) {
        MemStats s = mem_stats(device);
        py::dict d;
        d["allocated"] = s.allocated;
        d["peak"] = s.peak;
        d["reserved"] = s.reserved;
        d["num_mallocs"] = s.num_mallocs;
        return d;
    });
    m.def("reset_peak", &reset_peak);
    m.def("empty_cache", &empty_cache);

    py::class_<DeviceBuffer, std::shared_ptr<DeviceBuffer>>(m, "DeviceBuffer")
        .def(py::init<std::size_t, int>(), py::arg("nbytes"), py::arg("device"))
        .def_property_readonly("ptr", &DeviceBuffer::address)
        .def_readonly("nbytes", &DeviceBuffer::nbytes)
        .def_readonly("device", &DeviceBuffer::device);

    // host (numpy, C-contiguous) -> device; asynchronous on the stream, the source is staged
    m.def("copy_from_host", [](std::uintptr_t dst, py::buffer src, std::size_t nbytes, int device) {
        py::buffer_info info = src.request();
        if ((std::size_t)(info.size * info.itemsize) < nbytes) throw std::runtime_error("copy_from_host: source too small");
        refuse_in_capture(device, "a host-to-device copy");
        use_device(device);
        if (staged_upload(reinterpret_cast<void*>(dst), info.ptr, nbytes, device)) return;
        check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), info.ptr, nbytes, cudaMemcpyHostToDevice, stream(device)),
              "copy_from_host");
    });
    // device -> host (numpy, writable, C-contiguous); waits for the stream (a sync point by design)
    m.def("copy_to_host", [](py::buffer dst, std::uintptr_t src, std::size_t nbytes, int device) {
        py::buffer_info info = dst.request(true);
        if ((std::size_t)(info.size * info.itemsize) < nbytes) throw std::runtime_error("copy_to_host: destination too small");
        refuse_in_capture(device, "a device-to-host copy");
        void* hptr = info.ptr;
        py::gil_scoped_release nogil;
        use_device(device);
        check(cudaMemcpyAsync(hptr, reinterpret_cast<void*>(src), nbytes, cudaMemcpyDeviceToHost, stream(device)),
              "copy_to_host");
        check(cudaStreamSynchronize(stream(device)), "copy_to_host");
    });
    m.def("copy_device", [](std::uintptr_t dst, std::uintptr_t src, std::size_t nbytes, int device) {
        use_device(device);
        check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), nbytes,
                              cudaMemcpyDeviceToDevice, stream(device)),
              "copy");
    });
    // between GPUs: enqueue on the source's stream after the destination's pending work
    m.def("copy_peer", [](std::uintptr_t dst, int dst_device, std::uintptr_t src, int src_device, std::size_t nbytes) {
        cudaEvent_t ev;
        use_device(dst_device);
        check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "copy_peer");
        check(cudaEventRecord(ev, stream(dst_device)), "copy_peer");
        use_device(src_device);
        check(cudaStreamWaitEvent(stream(src_device), ev, 0), "copy_peer");
        check(cudaMemcpyPeerAsync(reinterpret_cast<void*>(dst), dst_device, reinterpret_cast<void*>(src), src_device,
                                  nbytes, stream(src_device)),
              "copy_peer");
        check(cudaEventRecord(ev, stream(src_device)), "copy_peer");
        use_device(dst_device);
        check(cudaStreamWaitEvent(stream(dst_device), ev, 0), "copy_peer");
        cudaEventDestroy(ev);
    });
    m.def("memset", [](std::uintptr_t dst, int value, std::size_t nbytes, int device) {
        use_device(device);
        check(cudaMemsetAsync(reinterpret_cast<void*>(dst), value, nbytes, stream(device)), "memset");
    });
}

}  // namespace engine
