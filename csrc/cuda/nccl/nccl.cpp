// The NCCL communicator of engine.distributed (nccl.h says what it does and why it is
// non-blocking). Every NCCL call is made under mutex_, so the watchdog thread's abort never runs
// inside another thread's NCCL call; the polling loops release it between polls.
#include "nccl/nccl.h"

#include <cstring>
#include <thread>

#include "runtime/runtime.h"
#include "runtime/types.h"

namespace engine {

namespace {

ncclDataType_t nccl_type(int dtype, const char* op) {
    switch (dtype) {
        case F32: return ncclFloat32;
        case F64: return ncclFloat64;
        case F16: return ncclFloat16;
        case BF16: return ncclBfloat16;
        case I64: return ncclInt64;
        case I32: return ncclInt32;
        case U8:
        case BOOL: return ncclUint8;
    }
    throw NcclError(std::string("nccl ") + op + ": unknown dtype code " + std::to_string(dtype));
}

ncclRedOp_t nccl_op(int op) {
    switch (static_cast<NcclOp>(op)) {
        case NcclOp::sum: return ncclSum;
        case NcclOp::avg: return ncclAvg;
        case NcclOp::max: return ncclMax;
        case NcclOp::min: return ncclMin;
    }
    throw NcclError("nccl all_reduce: unknown reduce op code " + std::to_string(op) + " (0 sum, 1 avg, 2 max, 3 min)");
}

std::string describe(ncclResult_t r, ncclComm_t comm) {
    std::string text = std::string(ncclGetErrorString(r));
    const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    if (last != nullptr && *last) text += ": " + std::string(last);
    return text;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void pause(int polls) {  // spin briefly (most calls finish within microseconds), then sleep
    if (polls < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 50 : 1000));
}

}  // namespace

std::string nccl_unique_id() {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw NcclError("nccl unique id: " + describe(r, nullptr));
    return std::string(id.internal, sizeof(id.internal));
}

int nccl_version() {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return 0;
    return v;
}

NcclComm::NcclComm(int device, const std::string& unique_id, int world_size, int rank, double timeout_s)
    : device_(device), world_size_(world_size), rank_(rank), timeout_s_(timeout_s) {
    if (unique_id.size() != sizeof(ncclUniqueId))
        throw NcclError("nccl init: the unique id has " + std::to_string(unique_id.size()) + " bytes, expected " +
                        std::to_string(sizeof(ncclUniqueId)) + " (rank 0's nccl_unique_id())");
    if (world_size < 1 || rank < 0 || rank >= world_size)
        throw NcclError("nccl init: rank " + std::to_string(rank) + " of world size " + std::to_string(world_size) +
                        " (expected 0 <= rank < world_size)");
    use_device(device);
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; wait_ready polls it under a deadline
    ncclResult_t r;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        r = ncclCommInitRankConfig(&comm_, world_size, id, rank, &config);
    }
    if (r != ncclSuccess && r != ncclInProgress) {
        std::string text = describe(r, comm_);
        if (comm_ != nullptr) ncclCommAbort(comm_);
        comm_ = nullptr;
        throw NcclError("nccl init of rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " on cuda:" +
                        std::to_string(device) + ": " + text);
    }
    wait_ready("init", timeout_s);
    int least = 0, greatest = 0;
    engine::check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "nccl side stream");
    engine::check(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, greatest), "nccl side stream");
    engine::check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "nccl events");
    engine::check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "nccl events");
}

NcclComm::~NcclComm() {
    try {
        std::lock_guard<std::mutex> lock(mutex_);
        if (comm_ != nullptr) ncclCommAbort(comm_);  // never destroy_process_group()'d: do not wait for peers
        comm_ = nullptr;
    } catch (...) {
    }
}

void NcclComm::raise_if_failed(const char* what) const {
    if (destroyed_) throw NcclError(std::string("nccl ") + what + ": the process group was destroyed");
    if (!failure_.empty())
        throw NcclError(std::string("nccl ") + what + ": the process group was aborted earlier: " + failure_);
}

void NcclComm::wait_ready(const char* what, double timeout_s) {
    auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
        ncclResult_t state = ncclSuccess;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            raise_if_failed(what);
            ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
            if (r != ncclSuccess) state = r;
            if (state == ncclSuccess) return;
            if (state != ncclInProgress) {
                failure_ = std::string("nccl ") + what + " on rank " + std::to_string(rank_) + ": " +
                           describe(state, comm_) + " (a peer rank died or cannot be reached)";
                ncclCommAbort(comm_);
                comm_ = nullptr;
                throw NcclError(failure_);
            }
            if (seconds_since(start) > timeout_s) {
                failure_ = std::string("nccl ") + what + " on rank " + std::to_string(rank_) + "/" +
                           std::to_string(world_size_) + " did not finish within " + std::to_string((int)timeout_s) +
                           " s: not every rank took part (one did not start, died, or cannot reach this one)";
                ncclCommAbort(comm_);
                comm_ = nullptr;
                throw NcclError(failure_);
            }
        }
        pause(polls);
    }
}

cudaStream_t NcclComm::stream_for(bool side) {
    cudaStream_t main = stream(device_);
    if (!side) return main;
    engine::check(cudaEventRecord(fork_, main), "nccl fork");  // the side stream starts after the work queued so far
    engine::check(cudaStreamWaitEvent(side_, fork_, 0), "nccl fork");
    return side_;
}

