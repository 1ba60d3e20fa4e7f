"""Tensor factories, as in PyTorch: full, zeros, ones, empty, *_like, arange, randn, rand, randint,
from_numpy, from_dlpack (`engine.tensor(data)` is in tensor.py)."""
from __future__ import annotations

import numpy as np

from . import dtypes
from .backends import backend_for
from .backends import cpu as cpu_backend
from .backends import cuda as cuda_backend
from .device import Device, as_device
from .methods.shape import _shape_arg
from .random import default_generator
from .tensor import Tensor, tensor


def from_numpy(arr: np.ndarray) -> Tensor:
    return tensor(arr, dtype=dtypes.from_numpy(arr.dtype))


def from_dlpack(obj) -> Tensor:
    """A tensor sharing memory with a DLPack-capable object (a torch tensor, a numpy array, ...), on
    the CPU (bf16 included) or on CUDA."""
    kind, index = obj.__dlpack_device__()
    if int(kind) == 1:
        return Tensor._wrap(cpu_backend.from_dlpack(obj), Device("cpu"))
    return Tensor._wrap(cuda_backend.from_dlpack(obj), Device("cuda", int(index)))


def full(shape, value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    shape = _shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,))
    dtype = dtypes.as_dtype(dtype) or (dtypes.float32 if isinstance(value, float) else dtypes.int64 if isinstance(value, int) and not isinstance(value, bool) else dtypes.bool_ if isinstance(value, bool) else dtypes.float32)
    device = as_device(device)
    out = Tensor._wrap(backend_for(device).full(shape, value, dtype, device.index), device)
    return out.requires_grad_(True) if requires_grad else out


def zeros(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return full(_shape_arg(shape), 0.0, dtypes.as_dtype(dtype) or dtypes.float32, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return full(_shape_arg(shape), 1.0, dtypes.as_dtype(dtype) or dtypes.float32, device, requires_grad)


empty = zeros


def zeros_like(t: Tensor, dtype=None, device=None) -> Tensor:
    return zeros(t.shape, dtype=dtype or t.dtype, device=device or t.device)


def ones_like(t: Tensor, dtype=None, device=None) -> Tensor:
    return ones(t.shape, dtype=dtype or t.dtype, device=device or t.device)


def full_like(t: Tensor, value, dtype=None, device=None) -> Tensor:
    return full(t.shape, value, dtype=dtype or t.dtype, device=device or t.device)


def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        dtype = dtypes.float32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.int64
    device = as_device(device)
    return Tensor._wrap(backend_for(device).arange(start, stop, step, dtypes.as_dtype(dtype), device.index), device)


def randn(*shape, dtype=None, device=None, requires_grad: bool = False, generator=None) -> Tensor:
    gen = generator or default_generator()
    arr = gen.standard_normal(_shape_arg(shape), dtype=np.float32)
    return tensor(arr, dtype=dtype or dtypes.float32, device=device, requires_grad=requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad: bool = False, generator=None) -> Tensor:
    gen = generator or default_generator()
    arr = gen.random(_shape_arg(shape), dtype=np.float32)
    return tensor(arr, dtype=dtype or dtypes.float32, device=device, requires_grad=requires_grad)


def randint(low: int, high: int, size, device=None, generator=None) -> Tensor:
    gen = generator or default_generator()
    return tensor(gen.integers(low, high, size=tuple(size)), dtype=dtypes.int64, device=device)
