// Elementwise kernels: binary arithmetic and comparisons (same-shape, scalar and broadcast forms),
// unary activations and their fused backward, where; every dtype but bfloat16 (elementwise_bf16.cu).
#include "elementwise/elementwise.h"
#include "runtime/common.cuh"
#include "runtime/vec.cuh"

namespace engine {
namespace {

constexpr int kThreads = 256;

// F4 (runtime/vec.cuh): the float32 kernels move 4 floats (16 bytes) per thread where the data allows

// ---- op definitions ------------------------------------------------------------------------------

// integer power by squaring: exact, unlike pow() on doubles (3^1 can come back as 2.9999...)
template <typename T> __device__ __forceinline__ T dpow(T a, T b) {
    if constexpr (std::is_signed_v<T>)
        if (b < 0) return (a == 1) ? T(1) : (a == (T)-1) ? ((b & 1) ? (T)-1 : T(1)) : T(0);
    T r = 1;
    while (b) {
        if (b & 1) r *= a;
        a *= a;
        b >>= 1;
    }
    return r;
}
__device__ __forceinline__ double dpow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ float dpow(float a, float b) { return powf(a, b); }
template <typename T> __device__ __forceinline__ T ddiv(T a, T b) { return (T)((double)a / (double)b); }
__device__ __forceinline__ float ddiv(float a, float b) { return a / b; }
__device__ __forceinline__ double ddiv(double a, double b) { return a / b; }

template <int OP, typename T>
__device__ __forceinline__ auto apply_binary(T a, T b) {
    if constexpr (OP == ADD) return (T)(a + b);
    else if constexpr (OP == SUB) return (T)(a - b);
    else if constexpr (OP == MUL) return (T)(a * b);
    else if constexpr (OP == DIV) return ddiv(a, b);
    else if constexpr (OP == POW) return dpow(a, b);
    // NaN propagates as in numpy's maximum/minimum
    else if constexpr (OP == MAXIMUM) return (a != a || a > b) ? a : b;
    else if constexpr (OP == MINIMUM) return (a != a || a < b) ? a : b;
    else if constexpr (OP == EQ) return (uint8_t)(a == b);
    else if constexpr (OP == NE) return (uint8_t)(a != b);
    else if constexpr (OP == LT) return (uint8_t)(a < b);
    else if constexpr (OP == LE) return (uint8_t)(a <= b);
    else if constexpr (OP == GT) return (uint8_t)(a > b);
    else return (uint8_t)(a >= b);
}

constexpr bool is_compare(int op) { return op >= EQ; }

// offset of element i along the strided space (dims coalesced by the caller)
template <typename I>
__device__ __forceinline__ void offsets(const Strided& s, I i, int nops, I* off) {
    for (int k = 0; k < nops; ++k) off[k] = 0;
    for (int d = s.ndim - 1; d >= 0; --d) {
        I n = (I)s.shape[d];
        I c = i % n;
        i /= n;
        for (int k = 0; k < nops; ++k) off[k] += c * (I)s.stride[k][d];
    }
}

// out (n,) = a (n,) OP b (n,) | a OP scalar | scalar OP b
template <typename T, typename R, int OP, bool NORM>
__global__ void binary_flat_kernel(R* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, T s,
                                   int64_t n, int mode) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T x = mode == 2 ? s : a[i];
        T y = mode == 1 ? s : b[i];
        auto r = apply_binary<OP>(x, y);
        out[i] = NORM ? (R)(r != 0) : (R)r;
    }
}

// out (shape) = a (broadcast) OP b (broadcast)
template <typename T, typename R, int OP, bool NORM, typename I>
__global__ void binary_strided_kernel(R* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, T s,
                                      Strided sh, int64_t n, int mode) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        I off[2];
        offsets<I>(sh, (I)i, 2, off);
        T x = mode == 2 ? s : a[off[0]];
        T y = mode == 1 ? s : b[off[1]];
        auto r = apply_binary<OP>(x, y);
        out[i] = NORM ? (R)(r != 0) : (R)r;
    }
}

