"""Movement primitives of the CPU backend: reshape, permute, broadcast_to, basic indexing and its
backward, concat."""
from __future__ import annotations

import numpy as np

from .creation import Array


def reshape(x: Array, shape: tuple) -> Array:
    return x.reshape(shape)


def permute(x: Array, dims: tuple) -> Array:
    return x.transpose(dims)


def broadcast_to(x: Array, shape: tuple) -> Array:
    return np.broadcast_to(x, shape)


def getitem(x: Array, index: tuple) -> Array:
    """Basic indexing: a tuple of ints, slices, None and Ellipsis."""
    return x[index]


def getitem_backward(grad: Array, index: tuple, shape: tuple) -> Array:
    """The gradient of x[index] w.r.t. x: zeros of `shape` with `grad` written at `index`."""
    out = np.zeros(shape, dtype=grad.dtype)
    out[index] = grad
    return out


def concat(xs: list, axis: int) -> Array:
    return np.concatenate(xs, axis=axis)
