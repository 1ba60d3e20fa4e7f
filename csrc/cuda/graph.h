// CUDA graphs for engine: capture the work one Python call queues on a device's stream, replay it
// with one launch (engine/graphs.py is the Python side: CapturedStep, compile_block).
//
// What makes a replay correct:
//  - memory: the graph's allocations come from a private pool (runtime.h) that eager code never
//    reuses while the graph lives;
//  - scalars that change every step are read from device memory, not baked into kernel
//    parameters: the optimizers' learning rate and step count (the *_dev launchers below), and the
//    random streams' epoch (capture_rng_epoch), advanced by the graph itself on every replay.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime.h"

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
    bool ready() const { return exec_ != nullptr; }
    int device() const { return device_; }

  private:
    void finish_capture(cudaGraph_t* out);
    int device_;
    std::shared_ptr<GraphPool> pool_;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
    bool capturing_ = false;
};

// The random epoch of `device` while its stream is being captured, else nullptr. Random kernels
// (dropout masks, rand, randn) mix it into their Philox key when non-null, so that every replay of
// a captured graph draws fresh numbers; the graph's first node advances it (rng_epoch_advance).
const uint64_t* capture_rng_epoch(int device);

// random.cu: epoch += 1 (one thread)
void rng_epoch_advance(int device, uint64_t* epoch);

// optimizer.cu, the device-scalar variants of adamw/sgd (ops.h): `lr` and `step` point at float32
// device memory (engine/optim keeps them per param group), so a captured update follows the
// schedule. Bias corrections are computed in double as the host path does (bit-identical results).
void adamw_dev(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& m,
               const std::vector<float*>& v, const std::vector<int64_t>& n, const float* lr, const float* step,
               double beta1, double beta2, float eps, float weight_decay);
void sgd_dev(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& buf,
             const std::vector<int64_t>& n, const float* lr, float momentum, float dampening, bool nesterov,
             float weight_decay, bool first_step);
// steps[i] += 1 for every bit i set in `mask` (i < 64): one launch advances every group's count
void optim_step_advance(int device, float* steps, uint64_t mask);

}  // namespace engine
