// CUDA graphs for engine: capture the work one Python call queues on a device's stream, replay it
// with one launch (engine/graphs/ is the Python side: CapturedStep, compile_block).
//
// What makes a replay correct:
//  - memory: the graph's allocations come from a private pool (runtime.h) that eager code never
//    reuses while the graph lives;
//  - scalars that change every step are read from device memory, not baked into kernel
//    parameters: the optimizers' learning rate and step count (the *_dev launchers of
//    optimizer/optimizer.h), and the random streams' epoch (capture_rng_epoch), advanced by the graph
//    itself on every replay (random/random.h: rng_epoch_advance).
//
// What makes a replay fast: cuBLASLt zeroes a counter in its workspace before each Hopper "coop" GEMM
// (a 4-byte memset node, 99 of them in gpt2_124m's step, about 1.1 us each). A captured GEMM gets a
// workspace of its own (capture_scratch), so that its zeroing can move to one kernel node at the
// graph's start (end()); memset nodes left are replaced by kernel nodes (a switch between node kinds
// idles the GPU about 4 us).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/runtime.h"

namespace engine {

// A private memory pool (runtime.h) as an object: released when the last graph using it is gone.
struct GraphPool {
    int id;
    int device;
    explicit GraphPool(int device_) : id(pool_create(device_)), device(device_) {}
    GraphPool(const GraphPool&) = delete;
    GraphPool& operator=(const GraphPool&) = delete;
    ~GraphPool() { pool_release(id); }
};

// One captured graph of one device's stream.
class CudaGraph {
  public:
    CudaGraph(int device, std::shared_ptr<GraphPool> pool);
    ~CudaGraph();
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;

    void begin();   // activate the pool, start capturing the stream (thread-local mode)
    void end();     // stop capturing, instantiate, claim live memory for the pool
    void abort();   // a capture that failed: stop capturing, drop what was recorded
    void replay();  // one launch of the whole graph on the stream
    std::size_t num_nodes() const;
    std::size_t memsets_replaced() const { return memsets_; }  // memset nodes run as kernel nodes (end())
    std::size_t memsets_hoisted() const { return hoisted_; }   // memsets done by the first node (end())
    bool ready() const { return exec_ != nullptr; }
    int device() const { return device_; }

  private:
    void finish_capture(cudaGraph_t* out);
    void release_scratch();
    friend void* capture_scratch(int device, std::size_t bytes);
    int device_;
    std::shared_ptr<GraphPool> pool_;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
    bool capturing_ = false;
    std::size_t memsets_ = 0, hoisted_ = 0;
    std::vector<std::pair<void*, std::size_t>> scratch_;  // capture_scratch's blocks, while the graph lives
    std::shared_ptr<void> memsets_table_;                   // the hoisted memsets' device table
};

// `bytes` of device memory for the one captured node that asks (a GEMM's cuBLASLt workspace), owned by
// the graph being captured on `device` and reused by a later capture once that graph is gone; nullptr
// when no CudaGraph is capturing there or the capture already holds kScratchBudget bytes (the caller
// then uses its shared memory). Nothing else in the graph may touch it.
constexpr std::size_t kScratchBudget = 256u << 20;
void* capture_scratch(int device, std::size_t bytes);

// The random epoch of `device` while its stream is being captured, else nullptr. Random kernels
// (dropout masks, rand, randn) mix it into their Philox key when non-null, so that every replay of
// a captured graph draws fresh numbers; the graph's first node advances it (rng_epoch_advance).
const uint64_t* capture_rng_epoch(int device);

}  // namespace engine