// out (n,) = a OP b, 4 elements per thread (float32, aligned); R is float or uint8 (comparisons)
template <typename R, int OP>
__global__ void binary_flat_vec_kernel(R* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b,
                                       float s, int64_t nvec, int mode) {
    using VR = Vec<R, 4>;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        F4 x{}, y{};
        if (mode != 2) x = reinterpret_cast<const F4*>(a)[i];
        if (mode != 1) y = reinterpret_cast<const F4*>(b)[i];
        VR r;
#pragma unroll
        for (int k = 0; k < 4; ++k) r.v[k] = (R)apply_binary<OP>(mode == 2 ? s : x.v[k], mode == 1 ? s : y.v[k]);
        reinterpret_cast<VR*>(out)[i] = r;
    }
}

// strided (broadcast) float32 operands, 4 consecutive elements of the last dim per thread: the
// index arithmetic is done once per 4; vec_a / vec_b: that operand is unit-stride and aligned
template <typename R, int OP, typename I>
__global__ void binary_strided_vec_kernel(R* __restrict__ out, const float* __restrict__ a,
                                          const float* __restrict__ b, float s, Strided sh, int64_t ngroups,
                                          int mode, bool vec_a, bool vec_b) {
    using VR = Vec<R, 4>;
    int last = sh.ndim - 1;
    I la = (I)sh.stride[0][last], lb = (I)sh.stride[1][last];
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < ngroups; g += stride) {
        I off[2];
        offsets<I>(sh, (I)(g * 4), 2, off);
        F4 x{}, y{};
        if (mode != 2) {
            if (vec_a) x = *reinterpret_cast<const F4*>(a + off[0]);
            else
#pragma unroll
                for (int k = 0; k < 4; ++k) x.v[k] = a[off[0] + k * la];
        }
        if (mode != 1) {
            if (vec_b) y = *reinterpret_cast<const F4*>(b + off[1]);
            else
#pragma unroll
                for (int k = 0; k < 4; ++k) y.v[k] = b[off[1] + k * lb];
        }
        VR r;
#pragma unroll
        for (int k = 0; k < 4; ++k) r.v[k] = (R)apply_binary<OP>(mode == 2 ? s : x.v[k], mode == 1 ? s : y.v[k]);
        reinterpret_cast<VR*>(out)[g] = r;
    }
}

// operand k can be read as aligned 4-vectors along the last dim of `s`
bool vec_operand(const Strided& s, int k, const void* p, int elsize) {
    if (!aligned(p, 4 * elsize)) return false;
    int last = s.ndim - 1;
    if (s.stride[k][last] != 1) return false;
    for (int d = 0; d < last; ++d)
        if (s.stride[k][d] % 4 != 0) return false;
    return true;
}

bool fits32(const Strided& s, int64_t n, int nops) {
    if (n >= (int64_t(1) << 31)) return false;
    for (int k = 0; k < nops; ++k) {
        int64_t m = 0;
        for (int d = 0; d < s.ndim; ++d) m += (s.shape[d] - 1) * (s.stride[k][d] < 0 ? -s.stride[k][d] : s.stride[k][d]);
        if (m >= (int64_t(1) << 31)) return false;
    }
    return true;
}

bool is_flat(const Strided& s, int mode) {
    // one dim, unit strides on the array operands
    if (s.ndim != 1) return false;
    if (mode != 2 && s.stride[0][0] != 1) return false;
    if (mode != 1 && s.stride[1][0] != 1) return false;
    return true;
}

