// elementwise/: binary arithmetic and comparisons (same-shape, scalar and broadcast forms), unary
// activations and their fused backward, where. elementwise.cu holds the kernels and launchers of every
// dtype but bfloat16, elementwise_bf16.cu the bfloat16 forms (reached from elementwise.cu's dispatch);
// bind.cpp the Python bindings. Launchers take device pointers, sizes and the device index; work is
// queued on the device's one stream and never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

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

// elementwise_bf16.cu: the bfloat16 forms of binary, unary, act_backward and where (same arguments;
// float32 arithmetic, bf16 in memory). elementwise.cu dispatches dtype BF16 here.
void binary_bf16(int device, int op, void* out, const void* a, const void* b, double scalar, int mode,
                 const Strided& s, int64_t n);
void unary_bf16(int device, int op, void* out, const void* x, int64_t n);
void act_backward_bf16(int device, int op, void* dx, const void* x, const void* g, int64_t n);
void where_bf16(int device, void* out, const void* cond, const void* a, const void* b, double sa, double sb, bool as,
                bool bs, const Strided& s, int64_t n);

}  // namespace engine
