"""Transfer, creation and dtype primitives of the CPU backend (numpy arrays), and the dropout mask.
bf16 arrays are ml_dtypes.bfloat16 numpy arrays (bf16.py); casts to them round to nearest even."""
from __future__ import annotations

import numpy as np

from ...dtypes import DType
from ...dtypes import from_numpy as _dtype_of_numpy
from .bf16 import BF16


Array = np.ndarray


_np = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": BF16, "int64": np.int64,
       "int32": np.int32, "uint8": np.uint8, "bool": np.bool_}


def from_numpy(a: np.ndarray, device_index=None) -> Array:
    """A backend array holding a copy of `a` (numpy in, array out)."""
    return np.array(a, copy=True)


def to_numpy(x: Array) -> np.ndarray:
    return x


def dtype_of(x: Array) -> DType:
    return _dtype_of_numpy(x.dtype)


def full(shape: tuple, value, dtype: DType, device_index=None) -> Array:
    if _np[dtype.name] == BF16:  # the value as float32, then rounded (the CUDA fill kernel's order)
        return np.full(shape, value, dtype=np.float32).astype(BF16)
    return np.full(shape, value, dtype=_np[dtype.name])


def arange(start, stop, step, dtype: DType, device_index=None) -> Array:
    if _np[dtype.name] == BF16:  # start + i * step in float32, each rounded to bf16
        return np.arange(start, stop, step, dtype=np.float32).astype(BF16)
    return np.arange(start, stop, step, dtype=_np[dtype.name])


def astype(x: Array, dtype: DType) -> Array:
    target = _np[dtype.name]
    if target == BF16 and x.dtype not in (BF16, np.float32):
        x = x.astype(np.float32)  # through float32, as the CUDA cast kernel (and torch) round
    return x.astype(target, copy=False)


def astype_many(xs: list, dtype: DType) -> list:
    """[astype(x, dtype) for x in xs]: on the GPU one launch for many float32 -> bf16 casts."""
    return [astype(x, dtype) for x in xs]


def copy_(dst: Array, src: Array) -> None:
    """dst[...] = src (same shape)."""
    np.copyto(dst, src)


def contiguous(x: Array) -> Array:
    """x itself if C-contiguous and writeable, else a C-contiguous copy (0-d stays 0-d)."""
    return x if x.flags.c_contiguous and x.flags.writeable else np.array(x, order="C")


def dropout_mask(shape: tuple, p: float, seed: int, dtype: DType, device_index=None) -> Array:
    """Inverted-dropout multiplier: 0 with probability p, else 1/(1-p); reproducible from `seed`."""
    keep = np.random.default_rng(seed).random(shape, dtype=np.float32) >= p
    if _np[dtype.name] == BF16:
        return (keep.astype(np.float32) * np.float32(1.0 / (1.0 - p))).astype(BF16)
    return keep.astype(_np[dtype.name]) * np.asarray(1.0 / (1.0 - p), dtype=_np[dtype.name])
