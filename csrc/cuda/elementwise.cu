// Elementwise kernels: binary arithmetic and comparisons (same-shape, scalar and broadcast forms),
// unary activations and their fused backward, where, dtype conversion, fill and arange.
#include "common.cuh"
#include "ops.h"

namespace engine {
namespace {

constexpr int kThreads = 256;

// ---- op definitions ------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ T dpow(T a, T b) { return (T)pow((double)a, (double)b); }
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
    unsigned int grid = blocks_for(n, kThreads);
    T sv = (T)scalar;
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

template <typename T>
void unary_float(int device, int op, void* out, const void* x, int64_t n) {
    cudaStream_t st = stream(device);
    unsigned int grid = blocks_for(n, kThreads);
    T* o = (T*)out;
    const T* i = (const T*)x;
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

template <typename T>
void where_typed(int device, void* out, const void* cond, const void* a, const void* b, double sa, double sb,
                 bool as, bool bs, const Strided& s, int64_t n) {
    unsigned int grid = blocks_for(n, kThreads);
    if (fits32(s, n, 3))
        where_kernel<T, int32_t><<<grid, kThreads, 0, stream(device)>>>((T*)out, (const uint8_t*)cond, (const T*)a,
                                                                         (const T*)b, (T)sa, (T)sb, as, bs, s, n);
    else
        where_kernel<T, int64_t><<<grid, kThreads, 0, stream(device)>>>((T*)out, (const uint8_t*)cond, (const T*)a,
                                                                        (const T*)b, (T)sa, (T)sb, as, bs, s, n);
}

// ---- conversion, fill, arange ------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ float to_f(T v) { return (float)v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
    if constexpr (std::is_same_v<D, __half>) return __float2half((float)to_f(v));
    else if constexpr (std::is_same_v<D, __nv_bfloat16>) return __float2bfloat16((float)to_f(v));
    else if constexpr (std::is_same_v<S, __half> || std::is_same_v<S, __nv_bfloat16>) return (D)to_f(v);
    else return (D)v;
}

// out (n,) dtype D = x (n,) dtype S; BOOL outputs are normalised to 0/1
template <typename D, typename S, bool TO_BOOL>
__global__ void astype_kernel(D* __restrict__ out, const S* __restrict__ x, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if constexpr (TO_BOOL) {
            if constexpr (std::is_same_v<S, __half> || std::is_same_v<S, __nv_bfloat16>) out[i] = (D)(to_f(x[i]) != 0.0f);
            else out[i] = (D)(x[i] != (S)0);
        }
        else out[i] = convert<D, S>(x[i]);
    }
}

template <typename S>
void astype_from(int device, int dst, void* out, const void* x, int64_t n) {
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    const S* i = (const S*)x;
    switch (dst) {
        case F32: astype_kernel<float, S, false><<<grid, kThreads, 0, st>>>((float*)out, i, n); return;
        case F64: astype_kernel<double, S, false><<<grid, kThreads, 0, st>>>((double*)out, i, n); return;
        case F16: astype_kernel<__half, S, false><<<grid, kThreads, 0, st>>>((__half*)out, i, n); return;
        case BF16: astype_kernel<__nv_bfloat16, S, false><<<grid, kThreads, 0, st>>>((__nv_bfloat16*)out, i, n); return;
        case I64: astype_kernel<int64_t, S, false><<<grid, kThreads, 0, st>>>((int64_t*)out, i, n); return;
        case I32: astype_kernel<int32_t, S, false><<<grid, kThreads, 0, st>>>((int32_t*)out, i, n); return;
        case U8: astype_kernel<uint8_t, S, false><<<grid, kThreads, 0, st>>>((uint8_t*)out, i, n); return;
        case BOOL: astype_kernel<uint8_t, S, true><<<grid, kThreads, 0, st>>>((uint8_t*)out, i, n); return;
    }
    unsupported("astype", dst);
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ out, T v, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = v;
}

template <typename T>
__global__ void arange_kernel(T* __restrict__ out, double start, double step, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = (T)(start + step * (double)i);
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
        if (op == RELU) act_backward_kernel<float, RELU><<<grid, kThreads, 0, st>>>((float*)dx, (const float*)x, (const float*)g, n);
        else act_backward_kernel<float, GELU><<<grid, kThreads, 0, st>>>((float*)dx, (const float*)x, (const float*)g, n);
    } else if (dtype == F64) {
        if (op == RELU) act_backward_kernel<double, RELU><<<grid, kThreads, 0, st>>>((double*)dx, (const double*)x, (const double*)g, n);
        else act_backward_kernel<double, GELU><<<grid, kThreads, 0, st>>>((double*)dx, (const double*)x, (const double*)g, n);
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
        default: unsupported("where", dtype);
    }
    check_launch("where");
}

void astype(int device, int src, int dst, void* out, const void* x, int64_t n) {
    if (n == 0) return;
    use_device(device);
    switch (src) {
        case F32: astype_from<float>(device, dst, out, x, n); break;
        case F64: astype_from<double>(device, dst, out, x, n); break;
        case F16: astype_from<__half>(device, dst, out, x, n); break;
        case BF16: astype_from<__nv_bfloat16>(device, dst, out, x, n); break;
        case I64: astype_from<int64_t>(device, dst, out, x, n); break;
        case I32: astype_from<int32_t>(device, dst, out, x, n); break;
        case U8: case BOOL: astype_from<uint8_t>(device, dst, out, x, n); break;
        default: unsupported("astype", src);
    }
    check_launch("astype");
}

void fill(int device, int dtype, void* out, double v, int64_t n) {
    if (n == 0) return;
    use_device(device);
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    switch (dtype) {
        case F32: fill_kernel<float><<<grid, kThreads, 0, st>>>((float*)out, (float)v, n); break;
        case F64: fill_kernel<double><<<grid, kThreads, 0, st>>>((double*)out, v, n); break;
        case F16: fill_kernel<__half><<<grid, kThreads, 0, st>>>((__half*)out, __float2half((float)v), n); break;
        case BF16: fill_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>((__nv_bfloat16*)out, __float2bfloat16((float)v), n); break;
        case I64: fill_kernel<int64_t><<<grid, kThreads, 0, st>>>((int64_t*)out, (int64_t)v, n); break;
        case I32: fill_kernel<int32_t><<<grid, kThreads, 0, st>>>((int32_t*)out, (int32_t)v, n); break;
        case U8: fill_kernel<uint8_t><<<grid, kThreads, 0, st>>>((uint8_t*)out, (uint8_t)v, n); break;
        case BOOL: fill_kernel<uint8_t><<<grid, kThreads, 0, st>>>((uint8_t*)out, (uint8_t)(v != 0), n); break;
        default: unsupported("full", dtype);
    }
    check_launch("full");
}

void arange(int device, int dtype, void* out, double start, double step, int64_t n) {
    if (n == 0) return;
    use_device(device);
    unsigned int grid = blocks_for(n, kThreads);
    cudaStream_t st = stream(device);
    switch (dtype) {
        case F32: arange_kernel<float><<<grid, kThreads, 0, st>>>((float*)out, start, step, n); break;
        case F64: arange_kernel<double><<<grid, kThreads, 0, st>>>((double*)out, start, step, n); break;
        case I64: arange_kernel<int64_t><<<grid, kThreads, 0, st>>>((int64_t*)out, start, step, n); break;
        case I32: arange_kernel<int32_t><<<grid, kThreads, 0, st>>>((int32_t*)out, start, step, n); break;
        default: unsupported("arange", dtype);
    }
    check_launch("arange");
}

}  // namespace engine
