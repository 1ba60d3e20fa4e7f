// layernorm/: layer norm over the last axis, forward and backward, and the residual add + layer norm
// forward. layernorm.cu: kernels and launchers; bind.cpp: the Python bindings. Launchers take device
// pointers, sizes and the device index; work is queued on the device's one stream and never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

namespace engine {

// float32: x (N, C) -> out (N, C), mean (N,), rstd (N,); weight/bias may be null
void layernorm_forward(int device, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps);
// dout (N, C) -> dx (N, C), dw (C,) and db (C,) when non-null
void layernorm_backward(int device, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);

// x / out / dout / dx of `dtype` (F32 or BF16); weights, biases, mean, rstd and the weight gradients
// are float32 (statistics in float32).
void layernorm_forward_dt(int device, int dtype, void* out, float* mean, float* rstd, const void* x, const float* w,
                          const float* b, int64_t N, int64_t C, float eps);
// dres (may be null): added to dx, the gradient of the residual stream x is (add_layer_norm's backward);
// ds (C,) float32 (may be null): the column sums of dx (with dres), add_layer_norm's residual-bias gradient
void layernorm_backward_dt(int device, int dtype, void* dx, float* dw, float* db, const void* dout, const void* x,
                           const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                           const void* dres = nullptr, float* ds = nullptr);
// sum = x + res + rb (rounded to dtype; rb (C,) float32 may be null) and out = layer_norm(sum), in one pass
void layernorm_add_forward_dt(int device, int dtype, void* out, void* sum, float* mean, float* rstd, const void* x,
                              const void* res, const float* rb, const float* w, const float* b, int64_t N, int64_t C,
                              float eps);

}  // namespace engine
