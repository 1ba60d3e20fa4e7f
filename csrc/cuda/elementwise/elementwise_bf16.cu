// bfloat16 kernels of the elementwise family (binary, unary, activation backward, where): bf16 in
// memory, float32 arithmetic in registers, 8 elements (16 bytes) per thread where the data allows.
// Reached from elementwise.cu's dispatch for dtype BF16.
#include "elementwise/elementwise.h"
#include "runtime/common.cuh"
#include "runtime/vec.cuh"

namespace engine {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

struct alignas(8) U8x8 {
    uint8_t v[8];
};

template <int OP>
__device__ __forceinline__ float bop(float a, float b) {
    if constexpr (OP == ADD) return a + b;
    else if constexpr (OP == SUB) return a - b;
    else if constexpr (OP == MUL) return a * b;
    else if constexpr (OP == DIV) return a / b;
    else if constexpr (OP == POW) return powf(a, b);
    else if constexpr (OP == MAXIMUM) return (a != a || a > b) ? a : b;
    else if constexpr (OP == MINIMUM) return (a != a || a < b) ? a : b;
    else if constexpr (OP == EQ) return a == b;
    else if constexpr (OP == NE) return a != b;
    else if constexpr (OP == LT) return a < b;
    else if constexpr (OP == LE) return a <= b;
    else if constexpr (OP == GT) return a > b;
    else return a >= b;
}

template <int OP, bool CMP>
__device__ __forceinline__ void put(void* out, int64_t i, float r) {
    if constexpr (CMP) static_cast<uint8_t*>(out)[i] = (uint8_t)(r != 0.f);
    else static_cast<bf16*>(out)[i] = __float2bfloat16(r);
}

// out (n,) = a OP b (same shape), a OP s, s OP b; 8 per thread (16-byte aligned, n % 8 == 0)
template <int OP, bool CMP>
__global__ void binary_vec_kernel(void* __restrict__ out, const B8* __restrict__ a, const B8* __restrict__ b, float s,
                                  int64_t nvec, int mode) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        B8 x{}, y{};
        if (mode != 2) x = a[i];
        if (mode != 1) y = b[i];
        if constexpr (CMP) {
            U8x8 r;
#pragma unroll
            for (int k = 0; k < 8; ++k)
                r.v[k] = (uint8_t)(bop<OP>(mode == 2 ? s : __bfloat162float(x.v[k]),
                                           mode == 1 ? s : __bfloat162float(y.v[k])) != 0.f);
            static_cast<U8x8*>(out)[i] = r;
        } else {
            B8 r;
#pragma unroll
            for (int k = 0; k < 8; ++k)
                r.v[k] = __float2bfloat16(bop<OP>(mode == 2 ? s : __bfloat162float(x.v[k]),
                                                  mode == 1 ? s : __bfloat162float(y.v[k])));
            static_cast<B8*>(out)[i] = r;
        }
    }
}

// out (shape) = a (broadcast) OP b (broadcast), strides in elements
template <int OP, bool CMP>
__global__ void binary_strided_kernel(void* __restrict__ out, const bf16* __restrict__ a, const bf16* __restrict__ b,
                                      float s, Strided sh, int64_t n, int mode) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oa = 0, ob = 0, rem = i;
        for (int d = sh.ndim - 1; d >= 0; --d) {
            int64_t c = rem % sh.shape[d];
            rem /= sh.shape[d];
            oa += c * sh.stride[0][d];
            ob += c * sh.stride[1][d];
        }
        float x = mode == 2 ? s : __bfloat162float(a[oa]);
        float y = mode == 1 ? s : __bfloat162float(b[ob]);
        put<OP, CMP>(out, i, bop<OP>(x, y));
    }
}

bool flat(const Strided& s, int mode) {
    if (s.ndim != 1) return false;
    return (mode == 2 || s.stride[0][0] == 1) && (mode == 1 || s.stride[1][0] == 1);
}

