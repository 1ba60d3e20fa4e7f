// random/: counter-based random numbers (Philox4x32-10, philox.cuh): dropout masks, rand, randn, and
// the graph's random epoch. random.cu: kernels and launchers; bind.cpp: the Python bindings. Launchers
// take device pointers, sizes and the device index; work is queued on the device's one stream and
// never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

namespace engine {

void dropout_mask(int device, int dtype, void* out, int64_t n, float p, uint64_t seed, uint64_t offset);
void random_uniform(int device, float* out, int64_t n, uint64_t seed, uint64_t offset);
void random_normal(int device, float* out, int64_t n, uint64_t seed, uint64_t offset);

// epoch += 1 (one thread): the first node of every captured graph (runtime/graph.cpp), so that each
// replay draws fresh numbers (runtime/graph.h, capture_rng_epoch)
void rng_epoch_advance(int device, uint64_t* epoch);

}  // namespace engine