template <typename T, int OP, bool NORM = false>
void launch_binary(int device, void* out, const void* a, const void* b, double scalar, int mode, const Strided& s,
                   int64_t n) {
    using R = std::conditional_t<is_compare(OP), uint8_t, T>;
    cudaStream_t st = stream(device);
    T sv = (T)scalar;
    if constexpr (std::is_same_v<T, float>) {
        constexpr int RB = sizeof(R) * 4;  // bytes of 4 outputs
        if (is_flat(s, mode) && n >= 4 && aligned(out, RB) && (mode == 2 || aligned(a, 16)) &&
            (mode == 1 || aligned(b, 16))) {
            int64_t nvec = n / 4, done = nvec * 4;
            binary_flat_vec_kernel<R, OP><<<blocks_for(nvec, kThreads), kThreads, 0, st>>>(
                (R*)out, (const float*)a, (const float*)b, sv, nvec, mode);
            if (done < n)
                binary_flat_kernel<T, R, OP, NORM><<<1, kThreads, 0, st>>>(
                    (R*)out + done, (const T*)a + (mode == 2 ? 0 : done), (const T*)b + (mode == 1 ? 0 : done), sv,
                    n - done, mode);
            return;
        }
        if (!is_flat(s, mode) && s.shape[s.ndim - 1] % 4 == 0 && aligned(out, RB) && fits32(s, n, 2)) {
            bool va = mode != 2 && vec_operand(s, 0, a, 4), vb = mode != 1 && vec_operand(s, 1, b, 4);
            int64_t ng = n / 4;
            binary_strided_vec_kernel<R, OP, int32_t><<<blocks_for(ng, kThreads), kThreads, 0, st>>>(
                (R*)out, (const float*)a, (const float*)b, sv, s, ng, mode, va, vb);
            return;
        }
    }
    unsigned int grid = blocks_for(n, kThreads);
    if (is_flat(s, mode)) {
        binary_flat_kernel<T, R, OP, NORM><<<grid, kThreads, 0, st>>>((R*)out, (const T*)a, (const T*)b, sv, n, mode);
    } else if (fits32(s, n, 2)) {
        binary_strided_kernel<T, R, OP, NORM, int32_t>
            <<<grid, kThreads, 0, st>>>((R*)out, (const T*)a, (const T*)b, sv, s, n, mode);
    } else {
        binary_strided_kernel<T, R, OP, NORM, int64_t>
            <<<grid, kThreads, 0, st>>>((R*)out, (const T*)a, (const T*)b, sv, s, n, mode);
    }
}

template <typename T, bool NORM = false>
void binary_typed(int device, int op, void* out, const void* a, const void* b, double sc, int mode, const Strided& s,
                  int64_t n) {
    switch (op) {
        case ADD: return launch_binary<T, ADD, NORM>(device, out, a, b, sc, mode, s, n);
        case SUB: return launch_binary<T, SUB, NORM>(device, out, a, b, sc, mode, s, n);
        case MUL: return launch_binary<T, MUL, NORM>(device, out, a, b, sc, mode, s, n);
        case DIV: return launch_binary<T, DIV, NORM>(device, out, a, b, sc, mode, s, n);
        case POW: return launch_binary<T, POW, NORM>(device, out, a, b, sc, mode, s, n);
        case MAXIMUM: return launch_binary<T, MAXIMUM, NORM>(device, out, a, b, sc, mode, s, n);
        case MINIMUM: return launch_binary<T, MINIMUM, NORM>(device, out, a, b, sc, mode, s, n);
        case EQ: return launch_binary<T, EQ>(device, out, a, b, sc, mode, s, n);
        case NE: return launch_binary<T, NE>(device, out, a, b, sc, mode, s, n);
        case LT: return launch_binary<T, LT>(device, out, a, b, sc, mode, s, n);
        case LE: return launch_binary<T, LE>(device, out, a, b, sc, mode, s, n);
        case GT: return launch_binary<T, GT>(device, out, a, b, sc, mode, s, n);
        case GE: return launch_binary<T, GE>(device, out, a, b, sc, mode, s, n);
    }
    throw std::runtime_error("cuda backend: unknown binary op " + std::to_string(op));
}

