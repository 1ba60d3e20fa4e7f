// optimizer/: fused AdamW and SGD updates, one launch over many parameters (runtime/multi_tensor.cuh),
// with host scalars or with device scalars (for captured graphs). optimizer.cu: kernels and launchers;
// bind.cpp: the Python bindings. Launchers take device pointers, sizes and the device index; work is
// queued on the device's one stream and never waited for.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/types.h"

namespace engine {

// one launch per 64 tensors
void adamw(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& m,
           const std::vector<float*>& v, const std::vector<int64_t>& n, float lr, float beta1, float beta2, float eps,
           float weight_decay, float bc1, float bc2);
void sgd(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& buf,
         const std::vector<int64_t>& n, float lr, float momentum, float dampening, bool nesterov, float weight_decay,
         bool first_step);

// The device-scalar variants of adamw/sgd: `lr` and `step` point at float32 device memory (engine/optim
// keeps them per param group), so a captured update follows the schedule. Bias corrections are computed
// in double as the host path does (bit-identical results).
void adamw_dev(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& m,
               const std::vector<float*>& v, const std::vector<int64_t>& n, const float* lr, const float* step,
               double beta1, double beta2, float eps, float weight_decay);
void sgd_dev(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& buf,
             const std::vector<int64_t>& n, const float* lr, float momentum, float dampening, bool nesterov,
             float weight_decay, bool first_step);
// steps[i] += 1 for every bit i set in `mask` (i < 64): one launch advances every group's count
void optim_step_advance(int device, float* steps, uint64_t mask);

}  // namespace engine
