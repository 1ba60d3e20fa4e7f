// Pieces of the wgmma attention kernels (attention_wgmma.cu, attention_fwd_ws.cu): a head dim's
// panels of swizzled shared-memory tiles, and the forward's score product and online softmax on wgmma
// accumulators.
#pragma once
#include <cmath>
#include <cstdint>

#include "attention/wgmma.cuh"

namespace engine {
namespace attn {

// a head dim's panels: P of W columns, each row of a panel 128 bytes (wgmma.cuh's swizzle atom)
template <int D>
struct Panels {
    static_assert(D == 32 || D == 64 || D == 128, "the wgmma kernels take head dims 32, 64 and 128");
    static constexpr int P = D > 64 ? D / 64 : 1, W = D < 64 ? D : 64;
    static constexpr uint32_t tile_bytes(int rows) { return (uint32_t)rows * 128 * P; }  // an (rows, D) tile
};
// 2^x on the SFU (ex2.approx.ftz: flushes denormal results to 0, which the softmax never needs)
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// S (64 x BN) = Q_wg K^T for a warpgroup's 64 queries: desc_q[p] describes panel p of its Q rows,
// sK the key tile (BN rows, panels of BN x 128 bytes); issued and committed as one group
template <int P, int W, int BN, int Rows = BN>
__device__ __forceinline__ void issue_scores(float (&s)[BN / 8][4], const uint64_t (&desc_q)[P], uint32_t sK) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const uint64_t desc_k = wgmma::desc(sK + p * (Rows * 128));
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) wgmma::mma_ss(s, desc_q[p] + 2 * kk, desc_k + 2 * kk, p > 0 || kk > 0);
    }
    wgmma::commit();
}

// O_wg (64 x D) += P (64 x BN, bf16 A-fragments pa) V (the first BN rows x D at sV, panels of Rows x 128
// bytes, N-major), k-steps of 16 keys (2048 bytes); committed as one group, with whatever was issued
// since the fence
template <int P, int W, int BN, int D, int Rows = BN>
__device__ __forceinline__ void issue_pv(float (&acc)[D / 8][4], const uint32_t (&pa)[BN / 16][4], uint32_t sV) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const uint64_t desc_v = wgmma::desc(sV + p * (Rows * 128));
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma::mma_rs_n_major(wgmma::columns<W>(acc, p * W), pa[kk], desc_v + 128 * kk);
    }
    wgmma::commit();
}

// the output's rows g and g + 8 so far, rescaled by alpha to the current tile's max
template <int N>
__device__ __forceinline__ void rescale_rows(float (&acc)[N][4], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        acc[j][0] *= alpha[0];
        acc[j][1] *= alpha[0];
        acc[j][2] *= alpha[1];
        acc[j][3] *= alpha[1];
    }
}

// Scores outside the mask -> -inf: keys >= S and, if causal, keys after the query (aligned bottom-
// right: key <= query + off). Fragment layout: s[j][e] is (row[e / 2], key k0 + 8 j + 2 t + e % 2).
// Both bounds are one: a row's keys from min(S, query + off + 1) on are hidden, so each element
// compares its constant column offset within the lane (8 j + e % 2) with the row's bound.
template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N][4], int k0, int S, bool causal, const int (&row)[2], int off,
                                            int t) {
    int hidden[2];  // the row's first hidden key, counted from this lane's first column
#pragma unroll
    for (int r = 0; r < 2; ++r) hidden[r] = (causal ? min(S, row[r] + off + 1) : S) - (k0 + 2 * t);
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (j * 8 + (e & 1) >= hidden[e >> 1]) s[j][e] = -INFINITY;
}

// One tile's step of the online softmax in the log2 domain, on S (64 x BN) in registers: mask (unless
// `full`), update the running max m (scaled) and sum l of rows g and g + 8, and leave
// P = 2^(S scale2 - m) in s. Returns in alpha the factor that rescales the rows of the output so far.
template <int N>
__device__ __forceinline__ void softmax_step(float (&s)[N][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             bool full, int k0, int S, bool causal, const int (&row)[2], int off,
                                             int t, float scale2) {
    if (!full) mask_scores(s, k0, S, causal, row, off, t);
    float mx[2] = {-INFINITY, -INFINITY}, m_use[2];
#pragma unroll
    for (int j = 0; j < N; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // each row's columns are spread over the 4 lanes of a quad
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r] * scale2);
        m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with no visible key yet: every p is 0
        alpha[r] = ex2(m[r] - m_use[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = ex2(fmaf(s[j][e], scale2, -m_use[e >> 1]));
            l[e >> 1] += s[j][e];  // this lane's share of the row sum; the quad is summed at the end
        }
}

}  // namespace attn
}  // namespace engine
