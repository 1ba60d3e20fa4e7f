// CUDA graph capture and replay (graph.h), and the Python bindings of pools and graphs (the
// device-scalar optimizer launchers a captured step uses are bound in optimizer/bind.cpp).
#include "runtime/graph.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "copy/copy.h"      // MemsetKernel
#include "random/random.h"  // rng_epoch_advance, the first node of a capture

namespace py = pybind11;

namespace engine {

namespace {

// the random epoch of each device: 8 bytes of device memory, made once, advanced by every replay
uint64_t* g_epoch[64] = {};

uint64_t* epoch_buffer(int device) {
    if (g_epoch[device] == nullptr) {
        void* p = nullptr;
        check(cudaMalloc(&p, sizeof(uint64_t)), "graph rng epoch");
        check(cudaMemsetAsync(p, 0, sizeof(uint64_t), stream(device)), "graph rng epoch");
        g_epoch[device] = static_cast<uint64_t*>(p);
    }
    return g_epoch[device];
}

std::string where(int device) { return "cuda:" + std::to_string(device); }

// Every memset node of g replaced by a kernel node that sets the same bytes, with the same edges.
// cuBLASLt queues a memset of its workspace before each Hopper "coop" GEMM; in a replay the GPU idles
// about 4 us around each memset node (the switch between node kinds), where kernel follows kernel
// with none. Returns how many were replaced.
std::size_t memsets_as_kernels(cudaGraph_t g) {
    std::size_t n = 0;
    check(cudaGraphGetNodes(g, nullptr, &n), "graph nodes");
    std::vector<cudaGraphNode_t> nodes(n);
    check(cudaGraphGetNodes(g, nodes.data(), &n), "graph nodes");
    std::size_t replaced = 0;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        check(cudaGraphNodeGetType(node, &type), "graph node type");
        if (type != cudaGraphNodeTypeMemset) continue;
        cudaMemsetParams m;
        check(cudaGraphMemsetNodeGetParams(node, &m), "graph memset node");
        std::size_t nd = 0, nt = 0;
        check(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &nd), "graph node edges");
        check(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &nt), "graph node edges");
        std::vector<cudaGraphNode_t> before(nd), after(nt);
        check(cudaGraphNodeGetDependencies(node, before.data(), nullptr, &nd), "graph node edges");
        check(cudaGraphNodeGetDependentNodes(node, after.data(), nullptr, &nt), "graph node edges");
        MemsetKernel k(m);
        cudaGraphNode_t kernel = nullptr;
        check(cudaGraphAddKernelNode(&kernel, g, before.data(), nd, &k.params), "graph memset as kernel");
        check(cudaGraphDestroyNode(node), "graph memset as kernel");
        for (cudaGraphNode_t next : after)
            check(cudaGraphAddDependencies(g, &kernel, &next, nullptr, 1), "graph memset as kernel");
        ++replaced;
    }
    return replaced;
}

}  // namespace

const uint64_t* capture_rng_epoch(int device) {
    if (!capturing(device)) return nullptr;
    return g_epoch[device];
}

CudaGraph::CudaGraph(int device, std::shared_ptr<GraphPool> pool) : device_(device), pool_(std::move(pool)) {
    if (!pool_) throw std::runtime_error("CudaGraph: needs a GraphPool");
    if (pool_->device != device)
        throw std::runtime_error("CudaGraph: the pool belongs to " + where(pool_->device) + ", the graph to " +
                                 where(device));
}

CudaGraph::~CudaGraph() {
    if (capturing_) {
        try {
            abort();
        } catch (...) {  // never throw from a destructor
        }
    }
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);  // an in-flight launch completes first
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    cudaGetLastError();
}

void CudaGraph::begin() {
    if (capturing_ || exec_ != nullptr) throw std::runtime_error("CudaGraph.begin: this graph was already captured");
    if (capturing(device_))
        throw std::runtime_error("CudaGraph.begin: another capture is under way on " + where(device_));
    use_device(device_);
    uint64_t* epoch = epoch_buffer(device_);
    cudaStream_t st = stream(device_);
    pool_activate(device_, pool_->id);
    cudaError_t err = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) {
        pool_activate(device_, 0);
        throw_cuda("graph capture begin", err);
    }
    set_capturing(device_, true);
    capturing_ = true;
    try {
        rng_epoch_advance(device_, epoch);  // the first node: every replay draws new random numbers
    } catch (...) {
        abort();  // never leave the stream capturing
        throw;
    }
}