template <int OP, bool CMP>
void launch_binary(cudaStream_t st, void* out, const void* a, const void* b, float sc, int mode, const Strided& s,
                   int64_t n) {
    if (flat(s, mode) && n % 8 == 0 && aligned16(out) && (mode == 2 || aligned16(a)) && (mode == 1 || aligned16(b))) {
        int64_t nvec = n / 8;
        binary_vec_kernel<OP, CMP><<<blocks_for(nvec, kThreads), kThreads, 0, st>>>(out, (const B8*)a, (const B8*)b,
                                                                                    sc, nvec, mode);
        return;
    }
    Strided f = s;
    if (flat(s, mode)) {  // unaligned flat: strided kernel with unit strides
        f.ndim = 1;
        f.shape[0] = n;
        f.stride[0][0] = f.stride[1][0] = 1;
    }
    binary_strided_kernel<OP, CMP><<<blocks_for(n, kThreads), kThreads, 0, st>>>(out, (const bf16*)a, (const bf16*)b,
                                                                                sc, f, n, mode);
}

// ---- unary ---------------------------------------------------------------------------------------

__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

template <int OP>
__device__ __forceinline__ float uop(float x) {
    if constexpr (OP == NEG) return -x;
    else if constexpr (OP == EXP) return expf(x);
    else if constexpr (OP == LOG) return logf(x);
    else if constexpr (OP == ABS) return fabsf(x);
    else if constexpr (OP == SQRT) return sqrtf(x);
    else if constexpr (OP == TANH) return tanhf(x);
    else if constexpr (OP == SIGN) return (float)((x > 0.f) - (x < 0.f));
    else if constexpr (OP == SIGMOID) return 0.5f * (1.f + tanhf(0.5f * x));
    else if constexpr (OP == RELU) return x > 0.f ? x : 0.f;
    else return gelu_tanh(x);
}

// out (n,) = f(x); 8 per thread when aligned (tail by the scalar loop)
template <int OP>
__global__ void unary_kernel(bf16* __restrict__ out, const bf16* __restrict__ x, int64_t n, bool vec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t nvec = vec ? n / 8 : 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        B8 v = reinterpret_cast<const B8*>(x)[i];
#pragma unroll
        for (int k = 0; k < 8; ++k) v.v[k] = __float2bfloat16(uop<OP>(__bfloat162float(v.v[k])));
        reinterpret_cast<B8*>(out)[i] = v;
    }
    for (int64_t i = nvec * 8 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __float2bfloat16(uop<OP>(__bfloat162float(x[i])));
}

// dx = g * f'(x), f = relu or gelu
template <int OP>
__global__ void act_backward_kernel(bf16* __restrict__ dx, const bf16* __restrict__ x, const bf16* __restrict__ g,
                                    int64_t n, bool vec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t nvec = vec ? n / 8 : 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        B8 xv = reinterpret_cast<const B8*>(x)[i], gv = reinterpret_cast<const B8*>(g)[i], r;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            float xx = __bfloat162float(xv.v[k]), gg = __bfloat162float(gv.v[k]);
            r.v[k] = __float2bfloat16(OP == RELU ? (xx > 0.f ? gg : 0.f) : gg * gelu_grad(xx));
        }
        reinterpret_cast<B8*>(dx)[i] = r;
    }
    for (int64_t i = nvec * 8 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float xx = __bfloat162float(x[i]), gg = __bfloat162float(g[i]);
        dx[i] = __float2bfloat16(OP == RELU ? (xx > 0.f ? gg : 0.f) : gg * gelu_grad(xx));
    }
}

// out = cond ? a : b over a strided space (stride 0: cond, 1: a, 2: b)
__global__ void where_kernel(bf16* __restrict__ out, const uint8_t* __restrict__ cond, const bf16* __restrict__ a,
                             const bf16* __restrict__ b, float sa, float sb, bool as, bool bs, Strided sh, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t oc = 0, oa = 0, ob = 0, rem = i;
        for (int d = sh.ndim - 1; d >= 0; --d) {
            int64_t c = rem % sh.shape[d];
            rem /= sh.shape[d];
            oc += c * sh.stride[0][d];
            oa += c * sh.stride[1][d];
            ob += c * sh.stride[2][d];
        }
        float v = cond[oc] ? (as ? sa : __bfloat162float(a[oa])) : (bs ? sb : __bfloat162float(b[ob]));
        out[i] = __float2bfloat16(v);
    }
}

}  // namespace

