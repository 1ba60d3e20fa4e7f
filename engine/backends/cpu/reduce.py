"""Reductions of the CPU backend: sum and max over axes, argmax over one."""
from __future__ import annotations

import numpy as np

from .creation import Array


def sum(x: Array, axes: tuple, keepdim: bool) -> Array:
    return np.asarray(np.sum(x, axis=axes, keepdims=keepdim, dtype=x.dtype))


def max(x: Array, axes: tuple, keepdim: bool) -> Array:
    return np.asarray(np.max(x, axis=axes, keepdims=keepdim))


def argmax(x: Array, axis: int) -> Array:
    return np.argmax(x, axis=axis).astype(np.int64)
