// The attention launchers: argument checks, and which kernels run. bf16 without dropout tries the
// Hopper wgmma kernels first (attention_wgmma.cu), then the mma.sync ones (attention_mma.cu); every
// other case, and any shape those decline, runs the general WMMA kernels of attention_wmma.cuh
// (float32 / TF32, precise float32, dropout, any D % 8 == 0 up to 128). The backward prepares
// delta = rowsum(dout * o) and a float32 dQ accumulator for whichever main pass runs, then writes dq.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention/attention.h"
#include "attention/attention_dropout.cuh"
#include "attention/attention_mma.h"
#include "attention/attention_wgmma.h"
#include "attention/attention_wmma.cuh"
#include "runtime/common.cuh"
#include "runtime/graph.h"

namespace engine {
namespace {

template <typename KernelT>
void set_smem(KernelT kernel, int bytes, const char* op) {
    if (bytes > 48 * 1024) check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), op);
}

template <typename T, int DP, bool PRECISE, bool DROPOUT>
void forward_typed(int device, void* o, float* lse, const void* q, const void* k, const void* v, AttnLayout lq,
                   AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T_, int S, int D, bool causal,
                   float scale, DropoutRule rule, uint64_t seed, uint64_t* key_out) {
    if constexpr (std::is_same_v<T, __nv_bfloat16> && !DROPOUT) {  // the fast paths: wgmma, then mma.sync
        if (attention_forward_wgmma(device, stream(device), o, lse, q, k, v, lq, lk, lv, lo, B, H, T_, S, D, causal,
                                    scale) ||
            attention_forward_mma(stream(device), o, lse, q, k, v, lq, lk, lv, lo, B, H, T_, S, D, causal, scale))
            return;
    }
    auto kernel = attention_forward_kernel<T, DP, PRECISE, DROPOUT>;
    int bytes = FwdSmem<T, DP>::bytes;
    set_smem(kernel, bytes, "attention");
    dim3 grid((unsigned)ceil_div(T_, BR), (unsigned)(B * H));
    const uint64_t* epoch = DROPOUT ? capture_rng_epoch(device) : nullptr;
    kernel<<<grid, kThreads, bytes, stream(device)>>>((T*)o, lse, (const T*)q, (const T*)k, (const T*)v, lq, lk, lv,
                                                      lo, H, T_, S, D, causal, scale, rule, seed, epoch, key_out);
}

template <typename T, int DP, bool PRECISE, bool DROPOUT>
void backward_typed(int device, void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                    const void* v, const void* o, const float* lse, AttnLayout lq, AttnLayout lk, AttnLayout lv,
                    AttnLayout lo, int B, int H, int T_, int S, int D, bool causal, float scale, DropoutRule rule,
                    const uint64_t* key, float* dbias) {
    cudaStream_t st = stream(device);
    int64_t rows = (int64_t)B * H * T_;
    std::size_t delta_block = 0, acc_block = 0, parts_block = 0;
    float* delta = (float*)device_alloc(sizeof(float) * std::max<int64_t>(rows, 1), device, &delta_block);
    float* dq_acc = (float*)device_alloc(sizeof(float) * std::max<int64_t>(rows * D, 1), device, &acc_block);
    // the bias gradient's partial column sums: dq's (qparts) and dout's (vparts), (B * T/16, H * D) each
    const int P = B * (T_ / 16), C = H * D;
    float* qparts = dbias ? (float*)device_alloc(sizeof(float) * 2 * P * C, device, &parts_block) : nullptr;
    float* vparts = dbias ? qparts + (int64_t)P * C : nullptr;
    const unsigned prep_blocks = (unsigned)ceil_div(rows, 16), prep_block = prep_threads(D);
    auto prep = dbias ? attention_backward_prep_kernel<T, true> : attention_backward_prep_kernel<T, false>;
    prep<<<prep_blocks, prep_block, 0, st>>>(delta, dq_acc, vparts, (const T*)dout, (const T*)o, lo, H, T_, D, rows);
    bool done = false;
    if constexpr (std::is_same_v<T, __nv_bfloat16> && !DROPOUT)  // the fast paths: wgmma, then mma.sync
        done = attention_backward_wgmma(device, st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H,
                                        T_, S, D, causal, scale) ||
               attention_backward_mma(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T_, S, D,
                                      causal, scale);
    if (!done) {
        auto kernel = attention_backward_kernel<T, DP, PRECISE, DROPOUT>;
        int bytes = BwdSmem<T, DP>::bytes;
        set_smem(kernel, bytes, "attention_backward");
        dim3 grid((unsigned)ceil_div(S, BC), (unsigned)(B * H));
        kernel<<<grid, kThreads, bytes, st>>>((T*)dk, (T*)dv, dq_acc, (const T*)dout, (const T*)q, (const T*)k,
                                              (const T*)v, lse, delta, lq, lk, lv, lo, H, T_, S, D, causal, scale,
                                              rule, key);
    }
    if (dbias) {
        attention_dq_bias_kernel<T>
            <<<prep_blocks, prep_block, 0, st>>>((T*)dq, qparts, dq_acc, lq, H, T_, D, scale, rows);
        attention_bias_grad_kernel<<<dim3((unsigned)ceil_div(C, 32), 3), dim3(32, 32), 0, st>>>(dbias, qparts, vparts,
                                                                                               P, C);
        device_free(qparts, parts_block, device);
    } else {
        attention_dq_kernel<T><<<blocks_for(rows * D / 8, 256), 256, 0, st>>>((T*)dq, dq_acc, lq, H, T_, D, scale,
                                                                             rows * D / 8);
    }
    device_free(delta, delta_block, device);
    device_free(dq_acc, acc_block, device);
}

