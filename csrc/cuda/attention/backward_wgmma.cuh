// The attention backward's step on one query tile, on wgmma, for a warpgroup that owns 64 keys: the
// pieces that attention_wgmma.cu's cp.async kernel and attention_bwd_ws.cu's warp-specialised one
// share. Tiles are 64 keys x 64 queries; Q, dO, K and V sit in shared memory as panels of W columns
// (softmax_wgmma.cuh's Panels), described by wgmma::desc.
#pragma once
#include <cstdint>

#include "attention/attention_tiles.cuh"
#include "attention/softmax_wgmma.cuh"
#include "attention/wgmma.cuh"

namespace engine {
namespace attn {

// S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries each), issued and committed as one group
template <int P, int W>
__device__ __forceinline__ void issue_scores_t(float (&st)[8][4], float (&dpt)[8][4], const uint64_t (&desc_k)[P],
                                               const uint64_t (&desc_q)[P], const uint64_t (&desc_v)[P],
                                               const uint64_t (&desc_do)[P]) {
    wgmma::fence();
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) wgmma::mma_ss(st, desc_k[p] + 2 * kk, desc_q[p] + 2 * kk, p > 0 || kk > 0);
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) wgmma::mma_ss(dpt, desc_v[p] + 2 * kk, desc_do[p] + 2 * kk, p > 0 || kk > 0);
    wgmma::commit();
}

// P^T = 2^(S^T scale2 - lse2) and dS^T = P^T (dP^T - delta), as bf16 A-fragments (pa, dsa), and dS^T
// also stored swizzled (keys, queries) at sdS for dQ's product. lse2 and delta are the tile's 64
// queries' (log2-domain lse: +inf past Tq, so P = 0 there); keys key[0], key[1] are this lane's rows.
// A tile wholly inside the visible region (Full) skips the mask; score_grads_t picks the version.
template <bool Full>
__device__ __forceinline__ void score_grads_t(const float (&st)[8][4], const float (&dpt)[8][4], const float* lse2s,
                                              const float* deltas, int i0, const int (&key)[2], int S, bool causal,
                                              int off, float scale2, int warp, int g, int t, unsigned char* sdS,
                                              uint32_t (&pa)[4][4], uint32_t (&dsa)[4][4]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float2 lse2 = *reinterpret_cast<const float2*>(lse2s + j * 8 + 2 * t);  // columns j * 8 + 2 t, + 1
        const float2 delta2 = *reinterpret_cast<const float2*>(deltas + j * 8 + 2 * t);
        float p[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            p[e] = ex2(fmaf(st[j][e], scale2, -(e & 1 ? lse2.y : lse2.x)));
            if constexpr (!Full) {
                const int qi = i0 + j * 8 + 2 * t + (e & 1), kr = key[e >> 1];
                if (kr >= S || (causal && kr > qi + off)) p[e] = 0.f;
            }
            ds[e] = p[e] * (dpt[j][e] - (e & 1 ? delta2.y : delta2.x));
        }
        pa[j >> 1][(j & 1) * 2] = pack_bf16(p[0], p[1]);
        pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
        dsa[j >> 1][(j & 1) * 2] = pack_bf16(ds[0], ds[1]);
        dsa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
        const int r0 = warp * 16 + g;  // rows r0 and r0 + 8 of dS^T; columns j * 8 + 2 t, + 1
        *reinterpret_cast<uint32_t*>(sdS + wgmma::swizzled(r0, j) + 4 * t) = dsa[j >> 1][(j & 1) * 2];
        *reinterpret_cast<uint32_t*>(sdS + wgmma::swizzled(r0 + 8, j) + 4 * t) = dsa[j >> 1][(j & 1) * 2 + 1];
    }
}

__device__ __forceinline__ void score_grads_t(const float (&st)[8][4], const float (&dpt)[8][4], const float* lse2s,
                                              const float* deltas, bool full, int i0, const int (&key)[2], int S,
                                              bool causal, int off, float scale2, int warp, int g, int t,
                                              unsigned char* sdS, uint32_t (&pa)[4][4], uint32_t (&dsa)[4][4]) {
    if (full)
        score_grads_t<true>(st, dpt, lse2s, deltas, i0, key, S, causal, off, scale2, warp, g, t, sdS, pa, dsa);
    else
        score_grads_t<false>(st, dpt, lse2s, deltas, i0, key, S, causal, off, scale2, warp, g, t, sdS, pa, dsa);
}

// dV += P^T dO and dK += dS^T Q (64 keys x D; the scale is applied at the end), k-steps of 16
// queries, issued and committed as one group
template <int P, int W, int D>
__device__ __forceinline__ void issue_key_grads(float (&dv_acc)[D / 8][4], float (&dk_acc)[D / 8][4],
                                                const uint32_t (&pa)[4][4], const uint32_t (&dsa)[4][4],
                                                const uint64_t (&desc_do)[P], const uint64_t (&desc_q)[P]) {
    wgmma::fence();
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma::mma_rs_n_major(wgmma::columns<W>(dv_acc, p * W), pa[kk], desc_do[p] + 128 * kk);
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma::mma_rs_n_major(wgmma::columns<W>(dk_acc, p * W), dsa[kk], desc_q[p] + 128 * kk);
    wgmma::commit();
}

// One panel of dQ (64 queries x W) = dS (queries x 64 N keys) K (64 N keys x W): N blocks of 64 keys,
// block n's dS read M-major out of its dS^T at desc_ds[n] and its K rows N-major at desc_k[n] (the
// panel's columns), k-steps of 16 keys, issued and committed as one group
template <int W, int N = 1>
__device__ __forceinline__ void issue_dq_panel(float (&dq)[W / 8][4], const uint64_t (&desc_ds)[N],
                                               const uint64_t (&desc_k)[N]) {
    wgmma::fence();
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma::mma_ss<1, 1>(dq, desc_ds[n] + 128 * kk, desc_k[n] + 128 * kk, n > 0 || kk > 0);
    wgmma::commit();
}
template <int W>
__device__ __forceinline__ void issue_dq_panel(float (&dq)[W / 8][4], uint64_t desc_ds, uint64_t desc_k) {
    issue_dq_panel<W, 1>(dq, {desc_ds}, {desc_k});
}

}  // namespace attn
}  // namespace engine
