// embedding/: embedding lookup and its backward. embedding.cu: kernels and launchers; bind.cpp: the
// Python bindings. Launchers take device pointers, sizes and the device index; work is queued on the
// device's one stream and never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

namespace engine {

// weight (V, C), idx (N,) -> out (N, C); backward scatter-adds into dweight (V, C)
void embedding_forward(int device, int dtype, void* out, const void* weight, const int64_t* idx, int64_t N,
                       int64_t V, int64_t C);
// weight (V, C), pos (P, C) float32, idx (N,) = (B, T) flattened -> out (N, C) of out_dtype (F32 or
// BF16) = weight[idx[n]] + pos[start + n % T] (start + T <= P: the caller checks)
void embedding_positions_forward(int device, int out_dtype, void* out, const float* weight, const float* pos,
                                 const int64_t* idx, int64_t N, int64_t V, int64_t C, int T, int start);
// g (N, C) float32 or bf16 (g_dtype) -> dweight (V, C) float32 with g's rows scatter-added; dweight is
// zeroed first unless accumulate (then the rows are added to the gradient it holds)
void embedding_backward(int device, int g_dtype, float* dweight, const void* g, const int64_t* idx, int64_t N,
                        int64_t V, int64_t C, bool accumulate);

// the backward of embedding_positions_forward: g (N, C) -> dweight (V, C) as embedding_backward's, and
// dpos (P, C) float32 = the sum over the batch in rows start..start+T-1, zeros elsewhere
void embedding_positions_backward(int device, int g_dtype, float* dweight, float* dpos, const void* g,
                                  const int64_t* idx, int64_t N, int64_t V, int64_t P, int64_t C, int T, int start,
                                  bool accumulate);

}  // namespace engine
