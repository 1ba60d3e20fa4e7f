// softmax/: softmax and log-softmax over the last axis, cross-entropy (forward, backward), and the
// fused classifier's loss-and-gradient kernel with its scale. softmax.cu: kernels and launchers;
// bind.cpp: the Python bindings. Launchers take device pointers, sizes and the device index; work is
// queued on the device's one stream and never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

namespace engine {

// float32, over the last axis of (N, L)
void softmax_forward(int device, float* out, const float* x, int64_t N, int64_t L, bool log);
void softmax_backward(int device, float* dx, const float* y, const float* g, int64_t N, int64_t L, bool log);
// logits (N, V), targets (N,) -> losses (N,), lse (N,)
void cross_entropy_forward(int device, float* losses, float* lse, const float* logits, const int64_t* targets,
                           int64_t N, int64_t V, int64_t ignore_index);
// dlogits (N, V) = (softmax - onehot) * g, 0 on ignored rows
void cross_entropy_backward(int device, float* dlogits, const float* logits, const int64_t* targets, const float* lse,
                            const float* g, int64_t N, int64_t V, int64_t ignore_index);

// cross-entropy with float32 or bf16 logits (float32 losses, lse and arithmetic);
// dlogits (logits' dtype) may be the logits' own memory.
void cross_entropy_forward_dt(int device, int dtype, float* losses, float* lse, const void* logits,
                              const int64_t* targets, int64_t N, int64_t V, int64_t ignore_index);
void cross_entropy_backward_dt(int device, int dtype, void* dlogits, const void* logits, const int64_t* targets,
                               const float* lse, const float* g, int64_t N, int64_t V, int64_t ignore_index);
// The fused classifier: logits (N, V) float32 or bf16, overwritten in place by softmax - onehot(target),
// the gradient of sum(losses) (0 on ignored rows); losses (N,) float32 (0 where ignored, NaN for a
// target out of range). And its backward's scale: out (n,) = x (n,) * factor[0] (a float32 on the
// device), float32 arithmetic, F32 or BF16 storage; out may be x. With dlogits8 (N, V) (bf16 logits
// only), the gradient's E5M2 codes too, scaled by kDlogitsFp8Scale: |softmax - onehot| <= 1, so a
// fixed scale fits them (no amax), 2^15 below E5M2's largest value, 2^-31 its smallest. With
// grad_scale (a float32 on the device; not with dlogits8), the gradient is times grad_scale[0].
constexpr float kDlogitsFp8Scale = 32768.f;
void cross_entropy_with_grad_dt(int device, int dtype, float* losses, void* logits, const int64_t* targets, int64_t N,
                                int64_t V, int64_t ignore_index, void* dlogits8 = nullptr,
                                const float* grad_scale = nullptr);
void scale_dt(int device, int dtype, void* out, const void* x, const float* factor, int64_t n);

}  // namespace engine
