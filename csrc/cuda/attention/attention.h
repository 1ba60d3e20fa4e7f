// attention/: fused scaled-dot-product attention, forward and backward, with dropout. attention.cu:
// the launchers (argument checks, and which kernels run: wgmma on Hopper, then mma.sync, then the
// general WMMA kernels of attention_wmma.cuh); attention_dropout.{cuh,cu}: the dropout rule and the
// mask/key kernels; attention_mma.cu, attention_wgmma.cu (with the warp-specialised
// attention_fwd_ws.cu and attention_bwd_ws.cu it chooses by shape): the bf16 fast paths. bind.cpp: the Python
// bindings. Launchers take device pointers, sizes and the device index; work is queued on the
// device's one stream and never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

namespace engine {

// Element strides of a (batch, head, time, d) view whose last axis is unit-stride: element
// (b, h, t, d) is at ptr[b * sb + h * sh + t * st + d]. Covers (B, H, T, D) contiguous arrays and
// the q/k/v thirds of a packed (B, T, 3C) projection (sb = 3TC, sh = D, st = 3C) alike.
struct AttnLayout {
    int64_t sb, sh, st;
};

// causal (bottom-right aligned: query i sees key j <= i + S - T) or full attention,
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
// dbias (null for none): self-attention from a packed projection q | k | v = x W^T + b, (3 H D,)
// float32 written with b's gradient, the column sums of dq, dk, dv: dq's summed as dq is written,
// dv's as sum_i dout_i (each query's probabilities sum to 1), dk's 0 (a constant added to a query's
// scores changes nothing), so no pass over the gradient of its own. Needs T == S, T % 16 == 0 and
// no dropout (which breaks both identities).
void attention_backward(int device, int dtype, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const void* o, const float* lse, AttnLayout lq, AttnLayout lk,
                        AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, int D, bool causal, float scale,
                        bool precise, float dropout_p, const uint64_t* rng_key, float* dbias = nullptr);

// attention_dropout.cu: out (BH, T, S) float32 = the Z the kernels above use: 0 or 1 / (1 - p). The
// key is *rng_key (what a forward wrote), or `seed` itself when rng_key is null (tests: the CPU
// reference's mask).
void attention_dropout_mask(int device, float* out, int64_t BH, int T, int S, float p, uint64_t seed,
                            const uint64_t* rng_key);
// *rng_key = the key a forward with this seed would use (for the unfused path with dropout)
void attention_rng_key(int device, uint64_t* rng_key, uint64_t seed);

}  // namespace engine
