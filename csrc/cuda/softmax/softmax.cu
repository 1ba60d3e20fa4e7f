// Softmax and log-softmax over the last axis (forward, backward), and cross-entropy fused with
// its backward: the forward keeps only each row's logsumexp, the backward rebuilds softmax - onehot.
// The fused classifier (F.linear_cross_entropy) has one kernel for both: the loss, and the gradient
// written over the logits; and a scale by a device scalar for its backward.
#include <type_traits>

#include "fp8/fp8.cuh"
#include "runtime/common.cuh"
#include "runtime/tma.cuh"
#include "softmax/softmax.h"

namespace engine {
namespace {

// running (max, sum of exp(x - max)) pairs, merged across threads
struct MaxSum {
    float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.f};
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
        v = merge(v, w);
    }
    return v;
}
__device__ MaxSum block_merge(MaxSum v) {
    __shared__ float sm[32], ss[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_merge(v);
    __syncthreads();
    if (lane == 0) { sm[warp] = v.m; ss[warp] = v.s; }
    __syncthreads();
    MaxSum r = lane < nw ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.f};
    return warp_merge(r);
}
__device__ __forceinline__ MaxSum add_value(MaxSum a, float x) {
    if (x == -INFINITY) return a;  // a masked entry adds nothing (and -inf - -inf would be NaN)
    if (x > a.m) return {x, a.s * __expf(a.m - x) + 1.f};
    return {a.m, a.s + __expf(x - a.m)};
}

// x (N, L) -> out (N, L); one warp (blockDim 32) or one block per row
__global__ void softmax_forward_kernel(float* __restrict__ out, const float* __restrict__ x, int64_t L, bool log) {
    int64_t row = blockIdx.x;
    const float* xr = x + row * L;
    float* o = out + row * L;
    MaxSum ms{-INFINITY, 0.f};
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) ms = add_value(ms, xr[j]);
    ms = blockDim.x == 32 ? warp_merge(ms) : block_merge(ms);
    if (log) {
        float lse = ms.m + logf(ms.s);
        for (int64_t j = threadIdx.x; j < L; j += blockDim.x) o[j] = xr[j] - lse;
    } else {
        float inv = 1.f / ms.s;
        for (int64_t j = threadIdx.x; j < L; j += blockDim.x) o[j] = expf(xr[j] - ms.m) * inv;
    }
}

// softmax: dx = y (g - sum(g y));  log_softmax: dx = g - exp(y) sum(g)
__global__ void softmax_backward_kernel(float* __restrict__ dx, const float* __restrict__ y, const float* __restrict__ g,
                                        int64_t L, bool log) {
    __shared__ float shared[32];
    int64_t row = blockIdx.x;
    const float* yr = y + row * L;
    const float* gr = g + row * L;
    float* d = dx + row * L;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) s += log ? gr[j] : gr[j] * yr[j];
    s = blockDim.x == 32 ? warp_sum(s) : block_sum(s, shared);
    if (log)
        for (int64_t j = threadIdx.x; j < L; j += blockDim.x) d[j] = gr[j] - expf(yr[j]) * s;
    else
        for (int64_t j = threadIdx.x; j < L; j += blockDim.x) d[j] = yr[j] * (gr[j] - s);
}

