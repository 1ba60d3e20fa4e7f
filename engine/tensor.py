"""Tensor: an n-dimensional array on a device, with reverse-mode autograd.

A Tensor wraps a raw backend array (`.data`: a numpy array on the CPU, a device array on CUDA).
This module holds the data type: storage, device, gradient slot, properties, conversion to host
data, DLPack, and `tensor()` (a Tensor from host data). The methods that run ops are defined
next to those ops and installed on Tensor when their modules load (`install_methods`):
`backward` by engine/autograd.py, arithmetic, reductions, shape and dtype/device methods by
engine/methods/, `softmax` by engine/nn/functional.py. Every op goes through one `Function` in
`engine/ops/`, which calls the device's backend."""
from __future__ import annotations

import numpy as np

from . import dtypes
from .backends import backend_for
from .device import Device, as_device
from .dtypes import DType


class Tensor:
    __array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators

    def __init__(self, data, dtype=None, device=None, requires_grad: bool = False):
        t = tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)
        self.__dict__.update(t.__dict__)

    @classmethod
    def _wrap(cls, raw, device: Device, requires_grad: bool = False) -> "Tensor":
        t = cls.__new__(cls)
        t.data = raw
        t.device = device
        t.requires_grad = requires_grad
        t.grad = None
        t._ctx = None
        t._retains_grad = False
        return t

    # ---- basic properties -----------------------------------------------------------------------

    @property
    def _backend(self):
        return backend_for(self.device)

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> DType:
        return self._backend.dtype_of(self.data)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        dev = "" if self.device.type == "cpu" else f", device='{self.device}'"
        return f"tensor({np.array2string(self.numpy(), precision=4, separator=', ')}{dev}, dtype={self.dtype}{grad})"

    # ---- autograd (backward: engine/autograd.py) ----------------------------------------------------

    def detach(self) -> "Tensor":
        return Tensor._wrap(self.data, self.device, False)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not self.dtype.is_floating_point:
            raise TypeError(f"only floating-point tensors can require grad, this one is {self.dtype}")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> None:
        self._retains_grad = True

    def _accumulate_grad(self, raw) -> None:
        be = self._backend
        if self.grad is None:
            # own, contiguous, writeable memory: optimizers and clipping update grads in place
            self.grad = Tensor._wrap(be.contiguous(be.astype(raw, self.dtype)) if raw is not self.data else raw, self.device)
            if self.device.type == "cpu" and not self.grad.data.flags.writeable:
                self.grad.data = self.grad.data.copy()
        else:
            self.grad = Tensor._wrap(be.binary("add", self.grad.data, raw), self.device)

    # ---- conversion -----------------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        return np.asarray(self._backend.to_numpy(self.data))

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item() needs a one-element tensor, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def contiguous(self) -> "Tensor":
        return self

    # DLPack: zero-copy exchange with other libraries (torch.from_dlpack(t)), bf16 included
    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        if self.device.type == "cpu":
            return self._backend.to_dlpack(self.data, stream, max_version=max_version, copy=kwargs.get("copy"))
        return self._backend.to_dlpack(self.data, stream, max_version=max_version)

    def __dlpack_device__(self):
        if self.device.type == "cpu":
            return (1, 0)
        return (2, self.device.index)

    def __bool__(self):
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def fill_(self, value) -> "Tensor":
        self._backend.copy_(self.data, self._backend.full(self.shape, value, self.dtype, self.device.index))
        return self


_CLASS_BOOKKEEPING = frozenset(vars(type("_Empty", (), {})))  # __module__, __dict__, __doc__, ...


def install_methods(methods: type) -> type:
    """Put every method and property defined in the class `methods` on Tensor, and return it.

    Modules above this one (autograd, engine/methods/, nn.functional) write Tensor's op methods as
    the body of a small class next to the ops they run and install them here, so that tensor.py
    never imports them (no import cycle, no import inside a method)."""
    for name, value in vars(methods).items():
        if name not in _CLASS_BOOKKEEPING:
            setattr(Tensor, name, value)
    return methods


# ---- from host data ------------------------------------------------------------------------------

def _default_dtype_for(data, arr: np.ndarray) -> DType:
    if arr.dtype == dtypes.bfloat16.numpy:  # ml_dtypes' bfloat16 (numpy kind 'V')
        return dtypes.bfloat16
    if arr.dtype.kind == "f":  # numpy arrays keep their float width; Python floats become float32
        return dtypes.from_numpy(arr.dtype) if isinstance(data, np.ndarray) else dtypes.float32
    if arr.dtype.kind in "iu":
        return dtypes.int64
    if arr.dtype.kind == "b":
        return dtypes.bool_
    raise TypeError(f"cannot make a tensor from numpy dtype {arr.dtype}: it has no engine counterpart (expected a "
                    "float, int or bool dtype, or ml_dtypes.bfloat16; convert with arr.astype(np.float32))")


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor from a Python number, nested list or numpy array (float32 by default for floats,
    int64 for integers, bfloat16 for an ml_dtypes.bfloat16 array); a Tensor is copied. dtype=bfloat16
    rounds to nearest even, as `.to(engine.bfloat16)` does."""
    if isinstance(data, Tensor):
        return tensor(data.numpy(), dtype or data.dtype, device or data.device, requires_grad)
    arr = np.asarray(data)
    dtype = dtypes.as_dtype(dtype) or _default_dtype_for(data, arr)
    if dtype is dtypes.bfloat16 and arr.dtype not in (dtype.numpy, np.float32):
        arr = arr.astype(np.float32)  # through float32, as the CUDA cast kernel (and torch) round
    arr = arr.astype(dtype.numpy, copy=False)
    device = as_device(device)
    out = Tensor._wrap(backend_for(device).from_numpy(arr, device.index), device)
    if requires_grad:
        out.requires_grad_(True)
    return out
