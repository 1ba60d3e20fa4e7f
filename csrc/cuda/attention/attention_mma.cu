// bf16 fused attention on mma.sync (m16n8k16) with register-resident tiles, flash-attention-2 style:
// the fast path of attention.cu for bf16 without dropout.
//
// attention_wmma.cuh's WMMA kernels round-trip every score tile and the output accumulator through
// shared memory (the WMMA fragment layout is opaque); here the fragment layout is the PTX one, so
// the scores, the softmax, the probabilities (re-packed in registers as the next MMA's A operand)
// and the accumulators never leave registers. Shared memory holds only the operand tiles, loaded
// with cp.async (K/V double-buffered in the forward) and read with ldmatrix.
//
// m16n8k16 fragments (g = lane / 4, t = lane % 4): A (16 x 16, row) a0 (g, 2t..2t+1), a1 (g+8, 2t..),
// a2 (g, 2t+8..), a3 (g+8, 2t+8..); B (16 x 8, col) b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g);
// C (16 x 8) c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1).
#include <cuda_bf16.h>

#include "attention/attention_mma.h"
#include "attention/attention_tiles.cuh"
#include "runtime/common.cuh"

namespace engine {
namespace {

using bf16 = __nv_bfloat16;
using namespace attn;
constexpr int kThreads = 128;  // 4 warps
constexpr int BR = 64, BC = 64;

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c (16 x 8, float) += a (16 x 16, bf16) b (16 x 8, bf16)
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Address of this lane's row for ldmatrix x4 over a 16 x 16 block at (r0, c0) of a row-major tile:
//  A operand, stored as is (row m, col k):             rows r0 + lane % 16, cols c0 + (lane / 16) * 8
//  B operand, stored as B^T (row n, col k), 2 n-tiles: rows r0 + (lane / 16) * 8 + lane % 8, cols c0 + (lane / 8 % 2) * 8
//  B operand, stored as is (row k, col n), .trans:     rows r0 + (lane / 8 % 2) * 8 + lane % 8, cols c0 + (lane / 16) * 8
//  A operand, stored transposed (row k, col m), .trans: rows r0 + (lane / 16) * 8 + lane % 8, cols c0 + (lane / 8 % 2) * 8
template <int LD>
__device__ __forceinline__ const bf16* a_rows(const bf16* s, int r0, int c0, int lane) {
    return s + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8;
}
template <int LD>
__device__ __forceinline__ const bf16* bt_rows(const bf16* s, int r0, int c0, int lane) {
    return s + (r0 + (lane >> 4) * 8 + (lane & 7)) * LD + c0 + ((lane >> 3) & 1) * 8;
}
template <int LD>
__device__ __forceinline__ const bf16* b_rows_t(const bf16* s, int r0, int c0, int lane) {
    return s + (r0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + c0 + (lane >> 4) * 8;
}

// rows [row0, row0 + R) of a (b, h) slice -> smem (R, D) with row stride LD; rows >= nrows zero
template <int R, int D, int LD, int NT = kThreads>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, int64_t st, int row0, int nrows) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < R * CH; i += NT) {
        int r = i / CH, c = (i % CH) * 8;
        int row = row0 + r;
        bool ok = row < nrows;
        cp_async16(dst + r * LD + c, src + (int64_t)(ok ? row : 0) * st + c, ok);
    }
}

// c (16 x 64, as 8 C fragments) = a (16 x D, as D / 16 A fragments) @ tile^T, tile (64 x D) row-major
// in shared memory with row stride LD: the scores S = Q K^T, S^T = K Q^T and dP^T = V dO^T
template <int D, int LD>
__device__ __forceinline__ void mma_frags_tile_t(float (&c)[8][4], const uint32_t (&a)[D / 16][4], const bf16* tile,
                                                 int lane) {
    zero(c);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            uint32_t r[4];
            ldsm_x4(r, bt_rows<LD>(tile, np * 16, kk * 16, lane));
            mma(c[2 * np], a[kk], r[0], r[1]);
            mma(c[2 * np + 1], a[kk], r[2], r[3]);
        }
    }
}

// acc (16 x D, as D / 8 C fragments) += a (16 x 64, as 4 A fragments) @ tile (64 x D, row-major in
// shared memory with row stride LD, read transposed by ldmatrix): the P V, P^T dO and dS^T Q products
template <int D, int LD>
__device__ __forceinline__ void mma_frags_tile(float (&acc)[D / 8][4], const uint32_t (&a)[4][4], const bf16* tile,
                                               int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t r[4];
            ldsm_x4_t(r, b_rows_t<LD>(tile, kk * 16, dp * 16, lane));
            mma(acc[2 * dp], a[kk], r[0], r[1]);
            mma(acc[2 * dp + 1], a[kk], r[2], r[3]);
        }
    }
}

