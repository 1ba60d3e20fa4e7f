// fp8/: casts to FP8 (E4M3, E5M2) with per-tensor delayed scaling, the operands of the FP8 GEMMs
// (matmul/matmul.h's matmul_fp8). bind.cpp: the Python bindings.
//
// A tensor's scaling state is its meta, 20 float32 words on the device (engine/backends/cuda/fp8.py
// makes them; the CPU backend's fp8.py is the same algorithm in numpy, the tests' reference):
//   [0]  scale: what the next cast multiplies by, fp8_max / max(amax history); 1 at first
//   [1]  the amax of the cast in flight (float bits, atomicMax), 0 between casts
//   [2]  the cast's finished-block counter, 0 between casts
//   [3]  unused
//   [4..19] the amax of the last 16 casts, newest first
// A cast reads the scale, writes q = fp8(x * scale) (round to nearest even, saturating at +-max; NaN
// stays NaN) and, from its last block, the inverse scale it used (`inv_scale`, one float32: the
// GEMM's dequantisation factor), then pushes its amax into the history and sets the next scale. No
// host synchronisation: a captured CUDA graph replays it as it is. With `current`, a first pass
// measures this tensor's amax and the cast scales by it (the first cast of a fresh meta).
#pragma once
#include <cstdint>

namespace engine {

enum Fp8Format { FP8_E4M3 = 0, FP8_E5M2 = 1 };
constexpr int kFp8MetaWords = 20;

// out (n,) uint8 = fp8(in (n,) * scale), in F32 or BF16; with out_t, in is (rows, cols) and out_t
// (cols, rows) gets the transpose too (both K-major copies of a weight); inv_scale (1,) float32
void fp8_cast(int device, int dtype, int format, void* out, void* out_t, float* inv_scale, float* meta, const void* in,
              int64_t rows, int64_t cols, bool current);

}  // namespace engine