// ---- unary -----------------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ T gelu_tanh(T x) {
    const T c = (T)0.7978845608028654;
    return (T)0.5 * x * ((T)1 + tanh(c * (x + (T)0.044715 * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

template <int OP, typename T>
__device__ __forceinline__ T apply_unary(T x) {
    if constexpr (OP == NEG) return (T)(-x);
    else if constexpr (OP == EXP) return exp(x);
    else if constexpr (OP == LOG) return log(x);
    else if constexpr (OP == ABS) return x < (T)0 ? (T)(-x) : x;
    else if constexpr (OP == SQRT) return sqrt(x);
    else if constexpr (OP == TANH) return tanh(x);
    else if constexpr (OP == SIGN) return (T)((x > (T)0) - (x < (T)0));
    else if constexpr (OP == SIGMOID) return (T)0.5 * ((T)1 + tanh((T)0.5 * x));
    else if constexpr (OP == RELU) return x > (T)0 ? x : (T)0;
    else return gelu_tanh(x);
}

// out (n,) = f(x) (n,)
template <typename T, int OP>
__global__ void unary_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = apply_unary<OP>(x[i]);
}

// out (n,) = f(x) (n,), 4 floats per thread
template <int OP>
__global__ void unary_vec_kernel(F4* __restrict__ out, const F4* __restrict__ x, int64_t nvec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        F4 v = x[i];
#pragma unroll
        for (int k = 0; k < 4; ++k) v.v[k] = apply_unary<OP>(v.v[k]);
        out[i] = v;
    }
}

template <int OP>
void unary_f32(cudaStream_t st, float* o, const float* i, int64_t n) {
    int64_t nvec = (aligned(o, 16) && aligned(i, 16)) ? n / 4 : 0;
    if (nvec) unary_vec_kernel<OP><<<blocks_for(nvec, kThreads), kThreads, 0, st>>>((F4*)o, (const F4*)i, nvec);
    if (n > nvec * 4)
        unary_kernel<float, OP><<<blocks_for(n - nvec * 4, kThreads), kThreads, 0, st>>>(o + nvec * 4, i + nvec * 4,
                                                                                          n - nvec * 4);
}

template <typename T>
void unary_float(int device, int op, void* out, const void* x, int64_t n) {
    cudaStream_t st = stream(device);
    unsigned int grid = blocks_for(n, kThreads);
    T* o = (T*)out;
    const T* i = (const T*)x;
    if constexpr (std::is_same_v<T, float>) {
        switch (op) {
            case NEG: return unary_f32<NEG>(st, o, i, n);
            case EXP: return unary_f32<EXP>(st, o, i, n);
            case LOG: return unary_f32<LOG>(st, o, i, n);
            case ABS: return unary_f32<ABS>(st, o, i, n);
            case SQRT: return unary_f32<SQRT>(st, o, i, n);
            case TANH: return unary_f32<TANH>(st, o, i, n);
            case SIGN: return unary_f32<SIGN>(st, o, i, n);
            case SIGMOID: return unary_f32<SIGMOID>(st, o, i, n);
            case RELU: return unary_f32<RELU>(st, o, i, n);
            case GELU: return unary_f32<GELU>(st, o, i, n);
        }
    }
    switch (op) {
        case NEG: unary_kernel<T, NEG><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case EXP: unary_kernel<T, EXP><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case LOG: unary_kernel<T, LOG><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case ABS: unary_kernel<T, ABS><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case SQRT: unary_kernel<T, SQRT><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case TANH: unary_kernel<T, TANH><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case SIGN: unary_kernel<T, SIGN><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case SIGMOID: unary_kernel<T, SIGMOID><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case RELU: unary_kernel<T, RELU><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case GELU: unary_kernel<T, GELU><<<grid, kThreads, 0, st>>>(o, i, n); return;
    }
    throw std::runtime_error("cuda backend: unknown unary op " + std::to_string(op));
}

template <typename T>
void unary_int(int device, int op, void* out, const void* x, int64_t n) {
    cudaStream_t st = stream(device);
    unsigned int grid = blocks_for(n, kThreads);
    T* o = (T*)out;
    const T* i = (const T*)x;
    switch (op) {
        case NEG: unary_kernel<T, NEG><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case ABS: unary_kernel<T, ABS><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case SIGN: unary_kernel<T, SIGN><<<grid, kThreads, 0, st>>>(o, i, n); return;
        case RELU: unary_kernel<T, RELU><<<grid, kThreads, 0, st>>>(o, i, n); return;
    }
    throw std::runtime_error("cuda backend: unary op " + std::to_string(op) + " needs a floating-point input");
}

// dx (n,) = g * relu'(x) | g * gelu'(x)
template <typename T, int OP>
__global__ void act_backward_kernel(T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ g, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T xi = x[i];
        if constexpr (OP == RELU) {
            dx[i] = xi > (T)0 ? g[i] : (T)0;
        } else {
            const T c = (T)0.7978845608028654;
            T x2 = xi * xi;
            T t = tanh(c * (xi + (T)0.044715 * x2 * xi));
            T dinner = c * ((T)1 + (T)(3.0 * 0.044715) * x2);
            dx[i] = g[i] * ((T)0.5 * ((T)1 + t) + (T)0.5 * xi * ((T)1 - t * t) * dinner);
        }
    }
}

