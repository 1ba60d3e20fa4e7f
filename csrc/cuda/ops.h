// Host-side launchers of engine's CUDA kernels (one .cu per family). Each takes device pointers,
// sizes and the device index; work is queued on the device's one stream and never waited for.
#pragma once
#include <cstdint>
#include <vector>

#include "types.h"

namespace engine {

// elementwise.cu ----------------------------------------------------------------------------------
enum BinaryOp : int { ADD = 0, SUB, MUL, DIV, POW, MAXIMUM, MINIMUM, EQ, NE, LT, LE, GT, GE };
enum UnaryOp : int { NEG = 0, EXP, LOG, ABS, SQRT, TANH, SIGN, SIGMOID, RELU, GELU };
// mode 0: a, b arrays (strides in s.stride[0], s.stride[1]); 1: b is `scalar`; 2: a is `scalar`
void binary(int device, int op, int dtype, void* out, const void* a, const void* b, double scalar, int mode,
            const Strided& s, int64_t n);
void unary(int device, int op, int dtype, void* out, const void* x, int64_t n);
void act_backward(int device, int op, int dtype, void* dx, const void* x, const void* g, int64_t n);  // RELU, GELU
// cond ? a : b; a_scalar/b_scalar replace the array; strides: 0 cond, 1 a, 2 b
void where(int device, int dtype, void* out, const void* cond, const void* a, const void* b, double sa, double sb,
           bool a_is_scalar, bool b_is_scalar, const Strided& s, int64_t n);
void astype(int device, int src_dtype, int dst_dtype, void* out, const void* x, int64_t n);
void fill(int device, int dtype, void* out, double value, int64_t n);
void arange(int device, int dtype, void* out, double start, double step, int64_t n);

// copy.cu: out[idx] = x[idx] over `s` (stride[0] = dst strides, stride[1] = src strides), elsize bytes
void strided_copy(int device, int elsize, void* dst, const void* src, const Strided& s, int64_t n);

// reduce.cu: x viewed as (outer, R, inner) -> out (outer, inner)
enum ReduceOp : int { RSUM = 0, RMAX = 1 };
void reduce(int device, int op, int dtype, void* out, const void* x, int64_t outer, int64_t R, int64_t inner);
void argmax_lastdim(int device, int dtype, int64_t* out, const void* x, int64_t rows, int64_t L);
// multi-tensor: out[0] = sum_i sum(x_i^2) (float32), x_i float32
void sum_of_squares(int device, float* out, const std::vector<float*>& xs, const std::vector<int64_t>& ns);
void scale_multi(int device, const std::vector<float*>& xs, const std::vector<int64_t>& ns, const float* factor);

// layernorm.cu: x (N, C) -> out (N, C), mean (N,), rstd (N,); weight/bias may be null
void layernorm_forward(int device, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps);
// dout (N, C) -> dx (N, C), dw (C,) and db (C,) when non-null
void layernorm_backward(int device, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);

// softmax.cu: over the last axis of (N, L)
void softmax_forward(int device, float* out, const float* x, int64_t N, int64_t L, bool log);
void softmax_backward(int device, float* dx, const float* y, const float* g, int64_t N, int64_t L, bool log);
// logits (N, V), targets (N,) -> losses (N,), lse (N,)
void cross_entropy_forward(int device, float* losses, float* lse, const float* logits, const int64_t* targets,
                           int64_t N, int64_t V, int64_t ignore_index);
// dlogits (N, V) = (softmax - onehot) * g, 0 on ignored rows
void cross_entropy_backward(int device, float* dlogits, const float* logits, const int64_t* targets, const float* lse,
                            const float* g, int64_t N, int64_t V, int64_t ignore_index);

// embedding.cu: weight (V, C), idx (N,) -> out (N, C); backward scatter-adds into dweight (V, C)
void embedding_forward(int device, int dtype, void* out, const void* weight, const int64_t* idx, int64_t N,
                       int64_t V, int64_t C);
void embedding_backward(int device, float* dweight, const float* g, const int64_t* idx, int64_t N, int64_t V,
                        int64_t C);

// random.cu: Philox4x32-10 counter-based RNG
void dropout_mask(int device, int dtype, void* out, int64_t n, float p, uint64_t seed, uint64_t offset);
void random_uniform(int device, float* out, int64_t n, uint64_t seed, uint64_t offset);
void random_normal(int device, float* out, int64_t n, uint64_t seed, uint64_t offset);

// optimizer.cu: one launch per 96 tensors
void adamw(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& m,
           const std::vector<float*>& v, const std::vector<int64_t>& n, float lr, float beta1, float beta2, float eps,
           float weight_decay, float bc1, float bc2);
void sgd(int device, const std::vector<float*>& p, const std::vector<float*>& g, const std::vector<float*>& buf,
         const std::vector<int64_t>& n, float lr, float momentum, float dampening, bool nesterov, float weight_decay,
         bool first_step);

// matmul.cpp (cuBLASLt): C (batch, M, N) = op(A) (batch, M, K) @ op(B) (batch, K, N), row-major,
// batch strides in elements (0 broadcasts). A and B are `dtype`; C is out_dtype: -1 for dtype, or F32
// with BF16 operands (float32 accumulation written as float32).
void matmul(int device, int dtype, void* c, const void* a, const void* b, int64_t batch, int64_t M, int64_t N,
            int64_t K, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b, int64_t stride_c,
            int out_dtype = -1);
// The same GEMM (no batch) with an epilogue of the Linear layer (matmul.cpp's header says what each
// does): c (M, N); bias (N,) for BIAS / GELU_BIAS, (M,) written for BGRAD; aux (M, N) written for
// GELU_BIAS / GELU; out_dtype as for matmul, and the bias of it. Returns false, doing nothing, where
// cuBLASLt offers no algorithm for it.
enum MatmulEpilogue { EPI_NONE = 0, EPI_BIAS = 1, EPI_GELU_BIAS = 2, EPI_BGRAD = 3, EPI_GELU = 4 };
bool matmul_epilogue(int device, int dtype, int epilogue, void* c, const void* a, const void* b, int64_t M, int64_t N,
                     int64_t K, bool trans_a, bool trans_b, void* bias, void* aux, int out_dtype = -1);
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace engine
