"""Data types of engine tensors, named as in PyTorch (`engine.float32`, `engine.int64`, ...).

numpy has no bfloat16 of its own: `ml_dtypes.bfloat16` is the numpy dtype of engine.bfloat16 (what
the CPU backend stores and `.numpy()` returns; its bits are the upper half of a float32's)."""
from __future__ import annotations

import ml_dtypes
import numpy as np


class DType:
    """A tensor element type. `numpy` is the numpy dtype used by the CPU backend and for transfers."""

    def __init__(self, name: str, numpy_dtype, is_floating_point: bool):
        self.name = name
        self.numpy = np.dtype(numpy_dtype)
        self.is_floating_point = is_floating_point
        self.itemsize = self.numpy.itemsize

    def __repr__(self) -> str:
        return f"engine.{self.name}"

    def __reduce__(self):  # dtypes are singletons
        return (from_name, (self.name,))


float32 = DType("float32", np.float32, True)
float64 = DType("float64", np.float64, True)
float16 = DType("float16", np.float16, True)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16, True)  # numpy kind 'V': not matched by kind "f" below
int64 = DType("int64", np.int64, False)
int32 = DType("int32", np.int32, False)
uint8 = DType("uint8", np.uint8, False)
bool_ = DType("bool", np.bool_, False)

ALL = (float32, float64, float16, bfloat16, int64, int32, uint8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NUMPY = {d.numpy: d for d in ALL}


def from_name(name: str) -> DType:
    return _BY_NAME[name]


def from_numpy(np_dtype) -> DType:
    """The engine dtype of a numpy dtype (ml_dtypes.bfloat16 is engine.bfloat16); unsigned/other ints map
    to int64, other floats to float32."""
    np_dtype = np.dtype(np_dtype)
    if np_dtype in _BY_NUMPY:
        return _BY_NUMPY[np_dtype]
    if np_dtype.kind in "iu":
        return int64
    if np_dtype.kind == "f":
        return float32
    raise TypeError(f"numpy dtype {np_dtype} has no engine counterpart (expected a float, int or bool dtype, "
                    "or ml_dtypes.bfloat16)")


def as_dtype(d) -> DType:
    """Accept an engine DType, a numpy dtype, or a name like 'float32'."""
    if d is None or isinstance(d, DType):
        return d
    if isinstance(d, str):
        if d in _BY_NAME:
            return _BY_NAME[d]
        raise TypeError(f"unknown dtype {d!r}; expected one of {sorted(_BY_NAME)}")
    return from_numpy(d)