template <int OP>
__global__ void act_backward_vec_kernel(F4* __restrict__ dx, const F4* __restrict__ x, const F4* __restrict__ g,
                                        int64_t nvec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        F4 xv = x[i], gv = g[i], r;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float xi = xv.v[k];
            if constexpr (OP == RELU) {
                r.v[k] = xi > 0.f ? gv.v[k] : 0.f;
            } else {
                const float c = 0.7978845608028654f;
                float x2 = xi * xi;
                float t = tanhf(c * (xi + 0.044715f * x2 * xi));
                float dinner = c * (1.0f + (float)(3.0 * 0.044715) * x2);
                r.v[k] = gv.v[k] * (0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * dinner);
            }
        }
        dx[i] = r;
    }
}

// ---- where -------------------------------------------------------------------------------------------

// out (shape) = cond ? a : b, each broadcast; a/b may be scalars
template <typename T, typename I>
__global__ void where_kernel(T* __restrict__ out, const uint8_t* __restrict__ cond, const T* __restrict__ a,
                             const T* __restrict__ b, T sa, T sb, bool as, bool bs, Strided sh, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        I off[3];
        offsets<I>(sh, (I)i, 3, off);
        out[i] = cond[off[0]] ? (as ? sa : a[off[1]]) : (bs ? sb : b[off[2]]);
    }
}

// float32 where, 4 consecutive elements of the last dim per thread (index arithmetic once per 4)
__global__ void where_vec_kernel(F4* __restrict__ out, const uint8_t* __restrict__ cond, const float* __restrict__ a,
                                 const float* __restrict__ b, float sa, float sb, bool as, bool bs, Strided sh,
                                 int64_t ngroups, bool vc, bool va, bool vb) {
    int last = sh.ndim - 1;
    int lc = (int)sh.stride[0][last], la = (int)sh.stride[1][last], lb = (int)sh.stride[2][last];
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < ngroups; g += stride) {
        int off[3];
        offsets<int>(sh, (int)(g * 4), 3, off);
        Vec<uint8_t, 4> c;
        if (vc) c = *reinterpret_cast<const Vec<uint8_t, 4>*>(cond + off[0]);
        else
#pragma unroll
            for (int k = 0; k < 4; ++k) c.v[k] = cond[off[0] + k * lc];
        F4 x{}, y{}, r;
        if (!as) {
            if (va) x = *reinterpret_cast<const F4*>(a + off[1]);
            else
#pragma unroll
                for (int k = 0; k < 4; ++k) x.v[k] = a[off[1] + k * la];
        }
        if (!bs) {
            if (vb) y = *reinterpret_cast<const F4*>(b + off[2]);
            else
#pragma unroll
                for (int k = 0; k < 4; ++k) y.v[k] = b[off[2] + k * lb];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) r.v[k] = c.v[k] ? (as ? sa : x.v[k]) : (bs ? sb : y.v[k]);
        out[g] = r;
    }
}

template <typename T>
void where_typed(int device, void* out, const void* cond, const void* a, const void* b, double sa, double sb,
                 bool as, bool bs, const Strided& s, int64_t n) {
    unsigned int grid = blocks_for(n, kThreads);
    if constexpr (std::is_same_v<T, float>) {
        if (s.shape[s.ndim - 1] % 4 == 0 && aligned(out, 16) && fits32(s, n, 3)) {
            bool vc = vec_operand(s, 0, cond, 1), va = !as && vec_operand(s, 1, a, 4), vb = !bs && vec_operand(s, 2, b, 4);
            where_vec_kernel<<<blocks_for(n / 4, kThreads), kThreads, 0, stream(device)>>>(
                (F4*)out, (const uint8_t*)cond, (const float*)a, (const float*)b, (float)sa, (float)sb, as, bs, s, n / 4,
                vc, va, vb);
            return;
        }
    }
    if (fits32(s, n, 3))
        where_kernel<T, int32_t><<<grid, kThreads, 0, stream(device)>>>((T*)out, (const uint8_t*)cond, (const T*)a,
                                                                         (const T*)b, (T)sa, (T)sb, as, bs, s, n);
    else
        where_kernel<T, int64_t><<<grid, kThreads, 0, stream(device)>>>((T*)out, (const uint8_t*)cond, (const T*)a,
                                                                        (const T*)b, (T)sa, (T)sb, as, bs, s, n);
}

}  // namespace

