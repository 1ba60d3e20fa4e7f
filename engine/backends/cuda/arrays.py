"""CudaArray, the CUDA backend's array: a contiguous n-d block of GPU memory from the caching
allocator; dtype codes, allocation and views, the strided-copy kernel, DLPack exchange."""
from __future__ import annotations

import math

import numpy as np

from ...dtypes import DType, bfloat16, bool_, float16, float32, float64, int32, int64, uint8
from ..._native import native
from . import runtime as _api
from .layout import _coalesce, _contiguous_strides, _is_contiguous


_CODE = {float32: 0, float64: 1, float16: 2, bfloat16: 3, int64: 4, int32: 5, uint8: 6, bool_: 7}


_BY_CODE = {v: k for k, v in _CODE.items()}


_NUMPY_TO_DTYPE = {d.numpy: d for d in _CODE if d.numpy is not None}


_HOST_NUMPY = {d: (d.numpy if d.numpy is not None else np.dtype(np.uint16)) for d in _CODE}  # bf16 as bits


class CudaArray:
    """A contiguous n-d array in GPU memory: `buf` (an engine._C.DeviceBuffer, kept alive here),
    `ptr` (address of element 0), `shape`, `dtype` (engine DType) and `device` (index)."""

    __slots__ = ("buf", "ptr", "shape", "dtype", "device", "size")

    def __init__(self, buf, ptr: int, shape: tuple, dtype: DType, device: int):
        self.buf = buf
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.size = math.prod(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype.name}, device='cuda:{self.device}')"

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        return to_dlpack(self, stream, max_version=max_version)

    def __dlpack_device__(self):
        return (2, self.device)


Array = CudaArray


def _empty(shape: tuple, dtype: DType, device: int) -> CudaArray:
    shape = tuple(shape)
    buf = native.DeviceBuffer(math.prod(shape) * dtype.itemsize, device)
    return CudaArray(buf, buf.ptr, shape, dtype, device)


def _device(device_index) -> int:
    return _api.current_device() if device_index is None else int(device_index)


def _view(x: CudaArray, shape: tuple, byte_offset: int = 0) -> CudaArray:
    return CudaArray(x.buf, x.ptr + byte_offset, tuple(shape), x.dtype, x.device)


def _same_device(op: str, *arrays) -> int:
    dev = None
    for a in arrays:
        if isinstance(a, CudaArray):
            if dev is None:
                dev = a.device
            elif a.device != dev:
                where = ", ".join(f"cuda:{x.device}" for x in arrays if isinstance(x, CudaArray))
                raise RuntimeError(f"{op}: arrays on different devices ({where}); move them to one device first")
    return dev


def _check_float32(op: str, *arrays) -> None:
    for a in arrays:
        if a is not None and a.dtype is not float32:
            raise TypeError(f"cuda backend: {op} supports float32, got {a.dtype.name}; convert with .float()")


def _strided_copy(dst: CudaArray, dst_offset: int, dst_strides, src: CudaArray, src_offset: int, src_strides,
                  shape: tuple) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    cshape, cstr = _coalesce(tuple(shape), (tuple(dst_strides), tuple(src_strides)))
    isz = dst.dtype.itemsize
    native.strided_copy(dst.device, isz, dst.ptr + dst_offset * isz, src.ptr + src_offset * isz, cshape, cstr, n)


def to_dlpack(x: CudaArray, stream=None, max_version=None):
    """A DLPack capsule sharing `x`'s memory; `stream` (the consumer's) is made to wait for our work."""
    versioned = max_version is not None and tuple(max_version) >= (1, 0)
    return native.to_dlpack(x.buf, x.ptr, list(x.shape), _CODE[x.dtype], stream, versioned)


def from_dlpack(obj) -> CudaArray:
    """A CudaArray sharing the memory of a CUDA DLPack producer (torch tensor, CuPy array, capsule).
    Non-contiguous producers are copied into a contiguous array."""
    if hasattr(obj, "__dlpack__"):
        kind, index = obj.__dlpack_device__()
        if int(kind) != 2:
            raise ValueError(f"from_dlpack: the object is on DLPack device type {int(kind)}, not CUDA (2)")
        stream = native.stream_handle(int(index))
        try:
            cap = obj.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:
            cap = obj.__dlpack__(stream=stream)
    else:
        cap = obj  # a capsule
    buf, shape, strides, code, device = native.from_dlpack_capsule(cap)
    shape = tuple(shape)
    dtype = _BY_CODE[code]
    arr = CudaArray(buf, buf.ptr, shape, dtype, device)
    if _is_contiguous(shape, strides) or arr.size == 0:
        return arr
    out = _empty(shape, dtype, device)
    _strided_copy(out, 0, _contiguous_strides(shape), arr, 0, strides, shape)
    return out


def synchronize(device_index=None) -> None:
    native.synchronize(_device(device_index))
