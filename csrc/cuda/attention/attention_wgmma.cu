// bf16 fused attention on Hopper's warpgroup MMA (wgmma, sm_90a), head dims 32, 64 and 128, forward
// and backward: attention.cu's first choice for bf16 without dropout, before attention_mma.cu's
// mma.sync kernels.
//
// A block of two warpgroups owns 128 queries, 64 per warpgroup. K and V tiles of BN keys are
// double-buffered in shared memory (cp.async into the 128-byte swizzled layout of wgmma.cuh), and
// the tensor cores read them from there, with no ldmatrix and no register copies of the operands:
//   S (64 x BN) = Q K^T      Q and K as K-major tiles;
//   O (64 x D) += P V        P in registers (S's accumulator re-packed as bf16: an m64nN accumulator
//                            has the layout of the next wgmma's A operand), V as an N-major tile.
// The online softmax in between is attention_mma.cu's, on the same fragment layout.
//
// Head dims: a tile of (rows, D) is P = D / 64 panels (at least one) of (rows, 64) swizzled bf16, one
// after the other; D = 32 fills the first half of each row. A product over D takes W / 16 k-steps
// in each panel (W = a panel's columns, 32 or 64), and a product into D columns is one wgmma of
// N = W per panel, into that panel's columns of the accumulator (wgmma::columns).
#include <cuda_bf16.h>

#include <type_traits>

#include "attention/attention_tiles.cuh"
#include "attention/attention_wgmma.h"
#include "attention/backward_wgmma.cuh"
#include "runtime/common.cuh"
#include "runtime/runtime.h"
#include "attention/softmax_wgmma.cuh"
#include "attention/wgmma.cuh"

namespace engine {
namespace {

using bf16 = __nv_bfloat16;
using namespace attn;
constexpr int BM = 128, kThreads = 256;  // two warpgroups of 64 queries

// Keys per K/V tile of the forward. 128 measured slower on gpt2_124m (0.160 against 0.138 ms a
// layer): 188 registers leave one block per SM.
constexpr int BN = 64;

// rows [row0, row0 + R) of a (b, h) slice -> the swizzled (R, D) tile at shared address dst (its
// panels of (R, 64) one after the other); rows >= nrows are zero
template <int D, int R, int NT = kThreads>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16* src, int64_t st, int row0, int nrows) {
    constexpr int CPR = D / 8;  // 16-byte chunks of a row
    for (int i = threadIdx.x; i < R * CPR; i += NT) {
        const int r = i / CPR, c = i % CPR, row = row0 + r;
        const bool ok = row < nrows;
        cp_async16(dst + (c >> 3) * (R * 128) + wgmma::swizzled(r, c & 7), src + (int64_t)(ok ? row : 0) * st + c * 8,
                   ok);
    }
}

// grid ceil(T / 128) * B * H (attn::tile_order, heaviest first). Per warpgroup, iteration j issues
// S_{j+1} = Q K_{j+1}^T and then O += P_j V_j, and runs the softmax of S_{j+1} while P_j V_j is on the
// tensor cores (FlashAttention-3's overlap inside a warpgroup). K/V tiles sit in a ring of three
// buffers: K_{j+1} and V_j are read while tile j + 2 loads. Head dim 128 holds 64 more accumulator
// registers a thread: one block per SM.
template <int D>
__global__ void __launch_bounds__(kThreads, D <= 64 ? 2 : 1)
    fwd_kernel(bf16* __restrict__ o, float* __restrict__ lse, const bf16* __restrict__ q, const bf16* __restrict__ k,
               const bf16* __restrict__ v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int H, int Tq,
               int S, bool causal, float scale2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    using PD = Panels<D>;
    constexpr int P = PD::P, W = PD::W;
    constexpr uint32_t kKV = PD::tile_bytes(BN);  // bytes of a swizzled (BN, D) tile
    const uint32_t sQ = (smem_addr(smem_raw) + 1023) & ~1023u;  // Q (BM, D); K, V [3](BN, D), swizzled
    const uint32_t sK = sQ + PD::tile_bytes(BM), sV = sK + 3 * kKV;
    // the warpgroup's index through a shuffle, so that the compiler sees it (and the branches around
    // the wgmma on it) as uniform over the warp; else it serialises every wgmma (ptxas C7520)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const QuerySlice qs = query_slice<BM>(q, k, v, lq, lk, lv, H, Tq, S);
    const int bh = qs.bh, b = qs.b, h = qs.h, q0 = qs.q0, off = qs.off;
    const int wq0 = q0 + wg * 64;  // this warpgroup's first query
    const bf16 *qb = qs.q, *kb = qs.k, *vb = qs.v;
    const int kv_end = causal ? max(0, min(S, min(q0 + BM, Tq) + off)) : S;
    const int ntiles = (kv_end + BN - 1) / BN;
    // tiles this warpgroup sees (under a causal mask the first warpgroup may see one fewer)
    const int wg_tiles = causal ? (max(0, min(S, min(wq0 + 64, Tq) + off)) + BN - 1) / BN : ntiles;
    auto load_kv = [&](int tile) {
        load_tile<D, BN>(sK + tile % 3 * kKV, kb, lk.st, tile * BN, S);
        load_tile<D, BN>(sV + tile % 3 * kKV, vb, lv.st, tile * BN, S);
    };
    auto is_full = [&](int tile) {  // wholly inside the visible region for every row of the warpgroup
        return (tile + 1) * BN <= S && (!causal || (tile + 1) * BN - 1 <= wq0 + off);
    };
    // desc_q[p]: panel p of this warpgroup's 64 rows of Q
    auto issue_s = [&](float (&s)[BN / 8][4], int tile, const uint64_t (&desc_q)[P]) {  // S = Q_wg K_tile^T
        issue_scores<P, W, BN>(s, desc_q, sK + tile % 3 * kKV);
    };

    float acc[D / 8][4];
    float s[BN / 8][4];
    uint32_t pa[BN / 16][4];
    zero(acc);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];  // rows g, g + 8
    const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};
    uint64_t desc_q[P];
