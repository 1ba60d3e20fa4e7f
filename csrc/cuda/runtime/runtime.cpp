#include "runtime/runtime.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace engine {

void throw_cuda(const char* op, cudaError_t err) {
    cudaGetLastError();  // clear a sticky-free error so the next op starts clean
    throw CudaError(std::string("engine op '") + op + "': CUDA error " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")");
}

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

std::string cuda_status() {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return std::string("no usable CUDA device: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    }
    if (n == 0) return "no CUDA device found";
    return "";
}

void use_device(int device) {
    // asked every time (cheap): another library in the process may have switched the device
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
    check(cudaSetDevice(device), "set_device");
}

namespace {

struct PrivatePool;

struct DevicePool {
    std::multimap<std::size_t, void*> free_blocks;  // block size -> pointer
    std::unordered_map<void*, std::size_t> live;    // live block -> its size (claimed at capture end)
    MemStats stats;
    cudaStream_t stream = nullptr;
    PrivatePool* active = nullptr;  // the private pool allocations come from, if any
    bool capturing = false;
};

struct PrivatePool {
    int id = 0;
    int device = 0;
    std::multimap<std::size_t, void*> free_blocks;
    PoolStats stats;
};

std::mutex g_mutex;
std::vector<DevicePool>& pools() {
    static auto* p = new std::vector<DevicePool>(64);  // never destroyed: buffers may be freed at exit
    return *p;
}
// private pools by id, and the owner (pool id) of every block a private pool owns
std::map<int, PrivatePool*>& private_pools() {
    static auto* p = new std::map<int, PrivatePool*>();
    return *p;
}
std::unordered_map<void*, int>& owners() {
    static auto* p = new std::unordered_map<void*, int>();
    return *p;
}
int g_next_pool_id = 1;

DevicePool& pool(int device) {
    if (device < 0 || device >= 64) throw std::runtime_error("engine: bad CUDA device index " + std::to_string(device));
    return pools()[device];
}

PrivatePool& private_pool(int id) {
    auto it = private_pools().find(id);
    if (it == private_pools().end()) throw std::runtime_error("engine: no graph memory pool " + std::to_string(id));
    return *it->second;
}

std::size_t round_size(std::size_t n) {
    if (n < (1u << 20)) return (n + 511) & ~std::size_t(511);             // 512 B granules below 1 MiB
    return (n + (std::size_t(2) << 20) - 1) & ~((std::size_t(2) << 20) - 1);  // 2 MiB granules above
}

// best fit, but never a block more than twice the request (+1 MiB) to bound waste
void* take_block(std::multimap<std::size_t, void*>& blocks, std::size_t want, std::size_t* got) {
    auto it = blocks.lower_bound(want);
    if (it == blocks.end() || it->first > 2 * want + (std::size_t(1) << 20)) return nullptr;
    void* ptr = it->second;
    *got = it->first;
    blocks.erase(it);
    return ptr;
}

void release_cached(int device, DevicePool& p) {
    if (p.free_blocks.empty() || p.capturing) return;  // no device sync while a capture is under way
    use_device(device);
    cudaDeviceSynchronize();
    for (auto& kv : p.free_blocks) {
        cudaFree(kv.second);
        p.stats.reserved -= kv.first;
    }
    p.free_blocks.clear();
}

// cudaMalloc; during a capture in the thread's relaxed mode, which allows it (the memory is not
// part of the graph; the pool keeps it). Warm-up steps in the pool make this rare.
cudaError_t raw_malloc(void** ptr, std::size_t bytes, bool capturing) {
    if (!capturing) return cudaMalloc(ptr, bytes);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaMalloc(ptr, bytes);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
}

}  // namespace

int sm_count(int device) {
    static int count[64] = {};
    if (count[device] == 0)
        check(cudaDeviceGetAttribute(&count[device], cudaDevAttrMultiProcessorCount, device), "sm count");
    return count[device];
}

int compute_capability(int device) {
    static int cc[64] = {};
    if (cc[device] == 0) {
        int major = 0, minor = 0;
        check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
        check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "compute capability");
        cc[device] = 10 * major + minor;
    }
    return cc[device];
}

cudaStream_t stream(int device) {
    DevicePool& p = pool(device);
    if (p.stream == nullptr) {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (p.stream == nullptr) {
            use_device(device);
            cudaStream_t s;
            check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream_create");
            p.stream = s;
        }
    }
    return p.stream;
}

