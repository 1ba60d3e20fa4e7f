// LayerNorm over the last axis, forward and backward (llm.c style: one warp per row).
#include <algorithm>
#include <type_traits>

#include "copy/copy.h"  // fill
#include "layernorm/layernorm.h"
#include "runtime/common.cuh"

namespace engine {
namespace {

__device__ __forceinline__ float ldf(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stf(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// x (N, C) -> out (N, C), mean (N,), rstd (N,); w, b (C,) or null. T: float or bf16 (statistics,
// weights and arithmetic in float32). With res (N, C), the row normalised is x + res, or x + (res + rb)
// with rb (C,) (the bias of the projection that made res) where not null, summed in float32 and
// rounded to T once, and written to sum: the residual stream of a pre-LN transformer, in one pass.
template <typename T>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ x, const T* __restrict__ res,
                                         const float* __restrict__ rb, T* __restrict__ sum,
                                         const float* __restrict__ w, const float* __restrict__ b, int64_t N, int C,
                                         float eps) {
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* xr = x + row * C;
    if (res) {  // each lane reads back only the columns it wrote
        for (int c = lane; c < C; c += 32)
            stf(sum + row * C, c, ldf(xr, c) + (ldf(res + row * C, c) + (rb ? rb[c] : 0.f)));
        xr = sum + row * C;
    }
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += ldf(xr, c);
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) {
        float d = ldf(xr, c) - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + eps);
    T* o = out + row * C;
    for (int c = lane; c < C; c += 32) {
        float y = (ldf(xr, c) - m) * r;
        if (w) y *= w[c];
        if (b) y += b[c];
        stf(o, c, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// v (W,) = p[at .. at + W) (16-byte aligned, W % 4 == 0), or `fill` where p is null
template <int W>
__device__ __forceinline__ void load_floats(float (&v)[W], const float* __restrict__ p, int at, float fill) {
#pragma unroll
    for (int k = 0; k < W; k += 4) {
        float4 q = p ? *reinterpret_cast<const float4*>(p + at + k) : make_float4(fill, fill, fill, fill);
        v[k] = q.x, v[k + 1] = q.y, v[k + 2] = q.z, v[k + 3] = q.w;
    }
}

// The same with 16-byte accesses and the row in registers (one read of x, one write of out): lane l
// owns chunks l, l + 32, ... (at most CH) of kVec<T> adjacent columns. C % kVec<T> == 0, rows 16-byte
// aligned. res, rb and sum as in layernorm_forward_kernel.
// Blocks of 8 warps; the registers a thread are capped at what the kernel took before rb (32, 40, 48,
// 56 for 1..4 chunks), so the same warps stay resident (54 registers at 3 chunks cost a block an SM).
constexpr int forward_blocks_per_sm(int CH) { return CH == 1 ? 8 : CH == 2 ? 6 : CH == 3 ? 5 : 4; }

template <typename T, int CH>
__global__ void __launch_bounds__(256, forward_blocks_per_sm(CH))
    layernorm_forward_vec_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                 const T* __restrict__ x, const T* __restrict__ res, const float* __restrict__ rb,
                                 T* __restrict__ sum, const float* __restrict__ w, const float* __restrict__ b,
                                 int64_t N, int C, float eps) {
    constexpr int W = kVec<T>;
    const int lane = threadIdx.x & 31, NC = C / W;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * C);
    float xv[CH][W];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        const int ch = lane + 32 * i;
        if (ch < NC) {
            unpack(xv[i], xr[ch]);
            if (res) {
                float rv[W], bv[W];
                unpack(rv, reinterpret_cast<const uint4*>(res + row * C)[ch]);
                load_floats(bv, rb, ch * W, 0.f);
#pragma unroll
                for (int k = 0; k < W; ++k) xv[i][k] += rv[k] + bv[k];
                const uint4 packed = pack(xv[i]);
                reinterpret_cast<uint4*>(sum + row * C)[ch] = packed;
                unpack(xv[i], packed);  // the rounded sum, as the layer norm of the stored one would see
            }
        }
#pragma unroll
        for (int k = 0; k < W; ++k) {
            if (ch >= NC) xv[i][k] = 0.f;
            s += xv[i][k];
        }
    }
    const float m = warp_sum(s) / C;
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < CH; ++i)
#pragma unroll
        for (int k = 0; k < W; ++k) {
            float d = lane + 32 * i < NC ? xv[i][k] - m : 0.f;
            v += d * d;
        }
    const float r = rsqrtf(warp_sum(v) / C + eps);
    uint4* o = reinterpret_cast<uint4*>(out + row * C);
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        const int ch = lane + 32 * i;
        if (ch >= NC) continue;
        float y[W], wk[W], bk[W];
        load_floats(wk, w, ch * W, 1.f);  // 16-byte loads: lanes read adjacent chunks of w and b
        load_floats(bk, b, ch * W, 0.f);
#pragma unroll
        for (int k = 0; k < W; ++k) y[k] = (xv[i][k] - m) * r * wk[k] + bk[k];
        o[ch] = pack(y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// The backward kernels' column sums over their rows: dw and db (the weight gradients, with
// part.dw) and ds (the column sums of dx itself, add_layer_norm's residual-bias gradient, with
// part.ds). Each block sums its rows in shared memory, zeroed before the rows are visited, and writes
// them at the end as its row of the (blocks, C) partials, which sum_block_parts_kernel adds. ds has
// ds_rows rows of C there (the group kernel's: one for each of its groups of warps), summed at the end.
struct Parts {
    float *dw, *db, *ds;  // (gridDim.x, C) each, or null (dw and db are both null or neither)
};
struct BlockSums {
    float *dw, *db, *ds;  // dw, db (C,), ds (ds_rows, C) in dynamic shared memory, where the part is not null
};
__host__ __device__ constexpr int block_sums_floats(int C, bool need_w, bool need_ds, int ds_rows) {
    return (need_w ? 2 * C : 0) + (need_ds ? ds_rows * C : 0);
}
__device__ __forceinline__ BlockSums zeroed_block_sums(int C, const Parts& part, int ds_rows = 1) {
    extern __shared__ float smem[];
    const int n = block_sums_floats(C, part.dw != nullptr, part.ds != nullptr, ds_rows);
    for (int c = threadIdx.x; c < n; c += blockDim.x) smem[c] = 0.f;
    return BlockSums{smem, smem + C, smem + (part.dw ? 2 * C : 0)};
}
__device__ __forceinline__ void store_block_sums(int C, const BlockSums& sums, const Parts& part, int ds_rows = 1) {
    __syncthreads();  // every warp has added its shares
    const int64_t at = (int64_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        if (part.dw) {
            part.dw[at + c] = sums.dw[c];
            part.db[at + c] = sums.db[c];
        }
        if (part.ds) {
            float s = 0.f;
            for (int q = 0; q < ds_rows; ++q) s += sums.ds[q * C + c];
            part.ds[at + c] = s;
        }
    }
}

// outs[y] (C,) = the column sums of the y-th (P, C) partials, part + y P C, for blockIdx.y = y (a null
// out is skipped): the backward kernels' sums, in one launch
struct PartOuts {
    float* out[3];
};
__global__ void sum_block_parts_kernel(PartOuts outs, const float* __restrict__ part, int P, int C) {
    float* out = outs.out[blockIdx.y];
    if (out != nullptr) sum_parts(out, part + (int64_t)blockIdx.y * P * C, P, C);
}

// dout (N, C) -> dx (N, C); per-block partial dw, db, ds (gridDim.x, C). One warp per row; lane l
// owns columns l, l + 32, ... (at most CPL of them, C <= 32 CPL): the row's values and the lane's
// share of dw and db stay in registers across all the rows the warp visits, and each warp adds its
// shares to the block's shared-memory sums once at the end (not an atomic per element); ds, where
// asked, by an atomic per element into the block's sums (this kernel is the fallback of the group
// kernel below, and registers held for ds would cost every call).
template <typename T, int CPL>
__global__ void layernorm_backward_kernel(T* __restrict__ dx, Parts part, const T* __restrict__ dout,
                                          const T* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ mean, const float* __restrict__ rstd, int64_t N,
                                          int C, const T* __restrict__ dres) {
    const BlockSums sums = zeroed_block_sums(C, part);
    if (part.ds) __syncthreads();  // zeroed before the rows' atomics
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    float acc_dw[CPL], acc_db[CPL], wc[CPL];
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
        int c = lane + 32 * i;
        acc_dw[i] = acc_db[i] = 0.f;
        wc[i] = c < C ? (w ? w[c] : 1.f) : 0.f;
    }
    for (int64_t row = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += (int64_t)gridDim.x * warps) {
        const T* g = dout + row * C;
        const T* xr = x + row * C;
        const float m = mean[row], r = rstd[row];
        float gv[CPL], xh[CPL];
        float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
        for (int i = 0; i < CPL; ++i) {
            int c = lane + 32 * i;
            gv[i] = c < C ? ldf(g, c) : 0.f;
            xh[i] = c < C ? (ldf(xr, c) - m) * r : 0.f;
            float gw = gv[i] * wc[i];
            sum_g += gw;
            sum_gx += gw * xh[i];
        }
        const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
        T* d = dx + row * C;
#pragma unroll
        for (int i = 0; i < CPL; ++i) {
            int c = lane + 32 * i;
            if (c < C) {
                const float o = (gv[i] * wc[i] - mean_g - xh[i] * mean_gx) * r + (dres ? ldf(dres + row * C, c) : 0.f);
                stf(d, c, o);
                if (part.ds) atomicAdd(&sums.ds[c], o);
            }
            acc_dw[i] += gv[i] * xh[i];
            acc_db[i] += gv[i];
        }
    }
    if (!part.dw && !part.ds) return;
    __syncthreads();
    if (part.dw)
#pragma unroll
        for (int i = 0; i < CPL; ++i) {
            int c = lane + 32 * i;
            if (c < C) {
                atomicAdd(&sums.dw[c], acc_dw[i]);
                atomicAdd(&sums.db[c], acc_db[i]);
            }
        }
    store_block_sums(C, sums, part);
}

// The weights of chunk `ch` (W columns; 1 without weights, 0 past the row), from L1 where they stay:
// re-read for each row rather than held in registers for the whole kernel.
template <int W>
__device__ __forceinline__ void load_weights(float (&wc)[W], const float* __restrict__ w, int ch, int NC) {
    if (ch < NC && w) {
        load_floats(wc, w, ch * W, 0.f);
    } else {
#pragma unroll
        for (int k = 0; k < W; ++k) wc[k] = ch < NC ? 1.f : 0.f;
    }
}

// The same with 16-byte accesses (C % kVec<T> == 0, at most 128 chunks of kVec<T> columns, rows
// 16-byte aligned) and G = ceil(chunks / 32) warps to a row, lane l of the group's warp g owning
// chunk 32 g + l: a thread holds one chunk of a row and its shares of dw and db, so that with few
// registers a thread many warps share an SM. (The kernel is bound by its arithmetic's latency, not by
// the memory: with a row a warp and its chunks in registers, 12 warps an SM issued an instruction
// every 8.6 cycles and moved 30% of the DRAM's bandwidth, Nsight Compute at gpt2_124m's shape; 32
// warps an SM here are 16-20% faster there.) A block is P groups of G warps; group p walks the rows
// p + P blockIdx.x, then on by P gridDim.x. A row's two sums meet across its warps in shared memory, a
// slot a warp, behind the group's named barrier; rows alternate between two sets of slots, so that
// one barrier a row orders both a row's reads and the next row but one's writes. With dres (RES), dx
// also adds dres (the gradient that reached x's residual stream by the other path). With DS, a thread
// also adds its chunk of dx into its group's row of the block's ds sums, in shared memory: a slot of
// its own (no atomics), where registers held across the rows would spill.
// Rows a block: blocks of 8 warps (9 at G = 3), up to 64 registers a thread
constexpr int group_rows(int G) { return G == 3 ? 3 : 8 / G; }
constexpr int group_blocks_per_sm(int G) { return G == 3 ? 3 : 4; }

template <typename T, int G, bool RES, bool DS>
__global__ void __launch_bounds__(32 * G * group_rows(G), group_blocks_per_sm(G))
    layernorm_backward_group_kernel(T* __restrict__ dx, Parts part, const T* __restrict__ dout,
                                    const T* __restrict__ x, const float* __restrict__ w,
                                    const float* __restrict__ mean, const float* __restrict__ rstd, int64_t N, int C,
                                    const T* __restrict__ dres) {
    constexpr int W = kVec<T>;
    constexpr int P = group_rows(G);
    const BlockSums sums = zeroed_block_sums(C, part, P);
    __shared__ float2 row_sums[2][G * P];  // [row parity][warp of the block]: a warp's sum of g w and of g w x^
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p = warp / G, NC = C / W, ch = 32 * (warp % G) + lane;
    const bool in = ch < NC;
    float acc_dw[W], acc_db[W];
#pragma unroll
    for (int k = 0; k < W; ++k) acc_dw[k] = acc_db[k] = 0.f;
    float4* acc_ds = DS && in ? reinterpret_cast<float4*>(sums.ds + p * C + ch * W) : nullptr;  // W / 4 of them
    if constexpr (DS) __syncthreads();  // zeroed
    const uint4 zero = make_uint4(0, 0, 0, 0);  // a chunk past the row: 0 in float32 and bf16 alike
    int parity = 0;
    for (int64_t row = (int64_t)blockIdx.x * P + p; row < N; row += (int64_t)gridDim.x * P, parity ^= 1) {
        const float m = mean[row], r = rstd[row];
        const int64_t at = row * C;
        const uint4 gp = in ? reinterpret_cast<const uint4*>(dout + at)[ch] : zero;
        const uint4 xp = in ? reinterpret_cast<const uint4*>(x + at)[ch] : zero;
        uint4 rp = zero;
        if constexpr (RES) rp = in ? reinterpret_cast<const uint4*>(dres + at)[ch] : zero;
        float wc[W], gv[W], xh[W], sum_g = 0.f, sum_gx = 0.f;
        load_weights(wc, w, ch, NC);  // from L1, rather than registers held for the whole walk
        unpack(gv, gp);
        unpack(xh, xp);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            xh[k] = (xh[k] - m) * r;
            const float gw = gv[k] * wc[k];
            sum_g += gw;
            sum_gx += gw * xh[k];
        }
        sum_g = warp_sum(sum_g);
        sum_gx = warp_sum(sum_gx);
        if constexpr (G > 1) {
            if (lane == 0) row_sums[parity][warp] = make_float2(sum_g, sum_gx);
            asm volatile("bar.sync %0, %1;\n" ::"r"(1 + p), "r"(32 * G) : "memory");
            sum_g = sum_gx = 0.f;
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float2 s = row_sums[parity][p * G + q];
                sum_g += s.x;
                sum_gx += s.y;
            }
        }
        sum_g /= C;
        sum_gx /= C;
        float o[W], rv[W];
        if constexpr (RES) unpack(rv, rp);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            o[k] = (gv[k] * wc[k] - sum_g - xh[k] * sum_gx) * r;
            if constexpr (RES) o[k] += rv[k];
            acc_dw[k] += gv[k] * xh[k];
            acc_db[k] += gv[k];
        }
        if (in) reinterpret_cast<uint4*>(dx + at)[ch] = pack(o);
        if constexpr (DS) {
            if (in)
#pragma unroll
                for (int q = 0; q < W / 4; ++q) {
                    float4 a = acc_ds[q];
                    a.x += o[4 * q], a.y += o[4 * q + 1], a.z += o[4 * q + 2], a.w += o[4 * q + 3];
                    acc_ds[q] = a;
                }
        }
    }
    if (!part.dw && !DS) return;
    __syncthreads();
    if (part.dw && in)