void binary_bf16(int device, int op, void* out, const void* a, const void* b, double scalar, int mode,
                 const Strided& s, int64_t n) {
    cudaStream_t st = stream(device);
    float sc = (float)scalar;
    switch (op) {
        case ADD: return launch_binary<ADD, false>(st, out, a, b, sc, mode, s, n);
        case SUB: return launch_binary<SUB, false>(st, out, a, b, sc, mode, s, n);
        case MUL: return launch_binary<MUL, false>(st, out, a, b, sc, mode, s, n);
        case DIV: return launch_binary<DIV, false>(st, out, a, b, sc, mode, s, n);
        case POW: return launch_binary<POW, false>(st, out, a, b, sc, mode, s, n);
        case MAXIMUM: return launch_binary<MAXIMUM, false>(st, out, a, b, sc, mode, s, n);
        case MINIMUM: return launch_binary<MINIMUM, false>(st, out, a, b, sc, mode, s, n);
        case EQ: return launch_binary<EQ, true>(st, out, a, b, sc, mode, s, n);
        case NE: return launch_binary<NE, true>(st, out, a, b, sc, mode, s, n);
        case LT: return launch_binary<LT, true>(st, out, a, b, sc, mode, s, n);
        case LE: return launch_binary<LE, true>(st, out, a, b, sc, mode, s, n);
        case GT: return launch_binary<GT, true>(st, out, a, b, sc, mode, s, n);
        case GE: return launch_binary<GE, true>(st, out, a, b, sc, mode, s, n);
    }
    throw std::runtime_error("cuda backend: unknown binary op " + std::to_string(op));
}

void unary_bf16(int device, int op, void* out, const void* x, int64_t n) {
    cudaStream_t st = stream(device);
    bool vec = aligned16(out) && aligned16(x);
    unsigned int grid = blocks_for(vec ? (n + 7) / 8 : n, kThreads);
    bf16* o = (bf16*)out;
    const bf16* i = (const bf16*)x;
    switch (op) {
        case NEG: unary_kernel<NEG><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case EXP: unary_kernel<EXP><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case LOG: unary_kernel<LOG><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case ABS: unary_kernel<ABS><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case SQRT: unary_kernel<SQRT><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case TANH: unary_kernel<TANH><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case SIGN: unary_kernel<SIGN><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case SIGMOID: unary_kernel<SIGMOID><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case RELU: unary_kernel<RELU><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
        case GELU: unary_kernel<GELU><<<grid, kThreads, 0, st>>>(o, i, n, vec); return;
    }
    throw std::runtime_error("cuda backend: unknown unary op " + std::to_string(op));
}

void act_backward_bf16(int device, int op, void* dx, const void* x, const void* g, int64_t n) {
    cudaStream_t st = stream(device);
    bool vec = aligned16(dx) && aligned16(x) && aligned16(g);
    unsigned int grid = blocks_for(vec ? (n + 7) / 8 : n, kThreads);
    if (op == RELU)
        act_backward_kernel<RELU><<<grid, kThreads, 0, st>>>((bf16*)dx, (const bf16*)x, (const bf16*)g, n, vec);
    else
        act_backward_kernel<GELU><<<grid, kThreads, 0, st>>>((bf16*)dx, (const bf16*)x, (const bf16*)g, n, vec);
}

void where_bf16(int device, void* out, const void* cond, const void* a, const void* b, double sa, double sb, bool as,
                bool bs, const Strided& s, int64_t n) {
    where_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream(device)>>>(
        (bf16*)out, (const uint8_t*)cond, (const bf16*)a, (const bf16*)b, (float)sa, (float)sb, as, bs, s, n);
}

}  // namespace engine
