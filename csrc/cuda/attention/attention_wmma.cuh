// Fused attention, flash-attention-2 style, on tensor cores through WMMA: forward (online softmax,
// only the log-sum-exp kept) and backward (scores recomputed tile by tile). No T x S matrix is
// ever in memory: a block holds one 64 x 64 tile of scores at a time in shared memory.
//
// Tiles: 64 queries x 64 keys per step, 4 warps, each warp owning 16 rows. Operands are staged in
// shared memory in the input type (bf16 -> bf16 MMA; float32 -> TF32 MMA, or 3 TF32 MMAs of the
// split hi/lo halves when `precise`), accumulators are float32. Head dims are padded to DP (32, 64
// or 128) with zeros in shared memory, so any D % 8 == 0 up to 128 works.
//
// Dropout on the probabilities (template flag DROPOUT, so the kernels without it are unchanged):
// element (bh, query, key) is kept with its Philox bits (keep8, attention_dropout.cuh) and scaled by
// Z = 1 / (1 - p).
// The forward sums the undropped P into the softmax denominator (lse as without dropout) and
// accumulates (P Z) V; the backward uses dV += (P Z)^T dO, dP = (dO V^T) Z, dS = P (dP - delta).
//
// Included by attention.cu alone (its launchers instantiate these templates); one translation unit.
#pragma once
#include <mma.h>

#include <type_traits>

#include "attention/attention.h"
#include "attention/attention_dropout.cuh"
#include "runtime/common.cuh"