// ---- forward ------------------------------------------------------------------------------------

// grid ceil(T / 64) * B * H (attn::tile_order); a warp owns 16 queries; K/V tiles of 64 keys double-buffered.
template <int D>
__global__ void __launch_bounds__(kThreads, D <= 64 ? 4 : 2) fwd_kernel(bf16* __restrict__ o, float* __restrict__ lse,
                                                       const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                       const bf16* __restrict__ v, AttnLayout lq, AttnLayout lk,
                                                       AttnLayout lv, AttnLayout lo, int H, int Tq, int S, bool causal,
                                                       float scale2) {
    constexpr int LD = D + 8;  // 16-byte row padding: ldmatrix rows fall in distinct banks
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sQ = reinterpret_cast<bf16*>(smem);
    bf16* sK = sQ + BR * LD;  // [2][BC][LD]
    bf16* sV = sK + 2 * BC * LD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const QuerySlice qs = query_slice<BR>(q, k, v, lq, lk, lv, H, Tq, S);
    const int bh = qs.bh, b = qs.b, h = qs.h, q0 = qs.q0, off = qs.off;
    const bf16 *qb = qs.q, *kb = qs.k, *vb = qs.v;
    const int kv_end = causal ? max(0, min(S, min(q0 + BR, Tq) + off)) : S;
    const int ntiles = (kv_end + BC - 1) / BC;

    load_rows<BR, D, LD>(sQ, qb, lq.st, q0, Tq);
    if (ntiles > 0) {
        load_rows<BC, D, LD>(sK, kb, lk.st, 0, S);
        load_rows<BC, D, LD>(sV, vb, lv.st, 0, S);
    }
    cp_async_commit();

    float acc[D / 8][4];
    zero(acc);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g + 8 (log2 domain)
    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    uint32_t qa[D / 16][4];

    for (int it = 0; it < ntiles; ++it) {
        const int k0 = it * BC, buf = it & 1;
        if (it + 1 < ntiles) {  // prefetch the next tile into the other buffer
            load_rows<BC, D, LD>(sK + (buf ^ 1) * BC * LD, kb, lk.st, k0 + BC, S);
            load_rows<BC, D, LD>(sV + (buf ^ 1) * BC * LD, vb, lv.st, k0 + BC, S);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qa[kk], a_rows<LD>(sQ, warp * 16, kk * 16, lane));
        }
        const bf16* tK = sK + buf * BC * LD;
        const bf16* tV = sV + buf * BC * LD;
        // S (16 x 64) = Q_w K^T
        float s[8][4];
        mma_frags_tile_t<D, LD>(s, qa, tK, lane);
        // mask, scale, online softmax (each row's 64 columns are spread over the 4 lanes of a quad);
        // tiles wholly inside the visible region skip the mask
        const bool full = k0 + BC <= S && (!causal || k0 + BC - 1 <= q0 + off);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = k0 + j * 8 + 2 * t + (e & 1), r = e >> 1;
                bool visible = full || (col < S && (!causal || col <= row[r] + off));
                s[j][e] = visible ? s[j][e] * scale2 : -INFINITY;
                mx[r] = fmaxf(mx[r], s[j][e]);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float m_new = fmaxf(m[r], mx[r]);
            alpha[r] = m_new == -INFINITY ? 1.f : exp2f(m[r] - m_new);
            m[r] = m_new;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int r = e >> 1;
                float p = s[j][e] == -INFINITY ? 0.f : exp2f(s[j][e] - m[r]);
                s[j][e] = p;
                l[r] += p;  // this lane's share of the row sum; the quad is summed at the end
            }
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            acc[j][0] *= alpha[0];
            acc[j][1] *= alpha[0];
            acc[j][2] *= alpha[1];
            acc[j][3] *= alpha[1];
        }
        // O_w (16 x D) += P (16 x 64) V (64 x D)
        uint32_t pa[4][4];
        to_a_frags(pa, s);
        mma_frags_tile<D, LD>(acc, pa, tV, lane);
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    cp_async_wait<0>();
    store_output<D>(o + b * lo.sb + h * lo.sh, lo.st, lse + (int64_t)bh * Tq, acc, l, m, row, Tq, t);
}

// ---- backward -----------------------------------------------------------------------------------

// grid (ceil(S / BK), B * H): a block of BK / 16 warps owns BK keys (a warp 16 of them, with its K
// and V rows as A fragments in registers and its dK, dV accumulators), walks the query tiles of 64
// that see them (double-buffered), and adds dQ = dS K for each tile into dq_acc (float32) with
// atomics. BK = 64 measured faster than 128 on gpt2_124m (5.8 against 6.5 ms per step): 128 keys
// halve the atomics but leave one 8-warp block per SM where 64 keys fit two 4-warp blocks.
constexpr int BK = 64, kThreadsB = BK / 16 * 32;
constexpr int kColSplit = BK / 64;  // dQ: each of the 4 row groups of 16 queries split over this many warps

