// attention_wgmma.cu: bf16 attention on Hopper's wgmma, head dims 32, 64 and 128, forward and
// backward. attention.cu calls these first for bf16 without dropout; false means "not here" (not
// built for sm_90a, not a compute capability 9.0 GPU, another head dim, unaligned rows, or turned
// off), and the caller goes on to attention_mma.cu's kernels (or, where those decline too, the
// WMMA ones: the backward at head dim 128).
#pragma once
#include <cuda_runtime.h>

#include "attention/attention.h"

namespace engine {

// whether this build has the kernel (ENGINE_CUDA_ARCHS with 90a)
bool attention_wgmma_built();

// whether the forward / the backward may run here (default true; false for tests and benchmarks, which
// then get attention_mma.cu's kernels); each returns the previous setting
bool attention_wgmma_forward(bool enabled);
bool attention_wgmma_backward(bool enabled);

// Which forward kernel runs at head dims 32, 64 and 128 (attention_fwd_ws.cu's warp-specialised ones, by
// consumer warpgroups and keys a tile: 1 = 2 x 128, 2 = 3 x 128, 3 = 2 x 64, 4 = 3 x 64; 0 =
// attention_wgmma.cu's own, two warpgroups loading with cp.async; -1, the default: by shape);
// returns the previous choice
int attention_wgmma_forward_kernel(int kernel);

// Which backward kernel runs at head dims 64 and 128 (attention_bwd_ws.cu's warp-specialised ones:
// 1 = 3 consumer warpgroups of 64 keys, 2 = 2 of them (at head dim 128 both are 2), plus the flags
// of attention_backward_ws; 0 = attention_wgmma.cu's own, one warpgroup a block loading with cp.async;
// -1, the default: by shape); returns the previous choice
int attention_wgmma_backward_kernel(int kernel);

// attention_fwd_ws.cu: the warp-specialised forward, as attention_forward_wgmma; false where it does
// not apply (another head dim, or a layout TMA cannot describe)
bool attention_forward_ws(int kernel, int device, cudaStream_t st, void* o, float* lse, const void* q, const void* k,
                          const void* v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H,
                          int T, int S, int D, bool causal, float scale);

// q (B, H, T, D), k, v (B, H, S, D) bf16 (D 32, 64 or 128) -> o (bf16), lse (B * H, T) float32, as
// attention_forward
bool attention_forward_wgmma(int device, cudaStream_t st, void* o, float* lse, const void* q, const void* k,
                             const void* v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H,
                             int T, int S, int D, bool causal, float scale);

// the backward's main pass, as attention_backward_mma: dk, dv (bf16) and dq_acc (float32, added to,
// without the scale) from delta = rowsum(dout * o)
bool attention_backward_wgmma(int device, cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout,
                              const void* q, const void* k, const void* v, const float* lse, const float* delta,
                              AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                              int D, bool causal, float scale);

// attention_bwd_ws.cu: the warp-specialised backward's main pass, as attention_backward_wgmma; false
// where it does not apply
bool attention_backward_ws(int kernel, int device, cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout,
                           const void* q, const void* k, const void* v, const float* lse, const float* delta,
                           AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                           int D, bool causal, float scale);

}  // namespace engine
