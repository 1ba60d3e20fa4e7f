#include "runtime.h"

#include <map>
#include <mutex>
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

struct DevicePool {
    std::multimap<std::size_t, void*> free_blocks;  // block size -> pointer
    MemStats stats;
    cudaStream_t stream = nullptr;
};

std::mutex g_mutex;
std::vector<DevicePool>& pools() {
    static auto* p = new std::vector<DevicePool>(64);  // never destroyed: buffers may be freed at exit
    return *p;
}

DevicePool& pool(int device) {
    if (device < 0 || device >= 64) throw std::runtime_error("engine: bad CUDA device index " + std::to_string(device));
    return pools()[device];
}

std::size_t round_size(std::size_t n) {
    if (n < (1u << 20)) return (n + 511) & ~std::size_t(511);             // 512 B granules below 1 MiB
    return (n + (std::size_t(2) << 20) - 1) & ~((std::size_t(2) << 20) - 1);  // 2 MiB granules above
}

void release_cached(int device, DevicePool& p) {
    if (p.free_blocks.empty()) return;
    use_device(device);
    cudaDeviceSynchronize();
    for (auto& kv : p.free_blocks) {
        cudaFree(kv.second);
        p.stats.reserved -= kv.first;
    }
    p.free_blocks.clear();
}

}  // namespace

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
    // best fit, but never hand out a block more than twice the request (+1 MiB) to bound waste
    auto it = p.free_blocks.lower_bound(want);
    if (it != p.free_blocks.end() && it->first <= 2 * want + (std::size_t(1) << 20)) {
        void* ptr = it->second;
        *block_bytes = it->first;
        p.free_blocks.erase(it);
        p.stats.allocated += *block_bytes;
        if (p.stats.allocated > p.stats.peak) p.stats.peak = p.stats.allocated;
        return ptr;
    }
    use_device(device);
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, want);
    if (err == cudaErrorMemoryAllocation) {
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
    p.stats.allocated += want;
    if (p.stats.allocated > p.stats.peak) p.stats.peak = p.stats.allocated;
    *block_bytes = want;
    return ptr;
}

void device_free(void* ptr, std::size_t block_bytes, int device) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& p = pool(device);
    p.stats.allocated -= block_bytes;
    p.free_blocks.emplace(block_bytes, ptr);
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
