"""Elementwise primitives of the CPU backend: binary and unary ops, activation backwards, where,
scale by a 0-d array. bf16 operands are computed in float32 and the result rounded once (bf16.py),
scalars taken in float32, as the CUDA bf16 kernels do."""
from __future__ import annotations

import numpy as np

from .bf16 import any_bf16, narrow, widen
from .creation import Array


_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


def binary(op: str, a, b) -> Array:
    """op(a, b) elementwise with broadcasting; a or b may be a scalar (not both)."""
    dtype = a.dtype if isinstance(a, (np.ndarray, np.generic)) else b.dtype
    if any_bf16(a, b):
        out = binary(op, widen(a), widen(b))
        return out if out.dtype == np.bool_ else narrow(out, dtype)
    out = np.asarray(_BINARY[op](a, b))  # 0-d results stay arrays, not numpy scalars
    if out.dtype != dtype and out.dtype != np.bool_:
        out = out.astype(dtype)
    return out


def _gelu(x: Array) -> Array:
    # tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    c = np.asarray(0.7978845608028654, dtype=x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


_UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "abs": np.abs, "sqrt": np.sqrt,
    "tanh": np.tanh, "sign": np.sign,
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),  # overflow-free logistic
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
}


def unary(op: str, x: Array) -> Array:
    if any_bf16(x):
        return narrow(unary(op, widen(x)), x.dtype)
    return np.asarray(_UNARY[op](x))


def relu_backward(x: Array, grad: Array) -> Array:
    if any_bf16(x, grad):
        return narrow(relu_backward(widen(x), widen(grad)), x.dtype)
    return grad * (x > 0)


def gelu_backward(x: Array, grad: Array) -> Array:
    if any_bf16(x, grad):
        return narrow(gelu_backward(widen(x), widen(grad)), x.dtype)
    # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2),  t = tanh(c (x + a x^3)); in place, few passes
    c, a = 0.7978845608028654, 0.044715
    x2 = x * x
    t = x2 * a
    t += 1.0
    t *= x
    t *= c
    np.tanh(t, out=t)
    d = x2  # reuse: 0.5 x c (1 + 3 a x^2)
    d *= 3.0 * a * c * 0.5
    d += 0.5 * c
    d *= x
    d *= 1.0 - t * t
    t += 1.0
    t *= 0.5
    d += t
    d *= grad
    return d


def where(cond: Array, a, b) -> Array:
    """cond ? a : b with broadcasting; a or b may be a scalar."""
    dtype = a.dtype if isinstance(a, (np.ndarray, np.generic)) else b.dtype
    if any_bf16(a, b):
        return narrow(where(cond, widen(a), widen(b)), dtype)
    return np.asarray(np.where(cond, a, b)).astype(dtype, copy=False)


def scale(x: Array, factor: Array) -> Array:
    """x * factor, factor a 0-d array (on the device: no host sync); x's dtype out (bf16 x: float32
    arithmetic, the factor not rounded to bf16)."""
    if any_bf16(x, factor):
        return narrow(widen(x) * widen(factor).astype(np.float32), x.dtype)
    return x * factor.astype(x.dtype)