#pragma unroll
        for (int k = 0; k < W; ++k) {
            atomicAdd(&sums.dw[ch * W + k], acc_dw[k]);
            atomicAdd(&sums.db[ch * W + k], acc_db[k]);
        }
    store_block_sums(C, sums, part, P);
}

// The same for any C (rows wider than 2048): an atomic per element into the block's shared sums
template <typename T>
__global__ void layernorm_backward_wide_kernel(T* __restrict__ dx, Parts part, const T* __restrict__ dout,
                                               const T* __restrict__ x, const float* __restrict__ w,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               int64_t N, int C, const T* __restrict__ dres) {
    const BlockSums sums = zeroed_block_sums(C, part);
    __syncthreads();
    int lane = threadIdx.x & 31;
    int warps = blockDim.x >> 5;
    for (int64_t row = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += (int64_t)gridDim.x * warps) {
        const T* g = dout + row * C;
        const T* xr = x + row * C;
        float m = mean[row], r = rstd[row];
        float sum_g = 0.f, sum_gx = 0.f;
        for (int c = lane; c < C; c += 32) {
            float gc = ldf(g, c);
            float gw = w ? gc * w[c] : gc;
            float xhat = (ldf(xr, c) - m) * r;
            sum_g += gw;
            sum_gx += gw * xhat;
        }
        float mean_g = warp_sum(sum_g) / C;
        float mean_gx = warp_sum(sum_gx) / C;
        T* d = dx + row * C;
        for (int c = lane; c < C; c += 32) {
            float gc = ldf(g, c);
            float gw = w ? gc * w[c] : gc;
            float xhat = (ldf(xr, c) - m) * r;
            const float o = (gw - mean_g - xhat * mean_gx) * r + (dres ? ldf(dres + row * C, c) : 0.f);
            stf(d, c, o);
            if (part.dw) {
                atomicAdd(&sums.dw[c], gc * xhat);
                atomicAdd(&sums.db[c], gc);
            }
            if (part.ds) atomicAdd(&sums.ds[c], o);
        }
    }
    if (part.dw || part.ds) store_block_sums(C, sums, part);
}

