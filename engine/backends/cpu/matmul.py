"""Matrix products of the CPU backend: matmul, linear (with GELU) and its backward, the weight gradient."""
from __future__ import annotations

import numpy as np

from ...dtypes import DType
from .creation import Array, astype, dtype_of
from .elementwise import _gelu, gelu_backward


def matmul(a: Array, b: Array, transpose_a: bool = False, transpose_b: bool = False) -> Array:
    """(..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast; the flags transpose the last two dims."""
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
    pre = matmul(x, w, transpose_b=True)
    if b is not None:
        pre += b
    if activation is None:
        return pre, None
    if activation != "gelu":
        raise ValueError(f"linear: unknown activation {activation!r} (only 'gelu')")
    return _gelu(pre), pre


def linear_backward(grad: Array, x: Array, w: Array, pre, activation: str | None, need: tuple,
                    param_dtype: DType | None = None):
    """grad (N, O) of linear's out -> dx (N, I), dw (O, I), db (O,); None where `need` (x, w, b) is False.
    dw and db in param_dtype (None: x's), as the CUDA backend."""
    if activation is not None:
        grad = gelu_backward(pre, grad)
    pdt = param_dtype if param_dtype is not None else dtype_of(x)
    dx = matmul(grad, w) if need[0] else None
    dw = weight_grad(grad, x, pdt) if need[1] else None
    db = astype(grad.sum(axis=0, dtype=grad.dtype), pdt) if need[2] else None
    return dx, dw, db


def weight_grad(grad: Array, x: Array, dtype: DType) -> Array:
    """dw (O, I) = grad (N, O)^T @ x (N, I), in `dtype` (the CUDA backend writes float32 for bf16 x)."""
    return astype(matmul(grad, x, transpose_a=True), dtype)
