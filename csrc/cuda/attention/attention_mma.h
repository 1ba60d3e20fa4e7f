// attention_mma.cu: the bf16, no-dropout fast path of attention.cu's kernels, on mma.sync with
// register-resident tiles. attention.cu calls these first; false means "not for these arguments"
// (head dim, alignment), and the caller runs its WMMA kernels instead.
#pragma once
#include <cuda_runtime.h>

#include "attention/attention.h"

namespace engine {

// head dims with a fast path: 32, 64 (forward and backward) and 128 (forward only)
bool attention_mma_supported(int D, bool backward);

// q (B, H, T, D), k, v (B, H, S, D) bf16 -> o (bf16), lse (B * H, T) float32, as attention_forward
bool attention_forward_mma(cudaStream_t st, void* o, float* lse, const void* q, const void* k, const void* v,
                           AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                           int D, bool causal, float scale);

// the backward's main pass: dk, dv (bf16, written once) and dq_acc (float32 (B * H, T, D), added to,
// without the scale) from delta = rowsum(dout * o); attention.cu prepares delta and turns dq_acc into dq
bool attention_backward_mma(cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout, const void* q,
                            const void* k, const void* v, const float* lse, const float* delta, AttnLayout lq,
                            AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, int D,
                            bool causal, float scale);

}  // namespace engine
