// reduce/: sum / max over a block of axes, argmax over the last axis, and the multi-tensor sum of
// squares + in-place scale of clip_grad_norm_. reduce.cu: kernels and launchers; bind.cpp: the Python
// bindings. Launchers take device pointers, sizes and the device index; work is queued on the
// device's one stream and never waited for.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/types.h"

namespace engine {

// reduce.cu: x viewed as (outer, R, inner) -> out (outer, inner)
enum ReduceOp : int { RSUM = 0, RMAX = 1 };
void reduce(int device, int op, int dtype, void* out, const void* x, int64_t outer, int64_t R, int64_t inner);
void argmax_lastdim(int device, int dtype, int64_t* out, const void* x, int64_t rows, int64_t L);
// multi-tensor: out[0] = sum_i sum(x_i^2) (float32), x_i float32
void sum_of_squares(int device, float* out, const std::vector<float*>& xs, const std::vector<int64_t>& ns);
void scale_multi(int device, const std::vector<float*>& xs, const std::vector<int64_t>& ns, const float* factor);

}  // namespace engine