void NcclComm::enqueued(cudaStream_t st) {
    if (capturing(device_)) return;  // a graph's collectives are not watched (no event query on a capture)
    std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t ev = nullptr;
    if (!spare_.empty()) {
        ev = spare_.front();
        spare_.pop_front();
    } else {
        engine::check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "nccl watchdog event");
    }
    engine::check(cudaEventRecord(ev, st), "nccl watchdog event");
    pending_.push_back({ev, std::chrono::steady_clock::now()});
}

void NcclComm::all_reduce(std::uintptr_t ptr, std::int64_t count, int dtype, int op, bool side) {
    ncclDataType_t type = nccl_type(dtype, "all_reduce");
    ncclRedOp_t red = nccl_op(op);
    use_device(device_);
    cudaStream_t st = stream_for(side);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        raise_if_failed("all_reduce");
        void* p = reinterpret_cast<void*>(ptr);
        ncclResult_t r = ncclAllReduce(p, p, static_cast<size_t>(count), type, red, comm_, st);
        if (r != ncclSuccess && r != ncclInProgress) {
            failure_ = "nccl all_reduce on rank " + std::to_string(rank_) + ": " + describe(r, comm_);
            ncclCommAbort(comm_);
            comm_ = nullptr;
            throw NcclError(failure_);
        }
    }
    wait_ready("all_reduce", timeout_s_);
    enqueued(st);
}

void NcclComm::broadcast(std::uintptr_t ptr, std::int64_t count, int dtype, int root, bool side) {
    ncclDataType_t type = nccl_type(dtype, "broadcast");
    if (root < 0 || root >= world_size_)
        throw NcclError("nccl broadcast: root " + std::to_string(root) + " is not a rank of world size " +
                        std::to_string(world_size_));
    use_device(device_);
    cudaStream_t st = stream_for(side);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        raise_if_failed("broadcast");
        void* p = reinterpret_cast<void*>(ptr);
        ncclResult_t r = ncclBroadcast(p, p, static_cast<size_t>(count), type, root, comm_, st);
        if (r != ncclSuccess && r != ncclInProgress) {
            failure_ = "nccl broadcast on rank " + std::to_string(rank_) + ": " + describe(r, comm_);
            ncclCommAbort(comm_);
            comm_ = nullptr;
            throw NcclError(failure_);
        }
    }
    wait_ready("broadcast", timeout_s_);
    enqueued(st);
}

void NcclComm::join() {
    use_device(device_);
    engine::check(cudaEventRecord(join_, side_), "nccl join");
    engine::check(cudaStreamWaitEvent(stream(device_), join_, 0), "nccl join");
}

std::string NcclComm::check() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty() || destroyed_ || comm_ == nullptr) return failure_;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
        failure_ = "nccl on rank " + std::to_string(rank_) + ": asynchronous error " + describe(state, comm_) +
                   " (a peer rank died or a link failed)";
    }
    if (failure_.empty()) {
        use_device(device_);
        while (!pending_.empty()) {
            cudaError_t q = cudaEventQuery(pending_.front().done);
            if (q == cudaErrorNotReady) break;
            if (q != cudaSuccess) {
                cudaGetLastError();
                failure_ = std::string("nccl on rank ") + std::to_string(rank_) + ": CUDA error " +
                           cudaGetErrorName(q) + " while a collective ran";
                break;
            }
            spare_.push_back(pending_.front().done);
            pending_.pop_front();
        }
        if (failure_.empty() && !pending_.empty() && seconds_since(pending_.front().queued) > timeout_s_) {
            failure_ = "nccl on rank " + std::to_string(rank_) + "/" + std::to_string(world_size_) +
                       ": a collective queued " + std::to_string((int)seconds_since(pending_.front().queued)) +
                       " s ago has not finished (timeout " + std::to_string((int)timeout_s_) +
                       " s): a peer rank stopped calling collectives or died";
        }
    }
    if (!failure_.empty()) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
    }
    return failure_;
}

void NcclComm::abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty()) failure_ = why.empty() ? "aborted" : why;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
}

std::string NcclComm::failure() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
}

void NcclComm::destroy() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (destroyed_) return;
        if (comm_ == nullptr) {  // aborted: nothing left to finalize
            destroyed_ = true;
            return;
        }
        use_device(device_);
        ncclResult_t r = ncclCommFinalize(comm_);  // flushes queued collectives (non-blocking: polled below)
        if (r != ncclSuccess && r != ncclInProgress) {
            ncclCommAbort(comm_);
            comm_ = nullptr;
            destroyed_ = true;
            throw NcclError("nccl destroy on rank " + std::to_string(rank_) + ": " + describe(r, nullptr));
        }
    }
    try {
        wait_ready("destroy", timeout_s_);
    } catch (const NcclError&) {
        std::lock_guard<std::mutex> lock(mutex_);
        destroyed_ = true;
        throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ncclCommDestroy(comm_);
    comm_ = nullptr;
    destroyed_ = true;
    for (auto& p : pending_) cudaEventDestroy(p.done);
    for (auto& e : spare_) cudaEventDestroy(e);
    pending_.clear();
    spare_.clear();
    if (fork_) cudaEventDestroy(fork_);
    if (join_) cudaEventDestroy(join_);
    if (side_) cudaStreamDestroy(side_);
    fork_ = join_ = nullptr;
    side_ = nullptr;
}

}  // namespace engine