__device__ __forceinline__ float ldf(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// The two passes over one row of logits x (V,) that the cross-entropy kernels share, float32 or bf16.
// VEC: V % kVec == 0 and the row 16-byte aligned, so each thread reads (and writes) 16 bytes at a time.

// 2^x on the SFU (ex2.approx.ftz, 2 ulp): e^x as ex2(x log2 e), the subtraction folded into one FFMA
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
constexpr float kLog2e = 1.4426950408889634f;

// this thread's share of the row's (max, sum of exp(x - max)); merge across the block afterwards.
// The vector path keeps one running max: a chunk above it rescales the sum once (one exp), where a
// merge of each chunk's own pair cost two more exps and the branches around them (the kernel over
// gpt2_124m's logits was bound by those instructions, not by memory).
template <typename T, bool VEC>
__device__ __forceinline__ MaxSum row_max_sum(const T* xr, int64_t V) {
    MaxSum ms{-INFINITY, 0.f};
    if constexpr (VEC) {
        constexpr int W = kVec<T>;
        const uint4* xv = reinterpret_cast<const uint4*>(xr);
        for (int64_t c = threadIdx.x; c < V / W; c += blockDim.x) {
            float f[W];
            unpack(f, xv[c]);
            float m = f[0];
#pragma unroll
            for (int i = 1; i < W; ++i) m = fmaxf(m, f[i]);
            if (m > ms.m) {
                ms.s = ms.m == -INFINITY ? 0.f : ms.s * ex2((ms.m - m) * kLog2e);
                ms.m = m;
            }
            if (ms.m == -INFINITY) continue;  // every entry so far masked
            const float m2 = ms.m * kLog2e;
#pragma unroll
            for (int i = 0; i < W; ++i) ms.s += ex2(fmaf(f[i], kLog2e, -m2));
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) ms = add_value(ms, ldf(xr, j));
    }
    return ms;
}

// d (V,) = (exp(x - lse) - onehot(t)) * scale. d may be x itself: each element is read, then written,
// by the same thread. The thread that reads x[t] (none when t is out of range) gets it in x_target
// and true back. With d8 (bf16 only), d's E5M2 codes too: fp8(d * kDlogitsFp8Scale) of the stored values.
template <typename T, bool VEC>
__device__ __forceinline__ bool write_softmax_minus_onehot(T* d, const T* xr, int64_t t, float lse, float scale,
                                                           int64_t V, float& x_target, uint8_t* d8 = nullptr) {
    bool saw_target = false;
    if constexpr (VEC) {
        constexpr int W = kVec<T>;
        const uint4* xv = reinterpret_cast<const uint4*>(xr);
        uint4* dv = reinterpret_cast<uint4*>(d);
        const float lse2 = lse * kLog2e;
        for (int64_t c = threadIdx.x; c < V / W; c += blockDim.x) {
            float f[W];
            unpack(f, xv[c]);
            const int64_t in_chunk = t - c * W;  // the target's place in this chunk, if it is in it
            const int ti = in_chunk >= 0 && in_chunk < W ? (int)in_chunk : -1;
#pragma unroll
            for (int i = 0; i < W; ++i) {
                const bool hit = i == ti;
                if (hit) x_target = f[i], saw_target = true;
                // bf16 out: the SFU's exp (2 ulp of float32) is far inside the output's rounding
                const float e = std::is_same_v<T, float> ? expf(f[i] - lse) : ex2(fmaf(f[i], kLog2e, -lse2));
                f[i] = (e - (hit ? 1.f : 0.f)) * scale;
            }
            const uint4 packed = pack(f);
            dv[c] = packed;
            if constexpr (W == 8) {
                if (d8 != nullptr) {  // the codes of the bf16 values just stored
                    unpack(f, packed);
                    uint32_t q[2];
#pragma unroll
                    for (int i = 0; i < W; i += 4)
                        q[i / 4] = fp8::to_fp8x2<FP8_E5M2>(f[i] * kDlogitsFp8Scale, f[i + 1] * kDlogitsFp8Scale) |
                                   (uint32_t)fp8::to_fp8x2<FP8_E5M2>(f[i + 2] * kDlogitsFp8Scale,
                                                                     f[i + 3] * kDlogitsFp8Scale) << 16;
                    reinterpret_cast<uint2*>(d8)[c] = make_uint2(q[0], q[1]);
                }
            }
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float x = ldf(xr, j);
            if (j == t) x_target = x, saw_target = true;
            const T v = (T)((expf(x - lse) - (j == t ? 1.f : 0.f)) * scale);
            d[j] = v;
            if (d8 != nullptr) d8[j] = fp8::to_fp8<FP8_E5M2>((float)v * kDlogitsFp8Scale);
        }
    }
    return saw_target;
}

template <typename T, bool VEC>
__device__ __forceinline__ void zero_row(T* d, int64_t V, uint8_t* d8 = nullptr) {
    if constexpr (VEC) {
        uint4* dv = reinterpret_cast<uint4*>(d);
        for (int64_t c = threadIdx.x; c < V / kVec<T>; c += blockDim.x) dv[c] = make_uint4(0u, 0u, 0u, 0u);
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) d[j] = (T)0.f;
    }
    if (d8 != nullptr)
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) d8[j] = 0;
}