void CudaGraph::finish_capture(cudaGraph_t* out) {
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream(device_), &g);
    set_capturing(device_, false);
    pool_activate(device_, 0);
    capturing_ = false;
    if (out != nullptr && err == cudaSuccess) {
        *out = g;
        return;
    }
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
    if (out != nullptr) throw_cuda("graph capture end", err);
}

void CudaGraph::end() {
    if (!capturing_) throw std::runtime_error("CudaGraph.end: no capture under way (call begin() first)");
    use_device(device_);
    finish_capture(&graph_);
    const char* keep = std::getenv("ENGINE_GRAPH_MEMSETS");  // "keep": cuBLASLt's memset nodes as captured
    if (keep == nullptr || std::string(keep) != "keep") memsets_ = memsets_as_kernels(graph_);
    check(cudaGraphInstantiate(&exec_, graph_, 0), "graph instantiate");
    check(cudaGraphUpload(exec_, stream(device_)), "graph upload");
    pool_claim_live(pool_->id);
}

void CudaGraph::abort() {
    if (!capturing_) return;
    use_device(device_);
    finish_capture(nullptr);
}

void CudaGraph::replay() {
    if (exec_ == nullptr) throw std::runtime_error("CudaGraph.replay: nothing captured yet");
    use_device(device_);
    check(cudaGraphLaunch(exec_, stream(device_)), "graph replay");
}

std::size_t CudaGraph::num_nodes() const {
    if (graph_ == nullptr) return 0;
    std::size_t n = 0;
    check(cudaGraphGetNodes(graph_, nullptr, &n), "graph nodes");
    return n;
}

void bind_graphs(py::module_& m) {
    py::class_<GraphPool, std::shared_ptr<GraphPool>>(m, "GraphPool",
                                                       "Private device memory of captured graphs (see runtime.h).")
        .def(py::init<int>(), py::arg("device"))
        .def_readonly("id", &GraphPool::id)
        .def_readonly("device", &GraphPool::device)
        .def("activate", [](GraphPool& p) { pool_activate(p.device, p.id); },
             "Allocations and frees on the device go to this pool until deactivate() (warm-up runs).")
        .def("deactivate", [](GraphPool& p) {
            if (active_pool(p.device) == p.id) pool_activate(p.device, 0);
        })
        .def("stats", [](GraphPool& p) {
            PoolStats s = pool_stats(p.id);
            py::dict d;
            d["reserved"] = s.reserved;
            d["cached"] = s.cached;
            d["owned_blocks"] = s.owned_blocks;
            d["mallocs_in_capture"] = s.mallocs_in_capture;
            return d;
        });

    py::class_<CudaGraph>(m, "CudaGraph", "One captured CUDA graph of a device's stream.")
        .def(py::init<int, std::shared_ptr<GraphPool>>(), py::arg("device"), py::arg("pool"))
        .def("begin", &CudaGraph::begin)
        .def("end", &CudaGraph::end)
        .def("abort", &CudaGraph::abort)
        // without the GIL: a launch blocks while the device's queue is full, and the process's
        // other threads (a worker's upload and download beside its inner steps) must run meanwhile
        .def("replay", &CudaGraph::replay, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("num_nodes", &CudaGraph::num_nodes)
        .def_property_readonly("memsets_replaced", &CudaGraph::memsets_replaced)
        .def_property_readonly("ready", &CudaGraph::ready)
        .def_property_readonly("device", &CudaGraph::device);

    m.def("capturing", [](int device) { return capturing(device); },
          "True while the device's stream is being captured into a graph.");
    m.def("alloc_count", [](int device) { return mem_stats(device).num_allocs; },
          "device_alloc calls on the device so far (did a step do any GPU work?).");
}

}  // namespace engine