// 16-byte chunks per lane for rows of C elements of T (1..4), or 0 where the vector kernels do not
// apply (C % kVec<T> != 0, more than 128 chunks, unaligned pointers; null ones count as aligned)
template <typename T, typename... P>
int vec_chunks(int64_t C, const P*... ptrs) {
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(ptrs) % 16 == 0) && ...);
    if (!aligned || C % kVec<T> != 0 || C / kVec<T> > 128) return 0;
    return (int)ceil_div(C / kVec<T>, 32);
}

template <typename T>
void layernorm_forward_typed(int device, T* out, float* mean, float* rstd, const T* x, const float* w,
                             const float* b, int64_t N, int64_t C, float eps, const T* res = nullptr,
                             const float* rb = nullptr, T* sum = nullptr) {
    if (N == 0) return;
    use_device(device);
    int warps = 8;
    const unsigned grid = (unsigned)ceil_div(N, warps);
    cudaStream_t st = stream(device);
    auto launch = [&](auto kernel) {
        kernel<<<grid, warps * 32, 0, st>>>(out, mean, rstd, x, res, rb, sum, w, b, N, (int)C, eps);
    };
    switch (vec_chunks<T>(C, out, x, w, b, res, rb, sum)) {
        case 1: launch(layernorm_forward_vec_kernel<T, 1>); break;
        case 2: launch(layernorm_forward_vec_kernel<T, 2>); break;
        case 3: launch(layernorm_forward_vec_kernel<T, 3>); break;
        case 4: launch(layernorm_forward_vec_kernel<T, 4>); break;
        default: launch(layernorm_forward_kernel<T>);
    }
    check_launch("layer_norm");
}

