// The attention backward's step on one query tile, on wgmma, for a warpgroup that owns 64 keys: the
// pieces that attention_wgmma.cu's cp.async kernel and attention_bwd_ws.cu's warp-specialised one
// share. Tiles are 64 keys x R queries (R = 8 N: 64, or 128 in attention_bwd_ws.cu's tiles of 128
// queries); Q, dO, K and V sit in shared memory as panels of W columns (softmax_wgmma.cuh's Panels),
// described by wgmma::desc, a query tile's panel R x 128 bytes.
#pragma once
#include <cstdint>

#include "attention/attention_tiles.cuh"
#include "attention/softmax_wgmma.cuh"
#include "attention/wgmma.cuh"

namespace engine {
namespace attn {

// dP^T's accumulator set to -delta (each column its query's: fragment j's columns j * 8 + 2 t, + 1),
// so that V dO^T added onto it (issue_scores_t's DeltaFirst) leaves dP^T - delta, and dS^T needs no
// load of delta after the product
template <int N>
__device__ __forceinline__ void minus_delta(float (&dpt)[N][4], const float* deltas, int t) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const float2 d = *reinterpret_cast<const float2*>(deltas + j * 8 + 2 * t);
        dpt[j][0] = dpt[j][2] = -d.x;
        dpt[j][1] = dpt[j][3] = -d.y;
    }
}

// S^T = K Q^T and dP^T = V dO^T (64 keys x 8 N queries each), issued and committed as one group, or
// (Apart) as two, S^T's first, so that a wait for one group leaves dP^T's product running. With
// DeltaFirst dP^T's accumulator is set to -delta (minus_delta) first: before the first product is
// issued, as ptxas would otherwise make S^T's product finish before dP^T's starts (a register an
// issued product's group may still use, written: it injects a wait).
template <int P, int W, int N, bool Apart = false, bool DeltaFirst = false>
__device__ __forceinline__ void issue_scores_t(float (&st)[N][4], float (&dpt)[N][4], const uint64_t (&desc_k)[P],
                                               const uint64_t (&desc_q)[P], const uint64_t (&desc_v)[P],
                                               const uint64_t (&desc_do)[P], const float* deltas = nullptr,
                                               int t = 0) {
    if constexpr (DeltaFirst) {
        minus_delta(dpt, deltas, t);
        wgmma::hold(dpt);  // written here, not moved past the fence
    }
    wgmma::fence();
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) wgmma::mma_ss(st, desc_k[p] + 2 * kk, desc_q[p] + 2 * kk, p > 0 || kk > 0);
    if constexpr (Apart) wgmma::commit();
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk)
            wgmma::mma_ss(dpt, desc_v[p] + 2 * kk, desc_do[p] + 2 * kk, DeltaFirst || p > 0 || kk > 0);
    wgmma::commit();
}

