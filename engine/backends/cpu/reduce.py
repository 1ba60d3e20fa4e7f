"""Reductions of the CPU backend: sum and max over axes, argmax over one. bf16 sums accumulate in
float32 and round once, as the CUDA kernels do."""
from __future__ import annotations

import numpy as np

from .bf16 import is_bf16, narrow, widen
from .creation import Array


def sum(x: Array, axes: tuple, keepdim: bool) -> Array:
    if is_bf16(x):
        return narrow(sum(widen(x), axes, keepdim))
    return np.asarray(np.sum(x, axis=axes, keepdims=keepdim, dtype=x.dtype))


def max(x: Array, axes: tuple, keepdim: bool) -> Array:
    if is_bf16(x):  # exact in float32
        return narrow(max(widen(x), axes, keepdim))
    return np.asarray(np.max(x, axis=axes, keepdims=keepdim))


def argmax(x: Array, axis: int) -> Array:
    return np.argmax(widen(x), axis=axis).astype(np.int64)