template <typename T>
void layernorm_backward_typed(int device, T* dx, float* dw, float* db, const T* dout, const T* x, const float* w,
                              const float* mean, const float* rstd, int64_t N, int64_t C, const T* dres = nullptr,
                              float* ds = nullptr) {
    use_device(device);
    cudaStream_t st = stream(device);
    const bool need_w = dw != nullptr || db != nullptr;
    if (N == 0) {
        for (float* out : {dw, db, ds})
            if (out) fill(device, F32, out, 0.0, C);
        return;
    }
    // One wave: as many blocks as fit on the GPU at once, each walking rows with a grid stride (a
    // second, partial wave would start its rows late); the column sums' partials have a row per block.
    // `warps` a block, `rows` at a time a block, ds_rows rows of ds sums a block.
    auto launch = [&](auto kernel, int warps = 4, int rows = 4, int ds_rows = 1) {
        const std::size_t smem = block_sums_floats((int)C, need_w, ds != nullptr, ds_rows) * sizeof(float);
        if (smem > 48 * 1024)
            check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                  "layer_norm_backward");
        int per_sm = 0;
        check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * 32, smem), "layer_norm_backward");
        const int blocks = (int)std::min<int64_t>(ceil_div(N, rows), (int64_t)std::max(1, per_sm) * sm_count(device));
        // partials (blocks, C): dw's, db's, ds's, in that order
        const int64_t P = (int64_t)blocks * C;
        float* part = nullptr;
        std::size_t held = 0;
        if (smem) part = (float*)device_alloc(sizeof(float) * P * (ds ? 3 : 2), device, &held);
        const Parts parts{need_w ? part : nullptr, need_w ? part + P : nullptr, ds ? part + 2 * P : nullptr};
        kernel<<<blocks, warps * 32, smem, st>>>(dx, parts, dout, x, w, mean, rstd, N, (int)C, dres);
        if (smem) {
            const PartOuts outs{{dw, db, ds}};
            sum_block_parts_kernel<<<dim3((unsigned)ceil_div(C, 32), ds ? 3 : 2), dim3(32, 32), 0, st>>>(
                outs, part, blocks, (int)C);
            device_free(part, held, device);
        }
    };
    // 16-byte chunks where the rows allow (up to 128 of them: G = ceil(chunks / 32) warps to a row,
    // group_rows(G) rows a block), else columns per lane in one warp a row, registers sized for C (up to
    // 1024; wider rows take the atomic kernel)
    const int chunks = vec_chunks<T>(C, dx, x, dout, dres);
    auto launch_vec = [&](auto with_res, auto with_ds) {
        constexpr bool RES = decltype(with_res)::value, DS = decltype(with_ds)::value;
        auto groups = [&](auto kernel, int G) { launch(kernel, G * group_rows(G), group_rows(G), group_rows(G)); };
        if (chunks == 1) groups(layernorm_backward_group_kernel<T, 1, RES, DS>, 1);
        else if (chunks == 2) groups(layernorm_backward_group_kernel<T, 2, RES, DS>, 2);
        else if (chunks == 3) groups(layernorm_backward_group_kernel<T, 3, RES, DS>, 3);
        else groups(layernorm_backward_group_kernel<T, 4, RES, DS>, 4);
    };
    auto launch_vec_ds = [&](auto with_res) {
        if (ds) launch_vec(with_res, std::true_type{});
        else launch_vec(with_res, std::false_type{});
    };
    if (chunks > 0 && dres) launch_vec_ds(std::true_type{});
    else if (chunks > 0) launch_vec_ds(std::false_type{});
    else if (C <= 128) launch(layernorm_backward_kernel<T, 4>);
    else if (C <= 256) launch(layernorm_backward_kernel<T, 8>);
    else if (C <= 384) launch(layernorm_backward_kernel<T, 12>);
    else if (C <= 512) launch(layernorm_backward_kernel<T, 16>);
    else if (C <= 768) launch(layernorm_backward_kernel<T, 24>);
    else if (C <= 1024) launch(layernorm_backward_kernel<T, 32>);
    else launch(layernorm_backward_wide_kernel<T>);
    check_launch("layer_norm_backward");
}

}  // namespace