void binary(int device, int op, int dtype, void* out, const void* a, const void* b, double scalar, int mode,
            const Strided& s, int64_t n) {
    if (n == 0) return;
    use_device(device);
    switch (dtype) {
        case F32: binary_typed<float>(device, op, out, a, b, scalar, mode, s, n); break;
        case F64: binary_typed<double>(device, op, out, a, b, scalar, mode, s, n); break;
        case I64: binary_typed<int64_t>(device, op, out, a, b, scalar, mode, s, n); break;
        case I32: binary_typed<int32_t>(device, op, out, a, b, scalar, mode, s, n); break;
        case U8: binary_typed<uint8_t>(device, op, out, a, b, scalar, mode, s, n); break;
        case BOOL: binary_typed<uint8_t, true>(device, op, out, a, b, scalar, mode, s, n); break;
        case BF16: binary_bf16(device, op, out, a, b, scalar, mode, s, n); break;
        default: unsupported("binary", dtype);
    }
    check_launch("binary");
}

void unary(int device, int op, int dtype, void* out, const void* x, int64_t n) {
    if (n == 0) return;
    use_device(device);
    switch (dtype) {
        case F32: unary_float<float>(device, op, out, x, n); break;
        case F64: unary_float<double>(device, op, out, x, n); break;
        case I64: unary_int<int64_t>(device, op, out, x, n); break;
        case I32: unary_int<int32_t>(device, op, out, x, n); break;
        case BF16: unary_bf16(device, op, out, x, n); break;
        default: unsupported("unary", dtype);
    }
    check_launch("unary");
}

void act_backward(int device, int op, int dtype, void* dx, const void* x, const void* g, int64_t n) {
    if (n == 0) return;
    use_device(device);
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    if (dtype == F32) {
        float* d = (float*)dx;
        const float *xi = (const float*)x, *gi = (const float*)g;
        int64_t nvec = (aligned(d, 16) && aligned(xi, 16) && aligned(gi, 16)) ? n / 4 : 0, done = nvec * 4;
        unsigned int gv = blocks_for(nvec, kThreads), gt = blocks_for(n - done, kThreads);
        if (op == RELU) {
            if (nvec) act_backward_vec_kernel<RELU><<<gv, kThreads, 0, st>>>((F4*)d, (const F4*)xi, (const F4*)gi, nvec);
            if (done < n) act_backward_kernel<float, RELU><<<gt, kThreads, 0, st>>>(d + done, xi + done, gi + done, n - done);
        } else {
            if (nvec) act_backward_vec_kernel<GELU><<<gv, kThreads, 0, st>>>((F4*)d, (const F4*)xi, (const F4*)gi, nvec);
            if (done < n) act_backward_kernel<float, GELU><<<gt, kThreads, 0, st>>>(d + done, xi + done, gi + done, n - done);
        }
        (void)grid;
    } else if (dtype == F64) {
        if (op == RELU) act_backward_kernel<double, RELU><<<grid, kThreads, 0, st>>>((double*)dx, (const double*)x, (const double*)g, n);
        else act_backward_kernel<double, GELU><<<grid, kThreads, 0, st>>>((double*)dx, (const double*)x, (const double*)g, n);
    } else if (dtype == BF16) {
        act_backward_bf16(device, op, dx, x, g, n);
    } else {
        unsupported(op == RELU ? "relu_backward" : "gelu_backward", dtype);
    }
    check_launch(op == RELU ? "relu_backward" : "gelu_backward");
}

void where(int device, int dtype, void* out, const void* cond, const void* a, const void* b, double sa, double sb,
           bool as, bool bs, const Strided& s, int64_t n) {
    if (n == 0) return;
    use_device(device);
    switch (dtype) {
        case F32: where_typed<float>(device, out, cond, a, b, sa, sb, as, bs, s, n); break;
        case F64: where_typed<double>(device, out, cond, a, b, sa, sb, as, bs, s, n); break;
        case I64: where_typed<int64_t>(device, out, cond, a, b, sa, sb, as, bs, s, n); break;
        case I32: where_typed<int32_t>(device, out, cond, a, b, sa, sb, as, bs, s, n); break;
        case U8: case BOOL: where_typed<uint8_t>(device, out, cond, a, b, sa, sb, as, bs, s, n); break;
        case BF16: where_bf16(device, out, cond, a, b, sa, sb, as, bs, s, n); break;
        default: unsupported("where", dtype);
    }
    check_launch("where");
}

}  // namespace engine
