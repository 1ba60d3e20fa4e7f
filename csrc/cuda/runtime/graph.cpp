// CUDA graph capture and replay (graph.h), and the Python bindings of pools and graphs (the
// device-scalar optimizer launchers a captured step uses are bound in optimizer/bind.cpp).
#include "runtime/graph.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "copy/copy.h"      // MemsetKernel, MemsetsKernel
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

// the graph capturing on each device (begin() to end() or abort()), for capture_scratch
CudaGraph* g_capturing[64] = {};
// capture_scratch's blocks no graph holds, by size, per device (never given back to the driver)
std::multimap<std::size_t, void*> g_free_scratch[64];
std::mutex g_scratch_mutex;

std::vector<cudaGraphNode_t> edges(cudaGraphNode_t node, bool dependents) {
    std::size_t n = 0;
    auto get = [&](cudaGraphNode_t* out) {
        return dependents ? cudaGraphNodeGetDependentNodes(node, out, nullptr, &n)
                          : cudaGraphNodeGetDependencies(node, out, nullptr, &n);
    };
    check(get(nullptr), "graph node edges");
    std::vector<cudaGraphNode_t> out(n);
    check(get(out.data()), "graph node edges");
    return out;
}

void add_edge(cudaGraph_t g, cudaGraphNode_t from, cudaGraphNode_t to) {
    for (cudaGraphNode_t d : edges(to, false))
        if (d == from) return;
    check(cudaGraphAddDependencies(g, &from, &to, nullptr, 1), "graph edge");
}

bool inside(const cudaMemsetParams& m, const std::vector<std::pair<void*, std::size_t>>& blocks) {
    const char* first = static_cast<const char*>(m.dst);
    const char* last = first + (m.height - 1) * m.pitch + m.width * m.elementSize;  // one past the end
    for (const auto& b : blocks) {
        const char* lo = static_cast<const char*>(b.first);
        if (first >= lo && last <= lo + b.second) return true;
    }
    return false;
}

// The memset nodes of g. Those inside `scratch` (captured GEMMs' own workspaces, which no other node
// touches) are removed, their edges joined through, and done by one kernel node that comes before the
// graph's first nodes: *table is its device table. The others are replaced by kernel nodes that set the
// same bytes, with the same edges. -> {replaced, hoisted}
std::pair<std::size_t, std::size_t> rewrite_memsets(cudaGraph_t g,
                                                    const std::vector<std::pair<void*, std::size_t>>& scratch,
                                                    std::shared_ptr<void>* table) {
    std::size_t n = 0;
    check(cudaGraphGetNodes(g, nullptr, &n), "graph nodes");
    std::vector<cudaGraphNode_t> nodes(n);
    check(cudaGraphGetNodes(g, nodes.data(), &n), "graph nodes");
    std::vector<cudaMemsetParams> hoisted;
    std::size_t replaced = 0;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        check(cudaGraphNodeGetType(node, &type), "graph node type");
        if (type != cudaGraphNodeTypeMemset) continue;
        cudaMemsetParams m;
        check(cudaGraphMemsetNodeGetParams(node, &m), "graph memset node");
        const std::vector<cudaGraphNode_t> before = edges(node, false), after = edges(node, true);
        check(cudaGraphDestroyNode(node), "graph memset node");
        if (inside(m, scratch) && hoisted.size() < MemsetsKernel::kMaxRegions) {
            hoisted.push_back(m);
            for (cudaGraphNode_t prev : before)
                for (cudaGraphNode_t next : after) add_edge(g, prev, next);
            continue;
        }
        MemsetKernel k(m);
        cudaGraphNode_t kernel = nullptr;
        check(cudaGraphAddKernelNode(&kernel, g, before.data(), before.size(), &k.params), "graph memset as kernel");
        for (cudaGraphNode_t next : after) add_edge(g, kernel, next);
        ++replaced;
    }
    if (!hoisted.empty()) {
        std::size_t nr = 0;
        check(cudaGraphGetRootNodes(g, nullptr, &nr), "graph roots");
        std::vector<cudaGraphNode_t> roots(nr);
        check(cudaGraphGetRootNodes(g, roots.data(), &nr), "graph roots");
        auto k = std::make_shared<MemsetsKernel>(hoisted);
        cudaGraphNode_t first = nullptr;
        check(cudaGraphAddKernelNode(&first, g, nullptr, 0, &k->params), "graph memsets as one kernel");
        for (cudaGraphNode_t root : roots) add_edge(g, first, root);
        *table = k;
    }
    return {replaced, hoisted.size()};
}

}  // namespace

void* capture_scratch(int device, std::size_t bytes) {
    CudaGraph* graph = g_capturing[device];
    if (graph == nullptr || bytes == 0) return nullptr;
    bytes = (bytes + 511) / 512 * 512;
    std::size_t held = 0;
    for (const auto& b : graph->scratch_) held += b.second;
    if (held + bytes > kScratchBudget) return nullptr;
    std::lock_guard<std::mutex> lock(g_scratch_mutex);
    auto& free_blocks = g_free_scratch[device];
    void* p = nullptr;
    auto it = free_blocks.lower_bound(bytes);
    if (it != free_blocks.end() && it->first <= 2 * bytes) {
        bytes = it->first;
        p = it->second;
        free_blocks.erase(it);
    } else {
        // cudaMalloc is not a stream operation: allowed inside this thread's capture in relaxed mode
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&mode);
        cudaError_t err = cudaMalloc(&p, bytes);
        cudaThreadExchangeStreamCaptureMode(&mode);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return nullptr;  // short of memory: the shared workspace will do
        }
    }
    graph->scratch_.emplace_back(p, bytes);
    return p;
}

void CudaGraph::release_scratch() {
    std::lock_guard<std::mutex> lock(g_scratch_mutex);
    for (const auto& b : scratch_) g_free_scratch[device_].emplace(b.second, b.first);
    scratch_.clear();
}

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
    release_scratch();  // a later capture's use of it is queued after this graph's last replay
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
    g_capturing[device_] = this;
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
    g_capturing[device_] = nullptr;
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
    if (keep == nullptr || std::string(keep) != "keep")
        std::tie(memsets_, hoisted_) = rewrite_memsets(graph_, scratch_, &memsets_table_);
    check(cudaGraphInstantiate(&exec_, graph_, 0), "graph instantiate");
    check(cudaGraphUpload(exec_, stream(device_)), "graph upload");
    pool_claim_live(pool_->id);
}

void CudaGraph::abort() {
    if (!capturing_) return;
    use_device(device_);
    finish_capture(nullptr);
    release_scratch();  // nothing recorded will run
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
        .def_property_readonly("memsets_hoisted", &CudaGraph::memsets_hoisted)
        .def_property_readonly("ready", &CudaGraph::ready)
        .def_property_readonly("device", &CudaGraph::device);

    m.def("capturing", [](int device) { return capturing(device); },
          "True while the device's stream is being captured into a graph.");
    m.def("alloc_count", [](int device) { return mem_stats(device).num_allocs; },
          "device_alloc calls on the device so far (did a step do any GPU work?).");
}

}  // namespace engine
