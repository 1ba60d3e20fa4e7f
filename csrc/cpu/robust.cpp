// The CPU kernels of the coordinator's close (coop.robust, coop.diloco's filtered_mean): the
// coordinate-wise median of N clipped contributions, each one's dot product with it, and their
// weighted sum, over one chunk of n coordinates.
//
//   median_dots   rows N x (n,) float32, scales (N,) float32 -> dots (N + 1,) float64
//                 x_ij = rows[i][j] * scales[i]          (float32: numpy's `stack *= scales[:, None]`)
//                 m_j  = median_i x_ij                   (float32; even N: 0.5f * (a + b), the middle two)
//                 dots[i] = sum_j x_ij m_j, dots[N] = sum_j m_j m_j   (float64)
//                 optionally, in the same pass, the weighted sum below (the mean when nobody is left out)
//   weighted_sum  rows N x (n,) float32, coefficients (N,) float64 -> out (n,) float32
//                 out[j] = float32(sum_{i = 0 .. N-1} double(rows[i][j]) * coefficients[i])
//
// Why native: in numpy each chunk costs 60-90 small calls (row copies, a min/max network, einsums)
// and the pool's threads serialise on the GIL, so 16 cores closed a round no faster than 2. These
// run with the GIL released (bind.cpp), one chunk per thread of coop.threads' pool.
//
// How: the chunk is walked in blocks of kBlock coordinates (fewer for a large N). A block's N scaled
// values are copied into a tile (N, block) that stays in L1, and for N <= kNetworkMax sorted by a
// fixed network of compare-exchanges (Batcher's odd-even merge sort, cut to what the middle outputs
// depend on; 17 for N = 8), each one an elementwise min / max over two of the tile's rows: loops the
// compiler turns into SIMD minps / maxps. Larger N take std::nth_element per coordinate. The dots'
// float64 sums are kLanes partial sums per row (so the loop vectorises with no reassociation),
// folded at the end of the chunk; the weighted sum holds kLanes coordinates' sums in registers while
// kRowGroup rows go by. Plain SSE2, the x86-64 baseline (no -march: the module must run on any
// x86-64; AVX2 clones of these loops through target_clones measured no faster on an EPYC).
//
// weighted_sum's bits are numpy's: `acc = zeros(float64); acc += row * c` for each row in order,
// then `out[...] = acc` (coop.robust.weighted_sum's fallback; tests/coop/test_robust_native.py
// checks equality). CMakeLists.txt compiles this file with -ffp-contract=off so that no multiply
// and add are ever fused into one rounding.
#include "cpu/robust.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace engine {
namespace {

constexpr int64_t kBlock = 256;          // coordinates per block (fewer for a large N: kTileFloats)
constexpr int64_t kTileFloats = 8192;    // the tile (N, block) float32 stays within 32 KB, in L1
constexpr int kNetworkMax = 256;         // up to this N a sorting network, past it std::nth_element (the
                                         // network measured 2.5x (N = 200) to 7x (N = 20) faster)
constexpr int kLanes = 8;                // float64 partial sums held in registers (four SSE2 ones)
constexpr int kRowGroup = 8;             // rows summed at a time by the weighted sum

using Network = std::vector<std::pair<int, int>>;  // compare-exchanges (a < b): min to a, max to b

// Batcher's odd-even merge sort for the next power of two >= N, less the compare-exchanges that
// touch a line >= N (those lines hold +inf: such a compare-exchange changes nothing), less those
// the middle outputs (N / 2 and, for even N, N / 2 - 1) do not depend on.
Network median_network(int N) {
    int P = 1;
    while (P < N) P <<= 1;
    Network all;
    for (int p = 1; p < P; p <<= 1)
        for (int k = p; k >= 1; k >>= 1)
            for (int j = k % p; j + k < P; j += 2 * k)
                for (int i = 0; i < std::min(k, P - j - k); ++i)
                    if ((i + j) / (2 * p) == (i + j + k) / (2 * p) && i + j + k < N) all.emplace_back(i + j, i + j + k);
    std::vector<bool> needed(N, false);
    needed[N / 2] = true;
    needed[(N - 1) / 2] = true;
    Network kept;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {  // backwards from the outputs
        if (needed[it->first] || needed[it->second]) {
            needed[it->first] = needed[it->second] = true;
            kept.push_back(*it);
        }
    }
    std::reverse(kept.begin(), kept.end());
    return kept;
}

// (a[k], b[k]) <- (min, max) for k < len: SIMD minps / maxps (std::min / max are exactly their rule)
void compare_exchange(float* __restrict a, float* __restrict b, int64_t len) {
    for (int64_t k = 0; k < len; ++k) {
        const float x = a[k], y = b[k];
        a[k] = std::min(x, y);
        b[k] = std::max(x, y);
    }
}

// tile (N, block): row i, coordinates [0, len) -> median (len,), the tile's rows reordered
void tile_median(float* tile, int N, int64_t block, int64_t len, const Network& network, std::vector<float>& column,
                 float* median) {
    const int lo = (N - 1) / 2, hi = N / 2;
    if (N <= kNetworkMax) {
        for (const auto& [a, b] : network) compare_exchange(tile + a * block, tile + b * block, len);
        const float* __restrict rlo = tile + lo * block;
        const float* __restrict rhi = tile + hi * block;
        for (int64_t k = 0; k < len; ++k) median[k] = lo == hi ? rhi[k] : 0.5f * (rlo[k] + rhi[k]);
        return;
    }
    for (int64_t k = 0; k < len; ++k) {
        for (int i = 0; i < N; ++i) column[i] = tile[i * block + k];
        std::nth_element(column.begin(), column.begin() + hi, column.end());
        const float upper = column[hi];
        // even N: the lower middle one is the largest of those nth_element put before it
        median[k] = lo == hi ? upper : 0.5f * (*std::max_element(column.begin(), column.begin() + hi) + upper);
    }
}

// out[start + k] = float32(sum_i double(rows[i][start + k]) * coefficients[i]), from 0.0, i = 0 .. N-1 in
// order, for k < len (<= kBlock). kRowGroup rows at a time go by kLanes coordinates' sums held in
// registers (sum: the block's sums between groups): few streams of memory at once, whatever N.
void weighted_sum_block(const float* const* rows, int N, int64_t start, int64_t len, const double* coefficients,
                        double* __restrict sum, float* __restrict out) {
    for (int64_t k = 0; k < len; ++k) sum[k] = 0.0;
    for (int first = 0; first < N; first += kRowGroup) {
        const int last = std::min(N, first + kRowGroup);
        int64_t k = 0;
        for (; k + kLanes <= len; k += kLanes) {
            double part[kLanes];
            for (int l = 0; l < kLanes; ++l) part[l] = sum[k + l];
            for (int i = first; i < last; ++i) {
                const float* __restrict row = rows[i] + start + k;
                const double c = coefficients[i];
                for (int l = 0; l < kLanes; ++l) part[l] += static_cast<double>(row[l]) * c;
            }
            for (int l = 0; l < kLanes; ++l) sum[k + l] = part[l];
        }
        for (; k < len; ++k)
            for (int i = first; i < last; ++i) sum[k] += static_cast<double>(rows[i][start + k]) * coefficients[i];
    }
    for (int64_t k = 0; k < len; ++k) out[start + k] = static_cast<float>(sum[k]);
}

// lanes[l] += double(row[k] * scale) * median[k] for k = l, l + kLanes, ... < len (kLanes partial sums,
// so that the loop vectorises with no reassociation; scale 1 and row = median for m . m)
void dot_block(const float* __restrict row, float scale, const double* __restrict median, int64_t len,
               double* __restrict lanes) {
    double part[kLanes];
    for (int l = 0; l < kLanes; ++l) part[l] = lanes[l];
    int64_t k = 0;
    for (; k + kLanes <= len; k += kLanes)
        for (int l = 0; l < kLanes; ++l) part[l] += static_cast<double>(row[k + l] * scale) * median[k + l];
    for (; k < len; ++k) part[0] += static_cast<double>(row[k] * scale) * median[k];
    for (int l = 0; l < kLanes; ++l) lanes[l] = part[l];
}

}  // namespace