#pragma unroll
    for (int p = 0; p < P; ++p) desc_q[p] = wgmma::desc(sQ + p * (BM * 128) + wg * 64 * 128);

    load_tile<D, BM>(sQ, qb, lq.st, q0, Tq);
    if (ntiles > 0) load_kv(0);
    cp_async_commit();
    cp_async_wait<0>();
    wgmma::fence_smem();
    __syncthreads();
    if (ntiles > 1) load_kv(1);
    cp_async_commit();
    if (wg_tiles > 0) {  // S_0 and its softmax
        wgmma::fence();
        issue_s(s, 0, desc_q);
        wgmma::wait<0>();
        wgmma::hold(s);
        softmax_step(s, m, l, alpha, is_full(0), 0, S, causal, row, off, t, scale2);
        to_a_frags(pa, s);
    }
    // O += P_it V_it; with `next` (a compile-time flag: no wgmma sits in a branch), also S_{it+1} and its
    // softmax, run while P V is on the tensor cores
    auto step = [&](int it, auto next) {
        rescale_rows(acc, alpha);  // the previous tiles' output, to this tile's max
        wgmma::hold(acc);          // the rescale stays before the fence
        wgmma::fence();
        if constexpr (next) issue_s(s, it + 1, desc_q);
        issue_pv<P, W, BN, D>(acc, pa, sV + it % 3 * kKV);  // O_wg += P V_it
        if constexpr (next) {
            wgmma::wait<1>();
            wgmma::hold(s);
            softmax_step(s, m, l, alpha, is_full(it + 1), (it + 1) * BN, S, causal, row, off, t, scale2);
        }
        wgmma::wait<0>();
        wgmma::hold(acc);
        wgmma::hold(pa);
        if constexpr (next) to_a_frags(pa, s);
    };
    for (int it = 0; it < ntiles; ++it) {
        if (it + 1 < ntiles) {  // tile it + 1 is in; every warpgroup is done with tile it - 1's buffers
            cp_async_wait<0>();
            wgmma::fence_smem();
            __syncthreads();
            if (it + 2 < ntiles) load_kv(it + 2);
            cp_async_commit();
        }
        if (it + 1 < wg_tiles) step(it, std::true_type{});  // branches uniform over the warpgroup
        else if (it < wg_tiles) step(it, std::false_type{});
    }
    cp_async_wait<0>();
    store_output<D>(o + b * lo.sb + h * lo.sh, lo.st, lse + (int64_t)bh * Tq, acc, l, m, row, Tq, t);
