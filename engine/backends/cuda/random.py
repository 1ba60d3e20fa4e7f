"""Random primitives of the CUDA backend (Philox on the device): the dropout mask, normal and
uniform numbers."""
from __future__ import annotations

from ...dtypes import DType, bfloat16, float32
from ..._native import native
from .arrays import _CODE, CudaArray, _device, _empty
from .creation import astype


def dropout_mask(shape: tuple, p: float, seed: int, dtype: DType, device_index=None) -> CudaArray:
    """Inverted-dropout multiplier: 0 with probability p, else 1/(1-p); Philox, reproducible from `seed`."""
    if dtype is bfloat16:  # drawn in float32 (the same mask), stored as bf16
        return astype(dropout_mask(shape, p, seed, float32, device_index), bfloat16)
    out = _empty(tuple(shape), dtype, _device(device_index))
    native.dropout_mask(out.device, _CODE[dtype], out.ptr, out.size, float(p), int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out


def random_normal(shape: tuple, seed: int, device_index=None) -> CudaArray:
    """float32 standard normal numbers drawn on the device (Philox + Box-Muller). Not in cpu/'s set."""
    out = _empty(tuple(shape), float32, _device(device_index))
    native.random_normal(out.device, out.ptr, out.size, int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out


def random_uniform(shape: tuple, seed: int, device_index=None) -> CudaArray:
    """float32 numbers in [0, 1) drawn on the device. Not in cpu/'s set."""
    out = _empty(tuple(shape), float32, _device(device_index))
    native.random_uniform(out.device, out.ptr, out.size, int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out
