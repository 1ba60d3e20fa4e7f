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
};
MemStats mem_stats(int device);
void reset_peak(int device);
void empty_cache(int device);  // cudaFree every cached block (synchronises the device)

}  // namespace engine