#else
    __trap();  // built without sm_90a: attention_forward_wgmma never launches this
#endif
}

// ---- backward -----------------------------------------------------------------------------------

// One warpgroup owns 64 keys (BK): K and V stay in shared memory, dK and dV accumulate in registers,
// and it walks the query tiles of 64 that see those keys (Q, dO, lse, delta double-buffered); each
// product over D or into D columns runs panel by panel, as the forward's:
//   S^T (keys x queries) = K Q^T       dP^T = V dO^T          K, V, Q, dO as K-major tiles
//   P^T = exp(S^T scale - lse)         dS^T = P^T (dP^T - delta)     in registers
//   dV += P^T dO                       dK += dS^T Q           P^T, dS^T as A in registers; dO, Q N-major
//   dQ (queries x D) = dS K            dS^T through shared memory as an M-major A, K as an N-major B,
//                                      added into dq_acc (float32) with atomics, a panel at a time
//                                      (head dim 128: 32 registers for it instead of 64)
// attention.cu prepares delta = rowsum(dO * O) and turns dq_acc into dq (with the scale).
constexpr int BK = 64, BRB = 64, kThreadsB = 128;

// grid ceil(S / 64) * B * H (attn::tile_order, heaviest first)
template <int D>
__global__ void __launch_bounds__(kThreadsB)
    bwd_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ dq_acc, const bf16* __restrict__ dout,
               const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
               const float* __restrict__ lse, const float* __restrict__ delta, AttnLayout lq, AttnLayout lk,
               AttnLayout lv, AttnLayout lo, int H, int Tq, int S, bool causal, float scale, float scale2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    using PD = Panels<D>;
    constexpr int P = PD::P, W = PD::W;
    constexpr uint32_t kTile = PD::tile_bytes(64), kPanel = 64 * 128;  // a swizzled (64, D) tile, one panel of it
    const uint32_t sK = (smem_addr(smem_raw) + 1023) & ~1023u, sV = sK + kTile;
    const uint32_t sQ2 = sV + kTile, sdO2 = sQ2 + 2 * kTile, sdS = sdO2 + 2 * kTile;  // Q, dO [2]; dS^T (keys, queries)
    float* sLse2 = reinterpret_cast<float*>(smem_raw + (sdS + kPanel - smem_addr(smem_raw)));  // [2][BRB]
    float* sDelta2 = sLse2 + 2 * BRB;
    unsigned char* sdS_ptr = smem_raw + (sdS - smem_addr(smem_raw));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const KeySlice ks = key_slice<BK, BRB>(q, dout, lse, delta, dq_acc, lq, lo, H, Tq, S, D, causal);
    const int b = ks.b, h = ks.h, k0 = ks.k0, off = ks.off, i_begin = ks.i_begin;

    // the query tile at i0 (its rows of Q, dO, lse, delta) into buffer `buf`
    auto load_query_tile = [&](int i0, int buf) {
        load_tile<D, BRB, kThreadsB>(sQ2 + buf * kTile, ks.q, lq.st, i0, Tq);
        load_tile<D, BRB, kThreadsB>(sdO2 + buf * kTile, ks.dout, lo.st, i0, Tq);
        stage_lse_delta<BRB, kThreadsB>(sLse2 + buf * BRB, sDelta2 + buf * BRB, ks.lse, ks.delta, i0, Tq);
    };

    load_tile<D, BK, kThreadsB>(sK, k + b * lk.sb + h * lk.sh, lk.st, k0, S);
    load_tile<D, BK, kThreadsB>(sV, v + b * lv.sb + h * lv.sh, lv.st, k0, S);
    if (i_begin < Tq) load_query_tile(i_begin, 0);
    cp_async_commit();

    float dk_acc[D / 8][4], dv_acc[D / 8][4];
    zero(dk_acc);
    zero(dv_acc);
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    const uint64_t desc_ds = wgmma::desc(sdS);
    uint64_t desc_k[P], desc_v[P];  // their panels