// P^T = 2^(S^T scale2 - lse2) and dS^T = P^T (dP^T - delta), as bf16 A-fragments (pa, dsa), and dS^T
// also stored swizzled (keys, queries) at sdS for dQ's product, as N / 8 tiles of (64 keys, 64
// queries) 8 KB apart. lse2 and delta are the tile's 8 N queries' (log2-domain lse: +inf past Tq, so
// P = 0 there); keys key[0], key[1] are this lane's rows. A tile wholly inside the visible region
// (Full) skips the mask; score_grads_t picks the version.
//
// Fragment j of P^T (this lane's keys key[0], key[1]; queries i0 + 8 j + 2 t, + 1) from S^T's
template <bool Full>
__device__ __forceinline__ void probs_frag(float (&p)[4], const float (&s)[4], const float* lse2s, int i0, int j,
                                           const int (&key)[2], int S, bool causal, int off, float scale2, int t) {
    const float2 lse2 = *reinterpret_cast<const float2*>(lse2s + j * 8 + 2 * t);  // columns j * 8 + 2 t, + 1
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        p[e] = ex2(fmaf(s[e], scale2, -(e & 1 ? lse2.y : lse2.x)));
        if constexpr (!Full) {
            const int qi = i0 + j * 8 + 2 * t + (e & 1), kr = key[e >> 1];
            if (kr >= S || (causal && kr > qi + off)) p[e] = 0.f;
        }
    }
}
// fragment j of dS^T (ds) -> its bf16 A-fragment half in dsa and the swizzled tiles at sdS
template <int K>
__device__ __forceinline__ void put_dscores_frag(uint32_t (&dsa)[K][4], const float (&ds)[4], int j, int warp, int g,
                                                 int t, unsigned char* sdS) {
    dsa[j >> 1][(j & 1) * 2] = pack_bf16(ds[0], ds[1]);
    dsa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
    // rows r0 and r0 + 8 of dS^T; columns j * 8 + 2 t, + 1: chunk j % 8 of the tile of 64 queries j / 8
    const int r0 = warp * 16 + g;
    unsigned char* const tile = sdS + (j >> 3) * (64 * 128);
    *reinterpret_cast<uint32_t*>(tile + wgmma::swizzled(r0, j & 7) + 4 * t) = dsa[j >> 1][(j & 1) * 2];
    *reinterpret_cast<uint32_t*>(tile + wgmma::swizzled(r0 + 8, j & 7) + 4 * t) = dsa[j >> 1][(j & 1) * 2 + 1];
}
// fragment j of dS^T = P^T (dP^T - delta), delta the queries' (columns j * 8 + 2 t, + 1)
template <int K>
__device__ __forceinline__ void dscores_frag(uint32_t (&dsa)[K][4], const float (&p)[4], const float (&dp)[4],
                                             const float* deltas, int j, int warp, int g, int t, unsigned char* sdS) {
    const float2 delta2 = *reinterpret_cast<const float2*>(deltas + j * 8 + 2 * t);
    float ds[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[e] = p[e] * (dp[e] - (e & 1 ? delta2.y : delta2.x));
    put_dscores_frag(dsa, ds, j, warp, g, t, sdS);
}

template <bool Full, int N>
__device__ __forceinline__ void score_grads_t(const float (&st)[N][4], const float (&dpt)[N][4], const float* lse2s,
                                              const float* deltas, int i0, const int (&key)[2], int S, bool causal,
                                              int off, float scale2, int warp, int g, int t, unsigned char* sdS,
                                              uint32_t (&pa)[N / 2][4], uint32_t (&dsa)[N / 2][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float p[4];
        probs_frag<Full>(p, st[j], lse2s, i0, j, key, S, causal, off, scale2, t);
        pa[j >> 1][(j & 1) * 2] = pack_bf16(p[0], p[1]);
        pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
        dscores_frag(dsa, p, dpt[j], deltas, j, warp, g, t, sdS);
    }
}

// The same step in two halves, so that P^T can be computed while dP^T's product runs (FlashAttention-3's
// order): P^T in place of S^T (float32, for dS^T) and as bf16 A-fragments pa ...
template <int N>
__device__ __forceinline__ void probs_t(float (&st)[N][4], const float* lse2s, bool full, int i0, const int (&key)[2],
                                        int S, bool causal, int off, float scale2, int t, uint32_t (&pa)[N / 2][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float p[4];
        if (full) probs_frag<true>(p, st[j], lse2s, i0, j, key, S, causal, off, scale2, t);
        else probs_frag<false>(p, st[j], lse2s, i0, j, key, S, causal, off, scale2, t);
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = p[e];
    }
    to_a_frags(pa, st);
}
// ... then dS^T = P^T (dP^T - delta) from P^T (pt) and dP^T - delta (dpt_delta: its accumulator began at
// -delta, issue_scores_t's DeltaFirst), as bf16 A-fragments dsa and stored at sdS
template <int N>
__device__ __forceinline__ void dscores_t(const float (&pt)[N][4], const float (&dpt_delta)[N][4], int warp, int g,
                                          int t, unsigned char* sdS, uint32_t (&dsa)[N / 2][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[e] = pt[j][e] * dpt_delta[j][e];
        put_dscores_frag(dsa, ds, j, warp, g, t, sdS);
    }
}

template <int N>
__device__ __forceinline__ void score_grads_t(const float (&st)[N][4], const float (&dpt)[N][4], const float* lse2s,
                                              const float* deltas, bool full, int i0, const int (&key)[2], int S,
                                              bool causal, int off, float scale2, int warp, int g, int t,
                                              unsigned char* sdS, uint32_t (&pa)[N / 2][4], uint32_t (&dsa)[N / 2][4]) {
    if (full)
        score_grads_t<true, N>(st, dpt, lse2s, deltas, i0, key, S, causal, off, scale2, warp, g, t, sdS, pa, dsa);
    else
        score_grads_t<false, N>(st, dpt, lse2s, deltas, i0, key, S, causal, off, scale2, warp, g, t, sdS, pa, dsa);
}

// acc (64 keys x D) += A^T B over a tile of 16 K queries: A^T (keys x queries) in bf16 A-fragments a,
// B (queries x D) an N-major tile in panels at desc_b, k-steps of 16 queries; issued, not committed
template <int P, int W, int D, int K>
__device__ __forceinline__ void mma_key_grad(float (&acc)[D / 8][4], const uint32_t (&a)[K][4],
                                             const uint64_t (&desc_b)[P]) {
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int kk = 0; kk < K; ++kk) wgmma::mma_rs_n_major(wgmma::columns<W>(acc, p * W), a[kk], desc_b[p] + 128 * kk);
}

// dV += P^T dO and dK += dS^T Q (64 keys x D; the scale is applied at the end), issued and committed
// as one group
template <int P, int W, int D, int K>
__device__ __forceinline__ void issue_key_grads(float (&dv_acc)[D / 8][4], float (&dk_acc)[D / 8][4],
                                                const uint32_t (&pa)[K][4], const uint32_t (&dsa)[K][4],
                                                const uint64_t (&desc_do)[P], const uint64_t (&desc_q)[P]) {
    wgmma::fence();
    mma_key_grad<P, W, D>(dv_acc, pa, desc_do);
    mma_key_grad<P, W, D>(dk_acc, dsa, desc_q);
    wgmma::commit();
}
// one of them (dV or dK) as a group of its own
template <int P, int W, int D, int K>
__device__ __forceinline__ void issue_key_grad(float (&acc)[D / 8][4], const uint32_t (&a)[K][4],
                                               const uint64_t (&desc_b)[P]) {
    wgmma::fence();
    mma_key_grad<P, W, D>(acc, a, desc_b);
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
