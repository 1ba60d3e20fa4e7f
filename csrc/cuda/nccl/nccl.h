// The NCCL process group of engine.distributed: one communicator per process (one rank, one GPU),
// its collectives on engine's stream or on a side stream that overlaps them with compute, and the
// error paths that keep a dead or silent peer from hanging the process forever.
//
// - The communicator is made non-blocking (ncclConfig_t.blocking = 0): every call returns at once,
//   possibly with ncclInProgress, and is then polled with ncclCommGetAsyncError under a deadline;
//   past the deadline, or on an asynchronous error, the communicator is aborted (ncclCommAbort) and
//   an NcclError says what happened. Nothing here waits without a bound.
// - Collectives work in place on device addresses: all_reduce (sum / avg / max / min) and broadcast
//   of `count` elements of one dtype (engine's dtype codes, runtime/types.h).
// - side = false: queued on stream(device), in order with every op (what a plain call wants).
//   side = true: queued on the communicator's own high-priority stream after an event that waits for
//   the work already on stream(device); join() makes stream(device) wait for the side stream. That
//   fork / join pattern is legal inside a CUDA graph capture, so a captured step may contain it.
// - Every collective queued outside a capture records an event; check() (called by a watchdog
//   thread) aborts the communicator when the oldest unfinished one is older than the timeout.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>

namespace engine {

struct NcclError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string nccl_unique_id();  // 128 bytes (ncclUniqueId), made by rank 0, handed to the others
int nccl_version();            // NCCL_VERSION_CODE of the loaded library (e.g. 23203)

enum class NcclOp : int { sum = 0, avg = 1, max = 2, min = 3 };

class NcclComm {
public:
    // Joins the communicator of `world_size` ranks named by `unique_id`; throws NcclError (after
    // aborting) when the others have not all joined within `timeout_s`.
    NcclComm(int device, const std::string& unique_id, int world_size, int rank, double timeout_s);
    ~NcclComm();

    // x (count,) of `dtype` at `ptr` <- the op over every rank's x (in place)
    void all_reduce(std::uintptr_t ptr, std::int64_t count, int dtype, int op, bool side);
    // x (count,) <- root's x (in place)
    void broadcast(std::uintptr_t ptr, std::int64_t count, int dtype, int root, bool side);
    void join();  // stream(device) waits for everything queued on the side stream so far

    // "" while healthy; else what went wrong (an asynchronous NCCL error, a collective older than
    // the timeout); in either case the communicator has been aborted. Thread-safe (watchdog).
    std::string check();
    void abort(const std::string& why);  // ncclCommAbort, idempotent; later calls raise `why`
    void destroy();                      // finalize (bounded by the timeout) and free; idempotent
    std::string failure() const;         // why it was aborted, "" if it was not

    int device() const { return device_; }
    int rank() const { return rank_; }
    int world_size() const { return world_size_; }

private:
    void wait_ready(const char* what, double timeout_s);  // polls ncclInProgress, bounded
    void enqueued(cudaStream_t st);                       // records the watchdog's event
    cudaStream_t stream_for(bool side);
    void raise_if_failed(const char* what) const;

    int device_, world_size_, rank_;
    double timeout_s_;
    ncclComm_t comm_ = nullptr;
    cudaStream_t side_ = nullptr;
    cudaEvent_t fork_ = nullptr, join_ = nullptr;
    struct Pending {
        cudaEvent_t done;
        std::chrono::steady_clock::time_point queued;
    };
    std::deque<Pending> pending_;  // collectives not yet seen finished, oldest first
    std::deque<cudaEvent_t> spare_;
    mutable std::mutex mutex_;     // pending_, spare_, failure_, comm_ (abort from the watchdog)
    std::string failure_;
    bool destroyed_ = false;
};

}  // namespace engine