template <int D>
__global__ void __launch_bounds__(kThreadsB) bwd_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv,
                                                       float* __restrict__ dq_acc, const bf16* __restrict__ dout,
                                                       const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                       const bf16* __restrict__ v, const float* __restrict__ lse,
                                                       const float* __restrict__ delta, AttnLayout lq, AttnLayout lk,
                                                       AttnLayout lv, AttnLayout lo, int H, int Tq, int S, bool causal,
                                                       float scale, float scale2) {
    constexpr int LD = D + 8, LDS = BR + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sK = reinterpret_cast<bf16*>(smem);
    bf16* sV = sK + BK * LD;
    bf16* sQ2 = sV + BK * LD;     // [2][BR][LD]: query tiles double-buffered
    bf16* sdO2 = sQ2 + 2 * BR * LD;
    bf16* sdS = sdO2 + 2 * BR * LD;  // dS^T (BK keys x 64 queries)
    float* sLse2 = reinterpret_cast<float*>(sdS + BK * LDS);  // [2][BR]
    float* sDelta2 = sLse2 + 2 * BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const KeySlice ks = key_slice<BK, BR>(q, dout, lse, delta, dq_acc, lq, lo, H, Tq, S, D, causal);
    const int b = ks.b, h = ks.h, k0 = ks.k0, off = ks.off, i_begin = ks.i_begin;

    // the query tile at i0 (its rows of Q, dO, lse, delta) into buffer `buf`
    auto load_query_tile = [&](int i0, int buf) {
        load_rows<BR, D, LD, kThreadsB>(sQ2 + buf * BR * LD, ks.q, lq.st, i0, Tq);
        load_rows<BR, D, LD, kThreadsB>(sdO2 + buf * BR * LD, ks.dout, lo.st, i0, Tq);
        stage_lse_delta<BR, kThreadsB>(sLse2 + buf * BR, sDelta2 + buf * BR, ks.lse, ks.delta, i0, Tq);
    };

    load_rows<BK, D, LD, kThreadsB>(sK, k + b * lk.sb + h * lk.sh, lk.st, k0, S);
    load_rows<BK, D, LD, kThreadsB>(sV, v + b * lv.sb + h * lv.sh, lv.st, k0, S);
    if (i_begin < Tq) load_query_tile(i_begin, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t ka[D / 16][4], va[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        ldsm_x4(ka[kk], a_rows<LD>(sK, warp * 16, kk * 16, lane));
        ldsm_x4(va[kk], a_rows<LD>(sV, warp * 16, kk * 16, lane));
    }
    float dk_acc[D / 8][4], dv_acc[D / 8][4];
    zero(dk_acc);
    zero(dv_acc);
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

    for (int i0 = i_begin, it = 0; i0 < Tq; i0 += BR, ++it) {
        const int buf = it & 1;
        if (i0 + BR < Tq) load_query_tile(i0 + BR, buf ^ 1);  // prefetch (that buffer was freed last iteration)
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* sQ = sQ2 + buf * BR * LD;
        const bf16* sdO = sdO2 + buf * BR * LD;
        const float* sLse = sLse2 + buf * BR;
        const float* sDelta = sDelta2 + buf * BR;
        // S^T (16 keys x 64 queries) = K_w Q^T;  dP^T = V_w dO^T
        float st[8][4], dpt[8][4];
        mma_frags_tile_t<D, LD>(st, ka, sQ, lane);
        mma_frags_tile_t<D, LD>(dpt, va, sdO, lane);
        // P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - delta); dS^T also to shared memory for dQ.
        // Tiles wholly inside the visible region skip the mask.
        const bool full = k0 + BK <= S && i0 + BR <= Tq && (!causal || k0 + BK - 1 <= i0 + off);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int c = j * 8 + 2 * t + (e & 1), qi = i0 + c, r = e >> 1;
                bool visible = full || (key[r] < S && qi < Tq && (!causal || key[r] <= qi + off));
                float p = visible ? exp2f(st[j][e] * scale2 - sLse[c]) : 0.f;
                st[j][e] = p;
                dpt[j][e] = p * (dpt[j][e] - sDelta[c]);
            }
            bf16* d0 = sdS + (warp * 16 + g) * LDS + j * 8 + 2 * t;
            *reinterpret_cast<uint32_t*>(d0) = pack_bf16(dpt[j][0], dpt[j][1]);
            *reinterpret_cast<uint32_t*>(d0 + 8 * LDS) = pack_bf16(dpt[j][2], dpt[j][3]);
        }
        // dV_w += P^T dO;  dK_w += dS^T Q  (scale applied at the end)
        uint32_t pa[4][4], dsa[4][4];
        to_a_frags(pa, st);
        to_a_frags(dsa, dpt);
        mma_frags_tile<D, LD>(dv_acc, pa, sdO, lane);
        mma_frags_tile<D, LD>(dk_acc, dsa, sQ, lane);
        __syncthreads();  // all of dS^T is in shared memory
        // dQ (64 queries x D) += dS (64 x BK keys) K (BK keys x D), dS read transposed out of dS^T;
        // warp w computes queries 16 (w % 4).. and the (w / 4)-th of kColSplit slices of the D columns
        constexpr int DC = D / kColSplit;
        const int qrow0 = i0 + (warp & 3) * 16, c0 = (warp >> 2) * DC;
        if (qrow0 < Tq) {
            float dq[DC / 8][4];
            zero(dq);
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                uint32_t a[4];
                ldsm_x4_t(a, bt_rows<LDS>(sdS, kk * 16, (warp & 3) * 16, lane));
#pragma unroll
                for (int dp = 0; dp < DC / 16; ++dp) {
                    uint32_t r[4];
                    ldsm_x4_t(r, b_rows_t<LD>(sK, kk * 16, c0 + dp * 16, lane));
                    mma(dq[2 * dp], a, r[0], r[1]);
                    mma(dq[2 * dp + 1], a, r[2], r[3]);
                }
            }
            add_dq(ks.dq, D, dq, qrow0, c0, Tq, g, t);
        }
        __syncthreads();  // this buffer and sdS are refilled next
    }
    cp_async_wait<0>();
    store_key_grads<D>(dk + b * lk.sb + h * lk.sh, lk.st, dv + b * lv.sb + h * lv.sh, lv.st, dk_acc, dv_acc, key, S, t,
                       scale);
}