#pragma unroll
    for (int p = 0; p < P; ++p) desc_k[p] = wgmma::desc(sK + p * kPanel), desc_v[p] = wgmma::desc(sV + p * kPanel);

    for (int i0 = i_begin, it = 0; i0 < Tq; i0 += BRB, ++it) {
        const int buf = it & 1;
        if (i0 + BRB < Tq) load_query_tile(i0 + BRB, buf ^ 1);  // prefetch (that buffer was freed last iteration)
        cp_async_commit();
        cp_async_wait<1>();
        wgmma::fence_smem();
        __syncthreads();
        uint64_t desc_q[P], desc_do[P];
#pragma unroll
        for (int p = 0; p < P; ++p)
            desc_q[p] = wgmma::desc(sQ2 + buf * kTile + p * kPanel), desc_do[p] = wgmma::desc(sdO2 + buf * kTile + p * kPanel);
        const float* sLse = sLse2 + buf * BRB;
        const float* sDelta = sDelta2 + buf * BRB;
        float st[8][4], dpt[8][4];
        issue_scores_t<P, W>(st, dpt, desc_k, desc_q, desc_v, desc_do);
        wgmma::wait<0>();
        wgmma::hold(st);
        wgmma::hold(dpt);
        // queries past Tq have lse2 = +inf, so P = 0
        const bool full = k0 + BK <= S && (!causal || k0 + BK - 1 <= i0 + off);
        uint32_t pa[4][4], dsa[4][4];
        score_grads_t(st, dpt, sLse, sDelta, full, i0, key, S, causal, off, scale2, warp, g, t, sdS_ptr, pa, dsa);
        issue_key_grads<P, W, D>(dv_acc, dk_acc, pa, dsa, desc_do, desc_q);
        wgmma::fence_smem();  // dS^T's stores, before the block's wgmma reads them
        __syncthreads();
        // dQ (64 queries x D) = dS (queries x keys, read M-major out of dS^T) K (keys x D, N-major),
        // a panel of W columns at a time
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float dq[W / 8][4];
            static_assert(BK == 64, "issue_dq_panel sums over 64 keys");
            issue_dq_panel<W>(dq, desc_ds, desc_k[p]);
            wgmma::wait<0>();
            wgmma::hold(dq);
            wgmma::hold(dv_acc);
            wgmma::hold(dk_acc);
            if (p == 0) {
                wgmma::hold(pa);
                wgmma::hold(dsa);
            }
            add_dq(ks.dq, D, dq, i0 + warp * 16, p * W, Tq, g, t);
        }
        __syncthreads();  // this buffer and dS^T are refilled next
    }
    cp_async_wait<0>();
    store_key_grads<D>(dk + b * lk.sb + h * lk.sh, lk.st, dv + b * lv.sb + h * lv.sh, lv.st, dk_acc, dv_acc, key, S, t,
                       scale);
#else
    __trap();  // built without sm_90a: attention_backward_wgmma never launches this
#endif
}

