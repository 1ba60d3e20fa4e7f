"""Matrix products of the CPU backend: matmul, linear (with GELU) and its backward, the weight gradient.
bf16 operands are multiplied in float32 (exact products, float32 sums: cuBLASLt's bf16 GEMM with a
float32 accumulator), bias and GELU applied in float32, and the output rounded once to bf16."""
from __future__ import annotations

import numpy as np

from ...dtypes import DType
from .bf16 import any_bf16, narrow, widen
from .creation import Array, astype, dtype_of
from .elementwise import _gelu, gelu_backward
from .fp8 import linear_grads_fp8


def matmul(a: Array, b: Array, transpose_a: bool = False, transpose_b: bool = False) -> Array:
    """(..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast; the flags transpose the last two dims."""
    if any_bf16(a, b):  # (numpy's own bf16 matmul would return float32)
        return narrow(matmul(widen(a), widen(b), transpose_a, transpose_b), a.dtype)
    if a.ndim > 2 or b.ndim > 2:
        # numpy's batched matmul only reaches BLAS for contiguous matrices; permuted views
        # (attention heads) otherwise take a loop some 30x slower than the copy costs
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def linear(x: Array, w: Array, b, activation: str | None):
    """x (N, I) @ w (O, I)^T + b (O,) -> out (N, O), then the activation ("gelu" or None).
    Returns (out, pre): pre is the pre-activation (what the backward needs), None without one."""
    if any_bf16(x, w, b):  # pre and out each rounded once from float32, as the GEMM's bf16 epilogue writes them
        out, pre = linear(widen(x), widen(w), widen(b), activation)
        return narrow(out, x.dtype), (narrow(pre, x.dtype) if pre is not None else None)
    pre = matmul(x, w, transpose_b=True)
    if b is not None:
        pre += b
    if activation is None:
        return pre, None
    if activation != "gelu":
        raise ValueError(f"linear: unknown activation {activation!r} (only 'gelu')")
    return _gelu(pre), pre


def linear_backward(grad: Array, x: Array, w: Array, pre, activation: str | None, need: tuple,
                    param_dtype: DType | None = None, fp8=None, x_gelu_pre=None):
    """grad (N, O) of linear's out -> dx (N, I), dw (O, I), db (O,); None where `need` (x, w, b) is False.
    dw and db in param_dtype (None: x's), as the CUDA backend; for bf16 x float32 sums throughout, dx
    rounded to bf16, dw and db rounded only if param_dtype is bf16 (float32 master weights get float32).
    fp8 (an FP8 layer's operands): dx, and dw where x's transposed copy was kept, through
    fp8.linear_grads_fp8, as the CUDA backend. x_gelu_pre (N, I): x is gelu(x_gelu_pre), and dx is
    the gradient at x_gelu_pre instead (gelu'(x_gelu_pre) * (grad @ w), rounded once)."""
    if any_bf16(grad, x, w, pre, x_gelu_pre):
        pdt = param_dtype if param_dtype is not None else dtype_of(x)
        if activation is not None:  # d pre, rounded to bf16 as the CUDA kernel stores it for the GEMMs
            grad = gelu_backward(narrow(pre, x.dtype), narrow(grad, x.dtype))
        fp8_dx = fp8_dw = None
        if fp8 is not None and (need[0] or need[1]):
            fp8_dx, fp8_dw = linear_grads_fp8(narrow(grad, x.dtype), fp8, need[0], need[1], pdt)
        rest = (need[0] and fp8_dx is None, need[1] and fp8_dw is None, need[2])
        dx, dw, db = linear_backward(widen(grad), widen(x), widen(w), None, None, rest, param_dtype=pdt,
                                     x_gelu_pre=widen(x_gelu_pre) if x_gelu_pre is not None else None)
        dx = fp8_dx if fp8_dx is not None else (narrow(dx, x.dtype) if dx is not None else None)
        return dx, (fp8_dw if fp8_dw is not None else dw), db
    if activation is not None:
        grad = gelu_backward(pre, grad)
    pdt = param_dtype if param_dtype is not None else dtype_of(x)
    dx = matmul(grad, w) if need[0] else None
    if dx is not None and x_gelu_pre is not None:
        dx = gelu_backward(x_gelu_pre, dx)
    dw = weight_grad(grad, x, pdt) if need[1] else None
    db = astype(grad.sum(axis=0, dtype=grad.dtype), pdt) if need[2] else None
    return dx, dw, db


def weight_grad(grad: Array, x: Array, dtype: DType) -> Array:
    """dw (O, I) = grad (N, O)^T @ x (N, I), in `dtype` (the CUDA backend writes float32 for bf16 x,
    from its float32 sums: bf16 operands are widened here, not the product rounded)."""
    return astype(matmul(widen(grad), widen(x), transpose_a=True), dtype)
