// DeviceBuffer: one block of device memory owned by Python (engine.backends.cuda.CudaArray holds
// it). Engine's own blocks go back to the caching allocator when the last reference dies; blocks
// imported through DLPack call the producer's deleter instead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/runtime.h"

namespace engine {

struct DeviceBuffer {
    void* ptr = nullptr;
    std::size_t nbytes = 0;      // bytes asked for
    std::size_t block = 0;       // bytes of the allocator block (>= nbytes)
    int device = 0;
    std::function<void()> release_external;  // set for memory imported from another library

    DeviceBuffer(std::size_t nbytes_, int device_) : nbytes(nbytes_), device(device_) {
        if (nbytes_ > 0) ptr = device_alloc(nbytes_, device_, &block);
    }
    DeviceBuffer(void* external, std::size_t nbytes_, int device_, std::function<void()> release)
        : ptr(external), nbytes(nbytes_), device(device_), release_external(std::move(release)) {}
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() {
        if (release_external) {
            release_external();
        } else if (ptr != nullptr) {
            device_free(ptr, block, device);
        }
    }
    std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(ptr); }
};

}  // namespace engine