void* device_alloc(std::size_t nbytes, int device, std::size_t* block_bytes) {
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& p = pool(device);
    std::size_t want = round_size(nbytes == 0 ? 1 : nbytes);
    p.stats.num_allocs++;
    PrivatePool* pp = p.active;
    void* ptr = take_block(pp ? pp->free_blocks : p.free_blocks, want, block_bytes);
    if (ptr == nullptr) {
        use_device(device);
        cudaError_t err = raw_malloc(&ptr, want, p.capturing);
        if (err == cudaErrorMemoryAllocation && !p.capturing) {
            cudaGetLastError();
            release_cached(device, p);
            err = cudaMalloc(&ptr, want);
        }
        if (err != cudaSuccess) {
            cudaGetLastError();
            throw CudaError("engine: out of GPU memory on cuda:" + std::to_string(device) + " allocating " +
                            std::to_string(want) + " bytes (" + std::to_string(p.stats.allocated) +
                            " bytes in use by engine): " + cudaGetErrorString(err));
        }
        p.stats.num_mallocs++;
        p.stats.reserved += want;
        *block_bytes = want;
        if (pp != nullptr) {
            owners()[ptr] = pp->id;
            pp->stats.reserved += want;
            pp->stats.owned_blocks++;
            if (p.capturing) pp->stats.mallocs_in_capture++;
        }
    } else if (pp != nullptr) {
        pp->stats.cached -= *block_bytes;
    }
    p.stats.allocated += *block_bytes;
    if (p.stats.allocated > p.stats.peak) p.stats.peak = p.stats.allocated;
    p.live.emplace(ptr, *block_bytes);
    return ptr;
}

void device_free(void* ptr, std::size_t block_bytes, int device) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& p = pool(device);
    p.stats.allocated -= block_bytes;
    p.live.erase(ptr);
    auto& own = owners();
    if (!own.empty()) {
        auto it = own.find(ptr);
        if (it != own.end()) {  // a graph's block: back to its pool, never to eager code
            PrivatePool& pp = private_pool(it->second);
            pp.free_blocks.emplace(block_bytes, ptr);
            pp.stats.cached += block_bytes;
            return;
        }
    }
    if (p.active != nullptr) {  // freed during a warm-up or capture: a captured kernel may have read it
        own[ptr] = p.active->id;
        p.active->free_blocks.emplace(block_bytes, ptr);
        p.active->stats.cached += block_bytes;
        p.active->stats.owned_blocks++;
        return;
    }
    p.free_blocks.emplace(block_bytes, ptr);
}

int pool_create(int device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    pool(device);  // validates the index
    auto* pp = new PrivatePool();
    pp->id = g_next_pool_id++;
    pp->device = device;
    private_pools()[pp->id] = pp;
    return pp->id;
}

void pool_release(int pool_id) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto found = private_pools().find(pool_id);
    if (found == private_pools().end()) return;
    PrivatePool* pp = found->second;
    private_pools().erase(found);
    DevicePool& p = pool(pp->device);
    if (p.active == pp) p.active = nullptr;
    // heir: the newest other pool of the device (its graphs may read these blocks too), else none
    PrivatePool* heir = nullptr;
    for (auto& kv : private_pools())
        if (kv.second->device == pp->device) heir = kv.second;
    auto& own = owners();
    for (auto it = own.begin(); it != own.end();) {
        if (it->second != pool_id) {
            ++it;
        } else if (heir != nullptr) {
            it->second = heir->id;
            heir->stats.owned_blocks++;
            ++it;
        } else {
            it = own.erase(it);
        }
    }
    for (auto& kv : pp->free_blocks) {
        if (heir != nullptr) {
            heir->free_blocks.emplace(kv.first, kv.second);
            heir->stats.cached += kv.first;
        } else {
            p.free_blocks.emplace(kv.first, kv.second);
        }
    }
    if (heir != nullptr) heir->stats.reserved += pp->stats.reserved;
    delete pp;
}

void pool_activate(int device, int pool_id) {
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& p = pool(device);
    if (pool_id == 0) {
        p.active = nullptr;
        return;
    }
    PrivatePool& pp = private_pool(pool_id);
    if (pp.device != device)
        throw std::runtime_error("engine: graph memory pool " + std::to_string(pool_id) + " belongs to cuda:" +
                                 std::to_string(pp.device) + ", not cuda:" + std::to_string(device));
    p.active = &pp;
}

int active_pool(int device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& p = pool(device);
    return p.active ? p.active->id : 0;
}

void pool_claim_live(int pool_id) {
    std::lock_guard<std::mutex> lock(g_mutex);
    PrivatePool& pp = private_pool(pool_id);
    auto& own = owners();
    for (auto& kv : pool(pp.device).live) {
        if (own.emplace(kv.first, pool_id).second) pp.stats.owned_blocks++;
    }
}

PoolStats pool_stats(int pool_id) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return private_pool(pool_id).stats;
}

void set_capturing(int device, bool on) {
    std::lock_guard<std::mutex> lock(g_mutex);
    pool(device).capturing = on;
}

bool capturing(int device) {
    if (device < 0 || device >= 64) return false;
    return pools()[device].capturing;
}

MemStats mem_stats(int device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return pool(device).stats;
}

void reset_peak(int device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& p = pool(device);
    p.stats.peak = p.stats.allocated;
}

void empty_cache(int device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    release_cached(device, pool(device));
}

}  // namespace engine
