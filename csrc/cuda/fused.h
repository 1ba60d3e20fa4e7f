// Host-side launchers of the fused kernels (attention.cu, fused.cu) and the bf16 mixed-precision
// kernels (mixed.cu). Same conventions as ops.h: device pointers, sizes, the device index; work is
// queued on the device's one stream and never waited for. Bindings: bind_fused.cpp.
#pragma once
#include <cstdint>

#include "types.h"

namespace engine {

// Element strides of a (batch, head, time, d) view whose last axis is unit-stride: element
// (b, h, t, d) is at ptr[b * sb + h * sh + t * st + d]. Covers (B, H, T, D) contiguous arrays and
// the q/k/v thirds of a packed (B, T, 3C) projection (sb = 3TC, sh = D, st = 3C) alike.
struct AttnLayout {
    int64_t sb, sh, st;
};

// attention.cu: causal (bottom-right aligned: query i sees key j <= i + S - T) or full attention,
// flash-style on tensor cores (bf16, or TF32 for float32; `precise` splits float32 into two TF32
// halves for ~float32 accuracy). dtype F32 or BF16; D % 8 == 0, D <= 128; pointers 16-byte aligned.
// q (B, H, T, D), k, v (B, H, S, D) -> o (B, H, T, D), lse (B, H, T) float32 (natural log of the
// softmax denominator of the scaled scores; -inf for a query that sees no key).
// Dropout (dropout_p in [0, 1); not with `precise`): probability (bh, i, j) is kept by its Philox
// bits under key = the seed, mixed with the graph epoch while capturing; the forward writes that key
// to rng_key (one uint64 of device memory the caller keeps) and the backward reads it from there.
// lse is the undropped one; o = sum_j P_ij Z_ij v_j with Z = keep / (1 - p).
void attention_forward(int device, int dtype, void* o, float* lse, const void* q, const void* k, const void* v,
                       AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, int D,
                       bool causal, float scale, bool precise, float dropout_p, uint64_t seed, uint64_t* rng_key);
// dout has o's layout; dq, dk, dv have q's, k's and v's layouts (each element written once).
void attention_backward(int device, int dtype, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const void* o, const float* lse, AttnLayout lq, AttnLayout lk,
                        AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, int D, bool causal, float scale,
                        bool precise, float dropout_p, const uint64_t* rng_key);
// out (BH, T, S) float32 = the Z the kernels above use: 0 or 1 / (1 - p). The key is *rng_key
// (what a forward wrote), or `seed` itself when rng_key is null (tests: the CPU reference's mask).
void attention_dropout_mask(int device, float* out, int64_t BH, int T, int S, float p, uint64_t seed,
                            const uint64_t* rng_key);
// *rng_key = the key a forward with this seed would use (for the unfused path with dropout)
void attention_rng_key(int device, uint64_t* rng_key, uint64_t seed);

// mixed.cu: the bfloat16 forms of elementwise.cu's binary, unary, act_backward and where (same
// arguments; float32 arithmetic, bf16 in memory). elementwise.cu dispatches dtype BF16 here.
void binary_bf16(int device, int op, void* out, const void* a, const void* b, double scalar, int mode,
                 const Strided& s, int64_t n);
void unary_bf16(int device, int op, void* out, const void* x, int64_t n);
void act_backward_bf16(int device, int op, void* dx, const void* x, const void* g, int64_t n);
// float32 <-> bf16 cast, 8 per thread; false (nothing launched) unless n % 8 == 0 and 16-byte aligned
bool cast_bf16_vec(int device, int src, int dst, void* out, const void* x, int64_t n);
void where_bf16(int device, void* out, const void* cond, const void* a, const void* b, double sa, double sb, bool as,
                bool bs, const Strided& s, int64_t n);

// bias_grad.cu: the Linear bias gradient db (O,) = column sums of g (N, O), dtype F32 or BF16 (dpre,
// pre of the same dtype; float32 sums); db of db_dtype: -1 for dtype, or F32. With pre: the GELU
// backward first, dpre = gelu'(pre) * g written out, and db its column sums. False (nothing launched)
// unless O is a multiple of 16 bytes of the dtype and the pointers are 16-byte aligned.
bool linear_bias_grad(int device, int dtype, void* db, void* dpre, const void* g, const void* pre, int64_t N,
                      int64_t O, int db_dtype = -1);

// layernorm.cu: layer_norm over the last axis with x / out / dout / dx of `dtype` (F32 or BF16);
// weights, biases, mean, rstd and the weight gradients are float32 (statistics in float32).
void layernorm_forward_dt(int device, int dtype, void* out, float* mean, float* rstd, const void* x, const float* w,
                          const float* b, int64_t N, int64_t C, float eps);
// dres (may be null): added to dx, the gradient of the residual stream x is (add_layer_norm's backward)
void layernorm_backward_dt(int device, int dtype, void* dx, float* dw, float* db, const void* dout, const void* x,
                           const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                           const void* dres = nullptr);
// sum = x + res (rounded to dtype) and out = layer_norm(sum), in one pass
void layernorm_add_forward_dt(int device, int dtype, void* out, void* sum, float* mean, float* rstd, const void* x,
                              const void* res, const float* w, const float* b, int64_t N, int64_t C, float eps);

// softmax.cu: cross-entropy with float32 or bf16 logits (float32 losses, lse and arithmetic);
// dlogits (logits' dtype) may be the logits' own memory.
void cross_entropy_forward_dt(int device, int dtype, float* losses, float* lse, const void* logits,
                              const int64_t* targets, int64_t N, int64_t V, int64_t ignore_index);
void cross_entropy_backward_dt(int device, int dtype, void* dlogits, const void* logits, const int64_t* targets,
                               const float* lse, const float* g, int64_t N, int64_t V, int64_t ignore_index);
// The fused classifier: logits (N, V) float32 or bf16, overwritten in place by softmax - onehot(target),
// the gradient of sum(losses) (0 on ignored rows); losses (N,) float32 (0 where ignored, NaN for a
// target out of range). And its backward's scale: out (n,) = x (n,) * factor[0] (a float32 on the
// device), float32 arithmetic, F32 or BF16 storage; out may be x.
void cross_entropy_with_grad_dt(int device, int dtype, float* losses, void* logits, const int64_t* targets, int64_t N,
                                int64_t V, int64_t ignore_index);
void scale_dt(int device, int dtype, void* out, const void* x, const float* factor, int64_t n);

}  // namespace engine