void layernorm_forward(int device, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
    layernorm_forward_typed<float>(device, out, mean, rstd, x, w, b, N, C, eps);
}

void layernorm_backward(int device, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
    layernorm_backward_typed<float>(device, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

void layernorm_forward_dt(int device, int dtype, void* out, float* mean, float* rstd, const void* x, const float* w,
                          const float* b, int64_t N, int64_t C, float eps) {
    if (dtype == F32) layernorm_forward_typed<float>(device, (float*)out, mean, rstd, (const float*)x, w, b, N, C, eps);
    else if (dtype == BF16)
        layernorm_forward_typed<__nv_bfloat16>(device, (__nv_bfloat16*)out, mean, rstd, (const __nv_bfloat16*)x, w, b,
                                               N, C, eps);
    else unsupported("layer_norm", dtype);
}

void layernorm_backward_dt(int device, int dtype, void* dx, float* dw, float* db, const void* dout, const void* x,
                           const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                           const void* dres, float* ds) {
    if (dtype == F32)
        layernorm_backward_typed<float>(device, (float*)dx, dw, db, (const float*)dout, (const float*)x, w, mean, rstd,
                                        N, C, (const float*)dres, ds);
    else if (dtype == BF16)
        layernorm_backward_typed<__nv_bfloat16>(device, (__nv_bfloat16*)dx, dw, db, (const __nv_bfloat16*)dout,
                                                (const __nv_bfloat16*)x, w, mean, rstd, N, C,
                                                (const __nv_bfloat16*)dres, ds);
    else unsupported("layer_norm_backward", dtype);
}

void layernorm_add_forward_dt(int device, int dtype, void* out, void* sum, float* mean, float* rstd, const void* x,
                              const void* res, const float* rb, const float* w, const float* b, int64_t N, int64_t C,
                              float eps) {
    if (dtype == F32)
        layernorm_forward_typed<float>(device, (float*)out, mean, rstd, (const float*)x, w, b, N, C, eps,
                                       (const float*)res, rb, (float*)sum);
    else if (dtype == BF16)
        layernorm_forward_typed<__nv_bfloat16>(device, (__nv_bfloat16*)out, mean, rstd, (const __nv_bfloat16*)x, w, b,
                                               N, C, eps, (const __nv_bfloat16*)res, rb, (__nv_bfloat16*)sum);
    else unsupported("layer_norm", dtype);
}

}  // namespace engine