template <int D>
void forward(cudaStream_t st, void* o, float* lse, const void* q, const void* k, const void* v, AttnLayout lq,
             AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    // Q, K and V [3]; + slack to align the tiles to 1024 bytes
    const int bytes = (int)Panels<D>::tile_bytes(BM + 6 * BN) + 1024;
    check(cudaFuncSetAttribute(fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "attention");
    const unsigned grid = (unsigned)(ceil_div(T, BM) * B * H);
    fwd_kernel<D><<<grid, kThreads, bytes, st>>>((bf16*)o, lse, (const bf16*)q, (const bf16*)k, (const bf16*)v, lq,
                                                 lk, lv, lo, H, T, S, causal, scale * kLog2e);
}

template <int D>
void backward(cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout, const void* q, const void* k,
              const void* v, const float* lse, const float* delta, AttnLayout lq, AttnLayout lk, AttnLayout lv,
              AttnLayout lo, int B, int H, int T, int S, bool causal, float scale) {
    // K, V, Q[2], dO[2] (64, D) and dS^T (64, 64); lse, delta [2]; alignment
    const int bytes = (int)Panels<D>::tile_bytes(6 * 64) + 64 * 128 + 4 * BRB * 4 + 1024;
    check(cudaFuncSetAttribute(bwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "attention_backward");
    const unsigned grid = (unsigned)(ceil_div(S, BK) * B * H);
    bwd_kernel<D><<<grid, kThreadsB, bytes, st>>>((bf16*)dk, (bf16*)dv, dq_acc, (const bf16*)dout, (const bf16*)q,
                                                  (const bf16*)k, (const bf16*)v, lse, delta, lq, lk, lv, lo, H, T, S,
                                                  causal, scale, scale * kLog2e);
}

bool g_forward = true, g_backward = true;  // false turns a direction's Hopper kernel off
int g_forward_kernel = -1, g_backward_kernel = -1;  // attention_wgmma_{forward,backward}_kernel; -1: by shape

// The kernels chosen by shape, from bench/attention.py on an H200 (docs/performance.md, "Attention
// alone"; ms at B 16, T 1024, head dim 64 unless said):
// - forward: the dynamic walk (at most a block an SM, each taking the next unclaimed item, heaviest
//   first), ws 3 x 128 from T 512 (0.095 against 0.106 a block an item, 0.131 on a static stride and
//   0.120 for cp.async), and below it since the walk's groups of heads (T 256: 0.0283 against ws 3 x
//   64's 0.0305 on an H100; before them 0.0299 against 0.0280); at head dim 128 ws 2 x 128
//   with the consumers taking turns (0.0769 against 0.0789 without, 0.091 a block an item). Turns
//   are slower at head dim 64 (0.0994 against 0.0937; T 256: 0.0327 against 0.0280);
// - backward at head dim 64: ws 3 x 64 walking dynamically with dQ summed over the consumers in
//   shared memory, one bulk reduction a query tile, from S 256 (0.302 against 0.310 for each
//   consumer's own bulk reductions a block an item, 0.311 walking dynamically, 0.368 with atomics,
//   0.377 for cp.async; B 64 H 6 T 256: 0.094 against 0.097); at head dim 128 ws 2 x 64 with dQ
//   split by columns between the consumers and added by bulk reductions of rows, a block an item
//   (on an H100, B 16 H 6: 0.306 against 0.311 split with atomics, 0.321 split walking dynamically,
//   0.350 summed; B 8 H 6 T 2048: 0.470 against 0.480, 0.508 and 0.549), in FlashAttention-3's order
//   since the walk's groups of heads (below).
int forward_kernel_for(int D, int T) {
    if (g_forward_kernel >= 0) return g_forward_kernel;
    // (since the walk's groups of heads, ws 3 x 128 dynamic at every T: B64 H6 T256 0.0283 ms against
    // ws 3 x 64's 0.0305 on an H100; at head dim 32 too, B16 H24 T1024: 0.1275 against 0.1372 with
    // turns, 0.1405 for ws 3 x 64 dynamic and the cp.async kernel's 0.1720. Since the output's TMA
    // store and the half-seen last tiles, ws 2 x 128 dynamic below 512 queries at head dim 64: B64 H6
    // T256 0.0254 against 3 x 128's 0.0264 ms on an H200)
    return D == 128 ? 13 : D == 64 && T < 512 ? 9 : 10;
}
int backward_kernel_for(int D, int S) {
    if (g_backward_kernel >= 0) return g_backward_kernel;
    // head dim 64: query tiles of 128 with dQ split by rows in FlashAttention-3's order, added by TMA
    // tensor reductions (2450: 0.302 against 402's atomics 0.314 and 57's 0.320 ms at B16 H12 T1024 on
    // an H100) from 1024 keys, three consumers with dQ summed (57) below it (0.105 against 0.106 at B64
    // H6 T256)
    // head dim 128: 330 (74 in FlashAttention-3's order) with dQ by TMA tensor reductions of tiles
    // staged in each consumer's own 16 KB (2378: 0.2554 against 330's 0.2828 ms at B16 H6 T1024, 0.3609
    // against 0.4199 at B8 T2048, on an H100)
    return D == 128 ? 2378 : D == 64 ? (S >= 1024 ? 2450 : S >= 256 ? 57 : 0) : 0;
}

bool usable(int device, int D) {
    return attention_wgmma_built() && (D == 32 || D == 64 || D == 128) && compute_capability(device) == 90;
}

}  // namespace

bool attention_wgmma_built() {
#if defined(ENGINE_WGMMA)
    return true;
#else
    return false;
#endif
}

bool attention_wgmma_forward(bool enabled) {
    const bool prev = g_forward;
    g_forward = enabled;
    return prev;
}

bool attention_wgmma_backward(bool enabled) {
    const bool prev = g_backward;
    g_backward = enabled;
    return prev;
}

int attention_wgmma_forward_kernel(int kernel) {
    const int prev = g_forward_kernel;
    g_forward_kernel = kernel;
    return prev;
}

int attention_wgmma_backward_kernel(int kernel) {
    const int prev = g_backward_kernel;
    g_backward_kernel = kernel;
    return prev;
}

bool attention_forward_wgmma(int device, cudaStream_t st, void* o, float* lse, const void* q, const void* k,
                             const void* v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H,
                             int T, int S, int D_, bool causal, float scale) {
    if (!g_forward || !usable(device, D_) || !aligned16(q, lq) || !aligned16(k, lk) || !aligned16(v, lv) || lo.st % 2 != 0)
        return false;
    const int kernel = forward_kernel_for(D_, T);
    if (kernel != 0 && attention_forward_ws(kernel, device, st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, D_, causal, scale))
        return true;
    if (D_ == 32) forward<32>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else if (D_ == 64) forward<64>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else forward<128>(st, o, lse, q, k, v, lq, lk, lv, lo, B, H, T, S, causal, scale);
    return true;
}

bool attention_backward_wgmma(int device, cudaStream_t st, void* dk, void* dv, float* dq_acc, const void* dout,
                              const void* q, const void* k, const void* v, const float* lse, const float* delta,
                              AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int B, int H, int T, int S,
                              int D_, bool causal, float scale) {
    if (!g_backward || !usable(device, D_) || !aligned16(q, lq) || !aligned16(k, lk) || !aligned16(v, lv) ||
        !aligned16(dout, lo))
        return false;
    const int kernel = backward_kernel_for(D_, S);
    if (kernel != 0 && attention_backward_ws(kernel, device, st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B,
                                             H, T, S, D_, causal, scale))
        return true;
    if (D_ == 32) backward<32>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else if (D_ == 64)
        backward<64>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    else backward<128>(st, dk, dv, dq_acc, dout, q, k, v, lse, delta, lq, lk, lv, lo, B, H, T, S, causal, scale);
    return true;
}

}  // namespace engine
