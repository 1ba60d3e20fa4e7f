// The CUDA runtime layer of engine: devices, the one stream per device, the caching allocator,
// and turning CUDA errors into C++ exceptions (which pybind11 turns into Python RuntimeErrors).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace engine {

struct CudaError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// "engine op 'add': CUDA error cudaErrorIllegalAddress (an illegal memory access ...)"
[[noreturn]] void throw_cuda(const char* op, cudaError_t err);
inline void check(cudaError_t err, const char* op) {
    if (err != cudaSuccess) throw_cuda(op, err);
}
// After a kernel launch: catches bad launch configurations now; a fault inside an earlier kernel
// is reported by whichever op next talks to the runtime (no host sync inside ops).
inline void check_launch(const char* op) { check(cudaGetLastError(), op); }

int device_count();          // 0 when there is no driver or no GPU (never throws)
std::string cuda_status();   // "" when usable, else why not (no driver, no device, ...)
void use_device(int device); // cudaSetDevice, skipped when already current on this thread
cudaStream_t stream(int device);  // the one stream all of engine's work on `device` goes to
int sm_count(int device);         // streaming multiprocessors of `device` (cached)
int compute_capability(int device);  // 10 * major + minor of `device` (cached): 90 for H100 / H200

// Caching allocator: blocks freed by engine go back to a per-device pool and are reused by later
// allocations on the same stream (stream order makes that safe without a sync). cudaMalloc only
// when the pool has no fitting block; on out-of-memory the pool is released and the call retried.
void* device_alloc(std::size_t nbytes, int device, std::size_t* block_bytes);
void device_free(void* ptr, std::size_t block_bytes, int device);

struct MemStats {
    std::size_t allocated = 0;  // bytes in live blocks
    std::size_t peak = 0;       // max of allocated since start / last reset
    std::size_t reserved = 0;   // bytes held from cudaMalloc (live + cached)
    std::size_t num_mallocs = 0;
    std::size_t num_allocs = 0;  // device_alloc calls (cache hits included)
};
MemStats mem_stats(int device);
void reset_peak(int device);
void empty_cache(int device);  // cudaFree every cached block (synchronises the device)

// ---- private pools, for CUDA graphs (graph.cpp drives them) ----------------------------------
// A captured graph replays into the same addresses every time, so its memory must never be handed
// to eager code while the graph lives. A private pool owns that memory:
//  - while a pool is *active* on a device, every allocation on the device comes from it (its own
//    free blocks first, cudaMalloc when none fits) and every free on the device goes to it;
//  - a block the pool owns goes back to the pool when freed, whenever that happens;
//  - at the end of a capture the pool also claims every block live on the device (parameters,
//    optimizer state, static inputs: whatever the graph may read), so that freeing one of those
//    later cannot let eager code reuse it under the graph;
//  - when the pool is released (its graphs destroyed), its blocks pass to another live pool of
//    the device, or back to the ordinary cache when there is none.
int pool_create(int device);             // a new empty pool; ids start at 1
void pool_release(int pool_id);
void pool_activate(int device, int pool_id);  // 0 = back to the ordinary cache
int active_pool(int device);
void pool_claim_live(int pool_id);       // claim every live block of the pool's device
struct PoolStats {
    std::size_t reserved = 0;            // bytes cudaMalloc'ed by this pool
    std::size_t cached = 0;              // bytes in its free list
    std::size_t owned_blocks = 0;        // blocks it owns (live or free)
    std::size_t mallocs_in_capture = 0;  // cudaMallocs while a capture was under way (0 after a warm-up)
};
PoolStats pool_stats(int pool_id);

// Capture state of a device's stream: set by graph.cpp around cudaStreamBeginCapture/EndCapture.
// Host transfers and synchronisation refuse to run while it is set (they would bake host data into
// the graph or wait for work that is not running).
void set_capturing(int device, bool on);
bool capturing(int device);

}  // namespace engine