void median_dots(const float* const* rows, int64_t N64, int64_t n, const float* scales, double* dots,
                 const double* coefficients, float* out) {
    const int N = static_cast<int>(N64);
    const Network network = N <= kNetworkMax ? median_network(N) : Network{};
    const int64_t block = std::max<int64_t>(kLanes, std::min(kBlock, kTileFloats / N / kLanes * kLanes));
    std::vector<float> tile(N * block), median(block), column(N);
    std::vector<double> median64(block), sum(block);
    std::vector<double> lanes((N + 1) * kLanes, 0.0);  // (N + 1, kLanes): the float64 partial sums
    for (int64_t start = 0; start < n; start += block) {
        const int64_t len = std::min(block, n - start);
        for (int i = 0; i < N; ++i) {
            const float* __restrict row = rows[i] + start;
            float* __restrict x = tile.data() + i * block;
            const float s = scales[i];
            for (int64_t k = 0; k < len; ++k) x[k] = row[k] * s;
        }
        tile_median(tile.data(), N, block, len, network, column, median.data());
        for (int64_t k = 0; k < len; ++k) median64[k] = median[k];
        for (int i = 0; i < N; ++i)  // the scaled values again (the tile is sorted now), from L1
            dot_block(rows[i] + start, scales[i], median64.data(), len, lanes.data() + i * kLanes);
        dot_block(median.data(), 1.0f, median64.data(), len, lanes.data() + N * kLanes);
        if (coefficients != nullptr) weighted_sum_block(rows, N, start, len, coefficients, sum.data(), out);
    }
    for (int i = 0; i <= N; ++i) {
        double total = 0.0;
        for (int l = 0; l < kLanes; ++l) total += lanes[i * kLanes + l];
        dots[i] = total;
    }
}

void weighted_sum(const float* const* rows, int64_t N, int64_t n, const double* coefficients, float* out) {
    std::vector<double> sum(kBlock);
    for (int64_t start = 0; start < n; start += kBlock)
        weighted_sum_block(rows, static_cast<int>(N), start, std::min(kBlock, n - start), coefficients, sum.data(), out);
}

}  // namespace engine