void check_shape(const char* op, int dtype, int D, int T_, int S) {
    if (dtype != F32 && dtype != BF16) unsupported(op, dtype);
    if (D <= 0 || D > 128 || D % 8 != 0)
        throw std::runtime_error(std::string(op) + ": head dim " + std::to_string(D) +
                                 " is not supported by the fused kernel (needs D % 8 == 0 and D <= 128)");
    if (T_ < 0 || S < 0) throw std::runtime_error(std::string(op) + ": negative length");
}

// the fused kernels with dropout: bf16 and TF32 float32 only (the `precise` float32 variants would
// double the dropout instantiations; engine/backends/cuda/ sends that case to its unfused path)
void check_dropout(const char* op, float p, int dtype, bool precise, const void* key) {
    if (p <= 0.f) return;
    if (precise && dtype == F32)
        throw std::runtime_error(std::string(op) + ": dropout is not compiled for the precise float32 kernel "
                                 "(TF32 switched off); use the unfused path, or allow TF32, or bfloat16");
    if (key == nullptr) throw std::runtime_error(std::string(op) + ": dropout needs the rng key buffer (1 x uint64)");
}

}  // namespace

void attention_forward(int device, int dtype, void* o, float* lse, const void* q, const void* k, const void* v,
                       AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T_, int S, int D,
                       bool causal, float scale, bool precise, float dropout_p, uint64_t seed, uint64_t* rng_key) {
    check_shape("attention", dtype, D, T_, S);
    DropoutRule rule = dropout_rule("attention", dropout_p);
    check_dropout("attention", dropout_p, dtype, precise, rng_key);
    bool dropout = dropout_p > 0.f;
    if ((int64_t)B * H * T_ == 0) {
        if (dropout) attention_rng_key(device, rng_key, seed);  // the backward reads a defined key
        return;
    }
    use_device(device);
#define ENGINE_ATTN_FWD(TYPE, DPV, PREC, DROP)                                                            \
    forward_typed<TYPE, DPV, PREC, DROP>(device, o, lse, q, k, v, lq, lk, lv, lo, B, H, T_, S, D, causal, scale, \
                                         rule, seed, rng_key)
#define ENGINE_ATTN_FWD_D(TYPE, PREC, DROP)                    \
    if (D <= 32) ENGINE_ATTN_FWD(TYPE, 32, PREC, DROP);        \
    else if (D <= 64) ENGINE_ATTN_FWD(TYPE, 64, PREC, DROP);   \
    else ENGINE_ATTN_FWD(TYPE, 128, PREC, DROP);
    if (dtype == BF16) {
        if (dropout) {
            ENGINE_ATTN_FWD_D(__nv_bfloat16, false, true)
        } else {
            ENGINE_ATTN_FWD_D(__nv_bfloat16, false, false)
        }
    } else if (precise) {
        ENGINE_ATTN_FWD_D(float, true, false)
    } else if (dropout) {
        ENGINE_ATTN_FWD_D(float, false, true)
    } else {
        ENGINE_ATTN_FWD_D(float, false, false)
    }
#undef ENGINE_ATTN_FWD_D
#undef ENGINE_ATTN_FWD
    check_launch("attention");
}

void attention_backward(int device, int dtype, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const void* o, const float* lse, AttnLayout lq, AttnLayout lk,
                        AttnLayout lv, AttnLayout lo, int B, int H, int T_, int S, int D, bool causal, float scale,
                        bool precise, float dropout_p, const uint64_t* rng_key, float* dbias) {
    check_shape("attention_backward", dtype, D, T_, S);
    DropoutRule rule = dropout_rule("attention_backward", dropout_p);
    check_dropout("attention_backward", dropout_p, dtype, precise, rng_key);
    bool dropout = dropout_p > 0.f;
    if (dbias != nullptr && (dropout || T_ != S || T_ % 16 != 0))
        throw std::invalid_argument("attention_backward: the projection's bias gradient (dbias) needs self-attention "
                                    "(T == S) with T a multiple of 16 and no dropout; got T " + std::to_string(T_) +
                                    ", S " + std::to_string(S) + ", dropout_p " + std::to_string(dropout_p));
    use_device(device);
    if ((int64_t)B * H * S == 0 || (int64_t)B * H * T_ == 0)
        throw std::runtime_error("attention_backward: empty inputs are handled by the caller");
#define ENGINE_ATTN_BWD(TYPE, DPV, PREC, DROP)                                                                      \
    backward_typed<TYPE, DPV, PREC, DROP>(device, dq, dk, dv, dout, q, k, v, o, lse, lq, lk, lv, lo, B, H, T_, S, D, \
                                          causal, scale, rule, rng_key, dbias)
#define ENGINE_ATTN_BWD_D(TYPE, PREC, DROP)                    \
    if (D <= 32) ENGINE_ATTN_BWD(TYPE, 32, PREC, DROP);        \
    else if (D <= 64) ENGINE_ATTN_BWD(TYPE, 64, PREC, DROP);   \
    else ENGINE_ATTN_BWD(TYPE, 128, PREC, DROP);
    if (dtype == BF16) {
        if (dropout) {
            ENGINE_ATTN_BWD_D(__nv_bfloat16, false, true)
        } else {
            ENGINE_ATTN_BWD_D(__nv_bfloat16, false, false)
        }
    } else if (precise) {
        ENGINE_ATTN_BWD_D(float, true, false)
    } else if (dropout) {
        ENGINE_ATTN_BWD_D(float, false, true)
    } else {
        ENGINE_ATTN_BWD_D(float, false, false)
    }
#undef ENGINE_ATTN_BWD_D
#undef ENGINE_ATTN_BWD
    check_launch("attention_backward");
}

}  // namespace engine
