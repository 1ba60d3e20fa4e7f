"""Movement primitives of the CUDA backend: reshape (a view), permute, broadcast_to, basic
indexing and its backward, concat (strided copies)."""
from __future__ import annotations

import builtins
import math

from ..._native import native
from .arrays import _CODE, CudaArray, _empty, _same_device, _strided_copy, _view
from .layout import _broadcast_shape, _broadcast_strides, _contiguous_strides, _index_view, _is_contiguous


def reshape(x: CudaArray, shape: tuple) -> CudaArray:
    shape = tuple(shape)
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(x.size // known if n == -1 else n for n in shape) if known else shape
    if math.prod(shape) != x.size:
        raise ValueError(f"reshape: cannot reshape {x.shape} ({x.size} elements) into {shape}")
    return _view(x, shape)


def permute(x: CudaArray, dims: tuple) -> CudaArray:
    dims = tuple(dims)
    if dims == tuple(range(x.ndim)):
        return x
    out_shape = tuple(x.shape[d] for d in dims)
    cs = _contiguous_strides(x.shape)
    out = _empty(out_shape, x.dtype, x.device)
    _strided_copy(out, 0, _contiguous_strides(out_shape), x, 0, [cs[d] for d in dims], out_shape)
    return out


def broadcast_to(x: CudaArray, shape: tuple) -> CudaArray:
    shape = tuple(shape)
    if shape == x.shape:
        return x
    if _broadcast_shape(x.shape, shape) != shape:
        raise ValueError(f"broadcast_to: cannot broadcast {x.shape} to {shape}")
    out = _empty(shape, x.dtype, x.device)
    _strided_copy(out, 0, _contiguous_strides(shape), x, 0, _broadcast_strides(x.shape, shape), shape)
    return out


def getitem(x: CudaArray, index: tuple) -> CudaArray:
    """Basic indexing: a tuple of ints, slices, None and Ellipsis (a view when the result is contiguous)."""
    if not isinstance(index, tuple):
        index = (index,)
    out_shape, offset, strides = _index_view(x.shape, index)
    if _is_contiguous(out_shape, strides):
        return _view(x, out_shape, offset * x.dtype.itemsize)
    out = _empty(out_shape, x.dtype, x.device)
    _strided_copy(out, 0, _contiguous_strides(out_shape), x, offset, strides, out_shape)
    return out


def getitem_backward(grad: CudaArray, index: tuple, shape: tuple) -> CudaArray:
    """Zeros of `shape` with `grad` written at `index`."""
    if not isinstance(index, tuple):
        index = (index,)
    out = _empty(tuple(shape), grad.dtype, grad.device)
    native.fill(out.device, _CODE[out.dtype], out.ptr, 0.0, out.size)
    view_shape, offset, strides = _index_view(tuple(shape), index)
    if view_shape != grad.shape:
        grad = broadcast_to(grad, view_shape)
    _strided_copy(out, offset, strides, grad, 0, _contiguous_strides(view_shape), view_shape)
    return out


def concat(xs: list, axis: int) -> CudaArray:
    first = xs[0]
    axis = axis % first.ndim
    dev = _same_device("concat", *xs)
    for x in xs:
        if x.dtype is not first.dtype:
            raise TypeError(f"concat: mixed dtypes {first.dtype.name} and {x.dtype.name}")
        if x.ndim != first.ndim or x.shape[:axis] != first.shape[:axis] or x.shape[axis + 1:] != first.shape[axis + 1:]:
            raise ValueError(f"concat: shapes {[x.shape for x in xs]} do not match except on axis {axis}")
    out_shape = first.shape[:axis] + (builtins.sum(x.shape[axis] for x in xs),) + first.shape[axis + 1:]
    out = _empty(out_shape, first.dtype, dev)
    ostr = _contiguous_strides(out_shape)
    start = 0
    for x in xs:
        if x.size:
            _strided_copy(out, start * ostr[axis], ostr, x, 0, _contiguous_strides(x.shape), x.shape)
        start += x.shape[axis]
    return out