template <typename KernelT>
void set_smem(KernelT kernel, int bytes, const char* op) {
    if (bytes > 48 * 1024) check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), op);
}

template <int D>
void forward_d(cudaStream_t st, void* o, float* lse, const void* q, const void* k, const void* v, AttnLayout lq,
               AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    int bytes = (BR + 4 * BC) * (D + 8) * (int)sizeof(bf16);
    set_smem(fwd_kernel<D>, bytes, "attention");
    unsigned grid = (unsigned)(ceil_div(T, BR) * B * H);  // see tile_order
    fwd_kernel<D><<<grid, kThreads, bytes, st>>>((bf16*)o, lse, (const bf16*)q, (const bf16*)k, (const bf16*)v, lq, lk,
                                                 lv, lo, H, T, S, causal, scale * kLog2e);
}

template <int D>
void backward_d(cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout, const void* q, const void* k,
                const void* v, const float* lse, const float* delta, AttnLayout lq, AttnLayout lk, AttnLayout lv,
                AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    int bytes = (2 * BK + 4 * BR) * (D + 8) * (int)sizeof(bf16) + BK * (BR + 8) * (int)sizeof(bf16) + 4 * BR * 4;
    set_smem(bwd_kernel<D>, bytes, "attention_backward");
    unsigned grid = (unsigned)(ceil_div(S, BK) * B * H);  // see tile_order
    bwd_kernel<D><<<grid, kThreadsB, bytes, st>>>((bf16*)dk, (bf16*)dv, dq_acc, (const bf16*)dout, (const bf16*)q,
                                                 (const bf16*)k, (const bf16*)v, lse, delta, lq, lk, lv, lo, H, T, S,
                                                 causal, scale, scale * kLog2e);
}

}  // namespace

bool attention_mma_supported(int D, bool backward) {
    return D == 32 || D == 64 || (D == 128 && !backward);
}

bool attention_forward_mma(cudaStream_t st, void* o, float* lse, const void* q, const void* k, const void* v,
                           AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                           int D, bool causal, float scale) {
    if (!attention_mma_supported(D, false) || !aligned16(q, lq) || !aligned16(k, lk) || !aligned16(v, lv) ||
        lo.st % 2 != 0)
        return false;
    if (D == 32) forward_d<32>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else if (D == 64) forward_d<64>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else forward_d<128>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
    return true;
}

bool attention_backward_mma(cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout, const void* q,
                            const void* k, const void* v, const float* lse, const float* delta, AttnLayout lq,
                            AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, int D,
                            bool causal, float scale) {
    if (!attention_mma_supported(D, true) || !aligned16(q, lq) || !aligned16(k, lk) || !aligned16(v, lv) ||
        !aligned16(dout, lo))
        return false;
    if (D == 32) backward_d<32>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else backward_d<64>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    return true;
}

}  // namespace engine
