// A list of float32 tensors passed by value to one kernel launch (kernel parameters, no host->device
// copy): tensor t covers elements [offs[t], offs[t+1]) of the concatenated index space.
#pragma once
#include <vector>

#include "runtime/common.cuh"

namespace engine {

constexpr int kMultiTensorMax = 64;  // per launch; 4 pointer lists + offsets stay < 4 KB of parameters

template <int NPTR>
struct MultiTensor {
    int count;
    int64_t offs[kMultiTensorMax + 1];
    float* ptr[NPTR][kMultiTensorMax];
};

// element e of the concatenated space -> tensor index, walking forward from a previous answer
template <int NPTR>
__device__ __forceinline__ int tensor_of(const MultiTensor<NPTR>& mt, int64_t e, int t) {
    while (t + 1 < mt.count && e >= mt.offs[t + 1]) ++t;
    return t;
}

// fn(t, first, n) for each piece of a block's elements [lo, hi) of the concatenated space: tensor t's
// elements [first, first + n), a tensor at a time. A kernel then reads a tensor's pointers once per
// piece; looked up per element, they come from the kernel parameters through the MIO queue, which
// throttled AdamW to half the memory bandwidth.
template <int NPTR, typename Fn>
__device__ __forceinline__ void for_each_piece(const MultiTensor<NPTR>& mt, int64_t lo, int64_t hi, Fn fn) {
    int t = tensor_of(mt, lo, 0);
    for (int64_t at = lo; at < hi;) {
        while (at >= mt.offs[t + 1]) ++t;  // past empty tensors
        const int64_t end = min(hi, mt.offs[t + 1]);
        fn(t, at - mt.offs[t], end - at);
        at = end;
    }
}

// calls fn(mt, total) for each chunk of at most kMultiTensorMax tensors
template <int NPTR, typename Fn>
void for_each_chunk(const std::vector<const std::vector<float*>*>& lists, const std::vector<int64_t>& ns, Fn fn) {
    size_t n = ns.size();
    for (size_t start = 0; start < n; start += kMultiTensorMax) {
        MultiTensor<NPTR> mt;
        mt.count = (int)std::min<size_t>(kMultiTensorMax, n - start);
        int64_t total = 0;
        for (int t = 0; t < mt.count; ++t) {
            mt.offs[t] = total;
            total += ns[start + t];
            for (int k = 0; k < NPTR; ++k) mt.ptr[k][t] = (*lists[k])[start + t];
        }
        mt.offs[mt.count] = total;
        if (total > 0) fn(mt, total);
    }
}

}  // namespace engine
