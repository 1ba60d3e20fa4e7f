"""DLPack exchange of the CPU backend's arrays (`torch.from_dlpack(t)`, `engine.from_dlpack(x)`), bf16 too.

numpy exports and imports DLPack for its own dtypes; bfloat16 (DLPack type code kDLBfloat, 16 bits)
is not among them. A bf16 array therefore travels as its uint16 bits: numpy makes the capsule of the
uint16 view and the type code in the capsule's DLTensor is rewritten to kDLBfloat before the
consumer sees it; an incoming bf16 capsule gets kDLUInt instead, numpy wraps it, and the uint16
array is viewed as bfloat16. Only the type code byte changes: data, shape, strides and the
producer's deleter stay numpy's (or the producer's), so the memory is shared and freed as usual.

The structs are DLPack's ABI (dlpack.h, v1.x): DLManagedTensor in a "dltensor" capsule,
DLManagedTensorVersioned in a "dltensor_versioned" one (what max_version >= (1, 0) asks for).
"""
from __future__ import annotations

import ctypes

import numpy as np

from .bf16 import BF16, is_bf16
from .creation import Array, contiguous

_KDL_CPU = 1
_KDL_UINT = 1  # DLDataTypeCode
_KDL_BFLOAT = 4


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_MANAGED = {b"dltensor": _DLManagedTensor, b"dltensor_versioned": _DLManagedTensorVersioned}

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _dl_dtype(capsule) -> _DLDataType:
    """The DLDataType inside an unconsumed DLPack capsule (a view into it: writes change the capsule)."""
    name = _capsule_name(capsule)
    if name not in _MANAGED:
        raise ValueError(f"from_dlpack: expected an unconsumed DLPack capsule ('dltensor' or 'dltensor_versioned'), "
                         f"got a capsule named {name!r}")
    managed = _MANAGED[name].from_address(_capsule_pointer(capsule, name))
    return managed.dl_tensor.dtype


class _Capsule:
    """A capsule already taken from its producer, handed on to np.from_dlpack (which asks for __dlpack__)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, *args, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (_KDL_CPU, 0)


def to_dlpack(x: Array, stream=None, max_version=None, copy=None, **kwargs):
    """A DLPack capsule sharing x's memory (a C-contiguous, writeable copy if x is neither, or if
    copy=True); `stream` must be None on the CPU. bf16: kDLBfloat, 16 bits."""
    if stream is not None:
        raise BufferError(f"to_dlpack: a CPU array takes no stream, got stream={stream!r}")
    x = np.array(x, order="C") if copy else contiguous(x)
    extra = {"max_version": max_version} if max_version is not None else {}
    if not is_bf16(x):
        return x.__dlpack__(**extra)
    capsule = x.view(np.uint16).__dlpack__(**extra)
    dtype = _dl_dtype(capsule)
    dtype.code = _KDL_BFLOAT  # bits 16, lanes 1: as numpy wrote them for uint16
    return capsule


def from_dlpack(obj) -> Array:
    """An array sharing the memory of a CPU DLPack producer (a torch CPU tensor, a numpy array, ...),
    bf16 producers included."""
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0
        capsule = obj.__dlpack__()
    dtype = _dl_dtype(capsule)
    if dtype.code != _KDL_BFLOAT:
        return np.from_dlpack(_Capsule(capsule))
    if dtype.bits != 16 or dtype.lanes != 1:
        raise TypeError(f"from_dlpack: bfloat16 of {dtype.bits} bits x {dtype.lanes} lanes is not supported "
                        "(expected 16 bits, 1 lane)")
    dtype.code = _KDL_UINT
    return np.from_dlpack(_Capsule(capsule)).view(BF16)
