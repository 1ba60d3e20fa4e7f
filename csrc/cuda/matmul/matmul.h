// matmul/: the GEMMs, through cuBLASLt (matmul.cpp: plain, batched, and with the Linear layer's
// epilogues), and the Linear layer's bias gradient where no epilogue gives it (bias_grad.cu). bind.cpp:
// the Python bindings. Launchers take device pointers, sizes and the device index; work is queued on
// the device's one stream and never waited for.
#pragma once
#include <cstdint>

#include "runtime/types.h"

namespace engine {

// matmul.cpp (cuBLASLt): C (batch, M, N) = op(A) (batch, M, K) @ op(B) (batch, K, N), row-major,
// batch strides in elements (0 broadcasts). A and B are `dtype`; C is out_dtype: -1 for dtype, or F32
// with BF16 operands (float32 accumulation written as float32).
void matmul(int device, int dtype, void* c, const void* a, const void* b, int64_t batch, int64_t M, int64_t N,
            int64_t K, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b, int64_t stride_c,
            int out_dtype = -1);
// The same GEMM (no batch) with an epilogue of the Linear layer (matmul.cpp's header says what each
// does): c (M, N); bias (N,) for BIAS / GELU_BIAS, (M,) written for BGRAD; aux (M, N) written for
// GELU_BIAS / GELU, read for DGELU (the GELU's input); out_dtype as for matmul, and the bias of it.
// Returns false, doing nothing, where cuBLASLt offers no algorithm for it.
enum MatmulEpilogue { EPI_NONE = 0, EPI_BIAS = 1, EPI_GELU_BIAS = 2, EPI_BGRAD = 3, EPI_GELU = 4, EPI_DGELU = 5 };
bool matmul_epilogue(int device, int dtype, int epilogue, void* c, const void* a, const void* b, int64_t M, int64_t N,
                     int64_t K, bool trans_a, bool trans_b, void* bias, void* aux, int out_dtype = -1);
// FP8 (Hopper and later): c (M, N) bf16 = (a (M, K) * a_inv_scale) @ (b (N, K) * b_inv_scale)^T with an
// epilogue (NONE, BIAS, GELU_BIAS, GELU; bias (N,) and aux (M, N) bf16); a and b uint8 FP8 codes of
// their formats (fp8/fp8.h: 0 E4M3, 1 E5M2; not both E5M2), both K-major, their inverse scales one
// float32 each on the device (what fp8_cast wrote). fast_accum: cuBLASLt's faster, less exact
// accumulation (the forward's choice; gradients take the exact one). False, doing nothing, where
// cuBLASLt offers no algorithm (another GPU, another shape): the caller runs the GEMM in bf16.
// out_dtype -1 (bf16) or F32 (with no epilogue: the weight gradient of a float32 master weight).
bool matmul_fp8(int device, int epilogue, void* c, const void* a, const void* b, int a_format, int b_format,
                const float* a_inv_scale, const float* b_inv_scale, int64_t M, int64_t N, int64_t K, void* bias,
                void* aux, bool fast_accum, int out_dtype = -1);
void set_allow_tf32(bool allow);
bool allow_tf32();

// bias_grad.cu: the Linear bias gradient db (O,) = column sums of g (N, O), dtype F32 or BF16 (dpre,
// pre of the same dtype; float32 sums); db of db_dtype: -1 for dtype, or F32. With pre: the GELU
// backward first, dpre = gelu'(pre) * g written out, and db its column sums. False (nothing launched)
// unless O is a multiple of 16 bytes of the dtype and the pointers are 16-byte aligned. With d8 (bf16
// only): the E5M2 codes (N, O) of d (dpre with pre, else g) too, scaled as a delayed-scaling cast with
// `meta` (fp8/fp8.h) would, its inverse scale written to inv_scale; with d8_t also their transpose
// (O, N) (N a multiple of 16), and dpre may then be null (not written).
bool linear_bias_grad(int device, int dtype, void* db, void* dpre, const void* g, const void* pre, int64_t N,
                      int64_t O, int db_dtype = -1, void* d8 = nullptr, float* inv_scale = nullptr,
                      float* meta = nullptr, void* d8_t = nullptr);

}  // namespace engine
