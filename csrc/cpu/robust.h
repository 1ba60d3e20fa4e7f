// cpu/: the CPU kernels of the coordinator's close (coop.robust), over one chunk of n coordinates
// of N contributions at a time. robust.cpp: the kernels; bind.cpp: the Python bindings (checks, and
// the GIL released for the whole computation). Plain C++: no pybind11 here.
#pragma once
#include <cstdint>

namespace engine {

// rows: N pointers to n float32 each; scales (N,) -> dots (N + 1,) float64, overwritten:
//   x_ij = rows[i][j] * scales[i] (float32), m_j = the median of x_0j .. x_(N-1)j (float32; even N:
//   0.5f * (a + b) of the two middle values), dots[i] = sum_j x_ij m_j, dots[N] = sum_j m_j^2 (float64).
// With coefficients (N,) and out (n,) (both or neither, nullptr for none): also
// weighted_sum(rows, N, n, coefficients, out) in the same pass over the rows.
void median_dots(const float* const* rows, int64_t N, int64_t n, const float* scales, double* dots,
                 const double* coefficients, float* out);

// rows: N pointers to n float32 each; coefficients (N,) -> out (n,):
//   out[j] = float32(sum_{i = 0 .. N-1} double(rows[i][j]) * coefficients[i]), summed from 0.0 in
//   that order in float64 and rounded once (the bits of coop.robust.weighted_sum's numpy fallback).
void weighted_sum(const float* const* rows, int64_t N, int64_t n, const double* coefficients, float* out);

}  // namespace engine