// logits (N, V), targets (N,) -> losses (N,) (0 where ignored), lse (N,); logits float or bf16.
template <typename T, bool VEC>
__global__ void cross_entropy_forward_kernel(float* __restrict__ losses, float* __restrict__ lse,
                                             const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                             int64_t V, int64_t ignore_index) {
    int64_t row = blockIdx.x;
    const T* xr = logits + row * V;
    MaxSum ms = row_max_sum<T, VEC>(xr, V);
    ms = blockDim.x == 32 ? warp_merge(ms) : block_merge(ms);
    if (threadIdx.x == 0) {
        float l = ms.m + logf(ms.s);
        lse[row] = l;
        int64_t t = targets[row];
        if (t == ignore_index) losses[row] = 0.f;
        else if (t < 0 || t >= V) losses[row] = NAN;  // out-of-range target: visible, no host sync to raise
        else losses[row] = l - ldf(xr, t);
    }
}

// dlogits (N, V) = (exp(logits - lse) - onehot(target)) * g[row]; 0 on ignored rows. dlogits may
// be logits itself (each element is read, then written, by the same thread): the classifier's
// gradient then takes the logits' memory instead of a second (N, V) buffer.
template <typename T, bool VEC>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const int64_t* __restrict__ targets,
                                              const float* __restrict__ lse, const float* __restrict__ g, int64_t V,
                                              int64_t ignore_index) {
    int64_t row = blockIdx.x;
    int64_t t = targets[row];
    float gr = t == ignore_index ? 0.f : g[row];
    float x_target;
    write_softmax_minus_onehot<T, VEC>(dlogits + row * V, logits + row * V, t, lse[row], gr, V, x_target);
}

// The fused classifier's loss and gradient in one kernel (engine/ops/classifier.py):
// logits (N, V), targets (N,) -> losses (N,) float32 (0 where ignored), and logits overwritten in place
// by softmax - onehot(target), the gradient of sum(losses) (0 on ignored rows, which are not read),
// times grad_scale[0] where given (a float32 on the device: the mean's 1 / rows kept).
// Pass 1 reads the row for its logsumexp; pass 2 reads it again and writes the gradient over it.
// The loss (lse - x[t]) comes from the thread that reads x[t] in pass 2, before it overwrites it.
template <typename T, bool VEC>
__global__ void cross_entropy_with_grad_kernel(float* __restrict__ losses, T* logits,
                                               const int64_t* __restrict__ targets, int64_t V, int64_t ignore_index,
                                               uint8_t* __restrict__ dlogits8, const float* __restrict__ grad_scale) {
    int64_t row = blockIdx.x;
    T* xr = logits + row * V;
    uint8_t* d8 = dlogits8 != nullptr ? dlogits8 + row * V : nullptr;
    int64_t t = targets[row];  // the same for the whole block: no thread skips a barrier below
    if (t == ignore_index) {
        zero_row<T, VEC>(xr, V, d8);
        if (threadIdx.x == 0) losses[row] = 0.f;
        return;
    }
    MaxSum ms = row_max_sum<T, VEC>(xr, V);
    ms = blockDim.x == 32 ? warp_merge(ms) : block_merge(ms);
    float lse = ms.m + logf(ms.s);
    if (threadIdx.x == 0 && (t < 0 || t >= V)) losses[row] = NAN;  // out-of-range target: visible, no host sync
    float x_target;
    const float gs = grad_scale != nullptr ? *grad_scale : 1.f;
    if (write_softmax_minus_onehot<T, VEC>(xr, xr, t, lse, gs, V, x_target, d8)) losses[row] = lse - x_target;
}

