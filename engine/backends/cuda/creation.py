"""Transfer, creation and dtype primitives of the CUDA backend: host <-> device copies, full,
arange, astype, copy_."""
from __future__ import annotations

import builtins
import math

import numpy as np

from ...dtypes import DType, bfloat16, float32
from ...dtypes import from_numpy as engine_dtype
from ..._native import native
from .arrays import _CODE, _HOST_NUMPY, _NUMPY_TO_DTYPE, CudaArray, _device, _empty, _same_device
from .movement import broadcast_to


def from_numpy(a: np.ndarray, device_index=None) -> CudaArray:
    """A device array holding a copy of `a`."""
    a = np.asarray(a)
    dtype = _NUMPY_TO_DTYPE.get(a.dtype)
    if dtype is None:
        dtype = engine_dtype(a.dtype)
        a = a.astype(dtype.numpy)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    dev = _device(device_index)
    out = _empty(a.shape, dtype, dev)
    if out.size:
        native.copy_from_host(out.ptr, a.reshape(-1).view(np.uint8), out.nbytes, dev)
    return out


def to_numpy(x: CudaArray) -> np.ndarray:
    """A host copy (waits for the GPU: a sync point, like torch's .cpu())."""
    out = np.empty(x.shape, dtype=_HOST_NUMPY[x.dtype])
    if x.size:
        native.copy_to_host(out.reshape(-1).view(np.uint8), x.ptr, x.nbytes, x.device)
    return out


def dtype_of(x: CudaArray) -> DType:
    return x.dtype


def full(shape: tuple, value, dtype: DType, device_index=None) -> CudaArray:
    out = _empty(tuple(shape), dtype, _device(device_index))
    native.fill(out.device, _CODE[dtype], out.ptr, float(value), out.size)
    return out


def arange(start, stop, step, dtype: DType, device_index=None) -> CudaArray:
    n = builtins.max(0, math.ceil((stop - start) / step))
    out = _empty((n,), dtype, _device(device_index))
    native.arange(out.device, _CODE[dtype], out.ptr, float(start), float(step), n)
    return out


def astype(x: CudaArray, dtype: DType) -> CudaArray:
    if x.dtype is dtype:
        return x
    out = _empty(x.shape, dtype, x.device)
    native.astype(x.device, _CODE[x.dtype], _CODE[dtype], out.ptr, x.ptr, x.size)
    return out


def astype_many(xs: list, dtype: DType) -> list:
    """[astype(x, dtype) for x in xs], the float32 -> bf16 casts of one device in one launch (per 64
    arrays): a model's weights under autocast, one kernel instead of one per weight."""
    outs = [x if x.dtype is dtype else _empty(x.shape, dtype, x.device) for x in xs]
    todo = [(x, o) for x, o in zip(xs, outs) if x is not o]
    devices = {x.device for x, _ in todo}
    if dtype is not bfloat16 or len(devices) > 1 or any(x.dtype is not float32 for x, _ in todo):
        return [astype(x, dtype) for x in xs]
    if todo:
        native.astype_f32_bf16_many(todo[0][0].device, [x.ptr for x, _ in todo], [o.ptr for _, o in todo],
                                    [x.size for x, _ in todo])
    return outs


def copy_(dst: CudaArray, src: CudaArray) -> None:
    """dst[...] = src (same shape, or broadcastable to it; converted to dst's dtype)."""
    _same_device("copy_", dst, src)
    if src.dtype is not dst.dtype:
        src = astype(src, dst.dtype)
    if src.shape != dst.shape:
        src = broadcast_to(src, dst.shape)
    if dst.ptr != src.ptr and dst.size:
        native.copy_device(dst.ptr, src.ptr, dst.nbytes, dst.device)


def contiguous(x: CudaArray) -> CudaArray:
    return x  # always contiguous


def copy_from_numpy_(dst: CudaArray, a: np.ndarray) -> None:
    """dst[...] = a, a C-contiguous host array of dst's size and itemsize, queued on the stream (no
    sync): how a CUDA graph's static buffers and the optimizers' device scalars are refilled."""
    if dst.size:
        native.copy_from_host(dst.ptr, a.reshape(-1).view(np.uint8), dst.nbytes, dst.device)


def device_copy(x: CudaArray, device: int) -> CudaArray:
    """A fresh device array holding x's values (outputs leave a CUDA graph's static buffers this way)."""
    buf = native.DeviceBuffer(x.nbytes, device)
    out = CudaArray(buf, buf.ptr, x.shape, x.dtype, device)
    if x.size:
        native.copy_device(out.ptr, x.ptr, x.nbytes, device)
    return out