namespace engine {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int BR = 64, BC = 64;  // queries, keys per tile
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

template <typename T> struct WM;
template <> struct WM<__nv_bfloat16> {
    static constexpr int K = 16;
    using in_t = __nv_bfloat16;
};
template <> struct WM<float> {
    static constexpr int K = 8;
    using in_t = wmma::precision::tf32;
};
template <typename T> using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, WM<T>::K, float>;
template <typename T, typename L> using AFrag = wmma::fragment<wmma::matrix_a, 16, 16, WM<T>::K, typename WM<T>::in_t, L>;
template <typename T, typename L> using BFrag = wmma::fragment<wmma::matrix_b, 16, 16, WM<T>::K, typename WM<T>::in_t, L>;

// padding of shared-memory rows: 16 bytes (keeps 32-byte fragment alignment, breaks bank conflicts)
template <typename T> constexpr int kPad = 16 / (int)sizeof(T);
constexpr int kLdS = BC + 4;  // float score rows

template <typename F>
__device__ __forceinline__ void to_tf32(F& f) {
#pragma unroll
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}
template <typename F>
__device__ __forceinline__ void split_tf32(F& hi, F& lo) {
#pragma unroll
    for (int i = 0; i < hi.num_elements; ++i) {
        float x = hi.x[i];
        float h = wmma::__float_to_tf32(x);
        hi.x[i] = h;
        lo.x[i] = wmma::__float_to_tf32(x - h);
    }
}

// acc (16 x 16) += A (16 x KDIM) @ B (KDIM x 16), both in shared memory. Row-major A: A(i, k) =
// a[i * lda + k]; col-major: a[i + k * lda]. Row-major B: B(k, j) = b[k * ldb + j]; col-major: b[k + j * ldb].
template <typename T, bool PRECISE, typename LA, typename LB, int KDIM>
__device__ __forceinline__ void mma_loop(AccFrag<T>& acc, const T* a, int lda, const T* b, int ldb) {
    constexpr int K = WM<T>::K;
    constexpr bool a_row = std::is_same_v<LA, wmma::row_major>;
    constexpr bool b_row = std::is_same_v<LB, wmma::row_major>;
#pragma unroll
    for (int k0 = 0; k0 < KDIM; k0 += K) {
        AFrag<T, LA> fa;
        BFrag<T, LB> fb;
        wmma::load_matrix_sync(fa, a + (a_row ? k0 : k0 * lda), lda);
        wmma::load_matrix_sync(fb, b + (b_row ? k0 * ldb : k0), ldb);
        if constexpr (std::is_same_v<T, float>) {
            if constexpr (PRECISE) {
                AFrag<T, LA> fa_lo;
                BFrag<T, LB> fb_lo;
                split_tf32(fa, fa_lo);
                split_tf32(fb, fb_lo);
                wmma::mma_sync(acc, fa_lo, fb, acc);
                wmma::mma_sync(acc, fa, fb_lo, acc);
            } else {
                to_tf32(fa);
                to_tf32(fb);
            }
        }
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// rows (R, D) of a strided (b, h) slice -> smem (R, DP) with row stride ld; rows >= nrows and
// columns >= D are zero. 16-byte vectors (D % (16 / sizeof(T)) == 0, 16-byte aligned rows).
template <typename T, int R, int DP>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, int ld, const T* __restrict__ src, int64_t st,
                                          int row0, int nrows, int D) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int CHUNKS = DP / VEC;
    for (int i = threadIdx.x; i < R * CHUNKS; i += kThreads) {
        int r = i / CHUNKS, c = (i % CHUNKS) * VEC;
        uint4 val = make_uint4(0, 0, 0, 0);
        int row = row0 + r;
        if (row < nrows && c < D) val = *reinterpret_cast<const uint4*>(src + (int64_t)row * st + c);
        *reinterpret_cast<uint4*>(dst + r * ld + c) = val;
    }
}

__host__ __device__ constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

// ---- forward --------------------------------------------------------------------------------------

template <typename T, int DP>
struct FwdSmem {
    static constexpr int ld = DP + kPad<T>, ldP = BC + kPad<T>, ldO = DP + 4;
    static constexpr int q = 0;
    static constexpr int k = q + align128(BR * ld * sizeof(T));
    static constexpr int v = k + align128(BC * ld * sizeof(T));
    static constexpr int s = v + align128(BC * ld * sizeof(T));
    static constexpr int p = s + align128(kWarps * 16 * kLdS * 4);
    static constexpr int o = p + align128(kWarps * 16 * ldP * sizeof(T));
    static constexpr int bytes = o + align128(kWarps * 16 * ldO * 4);
};

// q (B, H, T, D), k, v (B, H, S, D) -> o (B, H, T, D), lse (B*H, T). grid (ceil(T / BR), B * H)
// DROPOUT: the key is draw_key(seed, epoch); block (0, 0) writes it to *key_out for the backward.
template <typename T, int DP, bool PRECISE, bool DROPOUT>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(
    T* __restrict__ o, float* __restrict__ lse, const T* __restrict__ q, const T* __restrict__ k,
    const T* __restrict__ v, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int H, int Tq, int S, int D,
    bool causal, float scale, DropoutRule rule, uint64_t seed, const uint64_t* __restrict__ epoch,
    uint64_t* __restrict__ key_out) {
    using SM = FwdSmem<T, DP>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* sQ = reinterpret_cast<T*>(smem + SM::q);
    T* sK = reinterpret_cast<T*>(smem + SM::k);
    T* sV = reinterpret_cast<T*>(smem + SM::v);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* sS = reinterpret_cast<float*>(smem + SM::s) + warp * 16 * kLdS;
    T* sP = reinterpret_cast<T*>(smem + SM::p) + warp * 16 * SM::ldP;
    float* sO = reinterpret_cast<float*>(smem + SM::o) + warp * 16 * SM::ldO;

    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int q0 = blockIdx.x * BR;
    const T* qb = q + b * lq.sb + h * lq.sh;
    const T* kb = k + b * lk.sb + h * lk.sh;
    const T* vb = v + b * lv.sb + h * lv.sh;
    int off = S - Tq;  // bottom-right alignment of the causal mask
    int kv_end = S;
    if (causal) kv_end = max(0, min(S, min(q0 + BR, Tq) - 1 + off + 1));
    int ntiles = (kv_end + BC - 1) / BC;

    load_tile<T, BR, DP>(sQ, SM::ld, qb, lq.st, q0, Tq, D);
    for (int i = lane; i < 16 * SM::ldO; i += 32) sO[i] = 0.f;

    // softmax statistics of row r = lane / 2, kept by both lanes of the pair (each owns half the columns)
    int r = lane >> 1, half = lane & 1;
    int qi = q0 + warp * 16 + r;
    float m = -INFINITY, l = 0.f;
    const float scale2 = scale * kLog2e;
    uint2 dkey = make_uint2(0u, 0u);
    if constexpr (DROPOUT) {
        uint64_t key = draw_key(seed, epoch);
        if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *key_out = key;
        dkey = philox_key(key);
    }

    for (int t = 0; t < ntiles; ++t) {
        int k0 = t * BC;
        __syncthreads();  // previous tile's K/V fully used
        load_tile<T, BC, DP>(sK, SM::ld, kb, lk.st, k0, S, D);
        load_tile<T, BC, DP>(sV, SM::ld, vb, lv.st, k0, S, D);
        __syncthreads();
        // S_w (16 x BC) = Q_w (16 x DP) K^T
#pragma unroll
        for (int n0 = 0; n0 < BC; n0 += 16) {
            AccFrag<T> acc;
            wmma::fill_fragment(acc, 0.f);
            mma_loop<T, PRECISE, wmma::row_major, wmma::col_major, DP>(acc, sQ + warp * 16 * SM::ld, SM::ld,
                                                                       sK + n0 * SM::ld, SM::ld);
            wmma::store_matrix_sync(sS + n0, acc, kLdS, wmma::mem_row_major);
        }
        __syncwarp();
        // online softmax over this tile's 32 columns of the lane, then the pair
        float* srow = sS + r * kLdS + half * 32;
        int key0 = k0 + half * 32;
        int limit = causal ? min(S, qi + off + 1) : S;  // keys < limit are visible
        float mx = -INFINITY;
#pragma unroll 8
        for (int c = 0; c < 32; ++c) {
            float s = key0 + c < limit ? srow[c] * scale2 : -INFINITY;
            srow[c] = s;
            mx = fmaxf(mx, s);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        uint32_t keep = 0;  // bit c: keep key key0 + c (4 Philox calls for the lane's 32 keys)
        if constexpr (DROPOUT) {
#pragma unroll
            for (int g = 0; g < 4; ++g)
                if (qi < Tq && key0 + 8 * g < limit)
                    keep |= keep8(dkey, bh, qi, key0 / 8 + g, rule.threshold) << (8 * g);
        }
        float m_new = fmaxf(m, mx);
        float alpha = m_new == -INFINITY ? 1.f : exp2f(m - m_new);
        float sum = 0.f;
        T* prow = sP + r * SM::ldP + half * 32;
#pragma unroll 8
        for (int c = 0; c < 32; ++c) {
            float s = srow[c];
            float p = s == -INFINITY ? 0.f : exp2f(s - m_new);
            float pz = p;  // P Z goes into the P V product; the denominator sums the undropped P
            if constexpr (DROPOUT) pz = (keep >> c) & 1u ? p * rule.scale : 0.f;
            prow[c] = (T)pz;
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        float* orow = sO + r * SM::ldO;
        for (int c = half; c < DP; c += 2) orow[c] *= alpha;
        __syncwarp();
        // O_w (16 x DP) += P_w (16 x BC) V (BC x DP)
#pragma unroll
        for (int d0 = 0; d0 < DP; d0 += 16) {
            AccFrag<T> acc;
            wmma::load_matrix_sync(acc, sO + d0, SM::ldO, wmma::mem_row_major);
            mma_loop<T, PRECISE, wmma::row_major, wmma::row_major, BC>(acc, sP, SM::ldP, sV + d0, SM::ld);
            wmma::store_matrix_sync(sO + d0, acc, SM::ldO, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncwarp();
    if (qi < Tq) {
        float inv = l > 0.f ? 1.f / l : 0.f;
        T* orow_g = o + b * lo.sb + h * lo.sh + (int64_t)qi * lo.st;
        const float* orow = sO + r * SM::ldO;
        for (int c = half; c < D; c += 2) orow_g[c] = (T)(orow[c] * inv);
        if (half == 0) lse[(int64_t)bh * Tq + qi] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
}

// ---- backward -------------------------------------------------------------------------------------

// 8 consecutive elements (16-byte aligned) as floats, and back
__device__ __forceinline__ void load8(float (&f)[8], const float* p) {
    float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load8(float (&f)[8], const __nv_bfloat16* p) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void store8(float* p, const float (&f)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&f)[8]) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = u;
}

// The prep and dq passes' layout: a block is 16 rows of L lanes, L = blockDim.x / 16 the least power of
// two with 8 L >= D (prep_threads), lane 0..L-1 of a row owning its 8 consecutive elements 8 lane .. (none
// past D), so that no lane idles at head dims 16, 32, 64 and 128. The row and column of this thread:
inline unsigned prep_threads(int D) {
    unsigned lanes = 1;
    while (8 * lanes < (unsigned)D) lanes <<= 1;
    return 16 * lanes;
}
__device__ __forceinline__ int prep_lanes_log2() { return __ffs(blockDim.x >> 4) - 1; }
__device__ __forceinline__ int64_t prep_row() { return (int64_t)blockIdx.x * 16 + (threadIdx.x >> prep_lanes_log2()); }
__device__ __forceinline__ int prep_col() { return (threadIdx.x & ((blockDim.x >> 4) - 1)) * 8; }

// The column sums of a block's 16 rows (f: this thread's 8 values, 0 where it has none), the rows
// being one head's (Tq % 16 == 0): written to parts, (B * Tq/16, H * D) float32, at row b * Tq/16 +
// t/16 and columns h * D + 0..D-1 for the block's first row (bh, t). Partial sums of the packed
// projection's bias gradient, added up by attention_bias_grad_kernel.
__device__ __forceinline__ void block_column_sums(float* __restrict__ parts, const float (&f)[8], int64_t first_row,
                                                  int H, int Tq, int D) {
    __shared__ float sums[16][129];
    const int r = threadIdx.x >> prep_lanes_log2(), c = prep_col();
    if (c < D)
#pragma unroll
        for (int i = 0; i < 8; ++i) sums[r][c + i] = f[i];
    __syncthreads();
    if ((int)threadIdx.x < D) {  // blockDim.x = 16 L >= 2 D
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i) t += sums[i][threadIdx.x];
        const int64_t bh = first_row / Tq;
        const int64_t part = (bh / H) * (Tq / 16) + (first_row % Tq) / 16;
        parts[part * H * D + (bh % H) * D + threadIdx.x] = t;
    }
}

// delta (B*H, T) = rowsum(dout * o), and dQ's float32 accumulator dq_acc (B*H, T, D) zeroed beside
// it (one pass instead of a memset and a pass). Laid out as block_column_sums says, 8 consecutive
// elements a lane (16-byte loads, D % 8 == 0, D <= 128), so a row is read in one coalesced sweep. BIAS: also the
// column sums of dout, the value bias's gradient (block_column_sums into vparts; Tq % 16 == 0).
template <typename T, bool BIAS>
__global__ void attention_backward_prep_kernel(float* __restrict__ delta, float* __restrict__ dq_acc,
                                               float* __restrict__ vparts, const T* __restrict__ dout,
                                               const T* __restrict__ o, AttnLayout lo, int H, int Tq, int D,
                                               int64_t rows) {
    const int64_t row = prep_row();
    const int c = prep_col();
    float s = 0.f;
    float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (row < rows && c < D) {
        int64_t bh = row / Tq;
        int t = (int)(row % Tq);
        int64_t base = (bh / H) * lo.sb + (bh % H) * lo.sh + (int64_t)t * lo.st + c;
        float b[8];
        load8(a, dout + base);
        load8(b, o + base);
#pragma unroll
        for (int i = 0; i < 8; ++i) s += a[i] * b[i];
        float4* acc = reinterpret_cast<float4*>(dq_acc + row * D + c);
        acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int m = blockDim.x >> 5; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);  // L / 2 .. 1
    if (row < rows && c == 0) delta[row] = s;
    if constexpr (BIAS) block_column_sums(vparts, a, (int64_t)blockIdx.x * 16, H, Tq, D);
}

// dq (layout lq, type T) = dq_acc (B*H, T, D) * scale; a thread converts 8 consecutive elements
template <typename T>
__global__ void attention_dq_kernel(T* __restrict__ dq, const float* __restrict__ dq_acc, AttnLayout lq, int H,
                                    int Tq, int D, float scale, int64_t n8) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int per_row = D / 8;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += stride) {
        int64_t row = i / per_row;
        int c = (int)(i % per_row) * 8;
        int64_t bh = row / Tq;
        int t = (int)(row % Tq);
        float f[8];
        load8(f, dq_acc + row * D + c);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] *= scale;
        store8(dq + (bh / H) * lq.sb + (bh % H) * lq.sh + (int64_t)t * lq.st + c, f);
    }
}

// The same conversion laid out as the prep kernel (16 rows a block, block_column_sums), with the
// column sums of dq, the query bias's gradient (block_column_sums into qparts; Tq % 16 == 0)
template <typename T>
__global__ void attention_dq_bias_kernel(T* __restrict__ dq, float* __restrict__ qparts,
                                         const float* __restrict__ dq_acc, AttnLayout lq, int H, int Tq, int D,
                                         float scale, int64_t rows) {
    const int64_t row = prep_row();
    const int c = prep_col();
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (row < rows && c < D) {
        int64_t bh = row / Tq;
        int t = (int)(row % Tq);
        load8(f, dq_acc + row * D + c);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] *= scale;
        store8(dq + (bh / H) * lq.sb + (bh % H) * lq.sh + (int64_t)t * lq.st + c, f);
    }
    block_column_sums(qparts, f, (int64_t)blockIdx.x * 16, H, Tq, D);
}

// db (3C,) float32, the packed q | k | v projection's bias gradient: the P partial rows of qparts and
// of vparts (P, C) summed (the column sums of dq and of dout), and 0 for the keys' third. Without
// dropout each query's probabilities sum to 1, so the value bias's gradient sum_j dv_j =
// sum_i dout_i, and a constant added to a query's every score changes no probability, so the key
// bias has none (sum_j dk_j = 0 exactly). Grid (ceil(C / 32), 3), block (32, 32).
__global__ void attention_bias_grad_kernel(float* __restrict__ db, const float* __restrict__ qparts,
                                           const float* __restrict__ vparts, int P, int C) {
    const int third = blockIdx.y;
    if (third == 1) {
        int c = blockIdx.x * 32 + threadIdx.x;
        if (threadIdx.y == 0 && c < C) db[C + c] = 0.f;
        return;
    }
    sum_parts(db + third * C, third == 0 ? qparts : vparts, P, C);
}

template <typename T, int DP>
struct BwdSmem {
    static constexpr int ld = DP + kPad<T>, ldP = BR + kPad<T>;
    static constexpr int k = 0;
    static constexpr int v = k + align128(BC * ld * sizeof(T));
    static constexpr int q = v + align128(BC * ld * sizeof(T));
    static constexpr int dout = q + align128(BR * ld * sizeof(T));
    static constexpr int s = dout + align128(BR * ld * sizeof(T));          // per warp S^T (16 x BR) float
    static constexpr int dp = s + align128(kWarps * 16 * kLdS * 4);         // per warp dP^T (16 x BR) float
    static constexpr int pt = dp + align128(kWarps * 16 * kLdS * 4);        // P^T (BC x BR)
    static constexpr int dst = pt + align128(BC * ldP * sizeof(T));         // dS^T (BC x BR)
    static constexpr int lse = dst + align128(BC * ldP * sizeof(T));        // (BR,) log2-domain lse
    static constexpr int delta = lse + align128(BR * 4);                    // (BR,)
    static constexpr int bytes = delta + align128(BR * 4);
};

// grid (ceil(S / BC), B * H): a block owns 64 keys, walks the query tiles that see them, keeps dK and
// dV in registers and adds its share of dQ to dq_acc with atomics.
// DROPOUT: the key is *key, what the forward wrote (never recomputed from the graph epoch: the
// backward may be captured and replayed as a graph of its own).
template <typename T, int DP, bool PRECISE, bool DROPOUT>
__global__ void __launch_bounds__(kThreads) attention_backward_kernel(
    T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dq_acc, const T* __restrict__ dout,
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ lse,
    const float* __restrict__ delta, AttnLayout lq, AttnLayout lk, AttnLayout lv, AttnLayout lo, int H, int Tq, int S,
    int D, bool causal, float scale, DropoutRule rule, const uint64_t* __restrict__ key) {
    using SM = BwdSmem<T, DP>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* sK = reinterpret_cast<T*>(smem + SM::k);
    T* sV = reinterpret_cast<T*>(smem + SM::v);
    T* sQ = reinterpret_cast<T*>(smem + SM::q);
    T* sdO = reinterpret_cast<T*>(smem + SM::dout);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* sS = reinterpret_cast<float*>(smem + SM::s) + warp * 16 * kLdS;
    float* sdP = reinterpret_cast<float*>(smem + SM::dp) + warp * 16 * kLdS;
    T* sPT = reinterpret_cast<T*>(smem + SM::pt);
    T* sdST = reinterpret_cast<T*>(smem + SM::dst);
    float* sLse = reinterpret_cast<float*>(smem + SM::lse);
    float* sDelta = reinterpret_cast<float*>(smem + SM::delta);

    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int k0 = blockIdx.x * BC;
    int off = S - Tq;
    const T* qb = q + b * lq.sb + h * lq.sh;
    const T* dob = dout + b * lo.sb + h * lo.sh;
    load_tile<T, BC, DP>(sK, SM::ld, k + b * lk.sb + h * lk.sh, lk.st, k0, S, D);
    load_tile<T, BC, DP>(sV, SM::ld, v + b * lv.sb + h * lv.sh, lv.st, k0, S, D);

    AccFrag<T> acc_dk[DP / 16], acc_dv[DP / 16];
#pragma unroll
    for (int i = 0; i < DP / 16; ++i) {
        wmma::fill_fragment(acc_dk[i], 0.f);
        wmma::fill_fragment(acc_dv[i], 0.f);
    }
    // the first query that sees key k0 is k0 - off
    int i_begin = causal ? max(0, k0 - off) / BR * BR : 0;
    const float scale2 = scale * kLog2e;
    const float* lse_bh = lse + (int64_t)bh * Tq;
    const float* delta_bh = delta + (int64_t)bh * Tq;
    float* dq_bh = dq_acc + (int64_t)bh * Tq * D;
    uint2 dkey = make_uint2(0u, 0u);
    if constexpr (DROPOUT) dkey = philox_key(*key);

    for (int i0 = i_begin; i0 < Tq; i0 += BR) {
        __syncthreads();  // previous query tile fully used
        load_tile<T, BR, DP>(sQ, SM::ld, qb, lq.st, i0, Tq, D);
        load_tile<T, BR, DP>(sdO, SM::ld, dob, lo.st, i0, Tq, D);
        for (int i = threadIdx.x; i < BR; i += kThreads) {
            bool ok = i0 + i < Tq;
            float l = ok ? lse_bh[i0 + i] : INFINITY;
            sLse[i] = l == -INFINITY ? INFINITY : l * kLog2e;  // a query that saw nothing gets P = 0
            sDelta[i] = ok ? delta_bh[i0 + i] : 0.f;
        }
        __syncthreads();
        // S^T_w (16 keys x BR) = K_w Q^T;  dP^T_w = V_w dO^T
#pragma unroll
        for (int n0 = 0; n0 < BR; n0 += 16) {
            AccFrag<T> acc;
            wmma::fill_fragment(acc, 0.f);
            mma_loop<T, PRECISE, wmma::row_major, wmma::col_major, DP>(acc, sK + warp * 16 * SM::ld, SM::ld,
                                                                       sQ + n0 * SM::ld, SM::ld);
            wmma::store_matrix_sync(sS + n0, acc, kLdS, wmma::mem_row_major);
            wmma::fill_fragment(acc, 0.f);
            mma_loop<T, PRECISE, wmma::row_major, wmma::col_major, DP>(acc, sV + warp * 16 * SM::ld, SM::ld,
                                                                       sdO + n0 * SM::ld, SM::ld);
            wmma::store_matrix_sync(sdP + n0, acc, kLdS, wmma::mem_row_major);
        }
        __syncwarp();
        // P = exp(S scale - lse), dS = P (dP - delta); lanes own query columns lane and lane + 32
        if constexpr (!DROPOUT) {
#pragma unroll 4
            for (int r = 0; r < 16; ++r) {
                int key = k0 + warp * 16 + r;
#pragma unroll
                for (int cc = 0; cc < 2; ++cc) {
                    int c = lane + cc * 32;
                    int qi = i0 + c;
                    bool visible = key < S && qi < Tq && (!causal || key <= qi + off);
                    float p = visible ? exp2f(sS[r * kLdS + c] * scale2 - sLse[c]) : 0.f;
                    float ds = p * (sdP[r * kLdS + c] - sDelta[c]);
                    sPT[(warp * 16 + r) * SM::ldP + c] = (T)p;
                    sdST[(warp * 16 + r) * SM::ldP + c] = (T)ds;
                }
            }
        } else {
            // with Z: dV takes P Z, dP = (dO V^T) Z, dS = P (dP - delta). The warp's 16 keys are two
            // groups of 8: one Philox call per (query column, group) serves 8 keys
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                int c = lane + cc * 32;
                int qi = i0 + c;
#pragma unroll
                for (int g = 0; g < 2; ++g) {
                    int kg = k0 + warp * 16 + g * 8;  // first key of the group
                    uint32_t keep = 0;
                    if (qi < Tq && kg < S && (!causal || kg <= qi + off))
                        keep = keep8(dkey, bh, qi, kg / 8, rule.threshold);
#pragma unroll 4
                    for (int j = 0; j < 8; ++j) {
                        int r = g * 8 + j, key = kg + j;
                        bool visible = key < S && qi < Tq && (!causal || key <= qi + off);
                        float p = visible ? exp2f(sS[r * kLdS + c] * scale2 - sLse[c]) : 0.f;
                        float z = (keep >> j) & 1u ? rule.scale : 0.f;
                        float ds = p * (sdP[r * kLdS + c] * z - sDelta[c]);
                        sPT[(warp * 16 + r) * SM::ldP + c] = (T)(p * z);
                        sdST[(warp * 16 + r) * SM::ldP + c] = (T)ds;
                    }
                }
            }
        }
        __syncwarp();
        // dV_w += P^T_w dO;  dK_w += dS^T_w Q  (scale applied at the end)
#pragma unroll
        for (int d = 0; d < DP / 16; ++d) {
            mma_loop<T, PRECISE, wmma::row_major, wmma::row_major, BR>(acc_dv[d], sPT + warp * 16 * SM::ldP, SM::ldP,
                                                                       sdO + d * 16, SM::ld);
            mma_loop<T, PRECISE, wmma::row_major, wmma::row_major, BR>(acc_dk[d], sdST + warp * 16 * SM::ldP, SM::ldP,
                                                                       sQ + d * 16, SM::ld);
        }
        __syncthreads();  // every warp's dS^T rows are in place
        // dQ (queries 16w.., DP) += dS K: dS (q x key) is dS^T read column-major
        int qrow0 = i0 + warp * 16;
        if (qrow0 < Tq) {
#pragma unroll
            for (int d = 0; d < DP / 16; ++d) {
                if (d * 16 >= D) break;
                AccFrag<T> acc;
                wmma::fill_fragment(acc, 0.f);
                mma_loop<T, PRECISE, wmma::col_major, wmma::row_major, BC>(acc, sdST + warp * 16, SM::ldP,
                                                                           sK + d * 16, SM::ld);
                wmma::store_matrix_sync(sS, acc, kLdS, wmma::mem_row_major);
                __syncwarp();
#pragma unroll
                for (int e = lane; e < 256; e += 32) {
                    int rr = e >> 4, cc = e & 15;
                    int qi = qrow0 + rr, col = d * 16 + cc;
                    if (qi < Tq && col < D) atomicAdd(dq_bh + (int64_t)qi * D + col, sS[rr * kLdS + cc]);
                }
                __syncwarp();
            }
        }
    }
    // dK_w * scale, dV_w -> global through the warp's score buffer
    int key_base = k0 + warp * 16;
    T* dkb = dk + b * lk.sb + h * lk.sh;
    T* dvb = dv + b * lv.sb + h * lv.sh;
#pragma unroll
    for (int d = 0; d < DP / 16; ++d) {
        if (d * 16 >= D) break;
#pragma unroll
        for (int which = 0; which < 2; ++which) {
            __syncwarp();
            wmma::store_matrix_sync(sS, which == 0 ? acc_dk[d] : acc_dv[d], kLdS, wmma::mem_row_major);
            __syncwarp();
            T* dst = which == 0 ? dkb : dvb;
            int64_t st = which == 0 ? lk.st : lv.st;
            float mul = which == 0 ? scale : 1.f;
            for (int e = lane; e < 256; e += 32) {
                int rr = e >> 4, cc = e & 15;
                int key = key_base + rr, col = d * 16 + cc;
                if (key < S && col < D) dst[(int64_t)key * st + col] = (T)(sS[rr * kLdS + cc] * mul);
            }
        }
    }
}

}  // namespace
}  // namespace engine