// The same for long rows (a language model's vocabulary), each row read from memory once: a block an
// SM walks the rows blockIdx.x, + gridDim.x, ..., each copied whole into shared memory by one bulk copy
// (TMA) while the block works on the row before, in the other of two buffers. The two passes read the
// row from shared memory, so the logits cross the memory bus once each way (the two-pass kernel
// above reads them twice: the row is gone from the L2 by the second pass). Rows of up to
// kStagedBytes / 2 bytes (57856 bf16 values) where the device gives a block that much shared memory;
// same contract as cross_entropy_with_grad_kernel.
constexpr int kStagedThreads = 1024;
constexpr int kStagedBytes = 226 * 1024;  // the two buffers: Hopper's 227 KB a block, less 1 KB for the block's own
// Shorter rows stay with the two-pass kernel: its second pass finds them in the L2, and a block an SM
// working on one short row at a time waits on its own barriers (H100, 16384 rows: 397 against 218 us
// at 8192 bf16 values, 746 against 968 at 32000, 1159 against 1649 at 50304).
constexpr int kStagedMinRowBytes = 64000;  // 32000 bf16 values

template <typename T>
__global__ void __launch_bounds__(kStagedThreads, 1)
    cross_entropy_with_grad_staged_kernel(float* __restrict__ losses, T* logits, const int64_t* __restrict__ targets,
                                          int64_t N, int64_t V, int64_t ignore_index, uint8_t* dlogits8,
                                          const float* __restrict__ grad_scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // bulk copies: Hopper on (the launcher checks)
    extern __shared__ __align__(128) unsigned char staged[];  // two rows of V T
    __shared__ __align__(8) uint64_t full[2];                 // buffer b holds its row
    const uint32_t row_bytes = (uint32_t)(V * sizeof(T));
    const uint32_t buffers = (uint32_t)__cvta_generic_to_shared(staged);
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(full);
    auto fetch = [&](int b, int64_t row) {  // one thread: row -> buffer b, landing on full[b]
        if (row >= N) return;
        tma::arrive_expect_tx(bar + 8 * b, row_bytes);
        tma::load_bytes(buffers + b * row_bytes, logits + row * V, row_bytes, bar + 8 * b);
    };
    if (threadIdx.x == 0) {
        tma::init(bar, 1);
        tma::init(bar + 8, 1);
        tma::fence_init();
        fetch(0, blockIdx.x);
        fetch(1, blockIdx.x + gridDim.x);
    }
    __syncthreads();
    const float gs = grad_scale != nullptr ? *grad_scale : 1.f;
    int it = 0;
    for (int64_t row = blockIdx.x; row < N; row += gridDim.x, ++it) {
        const int b = it & 1;
        const int64_t t = targets[row];
        T* out = logits + row * V;
        uint8_t* d8 = dlogits8 != nullptr ? dlogits8 + row * V : nullptr;
        tma::wait(bar + 8 * b, (it >> 1) & 1);
        if (t == ignore_index) {
            zero_row<T, true>(out, V, d8);
            if (threadIdx.x == 0) losses[row] = 0.f;
        } else {
            const T* x = reinterpret_cast<const T*>(staged + b * row_bytes);
            MaxSum ms = block_merge(row_max_sum<T, true>(x, V));
            const float lse = ms.m + logf(ms.s);
            if (threadIdx.x == 0 && (t < 0 || t >= V)) losses[row] = NAN;  // visible, no host sync
            float x_target;
            if (write_softmax_minus_onehot<T, true>(out, x, t, lse, gs, V, x_target, d8)) losses[row] = lse - x_target;
        }
        __syncthreads();  // every thread done with buffer b: it takes the row after next
        if (threadIdx.x == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads before the copy's writes
            fetch(b, row + 2 * (int64_t)gridDim.x);
        }
    }
#endif
}

// out (n,) = x (n,) * factor[0] with float32 arithmetic, x and out of T (they may be one buffer).
// The fused classifier's backward: its gradients (bf16 under autocast) times the loss's float32
// gradient, which lives on the device.
template <typename T, bool VEC>
__global__ void scale_kernel(T* out, const T* x, const float* __restrict__ factor, int64_t n) {
    float s = *factor;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    if constexpr (VEC) {
        constexpr int W = kVec<T>;
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        uint4* ov = reinterpret_cast<uint4*>(out);
        for (int64_t c = first; c < n / W; c += step) {
            float f[W];
            unpack(f, xv[c]);
#pragma unroll
            for (int i = 0; i < W; ++i) f[i] *= s;
            ov[c] = pack(f);
        }
    } else {
        for (int64_t j = first; j < n; j += step) out[j] = (T)(ldf(x, j) * s);
    }
}

int threads_for(int64_t L) {
    if (L <= 256) return 32;
    if (L <= 2048) return 128;
    return 512;
}

// whether rows of V elements of T can be read 16 bytes at a time
template <typename T>
bool vectorizable(const void* p, const void* q, int64_t V) {
    auto a = reinterpret_cast<std::uintptr_t>(p) | reinterpret_cast<std::uintptr_t>(q);
    return V % kVec<T> == 0 && a % 16 == 0;
}

template <typename T>
void ce_forward(int device, float* losses, float* lse, const T* logits, const int64_t* targets, int64_t N, int64_t V,
                int64_t ignore_index) {
    if (N == 0) return;
    use_device(device);
    cudaStream_t st = stream(device);
    if (vectorizable<T>(logits, logits, V))
        cross_entropy_forward_kernel<T, true><<<(unsigned)N, threads_for(V), 0, st>>>(losses, lse, logits, targets, V,
                                                                                     ignore_index);
    else
        cross_entropy_forward_kernel<T, false><<<(unsigned)N, threads_for(V), 0, st>>>(losses, lse, logits, targets, V,
                                                                                      ignore_index);
    check_launch("cross_entropy");
}

template <typename T>
void ce_backward(int device, T* dlogits, const T* logits, const int64_t* targets, const float* lse, const float* g,
                 int64_t N, int64_t V, int64_t ignore_index) {
    if (N == 0) return;
    use_device(device);
    cudaStream_t st = stream(device);
    if (vectorizable<T>(logits, dlogits, V))
        cross_entropy_backward_kernel<T, true><<<(unsigned)N, threads_for(V), 0, st>>>(dlogits, logits, targets, lse, g,
                                                                                      V, ignore_index);
    else
        cross_entropy_backward_kernel<T, false><<<(unsigned)N, threads_for(V), 0, st>>>(dlogits, logits, targets, lse,
                                                                                       g, V, ignore_index);
    check_launch("cross_entropy_backward");
}


// the shared memory a block may opt in to on `device` (cached)
int max_shared_per_block(int device) {
    static int bytes[64] = {};
    if (bytes[device] == 0)
        check(cudaDeviceGetAttribute(&bytes[device], cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
              "shared memory per block");
    return bytes[device];
}

template <typename T>
void ce_with_grad(int device, float* losses, T* logits, const int64_t* targets, int64_t N, int64_t V,
                  int64_t ignore_index, uint8_t* dlogits8, const float* grad_scale) {
    if (N == 0) return;
    use_device(device);
    cudaStream_t st = stream(device);
    const bool vec = vectorizable<T>(logits, logits, V) && reinterpret_cast<std::uintptr_t>(dlogits8) % 8 == 0;
    const int64_t row_bytes = V * (int64_t)sizeof(T), smem = 2 * row_bytes;  // two rows staged a block
    if (vec && row_bytes >= kStagedMinRowBytes && smem <= kStagedBytes && compute_capability(device) >= 90 &&
        smem + 1024 <= max_shared_per_block(device)) {  // a block an SM, rows staged
        auto kernel = cross_entropy_with_grad_staged_kernel<T>;
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "cross_entropy_with_grad_");
        const unsigned blocks = (unsigned)std::min<int64_t>(N, sm_count(device));
        kernel<<<blocks, kStagedThreads, (size_t)smem, st>>>(losses, logits, targets, N, V, ignore_index, dlogits8,
                                                             grad_scale);
    } else if (vec)
        cross_entropy_with_grad_kernel<T, true><<<(unsigned)N, threads_for(V), 0, st>>>(losses, logits, targets, V,
                                                                                       ignore_index, dlogits8,
                                                                                       grad_scale);
    else
        cross_entropy_with_grad_kernel<T, false><<<(unsigned)N, threads_for(V), 0, st>>>(losses, logits, targets, V,
                                                                                        ignore_index, dlogits8,
                                                                                        grad_scale);
    check_launch("cross_entropy_with_grad_");
}

template <typename T>
void scale_by(int device, T* out, const T* x, const float* factor, int64_t n) {
    if (n == 0) return;
    use_device(device);
    cudaStream_t st = stream(device);
    if (vectorizable<T>(out, x, n))
        scale_kernel<T, true><<<blocks_for(n / kVec<T>, 256), 256, 0, st>>>(out, x, factor, n);
    else
        scale_kernel<T, false><<<blocks_for(n, 256), 256, 0, st>>>(out, x, factor, n);
    check_launch("scale");
}

}  // namespace

void softmax_forward(int device, float* out, const float* x, int64_t N, int64_t L, bool log) {
    if (N == 0 || L == 0) return;
    use_device(device);
    softmax_forward_kernel<<<(unsigned)N, threads_for(L), 0, stream(device)>>>(out, x, L, log);
    check_launch(log ? "log_softmax" : "softmax");
}

void softmax_backward(int device, float* dx, const float* y, const float* g, int64_t N, int64_t L, bool log) {
    if (N == 0 || L == 0) return;
    use_device(device);
    softmax_backward_kernel<<<(unsigned)N, threads_for(L), 0, stream(device)>>>(dx, y, g, L, log);
    check_launch(log ? "log_softmax_backward" : "softmax_backward");
}

void cross_entropy_forward(int device, float* losses, float* lse, const float* logits, const int64_t* targets,
                           int64_t N, int64_t V, int64_t ignore_index) {
    ce_forward<float>(device, losses, lse, logits, targets, N, V, ignore_index);
}

void cross_entropy_backward(int device, float* dlogits, const float* logits, const int64_t* targets, const float* lse,
                            const float* g, int64_t N, int64_t V, int64_t ignore_index) {
    ce_backward<float>(device, dlogits, logits, targets, lse, g, N, V, ignore_index);
}

void cross_entropy_forward_dt(int device, int dtype, float* losses, float* lse, const void* logits,
                              const int64_t* targets, int64_t N, int64_t V, int64_t ignore_index) {
    if (dtype == F32) return ce_forward<float>(device, losses, lse, (const float*)logits, targets, N, V, ignore_index);
    if (dtype != BF16) unsupported("cross_entropy", dtype);
    ce_forward<__nv_bfloat16>(device, losses, lse, (const __nv_bfloat16*)logits, targets, N, V, ignore_index);
}

void cross_entropy_backward_dt(int device, int dtype, void* dlogits, const void* logits, const int64_t* targets,
                               const float* lse, const float* g, int64_t N, int64_t V, int64_t ignore_index) {
    if (dtype == F32)
        return ce_backward<float>(device, (float*)dlogits, (const float*)logits, targets, lse, g, N, V, ignore_index);
    if (dtype != BF16) unsupported("cross_entropy_backward", dtype);
    ce_backward<__nv_bfloat16>(device, (__nv_bfloat16*)dlogits, (const __nv_bfloat16*)logits, targets, lse, g, N, V,
                               ignore_index);
}

void cross_entropy_with_grad_dt(int device, int dtype, float* losses, void* logits, const int64_t* targets, int64_t N,
                                int64_t V, int64_t ignore_index, void* dlogits8, const float* grad_scale) {
    if (dlogits8 != nullptr && dtype != BF16)
        throw std::runtime_error("engine op 'cross_entropy_with_grad_': the FP8 copy needs bfloat16 logits");
    if (dlogits8 != nullptr && grad_scale != nullptr)  // the codes' fixed scale assumes |softmax - onehot| <= 1 as is
        throw std::runtime_error("engine op 'cross_entropy_with_grad_': the FP8 copy takes no gradient scale");
    if (dtype == F32)
        return ce_with_grad<float>(device, losses, (float*)logits, targets, N, V, ignore_index, nullptr, grad_scale);
    if (dtype != BF16) unsupported("cross_entropy_with_grad_", dtype);
    ce_with_grad<__nv_bfloat16>(device, losses, (__nv_bfloat16*)logits, targets, N, V, ignore_index,
                                (uint8_t*)dlogits8, grad_scale);
}

void scale_dt(int device, int dtype, void* out, const void* x, const float* factor, int64_t n) {
    if (dtype == F32) return scale_by<float>(device, (float*)out, (const float*)x, factor, n);
    if (dtype != BF16) unsupported("scale", dtype);
    scale_by<__nv_bfloat16>(device, (__nv_bfloat16*)out, (const __nv_bfloat16*)x, factor, n);
}

}  // namespace engine
